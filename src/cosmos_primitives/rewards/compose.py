"""``RewardSet``: a weighted sum of named rewards over a batch, sync and async rewards alike.

Each reward is called per sample with the keyword arguments it declares among ``completion``,
``reference`` and ``row`` (all three when it takes ``**kwargs``). ``async`` rewards (and callables
returning awaitables) of the whole batch are awaited concurrently; sync ones run inline.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cosmos_primitives.rewards.registry import get_reward, reward_metric_names
from cosmos_primitives.utils.async_bridge import run_sync

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from cosmos_primitives.config.grpo import GRPOConfig

log = logging.getLogger(__name__)

REWARD_ARGUMENTS = ("completion", "reference", "row")


class RewardError(RuntimeError):
    """A reward raised or returned something unusable; the message names the reward and the sample."""


@dataclass
class SampleReward:
    """One sample's rewards.

    Attributes:
        total: ``sum(weight * value)`` over the set's rewards.
        values: each reward's unweighted value.
        metrics: metrics the rewards returned, keyed ``"<reward>/<metric>"`` (the reward's
            :func:`~cosmos_primitives.rewards.reward_metric_names` name).
        failed: rewards that raised and were replaced by the fallback score.
    """

    total: float
    values: dict[str, float]
    metrics: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


@dataclass
class RewardBatch:
    """The rewards of a batch: per sample, and batch means in ``metrics``.

    ``metrics`` holds ``reward/total`` (mean), ``reward/total_std`` (population std),
    ``reward/<name>`` (mean of each reward; ``<name>`` is its ``reward_metric_names`` name, the
    function's name for an import path), ``reward/<name>/<metric>`` (means over the samples that
    reported it) and ``reward/<name>/failures`` (count, for each reward that fell back at least once).
    """

    samples: list[SampleReward]
    metrics: dict[str, float]

    @property
    def totals(self) -> list[float]:
        return [s.total for s in self.samples]

    def values(self, name: str) -> list[float]:
        """The unweighted values of reward ``name``, one per sample."""
        return [s.values[name] for s in self.samples]

    def total_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Totals as a [N] float32 tensor (the rewards ``cp.algo.compute_advantages`` takes)."""
        import torch

        return torch.tensor(self.totals, dtype=torch.float32, device=device)


