"""Prompt ranges claimed by rollout jobs through Redis, so that independent jobs share one epoch order.

Range ``r`` of a run covers positions ``[p * range_size, (p + 1) * range_size)`` (the last range of
an epoch may be shorter) of epoch ``e``'s permutation of the dataset, where ``e = r //
ranges_per_epoch`` and ``p = r % ranges_per_epoch``; the permutation is the one
:class:`~cosmos_primitives.data.ResumableDistributedSampler` uses (``torch.randperm`` seeded with
``seed + e``), so every job derives the same indices from a range id and only the ids travel.

A claim lives until its job completes it (its records are on the queue), releases it, or stops
renewing it for ``claim_ttl_s``; an expired claim is handed to the next job that asks, before any
new range. The keys are described in :mod:`cosmos_primitives.queue.claim_scripts`.
"""

from __future__ import annotations

import array
import functools
import logging
import re
from collections.abc import Iterable
from typing import Any

import attrs
import redis

from cosmos_primitives.config.redis import RedisConfig
from cosmos_primitives.queue import claim_scripts
from cosmos_primitives.queue.periodic import Periodic
from cosmos_primitives.queue.redis_link import RedisLink

log = logging.getLogger("cosmos.queue")
CLAIM_KEY_SUFFIXES = ("meta", "next", "deadlines", "owners", "stats")


def claim_keys(prefix: str) -> dict[str, str]:
    """The Redis keys of the claims of the run whose stream is ``prefix``, by role."""
    return {name: f"{prefix}:claims:{name}" for name in CLAIM_KEY_SUFFIXES}


@attrs.frozen
class Claim:
    """One range of prompts held by one job.

    Attributes:
        range_id: global index over the run; ``epoch = range_id // ranges_per_epoch``.
        epoch: the epoch the range belongs to.
        indices: dataset indices, in the epoch's seeded permutation order.
        job_id: the job the claim was handed to.
        reissued: the range had been claimed before by a job that let it expire or released it.
    """

    range_id: int
    epoch: int
    indices: tuple[int, ...]
    job_id: str
    reissued: bool = False


# two epochs: the current one and the previous, whose expired claims may still be re-issued
@functools.lru_cache(maxsize=2)
def epoch_permutation(dataset_size: int, seed: int, epoch: int) -> array.array:
    """The dataset order of ``epoch``: that of ``ResumableDistributedSampler(dataset_size, seed=seed)`` on one rank
    (``[dataset_size]`` int64, 8 bytes a prompt however large the dataset)."""
    from cosmos_primitives.data.sampler import ResumableDistributedSampler

    return array.array("q", ResumableDistributedSampler(dataset_size, seed=seed).epoch_indices(epoch))


@functools.lru_cache(maxsize=2)
def _epoch_positions(dataset_size: int, seed: int, epoch: int) -> array.array:
    """``[dataset_size]``: the position of each dataset index in ``epoch``'s permutation."""
    positions = array.array("q", bytes(8 * dataset_size))
    for position, index in enumerate(epoch_permutation(dataset_size, seed, epoch)):
        positions[index] = position
    return positions


