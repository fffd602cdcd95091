"""Name maps between the trainer's parameter names and a rollout engine's, one table per model family.

A trainer holds a HF model in memory (transformers 5 names, e.g. Qwen2.5-VL's
``model.language_model.layers.0.self_attn.q_proj.weight``). A rollout engine wants the same values
under its own names, in one of three layouts:

``"hf"``
    identity: the engine runs the same HF class (e.g. ``HFRolloutEngine``). Needs no family table.
``"hf_checkpoint"``
    the names in a HF checkpoint on disk (Qwen2.5-VL: ``model.*``, ``visual.*``, ``lm_head.*``;
    Qwen3-VL: its in-memory names ``model.language_model.*``, ``model.visual.*``, ``lm_head.*``), which
    is what vLLM's ``model.load_weights(iterable)`` accepts (vLLM fuses and shards them itself).
    A tied ``lm_head`` is left out, as ``save_pretrained`` does.
``"vllm"``
    vLLM's in-memory module tree, with packed modules fused along dim 0 (``qkv_proj`` = cat of
    ``q_proj``, ``k_proj``, ``v_proj``; ``gate_up_proj`` = cat of ``gate_proj``, ``up_proj``), for an
    engine whose fused parameters are written directly.

Adding a family: write ``cosmos_primitives/models/<model_type>.py`` with a
:class:`FamilyNameMap` (prefix rules per layout, fusions, the tied pair) and register it in
``models/families.py``; from user code, call :func:`register_family` with the same object.
``model_type`` is the HF ``config.model_type`` of the trainer's model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

LAYOUTS = ("hf", "hf_checkpoint", "vllm")


class NameMapError(ValueError):
    """A name cannot be mapped, or the mapped names do not fit the engine."""


class UnknownFamilyError(NameMapError):
    """No name map is registered for a model family."""


@attrs.frozen
class Fusion:
    """Engine parameter ``<module>.<fused>.<leaf>`` = cat over ``parts`` of ``<module>.<part>.<leaf>`` along dim 0.

    ``fused`` and ``parts`` are module-path suffixes, e.g. ``"self_attn.qkv_proj"`` and
    ``("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")``; ``leaf`` is ``weight`` / ``bias``.
    """

    fused: str
    parts: tuple[str, ...]


@attrs.frozen
class FamilyNameMap:
    """The name table of one model family (see the module docstring for the layouts).

    Args:
        model_type: HF ``config.model_type`` (``"qwen2_5_vl"``).
        prefixes: layout -> ordered ``(trainer prefix, engine prefix)`` rules; the first rule whose
            trainer prefix starts a name rewrites it. A name no rule matches is an error.
        fusions: layout -> fusions applied after renaming (engine-side names).
        tied: ``(output embedding, input embedding)`` trainer names, e.g.
            ``("lm_head.weight", "model.embed_tokens.weight")``: when the model ties them, the
            output embedding is fed from the input embedding if an engine asks for it.
    """

    model_type: str
    prefixes: Mapping[str, tuple[tuple[str, str], ...]]
    fusions: Mapping[str, tuple[Fusion, ...]] = attrs.field(factory=dict)
    tied: tuple[str, str] | None = None

    def rename(self, name: str, layout: str) -> str:
        """Trainer name -> engine name in ``layout`` (before fusion)."""
        if layout == "hf":
            return name
        rules = self.prefixes.get(layout)
        if rules is None:
            raise NameMapError(
                f"the '{self.model_type}' name map has no '{layout}' layout; it has "
                f"{sorted(['hf', *self.prefixes])}. Add prefix rules for it in its FamilyNameMap"
            )
        for old, new in rules:
            if name.startswith(old):
                return new + name[len(old):]
        raise NameMapError(
            f"parameter '{name}' matches no '{layout}' prefix rule of the '{self.model_type}' name map "
            f"(rules: {[old for old, _ in rules]}); add a rule for it to that family's FamilyNameMap"
        )


@attrs.frozen
class TargetSpec:
    """One engine tensor: its name and the trainer tensors (one, or several concatenated on dim 0)."""

    name: str
    sources: tuple[str, ...]


_FAMILIES: dict[str, FamilyNameMap] = {}


def register_family(family: FamilyNameMap, *, replace: bool = False) -> FamilyNameMap:
    """Register ``family`` under its ``model_type`` (``replace=True`` to override an existing one)."""
    if family.model_type in _FAMILIES and not replace:
        raise NameMapError(
            f"a name map for '{family.model_type}' is already registered; pass replace=True to override it"
        )
    _FAMILIES[family.model_type] = family
    return family


def known_families() -> list[str]:
    """The registered ``model_type`` names."""
    _load_builtin_families()
    return sorted(_FAMILIES)


def get_family(model_type: str) -> FamilyNameMap:
    """The name map of a HF ``config.model_type``.

    Raises:
        UnknownFamilyError: listing the known families and how to add one.
    """
    _load_builtin_families()
    try:
        return _FAMILIES[model_type]
    except KeyError:
        raise UnknownFamilyError(
            f"no weight-sync name map for model family '{model_type}'; known families: {sorted(_FAMILIES)}. "
            "Use layout='hf' when the engine runs the same HF class, or add a FamilyNameMap "
            "(cosmos_primitives/models/<model_type>.py, or cp.models.register_family(...) from your script)"
        ) from None


def family_of(model: object) -> str:
    """``model.config.model_type`` of a HF model (also after ``fully_shard``)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not model_type:
        raise UnknownFamilyError(
            f"cannot tell the model family of {type(model).__name__}: it has no config.model_type; "
            "pass family='<model_type>' explicitly, or use layout='hf'"
        )
    return str(model_type)