def _call_plan(name: str, fn: Callable[..., Any]) -> tuple[str, ...]:
    """Which of completion / reference / row to pass ``fn``, checked once up front."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return REWARD_ARGUMENTS
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return REWARD_ARGUMENTS
    names = tuple(p.name for p in params if p.name in REWARD_ARGUMENTS)
    for p in params:
        if p.name not in REWARD_ARGUMENTS and p.default is inspect.Parameter.empty and p.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
        ):
            raise TypeError(
                f"reward '{name}' ({getattr(fn, '__qualname__', fn)!r}) requires argument '{p.name}'; a reward "
                f"receives only the keyword arguments {', '.join(REWARD_ARGUMENTS)} (give others defaults)"
            )
    return names


def _as_score(value: Any) -> tuple[float, dict[str, float]]:
    metrics: Mapping[str, Any] = {}
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], Mapping):
            raise TypeError(f"returned a tuple {value!r}; expected (float, dict of metrics)")
        value, metrics = value
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"returned {type(value).__name__} {value!r}; expected a float") from None
    if not math.isfinite(score):
        raise ValueError(f"returned a non-finite score {score}")
    return score, {str(k): float(v) for k, v in metrics.items()}


def _sample_label(index: int, prompt_id: Any) -> str:
    return f"sample {index}" + (f" (prompt id {prompt_id!r})" if prompt_id is not None else "")


class RewardSet:
    """A weighted sum of rewards.

    Args:
        weights: ``{reward name: weight}`` (``[grpo] reward_function``); names come from ``functions``
            first, then the registry (``cp.rewards.reward_names()``).
        functions: extra ``{name: callable}`` not in the registry (e.g. a closure over a model).
        fallback_score: used for a reward that raises (the failure is counted in the metrics and
            logged); None (default) re-raises as :class:`RewardError`.

    Example::

        rewards = RewardSet({"format": 1.0, "single_choice": 1.0})
        batch = rewards(completions, references, rows)      # or: await rewards.acompute(...)
        batch.totals, batch.metrics["reward/single_choice"]
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        functions: Mapping[str, Callable[..., Any]] | None = None,
        fallback_score: float | None = None,
    ) -> None:
        if not weights:
            raise ValueError("a RewardSet needs at least one reward ([grpo] reward_function is empty)")
        functions = dict(functions or {})
        self.weights = {name: float(w) for name, w in weights.items()}
        self.functions = {name: functions[name] if name in functions else get_reward(name) for name in self.weights}
        self._plans = {name: _call_plan(name, fn) for name, fn in self.functions.items()}
        self.metric_names = reward_metric_names(self.weights)  # config name -> name in the metric keys
        self.fallback_score = fallback_score

    @classmethod
    def from_config(
        cls, cfg: GRPOConfig, *, functions: Mapping[str, Callable[..., Any]] | None = None
    ) -> RewardSet:
        """From ``[grpo] reward_function`` and ``reward_fallback_score``."""
        return cls(cfg.reward_function, functions=functions, fallback_score=cfg.reward_fallback_score)

    def __call__(
        self,
        completions: Sequence[str],
        references: Sequence[str | None] | None = None,
        rows: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt_ids: Sequence[Any] | None = None,
    ) -> RewardBatch:
        """Score a batch from synchronous code (inside a running event loop, it runs on a helper thread)."""
        return run_sync(self.acompute(completions, references, rows, prompt_ids=prompt_ids))

    async def acompute(
        self,
        completions: Sequence[str],
        references: Sequence[str | None] | None = None,
        rows: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt_ids: Sequence[Any] | None = None,
    ) -> RewardBatch:
        """Score a batch; all async rewards of all samples are awaited concurrently.

        Args:
            completions: N completion texts.
            references: N reference answers (None entries allowed for rewards that need none).
            rows: N dataset rows, passed as ``row``.
            prompt_ids: N ids named in errors (default: the row's ``prompt_id`` or ``id`` when present).
        """
        n = len(completions)
        references = list(references) if references is not None else [None] * n
        rows = list(rows) if rows is not None else [{} for _ in range(n)]
        for what, seq in (("references", references), ("rows", rows), ("prompt_ids", prompt_ids)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{len(seq)} {what} for {n} completions; pass one per completion")
        ids = list(prompt_ids) if prompt_ids is not None else [
            row.get("prompt_id", row.get("id")) if isinstance(row, Mapping) else None for row in rows
        ]

        outcomes: dict[tuple[str, int], Any] = {}
        pending: list[tuple[tuple[str, int], Any]] = []
        for name, fn in self.functions.items():
            plan = self._plans[name]
            for i in range(n):
                available = {"completion": completions[i], "reference": references[i], "row": rows[i]}
                try:
                    result = fn(**{k: available[k] for k in plan})
                except Exception as exc:  # a reward's bug must name the sample, whatever it raised
                    outcomes[(name, i)] = exc
                    continue
                if inspect.isawaitable(result):
                    pending.append(((name, i), result))
                else:
                    outcomes[(name, i)] = result
        if pending:
            results = await asyncio.gather(*(awaitable for _, awaitable in pending), return_exceptions=True)
            outcomes.update({key: value for (key, _), value in zip(pending, results)})
        return self._assemble(outcomes, n, ids)

    def _assemble(self, outcomes: dict[tuple[str, int], Any], n: int, ids: list[Any]) -> RewardBatch:
        samples = [SampleReward(total=0.0, values={}) for _ in range(n)]
        failures: dict[str, int] = {}
        for i, sample in enumerate(samples):
            for name, weight in self.weights.items():
                outcome = outcomes[(name, i)]
                try:
                    if isinstance(outcome, BaseException):
                        raise outcome
                    score, metrics = _as_score(outcome)
                except Exception as exc:
                    message = f"reward '{name}' failed on {_sample_label(i, ids[i])}: {type(exc).__name__}: {exc}"
                    if self.fallback_score is None:
                        hint = " (set [grpo] reward_fallback_score to score such samples instead)"
                        raise RewardError(message + hint) from exc
                    if not failures:
                        log.warning("%s; using the fallback score %s", message, self.fallback_score)
                    failures[name] = failures.get(name, 0) + 1
                    sample.failed.append(name)
                    score, metrics = float(self.fallback_score), {}
                sample.values[name] = score
                sample.total += weight * score
                sample.metrics.update({f"{self.metric_names[name]}/{k}": v for k, v in metrics.items()})
        return RewardBatch(samples=samples, metrics=self._batch_metrics(samples, failures))

    def _batch_metrics(self, samples: list[SampleReward], failures: dict[str, int]) -> dict[str, float]:
        if not samples:
            return {}
        n = len(samples)
        mean_total = sum(s.total for s in samples) / n
        metrics = {
            "reward/total": mean_total,
            "reward/total_std": math.sqrt(sum((s.total - mean_total) ** 2 for s in samples) / n),
        }
        for name in self.weights:
            metrics[f"reward/{self.metric_names[name]}"] = sum(s.values[name] for s in samples) / n
        reported: dict[str, list[float]] = {}
        for s in samples:
            for key, value in s.metrics.items():
                reported.setdefault(key, []).append(value)
        metrics.update({f"reward/{key}": sum(v) / len(v) for key, v in reported.items()})
        metrics.update({f"reward/{self.metric_names[name]}/failures": float(count) for name, count in failures.items()})
        return metrics
