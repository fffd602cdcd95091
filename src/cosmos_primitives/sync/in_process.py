"""In-process weight sync for the colocated case: trainer and rollout engine in one process.

Each engine tensor is either SHARED (it aliases the trainer's storage: same dtype, device and
shape, not sharded; later syncs only re-check ``data_ptr`` and bump the version) or COPIED (a dtype
cast, an FSDP2 ``DTensor`` gathered with ``full_tensor()``, a fused ``qkv_proj`` / ``gate_up_proj``):
into the module's own tensor for a module target, or, for a ``RolloutEngine`` target, into a tensor
made when the engine draws it from the iterator handed to ``update_weights`` (no copy of the model
is kept between syncs). The plan (name, shape, dtype, mode per tensor) is built once in
the constructor. The first sync is checked: every engine tensor must equal, bit for bit, the
trainer's value after the same cast.

With shared storage the engine sees each optimizer step as soon as it happens; ``sync`` is still
what moves the version tag that rollouts carry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import attrs
import torch
from torch import nn

from cosmos_primitives.models.name_maps import NameMapError, TargetSpec, map_names, resolve_family
from cosmos_primitives.parallel.param_names import clean_name
from cosmos_primitives.sync.checks import WeightMismatchError, bitwise_equal, describe_difference
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.sources import (
    full_tensor,
    fused_shape,
    is_sharded,
    local_device,
    named_sources,
    ties_embeddings,
)


@attrs.frozen
class PlanEntry:
    """How one engine tensor is fed.

    Attributes:
        target: engine name.
        sources: trainer names (several: concatenated along dim 0 into a fused tensor).
        shape: engine shape.
        dtype: engine dtype (for an engine target: the dtype handed to ``update_weights``).
        mode: ``"share"`` (aliases the trainer tensor) or ``"copy"``.
    """

    target: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    mode: Literal["share", "copy"]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


class InProcessSync:
    """Feeds the trainer's current weights to a rollout engine living in the same process.

    Args:
        source: the trainer's model (plain, or FSDP2-sharded: then every rank of its mesh must call
            :meth:`sync` together, since gathering is a collective).
        target: the engine's ``nn.Module`` (its parameters are written / aliased), or a
            ``RolloutEngine`` (``update_weights(named_tensors, version)`` is called with tensors in
            the engine's names; they are valid only during the call).
        layout: engine names: ``"hf"`` (identity), ``"hf_checkpoint"`` or ``"vllm"``
            (see :mod:`cosmos_primitives.models.name_maps`).
        family: HF ``model_type`` of the name map; default: ``source.config.model_type``.
        share: alias storage where possible (``False``: always copy).
        dtype: for a ``RolloutEngine`` target, the dtype of the tensors handed over (default: the
            trainer's); module targets keep their own parameter dtypes.
        verify_first: check the first sync bit for bit.
        read_back: ``name -> tensor`` reading an engine tensor back for that check; default: the
            module's parameters, or ``engine.model``'s for a ``RolloutEngine`` that has one.
        engine: the engine whose ``weight_version`` is set after each sync when ``target`` is its model.
        strict: a module target must have every one of its parameters fed.

    Raises:
        NameMapError: an engine name or shape that does not fit (names the tensor).
        UnknownFamilyError: a layout that needs a family map for an unregistered family.
    """

    def __init__(self, source: nn.Module, target: Any, *, layout: str = "hf", family: str | None = None,
                 share: bool = True, dtype: torch.dtype | None = None, verify_first: bool = True,
                 read_back: Callable[[str], torch.Tensor] | None = None, engine: Any = None,
                 strict: bool = True) -> None:
        self._sources = named_sources(source)
        self._module = target if isinstance(target, nn.Module) else None
        if self._module is None and not callable(getattr(target, "update_weights", None)):
            raise TypeError(f"target must be an nn.Module or a RolloutEngine with update_weights(); "
                            f"got {type(target).__name__}")
        self._engine = engine if self._module is not None else target
        self.weight_version: int | None = None
        self._verify_pending = verify_first
        family_map = resolve_family(source, family, layout)
        engine_params = _named_params(self._module) if self._module is not None else None
        specs = map_names(list(self._sources), layout, family_map, tied=ties_embeddings(source),
                          want=engine_params.keys() if engine_params is not None else None)
        if engine_params is not None:
            _check_coverage(specs, engine_params, layout, strict)
            self._targets = {s.name: engine_params[s.name] for s in specs}
        else:
            self._targets = {}
        self.plan: list[PlanEntry] = [self._entry(s.name, s.sources, share, dtype) for s in specs]
        self._cuda = _uses_cuda(self._targets, self._sources)
        self._read_back = read_back or self._default_read_back()
        # an engine whose tensors live elsewhere (vLLM workers) is checked by per-tensor checksums, asked
        # for under the names the engine itself holds (its ``checksum_layout``: vLLM's fused tree)
        self._checksums = getattr(self._engine, "weight_checksums", None) if self._read_back is None else None
        # a tensor-parallel engine holds shards, which no trainer tensor equals: checked by coverage instead
        self._unloaded: Callable[[], list[str]] | None = None
        if self._checksums is not None and getattr(self._engine, "checksum_layout", layout) is None:
            self._checksums, self._unloaded = None, self._engine.unloaded_weights
        self._check_specs: list[TargetSpec] = []
        self._check_dtype = dtype
        if self._checksums is not None:
            check_layout = getattr(self._engine, "checksum_layout", layout)
            check_family = family_map if check_layout == layout else resolve_family(source, family, check_layout)
            self._check_specs = map_names(list(self._sources), check_layout, check_family,
                                          tied=ties_embeddings(source))
        if verify_first and self._read_back is None and self._checksums is None and self._unloaded is None:
            raise ValueError(
                f"verify_first needs to read the engine's tensors back, but {type(target).__name__} has no "
                "'model' nn.Module nor weight_checksums(); pass read_back=lambda name: <engine tensor>, or "
                "verify_first=False"
            )

    # plan ------------------------------------------------------------------------------------

    def _entry(self, name: str, sources: tuple[str, ...], share: bool, dtype: torch.dtype | None) -> PlanEntry:
        parts = [self._sources[s] for s in sources]
        shape = fused_shape(name, sources, parts)
        if self._module is not None:
            dst = self._targets[name]
            if tuple(dst.shape) != shape:
                raise NameMapError(
                    f"engine tensor '{name}' has shape {tuple(dst.shape)} but the trainer's "
                    f"{list(sources)} give {shape}; the engine is a different model size or layout"
                )
            src = parts[0]
            can_share = (share and len(parts) == 1 and not is_sharded(src) and src.dtype == dst.dtype
                         and src.device == dst.device and isinstance(dst, nn.Parameter))
            return PlanEntry(name, sources, shape, dst.dtype, "share" if can_share else "copy")
        out_dtype = dtype if dtype is not None and parts[0].is_floating_point() else parts[0].dtype
        can_share = share and len(parts) == 1 and not is_sharded(parts[0]) and out_dtype == parts[0].dtype
        return PlanEntry(name, sources, shape, out_dtype, "share" if can_share else "copy")

    def describe(self) -> list[dict[str, Any]]:
        """The plan as rows ``{"name", "sources", "shape", "dtype", "mode"}`` (for logs)."""
        return [{"name": e.target, "sources": list(e.sources), "shape": list(e.shape), "dtype": str(e.dtype),
                 "mode": e.mode} for e in self.plan]

    # sync ------------------------------------------------------------------------------------

    def sync(self, version: int) -> SyncResult:
        """Make the engine see the trainer's current weights and tag them ``version``.

        Returns:
            :class:`SyncResult`; ``seconds`` covers the transfer, not the first-sync check.

        Raises:
            WeightMismatchError: the first-sync check found an engine tensor that differs
                (names it and the first differing element).
        """
        start = time.perf_counter()
        with torch.no_grad():
            if self._module is not None:
                moved = self._sync_module()
            else:
                moved = self._sync_engine(version)
        if self._cuda:
            torch.cuda.synchronize()  # time the copies, not their launch
        seconds = time.perf_counter() - start
        verified = False
        if self._verify_pending:
            self.verify()
            self._verify_pending = False
            verified = True
        self.weight_version = version
        if self._module is not None and self._engine is not None:
            self._engine.weight_version = version
        shared = sum(e.mode == "share" for e in self.plan)
        return SyncResult(version=version, seconds=seconds, bytes_moved=moved, num_shared=shared,
                          num_copied=len(self.plan) - shared, verified=verified)

    def _sync_module(self) -> int:
        moved = 0
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for e in self.plan:
            dst = self._targets[e.target]
            if e.mode == "share":
                src = self._sources[e.sources[0]]
                if dst.data_ptr() != src.data_ptr() or dst.shape != src.shape:
                    if src.shape != torch.Size(e.shape) or src.dtype != e.dtype:
                        raise NameMapError(
                            f"trainer tensor '{e.sources[0]}' changed to {tuple(src.shape)} {src.dtype} after the "
                            f"sync plan was built ({e.shape} {e.dtype}); build a new InProcessSync"
                        )
                    dst.data = src.data
                continue
            for piece_dst, piece_src in _pieces(dst.data, [full_tensor(self._sources[s]) for s in e.sources]):
                dsts.append(piece_dst)
                srcs.append(piece_src)
            moved += e.nbytes
            if any(is_sharded(self._sources[s]) for s in e.sources):
                # flush now: a gathered full tensor should not outlive its copy
                torch._foreach_copy_(dsts, srcs)
                dsts, srcs = [], []
        if dsts:
            torch._foreach_copy_(dsts, srcs)
        return moved

    def _sync_engine(self, version: int) -> int:
        self._engine.update_weights(self._engine_tensors(), version)
        return sum(e.nbytes for e in self.plan if e.mode == "copy")

    def _engine_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(engine name, tensor)`` per plan entry, each copied (gathered, cast, fused) only when the
        engine draws it: an engine that loads as it reads (vLLM's, bucket by bucket) keeps one bucket of
        copies alive, not a copy of the whole model (a 7B model's bf16 copy beside an FSDP2 trainer is
        ~15 GB on every GPU). Every rank of a sharded trainer must draw in plan order (gathers are collective)."""
        for e in self.plan:
            if e.mode == "share":
                yield e.target, full_tensor(self._sources[e.sources[0]])
            else:
                yield e.target, self._copied(e)

    def _copied(self, e: PlanEntry) -> torch.Tensor:
        fulls = [full_tensor(self._sources[s]) for s in e.sources]
        out = torch.empty(e.shape, dtype=e.dtype, device=local_device(self._sources[e.sources[0]]))
        for piece_dst, piece_src in _pieces(out, fulls):
            piece_dst.copy_(piece_src)
        return out

    # first-sync check -----------------------------------------------------------------------

    def verify(self) -> None:
        """Compare every engine tensor with the trainer's value cast the same way, bit for bit (or,
        for an engine that cannot hand its tensors back, by its ``weight_checksums``; for a
        tensor-parallel engine, whose ``checksum_layout`` is None, check that its
        ``unloaded_weights()`` is empty: every shard it holds was written).

        Raises:
            WeightMismatchError: naming the first engine tensor that differs (or was never written).
        """
        if self._unloaded is not None:
            unloaded = self._unloaded()
            if unloaded:
                raise WeightMismatchError(
                    f"weight sync check failed: {len(unloaded)} of the engine's tensors were not loaded by the sync, "
                    f"e.g. {unloaded[:3]} (the name map sends no tensor the engine's loader maps to them); fix the "
                    "family's name map, or pass verify_first=False to skip the check"
                )
            return
        if self._read_back is None:
            self._verify_checksums()
            return
        with torch.no_grad():
            for e in self.plan:
                got = self._read_back(e.target)
                expected = _expected(e, [full_tensor(self._sources[s]) for s in e.sources], got.dtype)
                if not bitwise_equal(expected, got):
                    raise WeightMismatchError(
                        f"weight sync check failed: engine tensor '{e.target}' (from trainer {list(e.sources)}, "
                        f"mode {e.mode}) differs from the trainer's value cast to {got.dtype}: "
                        f"{describe_difference(expected, got.to(expected.device))}. The engine's weight loader "
                        "or the name map is wrong for this tensor"
                    )

    def _verify_checksums(self) -> None:
        """The first-sync check through the engine's ``weight_checksums(names)`` (float64 sums).

        The names are the engine's own (its ``checksum_layout``; for vLLM the fused ``qkv_proj`` /
        ``gate_up_proj`` under ``language_model.model.*``), so every tensor it holds is compared: a
        fused tensor's sum against the sum of its parts. Every name must be answered.
        """
        assert self._checksums is not None
        names = [spec.name for spec in self._check_specs]
        got = self._checksums(names)
        missing = [n for n in names if n not in got]
        if missing:
            raise WeightMismatchError(
                f"weight sync check failed: the engine reported no checksum for {len(missing)} of the {len(names)} "
                f"tensors it should hold, e.g. {missing[:3]} (its parameter names differ from the name map's "
                "layout for it); fix the family's name map, or pass verify_first=False to skip the check"
            )
        with torch.no_grad():
            for spec in self._check_specs:
                expected = 0.0
                for source in spec.sources:
                    value = full_tensor(self._sources[source])
                    if self._check_dtype is not None and value.is_floating_point():
                        value = value.to(self._check_dtype)
                    expected += float(value.double().sum())
                if not math.isclose(expected, float(got[spec.name]), rel_tol=1e-7, abs_tol=1e-6):
                    raise WeightMismatchError(
                        f"weight sync check failed: engine tensor '{spec.name}' (from trainer {list(spec.sources)}) "
                        f"sums to {got[spec.name]!r}, the trainer's value to {expected!r}. The engine's weight "
                        "loader or the name map is wrong for this tensor"
                    )

    def _default_read_back(self) -> Callable[[str], torch.Tensor] | None:
        if self._module is not None:
            return lambda name: self._targets[name]
        model = getattr(self._engine, "model", None)
        if not isinstance(model, nn.Module):
            return None
        params = _named_params(model)
        missing = [e.target for e in self.plan if e.target not in params]
        if missing:
            return None
        return lambda name: params[name]


def _named_params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {clean_name(n): p for n, p in module.named_parameters()}


def _check_coverage(specs: list[Any], engine_params: dict[str, torch.Tensor], layout: str, strict: bool) -> None:
    names = {s.name for s in specs}
    unknown = [s.name for s in specs if s.name not in engine_params]
    if unknown:
        raise NameMapError(
            f"{len(unknown)} mapped tensors are not parameters of the engine model, e.g. {unknown[:3]}; "
            f"the engine has e.g. {list(engine_params)[:3]}. Pick the layout the engine uses (now '{layout}')"
        )
    unfed = [n for n in engine_params if n not in names]
    if unfed and strict:
        raise NameMapError(
            f"{len(unfed)} engine parameters would get no trainer value, e.g. {unfed[:3]}; the trainer and "
            "engine are different models, or pass strict=False to leave them as they are"
        )


def _pieces(dst: torch.Tensor, parts: list[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(destination slice, source) pairs: a fused destination is cut along dim 0."""
    if len(parts) == 1:
        yield dst, parts[0]
        return
    offset = 0
    for part in parts:
        yield dst.narrow(0, offset, part.shape[0]), part
        offset += part.shape[0]


def _expected(entry: PlanEntry, fulls: list[torch.Tensor], read_dtype: torch.dtype) -> torch.Tensor:
    cast = [f.to(entry.dtype).to(read_dtype) for f in fulls]
    return cast[0] if len(cast) == 1 else torch.cat(cast, dim=0)


def _uses_cuda(targets: dict[str, torch.Tensor], sources: dict[str, torch.Tensor]) -> bool:
    return any(t.is_cuda for t in targets.values()) or any(local_device(s).type == "cuda" for s in sources.values())
