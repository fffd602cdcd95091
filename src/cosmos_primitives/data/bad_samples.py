"""Skip, count and log bad samples; fail only past a budget, naming the worst offenders."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from cosmos_primitives.logging.console import get_logger


class BadSampleError(Exception):
    """One sample cannot be used (missing or undecodable media, too long, malformed row).

    ``path`` is the file at fault (or the dataset / row id when no file is involved).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@contextlib.contextmanager
def bad_sample_boundary(path: str, what: str = "") -> Iterator[None]:
    """The per-sample boundary: any failure inside becomes a :class:`BadSampleError` naming ``path``.

    Readers and decoders fail in many ways a loader cannot list (PIL's ``DecompressionBombError``,
    a processor's ``ValueError``, ``RuntimeError`` on a symlink loop, ``UnicodeDecodeError``, a
    ``SafetensorError``...); whatever one sample's content raises, the sample is bad, not the run.
    ``what`` prefixes the reason (e.g. ``"could not read image"``). A ``BadSampleError`` raised
    inside passes unchanged (it already names its file); ``ImportError`` (a missing package is the
    environment's fault, not the sample's) and non-``Exception`` errors (``KeyboardInterrupt``) too.
    """
    try:
        yield
    except (BadSampleError, ImportError):
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        raise BadSampleError(path, f"{what}: {detail}" if what else detail) from exc


class BadSampleBudgetExceeded(RuntimeError):
    """More bad samples than ``bad_sample_budget`` allows."""


class NoGoodSamplesError(BadSampleBudgetExceeded):
    """Every sample a loader drew in an epoch was bad: there is nothing to train on."""


class BadSampleTracker:
    """Counts bad samples by path and reason, logs each one, and raises past ``budget``.

    Args:
        budget: how many bad samples are tolerated (per process: each rank has its own tracker);
            the ``budget + 1``-th raises :class:`BadSampleBudgetExceeded`. ``-1``: unlimited.
        config_key: where the budget is set, for the error message.
        max_listed: how many offenders the error message lists.
    """

    def __init__(self, budget: int, config_key: str = "train.train_policy.dataset.bad_sample_budget",
                 max_listed: int = 10) -> None:
        self.budget = budget
        self.config_key = config_key
        self.max_listed = max_listed
        self.count = 0
        self._by_path: Counter[str] = Counter()
        self._reason: dict[str, str] = {}
        self._log = get_logger()

    def record(self, error: BadSampleError, sample: Any = None) -> None:
        """Count one bad sample (``sample``: its index or id, for the log line)."""
        self.count += 1
        self._by_path[error.path] += 1
        self._reason[error.path] = error.reason
        where = f" (sample {sample})" if sample is not None else ""
        self._log.warning(f"skipping bad sample{where}: {error.path}: {error.reason} "
                          f"[{self.count} bad so far, budget {self.budget}]")
        if self.budget >= 0 and self.count > self.budget:
            raise BadSampleBudgetExceeded(self.report())

    def no_good_samples(self, drawn: int, epoch: int) -> NoGoodSamplesError:
        """The error for an epoch in which all ``drawn`` samples were bad (within the budget or not)."""
        lines = [f"all {drawn} samples drawn in epoch {epoch} were bad samples: nothing to train on. Worst offenders:"]
        lines += [f"  {path} (x{k}): {reason}" for path, k, reason in self.worst(self.max_listed)]
        lines.append("Fix the data (paths, media_dir, formats) or the encoding settings these reasons name.")
        return NoGoodSamplesError("\n".join(lines))

    def worst(self, n: int | None = None) -> list[tuple[str, int, str]]:
        """``(path, times seen, last reason)``, most frequent first."""
        return [(path, k, self._reason[path]) for path, k in self._by_path.most_common(n)]

    def report(self) -> str:
        """The message raised once the budget is exceeded."""
        lines = [f"{self.count} bad samples exceed the bad-sample budget of {self.budget} "
                 f"(config key {self.config_key}). Worst offenders:"]
        lines += [f"  {path} (x{k}): {reason}" for path, k, reason in self.worst(self.max_listed)]
        if len(self._by_path) > self.max_listed:
            lines.append(f"  ... and {len(self._by_path) - self.max_listed} more files")
        lines.append("Fix or remove these files, or raise the budget if they are expected.")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "by_path": dict(self._by_path), "reason": dict(self._reason)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        self._by_path = Counter({str(k): int(v) for k, v in state["by_path"].items()})
        self._reason = {str(k): str(v) for k, v in state["reason"].items()}
