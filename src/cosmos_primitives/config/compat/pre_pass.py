"""The cosmos-rl pre-pass the core loader runs on a parsed file: which format the file is in, its
ignored / refused keys taken out, and (after the loader has moved aliases onto our keys and set the
overrides) cosmos-rl's meanings and defaults. Dict in, dict out: it warns, logs and validates
nothing; the loader says the reading's one warning and validates the result once.

Two stages around the overrides because cosmos-rl's derived values follow them: an override of
``grpo.num_samples_per_prompt`` changes the sequences per generate call that ``rollout.batch_size``
(prompts there) becomes, and a key given on the command line gets no cosmos-rl default.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cosmos_primitives.config.compat import cosmos_rl, cosmos_rl_wfm
from cosmos_primitives.config.errors import ConfigError

Reading = cosmos_rl.CosmosRLReading | cosmos_rl_wfm.WorldModelReading


@dataclass(frozen=True)
class OurKeys:
    """What only the core loader knows about this library's keys: ``is_own_key(path)`` (a key of the
    config, not an alias), ``is_alias(path)`` (a spelling moved onto one) and ``suggest(path)`` (the
    ``"; did you mean ..."`` hint for a key neither config has, or ``""``)."""

    is_own_key: Callable[[str], bool]
    is_alias: Callable[[str], bool]
    suggest: Callable[[str], str]

    def is_ours(self, path: str) -> bool:
        return self.is_alias(path) or self.is_own_key(path)


def pop_style(tree: dict[str, Any], source: str) -> cosmos_rl.Style | None:
    """Take the top-level ``config_style`` marker out of ``tree`` (None when the file has none)."""
    if cosmos_rl.STYLE_KEY not in tree:
        return None
    marker = tree.pop(cosmos_rl.STYLE_KEY)
    if marker not in typing.get_args(cosmos_rl.Style):
        raise ConfigError(f"{source}: key '{cosmos_rl.STYLE_KEY}' = {marker!r}: write \"cosmos-rl\" (read with "
                          "cosmos-rl's meanings and defaults) or \"cosmos_primitives\" (this library's), or leave it "
                          "out to have it decided from the file's keys (docs/from_cosmos_rl.md)")
    return marker


def read(tree: dict[str, Any], marker: cosmos_rl.Style | None, keys: OurKeys) -> tuple[Reading | None, str]:
    """Decide once how ``tree`` is read. A cosmos-rl world-model file (:func:`cosmos_rl_wfm.world_model_kind`)
    is translated onto our keys whole, unless its marker says it is this library's; any other file is
    read as :func:`cosmos_rl.file_style` decides, and for a cosmos-rl style file its ignored / refused
    keys are taken out (the reading says which). Returns ``(reading or None, why)``."""
    if marker != "cosmos_primitives":
        world_model = cosmos_rl_wfm.read_world_model_file(tree)
        if world_model is not None:
            return world_model, world_model.style_reason
    style, why, written_for_it = cosmos_rl.file_style(tree, keys.is_own_key, keys.is_alias, marker)
    if style != "cosmos-rl":
        return None, why
    reading = cosmos_rl.read_cosmos_rl(tree, keys.is_ours, keys.suggest if written_for_it else None)
    reading.style_reason = why
    return reading, why


def finish(tree: dict[str, Any], reading: Reading | None, explicit: set[str]) -> None:
    """cosmos-rl's meanings and defaults for the keys neither the file nor ``explicit`` (canonical keys
    given on the command line) sets, and refused keys into ``[unsupported]``; ``tree`` holds our keys."""
    if isinstance(reading, cosmos_rl_wfm.WorldModelReading):
        reading.finish(tree, explicit)
        return
    if reading is None:
        return
    cosmos_rl.apply_cosmos_rl_meanings(tree, reading, explicit)
    if reading.refused:
        unsupported = tree.setdefault("unsupported", {})
        if isinstance(unsupported, dict):
            unsupported.update(reading.refused)