_RECORD_ID = re.compile(r"e(\d+)-i(\d+)")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stored_int(value: Any, key: str, field: str | None = None) -> int:
    """An integer read back from the run's Redis ``key`` (``field`` of a hash); anything else, which
    this library never writes there, is a ``ValueError`` naming the key."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    try:
        return int(text)
    except ValueError:
        where = f"key {key}" + (f" (field {field})" if field else "")
        raise ValueError(f"{where} holds {text[:60]!r}, not an integer: not written by cosmos_primitives (another "
                         "program, or damage). Clear the run (PromptClaims.clear / RunControl.clear_stream) or "
                         "start another run name") from None


def _flat_hash(flat: list[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


def read_position(client: Any, prefix: str) -> dict[str, Any] | None:
    """The claims position of the run under ``prefix`` read with the redis-py ``client``, None when the
    run never claimed a range. See :meth:`PromptClaims.position` for the keys."""
    keys = claim_keys(prefix)
    script = client.register_script(claim_scripts.POSITION)
    nxt, in_flight, expired, meta, stats = script(keys=[keys["meta"], keys["next"], keys["deadlines"], keys["stats"]])
    meta, stats = _flat_hash(meta), _flat_hash(stats)
    if not meta:
        return None
    dataset_size, range_size, seed = (stored_int(meta.get(f, ""), keys["meta"], f)
                                      for f in ("dataset_size", "range_size", "seed"))
    if dataset_size < 1 or range_size < 1:
        raise ValueError(f"key {keys['meta']} holds dataset_size {dataset_size} and range_size {range_size}: "
                         "not written by cosmos_primitives. Clear the run or start another run name")
    per_epoch = -(-dataset_size // range_size)
    next_range = stored_int(nxt, keys["next"]) if _text(nxt) else 0
    counts = {f: stored_int(stats.get(f, 0), keys["stats"], f)
              for f in ("completed", "late_completes", "reissued", "released", "requeued", "garbage_removed")}
    return {
        "epoch": next_range // per_epoch,
        "next_range": next_range,
        "range_in_epoch": next_range % per_epoch,
        "ranges_per_epoch": per_epoch,
        "in_flight": int(in_flight),
        "expired": int(expired),
        **counts,
        "dataset_size": dataset_size,
        "range_size": range_size,
        "seed": seed,
    }


class PromptClaims:
    """Epoch-ordered prompt ranges handed out to rollout jobs through Redis, without a controller.

    Every operation is one Lua script, so jobs on any node claim concurrently and never receive
    the same range while it is held; deadlines use the Redis server's clock. The position (next
    range, claims in flight) lives in Redis: a restarted job, or a new object, continues the epoch.

    A rollout job's loop::

        claims = cp.queue.PromptClaims(url, stream, dataset_size=len(dataset), range_size=8, seed=cfg.train.seed,
                                       max_epochs=cfg.train.epochs)
        claims.start_renewal(job_id)           # keeps this job's claims while it generates
        while (claim := claims.claim(job_id)) is not None or not claims.exhausted():
            if claim is None:                  # the last ranges are held by others; one may still expire
                time.sleep(1); continue
            records = [make_record(i, record_id=claims.record_id(claim, i)) for i in claim.indices]
            queue.put_many(records)
            claims.complete(claim)             # False: it expired and another job produced it too
        claims.release(job_id)                 # on a clean stop (SIGTERM): hand back what is held

    Args:
        redis_url: the run's Redis (empty: ``$COSMOS_REDIS_URL``).
        prefix: the run's stream name (:func:`~cosmos_primitives.config.run_stream`).
        dataset_size: prompts in the dataset (every job of the run must give the same).
        range_size: prompts per claim (same for every job).
        seed: permutation seed (same for every job).
        claim_ttl_s: a claim not renewed or completed for this long is handed to another job (seconds).
        max_epochs: :meth:`claim` returns None once this many epochs were handed out; None: no end.
        config: ``[redis]`` for the reconnect and socket settings.

    Raises:
        ValueError: bad sizes, or a run under ``prefix`` that was started with another
            ``dataset_size`` / ``range_size`` / ``seed`` (its ranges would mean other prompts).
    """

    def __init__(self, redis_url: str, prefix: str, *, dataset_size: int, range_size: int, seed: int,
                 claim_ttl_s: float = 60.0, max_epochs: int | None = None, config: RedisConfig | None = None) -> None:
        problems = []
        if dataset_size < 1:
            problems.append(f"dataset_size = {dataset_size} must be >= 1")
        if range_size < 1:
            problems.append(f"range_size = {range_size} must be >= 1")
        if not claim_ttl_s > 0:
            problems.append(f"claim_ttl_s = {claim_ttl_s} must be > 0 (seconds)")
        if max_epochs is not None and max_epochs < 1:
            problems.append(f"max_epochs = {max_epochs} must be >= 1 or None")
        if not prefix:
            problems.append("prefix is empty (use the run's stream name, cp.config.run_stream(run))")
        if problems:
            raise ValueError("invalid PromptClaims settings: " + "; ".join(problems))
        self.prefix = prefix
        self.dataset_size = int(dataset_size)
        self.range_size = int(range_size)
        self.seed = int(seed)
        self.claim_ttl_s = float(claim_ttl_s)
        self.max_epochs = max_epochs
        self.ranges_per_epoch = -(-self.dataset_size // self.range_size)
        self.keys = claim_keys(prefix)
        self._link = RedisLink(redis_url, config)
        self.safe_url = self._link.safe_url
        client = self._link.client
        self._check_script = client.register_script(claim_scripts.CHECK_META)
        self._claim_script = client.register_script(claim_scripts.CLAIM)
        self._renew_script = client.register_script(claim_scripts.RENEW)
        self._complete_script = client.register_script(claim_scripts.COMPLETE)
        self._release_script = client.register_script(claim_scripts.RELEASE)
        self._reissue_script = client.register_script(claim_scripts.REISSUE)
        self._sweep_script = client.register_script(claim_scripts.SWEEP)
        self._raise_next_script = client.register_script(claim_scripts.RAISE_NEXT)
        self._renewers: dict[str, Periodic] = {}
        self._check_reply(self._link.call("check claims settings", lambda: self._check_script(
            keys=[self.keys["meta"]], args=self._meta_args())))

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(1000 * self.claim_ttl_s))

    def _meta_args(self) -> list[int]:
        return [self.dataset_size, self.range_size, self.seed]

    def _check_reply(self, reply: list[Any]) -> list[Any]:
        if _text(reply[0]) != "mismatch":
            return reply
        stored = dict(zip(("dataset_size", "range_size", "seed"), (_text(v) for v in reply[1:])))
        mine = dict(zip(("dataset_size", "range_size", "seed"), (str(v) for v in self._meta_args())))
        diff = ", ".join(f"{k} {stored[k]} there, {mine[k]} here" for k in stored if stored[k] != mine[k])
        raise ValueError(
            f"the prompt claims under {self.keys['meta']!r} at {self.safe_url} were started with other settings "
            f"({diff}): every job of a run must use the same dataset, range size and seed. Start a fresh run "
            "(another --run name, or clear the old one: RunControl.clear_stream / PromptClaims.clear)"
        )

    def _script(self, what: str, fn: Any) -> Any:
        """``fn()``, one script call; a script that met a value or key type it never writes (the claims
        keys were written by another program) raises ``ValueError`` naming the keys, not Redis's error."""
        try:
            return self._link.call(what, fn)
        except redis.exceptions.ResponseError as exc:
            raise ValueError(f"{what}: the prompt claims keys {self.prefix}:claims:* at {self.safe_url} hold values "
                             f"not written by PromptClaims ({exc}). The trainer job repairs them "
                             "(TrainedPrompts.audit); else clear the run (PromptClaims.clear)") from None

    def _claim(self, range_id: int, job_id: str, reissued: bool) -> Claim:
        epoch, position = divmod(range_id, self.ranges_per_epoch)
        order = epoch_permutation(self.dataset_size, self.seed, epoch)
        indices = tuple(order[position * self.range_size:(position + 1) * self.range_size])
        return Claim(range_id=range_id, epoch=epoch, indices=indices, job_id=job_id, reissued=reissued)

    def claim(self, job_id: str) -> Claim | None:
        """The next range for ``job_id``: an expired or released claim first (re-issued to ``job_id``),
        else the next new range; None once ``max_epochs`` epochs were handed out and none of their
        claims is free (some may still be in flight: see :meth:`exhausted`)."""
        if not job_id:
            raise ValueError("job_id is empty; give every rollout job its own id (JobRegistry.join returns one)")
        limit = -1 if self.max_epochs is None else self.max_epochs * self.ranges_per_epoch
        keys = [self.keys[k] for k in CLAIM_KEY_SUFFIXES]
        reply = self._check_reply(self._script("claim prompts", lambda: self._claim_script(
            keys=keys, args=[*self._meta_args(), job_id, self._ttl_ms, limit])))
        kind = _text(reply[0])
        if kind == "exhausted":
            return None
        if kind == "damaged":
            raise ValueError(f"claim prompts: key {self.keys['next']} at {self.safe_url} holds "
                             f"{_text(reply[1])[:60]!r}, not a range id: not written by PromptClaims. The trainer "
                             "job repairs it (TrainedPrompts.audit); else clear the run (PromptClaims.clear)")
        return self._claim(stored_int(reply[1], self.keys["deadlines" if kind == "reissued" else "next"]), job_id,
                           reissued=kind == "reissued")

    def renew(self, job_id: str) -> int:
        """Move the deadline of every claim ``job_id`` holds to ``claim_ttl_s`` from now; returns how many."""
        return int(self._script("renew claims", lambda: self._renew_script(
            keys=[self.keys["deadlines"], self.keys["owners"]], args=[job_id, self._ttl_ms])))

    def start_renewal(self, job_id: str, interval_s: float | None = None) -> None:
        """Renew ``job_id``'s claims from a daemon thread every ``interval_s`` (default ``claim_ttl_s / 3``)
        while it generates, until :meth:`stop_renewal` or :meth:`close`; a failed renewal is logged and
        tried again next round."""
        if job_id in self._renewers:
            raise ValueError(f"the claims of job {job_id!r} are already renewed by this PromptClaims")
        self._renewers[job_id] = Periodic(f"renewal of the claims of job {job_id}",
                                          self.claim_ttl_s / 3 if interval_s is None else interval_s,
                                          lambda: self.renew(job_id))

    def stop_renewal(self, job_id: str) -> None:
        """Stop :meth:`start_renewal`'s thread for ``job_id`` (its claims then expire ``claim_ttl_s`` later)."""
        renewer = self._renewers.pop(job_id, None)
        if renewer is not None:
            renewer.stop()

    def complete(self, claim: Claim) -> bool:
        """Mark the range done (its records are on the queue). False, counted as ``late_completes``, when
        the claim had expired and was re-issued to another job (or released): the records put for it
        are then duplicates, which the queue trains once by record id (:meth:`record_id`)."""
        return bool(self._script("complete claim", lambda: self._complete_script(
            keys=[self.keys["deadlines"], self.keys["owners"], self.keys["stats"]],
            args=[claim.range_id, claim.job_id])))

    def holds(self, claim: Claim) -> bool:
        """Whether ``claim.job_id`` still holds the range (not re-issued, released or completed). A job
        may check before putting a range's records: if another job took the range over, putting
        them only adds duplicates that fill the queue until a trainer drops them."""
        owner = self._script("read claim holder", lambda: self._link.client.hget(
            self.keys["owners"], str(claim.range_id)))
        return owner is not None and _text(owner) == claim.job_id

    def release(self, job_id: str) -> int:
        """Hand back every claim ``job_id`` holds, to be re-issued before any new range (a job stopping
        cleanly); returns how many."""
        return int(self._script("release claims", lambda: self._release_script(
            keys=[self.keys["deadlines"], self.keys["owners"], self.keys["stats"]], args=[job_id])))

    def position(self) -> dict[str, Any]:
        """Where the run is: ``epoch`` (of the next new range), ``next_range`` (global id),
        ``range_in_epoch``, ``ranges_per_epoch``, ``in_flight`` (claims held or waiting for re-issue),
        ``expired`` (of those, past their deadline or released), ``completed``, ``late_completes``,
        ``reissued``, ``released``, ``requeued`` (:meth:`reissue`), ``garbage_removed`` (members of the
        re-issue list that were no range id, removed by :meth:`claim` or :meth:`in_flight`; run totals), and the run's
        ``dataset_size``, ``range_size``, ``seed``."""
        position = self._script("read claims position", lambda: read_position(self._link.client, self.prefix))
        if position is None:  # cleared since this object was made: nothing was claimed yet
            position = {"epoch": 0, "next_range": 0, "range_in_epoch": 0, "ranges_per_epoch": self.ranges_per_epoch,
                        "in_flight": 0, "expired": 0, "completed": 0, "late_completes": 0, "reissued": 0,
                        "released": 0, "requeued": 0, "garbage_removed": 0, "dataset_size": self.dataset_size,
                        "range_size": self.range_size,
                        "seed": self.seed}
        return position

    def restore(self, next_range: int) -> bool:
        """Put back a position saved in a checkpoint (``position()["next_range"]``) when Redis lost the
        run's claims (a server without persistence restarted, or a new server): the next new range
        is then ``next_range``. Ranges that were in flight when the position was saved are not
        re-issued. Does nothing when the run has a position already (it is newer than any
        checkpoint); returns whether it set it."""
        if next_range < 0:
            raise ValueError(f"next_range = {next_range} must be >= 0")
        self._check_reply(self._link.call("check claims settings", lambda: self._check_script(
            keys=[self.keys["meta"]], args=self._meta_args())))
        return bool(self._link.call("restore claims position", lambda: self._link.client.set(
            self.keys["next"], int(next_range), nx=True)))

    def exhausted(self) -> bool:
        """True once ``max_epochs`` epochs were handed out and every claim of them was completed (never
        with ``max_epochs = None``)."""
        if self.max_epochs is None:
            return False
        position = self.position()
        return position["next_range"] >= self.max_epochs * self.ranges_per_epoch and position["in_flight"] == 0

    def record_id(self, claim: Claim, index: int) -> str:
        """The record id of the group of dataset ``index`` in the claim's epoch: ``e<epoch>-i<index>``.

        A range produced twice (a job died after putting, before :meth:`complete`) yields the same
        ids, and the queue never trains one record id twice.
        """
        if index not in claim.indices:
            raise ValueError(f"dataset index {index} is not in claim {claim.range_id} (epoch {claim.epoch}, "
                             f"indices {list(claim.indices[:8])}{'...' if len(claim.indices) > 8 else ''})")
        return f"e{claim.epoch}-i{index}"

    def range_of(self, record_id: str) -> int | None:
        """The range id whose prompt gave ``record_id`` (:meth:`record_id`'s ``e<epoch>-i<index>``), None
        for an id of another form or an index outside the dataset."""
        match = _RECORD_ID.fullmatch(record_id)
        if match is None or int(match.group(2)) >= self.dataset_size:
            return None
        epoch, index = int(match.group(1)), int(match.group(2))
        position = _epoch_positions(self.dataset_size, self.seed, epoch)[index]
        return epoch * self.ranges_per_epoch + position // self.range_size

    def reissue(self, range_ids: Iterable[int]) -> int:
        """Hand ranges out again, before any new range: each one handed out before and not held now is
        re-issued by the next :meth:`claim` (its prompts generated again, with the same record ids).
        For prompts whose records were lost to the trainer (trained after the checkpoint it resumed
        from, or returned untrained); a range's prompts that were trained are skipped by the queue
        as duplicates. Returns how many ranges were added (counted as ``requeued``)."""
        ids = sorted({int(r) for r in range_ids})
        if not ids:
            return 0
        return int(self._script("reissue ranges", lambda: self._reissue_script(
            keys=[self.keys["next"], self.keys["deadlines"], self.keys["stats"]], args=ids)))

    def in_flight(self) -> set[int]:
        """The range ids in flight (held, or waiting to be re-issued), after sweeping what this library never
        writes there: members that are not range ids are removed, and a deadline further ahead than
        ``2 * claim_ttl_s`` (no renewal sets one) is set to 0 so that its range is re-issued. Each is
        logged as an error."""
        ids, removed, reset = self._script("sweep claims in flight", lambda: self._sweep_script(
            keys=[self.keys[k] for k in ("deadlines", "owners", "stats", "meta", "next")], args=[2 * self._ttl_ms]))
        if int(removed) or int(reset):
            log.error("prompt claims %s at %s: removed %d members that are not range ids and re-issued %d ranges "
                      "whose deadline lay further ahead than any renewal sets: not written by PromptClaims (someone "
                      "else writes the run's Redis)", self.keys["deadlines"], self.safe_url, int(removed), int(reset))
        return {int(_text(r)) for r in ids}

    def raise_next(self, range_id: int) -> bool:
        """Move the position forward to ``range_id`` when it is behind it or not a range id (the ranges
        before ``range_id`` were all trained); returns whether it moved."""
        return bool(self._script("raise claims position", lambda: self._raise_next_script(
            keys=[self.keys["next"]], args=[int(range_id)])))

    def reset(self, next_range: int) -> None:
        """Forget every claim and start the position at ``next_range`` with this object's settings (the
        trainer repairing claims keys that hold what this library never writes). Ranges that were in
        flight are no longer held: their holders' :meth:`holds` turns False."""
        self.clear()
        self._check_reply(self._link.call("check claims settings", lambda: self._check_script(
            keys=[self.keys["meta"]], args=self._meta_args())))
        self._link.call("set claims position", lambda: self._link.client.set(self.keys["next"], int(next_range)))

    def clear(self) -> int:
        """Forget every claim and the position (a fresh run); returns how many keys existed."""
        return int(self._link.call("clear claims", lambda: self._link.client.delete(*self.keys.values())))

    def close(self) -> None:
        """Stop the renewal threads and close the connection (held claims expire ``claim_ttl_s`` later)."""
        for job_id in list(self._renewers):
            self.stop_renewal(job_id)
        self._link.close()

    def __enter__(self) -> PromptClaims:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
