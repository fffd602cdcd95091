"""Choose which parameters train: regex freeze / trainable patterns over parameter names."""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs
import torch


@attrs.frozen
class TrainableSummary:
    """What :func:`apply_trainable_patterns` left trainable (counts are numbers of elements)."""

    trainable_params: int
    frozen_params: int
    trainable_tensors: int
    frozen_tensors: int

    @property
    def total_params(self) -> int:
        return self.trainable_params + self.frozen_params

    def __str__(self) -> str:
        share = 100.0 * self.trainable_params / max(self.total_params, 1)
        return (f"trainable params: {self.trainable_params:,} of {self.total_params:,} ({share:.2f}%), "
                f"{self.trainable_tensors} tensors trainable, {self.frozen_tensors} frozen")


def _compile(patterns: Sequence[str], key: str) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"[policy] {key}: invalid regular expression '{pattern}': {exc}") from None
    return compiled


def apply_trainable_patterns(
    model: torch.nn.Module,
    freeze_patterns: Sequence[str] = (),
    trainable_patterns: Sequence[str] = (),
) -> TrainableSummary:
    """Set ``requires_grad`` from regexes searched (``re.search``) in parameter names.

    Order: with ``trainable_patterns`` only matching parameters train, otherwise all do; then
    ``freeze_patterns`` freeze what they match (freezing wins). Names are the model's own
    ``named_parameters()`` names, e.g. ``^model\\.visual\\.`` is Qwen2.5-VL's vision tower.
    Tied parameters (``lm_head.weight`` = ``embed_tokens.weight``) are one tensor: it trains if any
    of its names says so and is not frozen by any.

    Raises:
        ValueError: a pattern is not a valid regex or matches no parameter (almost always a typo);
            the message lists a few parameter names.
    """
    freeze = _compile(freeze_patterns, "freeze_patterns")
    train = _compile(trainable_patterns, "trainable_patterns")
    names_by_param: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
        params[id(param)] = param
    all_names = [n for names in names_by_param.values() for n in names]
    for key, compiled in (("freeze_patterns", freeze), ("trainable_patterns", train)):
        for pattern in compiled:
            if not any(pattern.search(n) for n in all_names):
                examples = ", ".join(all_names[:3] + all_names[-2:])
                raise ValueError(
                    f"[policy] {key}: pattern '{pattern.pattern}' matches no parameter of "
                    f"{type(model).__name__} (names look like: {examples})"
                )
    summary = {"trainable_params": 0, "frozen_params": 0, "trainable_tensors": 0, "frozen_tensors": 0}
    for pid, names in names_by_param.items():
        trainable = not train or any(p.search(n) for p in train for n in names)
        if any(p.search(n) for p in freeze for n in names):
            trainable = False
        params[pid].requires_grad_(trainable)
        kind = "trainable" if trainable else "frozen"
        summary[f"{kind}_params"] += params[pid].numel()
        summary[f"{kind}_tensors"] += 1
    return TrainableSummary(**summary)


def trainable_summary(model: torch.nn.Module) -> TrainableSummary:
    """Counts of the current ``requires_grad`` flags (sharded parameters count in full)."""
    summary = {"trainable_params": 0, "frozen_params": 0, "trainable_tensors": 0, "frozen_tensors": 0}
    for param in model.parameters():
        kind = "trainable" if param.requires_grad else "frozen"
        summary[f"{kind}_params"] += param.numel()
        summary[f"{kind}_tensors"] += 1
    return TrainableSummary(**summary)