def resolve_family(model: object, family: str | None, layout: str) -> FamilyNameMap | None:
    """The name map a sync of ``model`` in ``layout`` uses: ``family`` (a ``model_type``) or the
    model's own. The identity layout ``"hf"`` needs none (the map is then only used, when known,
    to feed a tied output embedding that the engine holds separately)."""
    if layout == "hf":
        try:
            return get_family(family or family_of(model))
        except UnknownFamilyError:
            return None
    return get_family(family or family_of(model))


def map_names(source_names: Sequence[str], layout: str, family: FamilyNameMap | None = None, *,
              tied: bool = False, want: Iterable[str] | None = None) -> list[TargetSpec]:
    """Engine tensors for the trainer tensors ``source_names`` in ``layout``, in trainer order.

    Args:
        source_names: trainer names (``named_parameters()`` order, tied duplicates removed).
        layout: one of :data:`LAYOUTS`.
        family: the family table; not needed for ``"hf"``.
        tied: the model ties its output embedding to its input embedding.
        want: the engine's parameter names when known; a tied output embedding the engine holds
            separately (e.g. an untied engine copy) is then fed from the input embedding.

    Raises:
        NameMapError: unknown layout, an unmatched name, an incomplete fusion group, or two trainer
            tensors mapping to one engine name.
    """
    if layout not in LAYOUTS:
        raise NameMapError(f"unknown weight layout '{layout}'; choose one of {list(LAYOUTS)}")
    if layout != "hf" and family is None:
        raise NameMapError(f"layout '{layout}' needs the model family's name map; pass family=")
    renamed = [(family.rename(n, layout) if family else n, n) for n in source_names]
    if tied and family is not None and family.tied is not None:
        out_name, in_name = family.tied
        out_target = family.rename(out_name, layout)
        if out_name not in source_names and in_name in source_names and want is not None and out_target in set(want):
            renamed.append((out_target, in_name))
    fusions = family.fusions.get(layout, ()) if family else ()
    specs: list[TargetSpec] = []
    groups: dict[str, dict[str, str]] = {}  # fused engine name -> part -> trainer name
    group_fusion: dict[str, Fusion] = {}
    for engine_name, source in renamed:
        match = _fusion_of(engine_name, fusions)
        if match is None:
            specs.append(TargetSpec(engine_name, (source,)))
            continue
        fused_name, fusion, part = match
        if fused_name not in groups:
            groups[fused_name] = {}
            group_fusion[fused_name] = fusion
            specs.append(TargetSpec(fused_name, ()))  # placeholder keeps trainer order
        if part in groups[fused_name]:
            raise NameMapError(f"trainer tensors '{groups[fused_name][part]}' and '{source}' are both the "
                               f"'{part}' part of fused engine tensor '{fused_name}'")
        groups[fused_name][part] = source
    out: list[TargetSpec] = []
    seen: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        if not spec.sources:
            fusion, members = group_fusion[spec.name], groups[spec.name]
            missing = [p for p in fusion.parts if p not in members]
            if missing:
                raise NameMapError(
                    f"fused engine tensor '{spec.name}' needs {list(fusion.parts)} but the trainer has no "
                    f"{missing} for it (found {sorted(members.values())})"
                )
            spec = TargetSpec(spec.name, tuple(members[p] for p in fusion.parts))
        if spec.name in seen:
            raise NameMapError(
                f"trainer tensors {list(seen[spec.name])} and {list(spec.sources)} both map to engine "
                f"tensor '{spec.name}' in layout '{layout}'; fix the family's prefix rules"
            )
        seen[spec.name] = spec.sources
        out.append(spec)
    return out


def _fusion_of(engine_name: str, fusions: Sequence[Fusion]) -> tuple[str, Fusion, str] | None:
    """``(fused engine name, fusion, part)`` when ``engine_name`` is a part of a fusion."""
    module, _, leaf = engine_name.rpartition(".")
    for fusion in fusions:
        for part in fusion.parts:
            if module == part or module.endswith("." + part):
                stem = module[: len(module) - len(part)]
                return f"{stem}{fusion.fused}.{leaf}", fusion, part
    return None


_BUILTINS_LOADED = False


def _load_builtin_families() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import cosmos_primitives.models.families  # noqa: F401  (registers on import)
