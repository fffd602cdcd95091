"""Reward functions hosted by the reference server: loading user callables and running one safely.

A reward function is a plain callable::

    fn(media, *, media_type, prompts, video_infos) -> [B] scores | {score key: [B] scores}

``media`` is the array as enqueued (see :mod:`cosmos_primitives.rewards.remote_protocol` for the
layouts), ``prompts`` the B prompts, ``video_infos`` the list sent by the client (may be empty).
Accept ``**kwargs`` to ignore what you do not need. A bare array / list becomes the score key named
after the reward.
"""

from __future__ import annotations

import importlib
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from cosmos_primitives.rewards.remote_protocol import FAILED_SCORE

log = logging.getLogger(__name__)

RewardFn = Callable[..., Any]

# errors kept in one reply; the rest are counted
_MAX_ERRORS = 8


def load_reward_spec(spec: str) -> tuple[str, RewardFn]:
    """``"module:function"`` or ``"name=module:function"`` -> ``(name, callable)``.

    The name defaults to the function's name. Raises ``ValueError`` naming the spec when the module
    cannot be imported or has no such callable.
    """
    name, _, target = spec.rpartition("=")
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward {spec!r}: write module:function or name=module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {module_name} has no callable {attr!r}")
    return name or attr.split(".")[-1], fn


def _as_scores(out: Any, name: str, batch_size: int) -> dict[str, np.ndarray]:
    items = out.items() if isinstance(out, dict) else [(name, out)]
    scores: dict[str, np.ndarray] = {}
    for key, values in items:
        arr = np.asarray(values, dtype=np.float64).reshape(-1) if np.ndim(values) else None
        if arr is None or arr.shape != (batch_size,):
            raise ValueError(
                f"reward {name!r} returned {np.shape(values)} for key {key!r}; expected one score per item "
                f"[{batch_size}]"
            )
        scores[str(key)] = arr
    if not scores:
        raise ValueError(f"reward {name!r} returned no scores")
    return scores


def _call(fn: RewardFn, name: str, media: np.ndarray, media_type: str, prompts: list[str],
          video_infos: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    out = fn(media, media_type=media_type, prompts=prompts, video_infos=video_infos)
    return _as_scores(out, name, media.shape[0])


def run_reward(fn: RewardFn, name: str, media: np.ndarray, media_type: str, prompts: list[str],
               video_infos: list[dict[str, Any]]) -> tuple[dict[str, list[float]], list[str], float]:
    """Score one batch with ``fn``; failed items get -1.0 instead of failing the batch.

    When the batch call raises (or returns the wrong shape) each item is retried alone; items that
    still fail, and non-finite scores, become ``FAILED_SCORE`` (-1.0) in every score key.

    Returns:
        ``(scores, errors, seconds)``: {key: B floats}, messages naming the failed items, time spent.
    """
    start = time.perf_counter()
    batch = media.shape[0]
    errors: list[str] = []
    try:
        scores = _call(fn, name, media, media_type, prompts, video_infos)
    except Exception as exc:
        log.warning("reward %r failed on a batch of %d (%s); scoring items one by one", name, batch, exc)
        per_item: list[dict[str, np.ndarray] | None] = []
        for i in range(batch):
            infos = video_infos[i : i + 1] if len(video_infos) == batch else video_infos
            try:
                per_item.append(_call(fn, name, media[i : i + 1], media_type, prompts[i : i + 1], infos))
            except Exception as item_exc:
                per_item.append(None)
                if len(errors) < _MAX_ERRORS:
                    errors.append(f"item {i}: {type(item_exc).__name__}: {item_exc}")
                log.debug("reward %r item %d:\n%s", name, i, traceback.format_exc())
        keys = sorted({k for s in per_item if s is not None for k in s}) or [name]
        scores = {
            k: np.array([s[k][0] if s is not None and k in s else FAILED_SCORE for s in per_item]) for k in keys
        }
        failed = sum(s is None for s in per_item)
        if failed > len(errors):
            errors.append(f"... {failed - len(errors)} more failed item(s)")
    out: dict[str, list[float]] = {}
    for key, values in scores.items():
        bad = ~np.isfinite(values)
        if bad.any():
            errors.append(f"key {key!r}: non-finite score at items {np.flatnonzero(bad).tolist()[:_MAX_ERRORS]}")
        out[key] = np.where(bad, FAILED_SCORE, values).tolist()
    return out, errors, time.perf_counter() - start
