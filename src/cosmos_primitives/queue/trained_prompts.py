"""The trainer's own account of which prompts of each epoch it trained: the authority over the prompt claims.

The prompt claims (:class:`~cosmos_primitives.queue.PromptClaims`) are Lua state in Redis, which
cannot hold the run secret, so anyone holding the Redis URL can rewrite them: move the position
forward past prompts nobody generated, delete claims in flight, reset the epoch, add ranges or
garbage to the re-issue list. The trainer therefore keeps its own account, in its checkpoint
(never in unsigned Redis state): for each epoch not yet fully trained, one bit per prompt, set when a
record of that prompt (record id ``e<epoch>-i<index>``, fixed by epoch and prompt) was trained.

- :meth:`TrainedPrompts.is_trained` tells the trainer which delivered records it trained before
  (it acknowledges them untrained: no record id is trained twice, whatever the claims say);
- :meth:`TrainedPrompts.audit`, called once a step on one rank, compares the claims with the
  account: a range of the lowest unfinished epoch that the claims handed out, that is not in flight
  and still has an untrained prompt ``grace_steps`` audits in a row (long enough for the records a
  finished range put on the queue to be trained) is handed out again; a position behind the
  trained epochs is moved forward; claims keys holding what this library never writes are reset,
  with an error naming the key.

So an attacker who rewrites the claims can waste or stall generation, never make a prompt of an
epoch go untrained nor be trained twice.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from cosmos_primitives.queue.prompt_claims import PromptClaims, epoch_permutation

log = logging.getLogger("cosmos.queue")

_RECORD_ID = re.compile(r"e(\d+)-i(\d+)")


class TrainedPrompts:
    """Which prompts the trainer trained, epoch by epoch (one bit a prompt for each unfinished epoch).

    Args:
        dataset_size, range_size, seed: the run's claims settings (as given to ``PromptClaims``).
        first_epoch: every epoch before it counts as fully trained.
        position_behind: the claims position may still be inside an epoch before ``first_epoch`` (a run
            resumed from a checkpoint that predates this account: its last epoch is left to the
            claims); :meth:`audit` then moves no position forward until it reaches ``first_epoch``.

    Attributes:
        low: the lowest epoch with an untrained prompt; the epochs before it are fully trained.
        abandoned: prompts given up by :meth:`audit` (never trained, each named in an error log).
        last_given_up: the record ids the last :meth:`audit` gave up (apply them on the other ranks
            with :meth:`give_up`).
    """

    def __init__(self, *, dataset_size: int, range_size: int, seed: int, first_epoch: int = 0,
                 position_behind: bool = False) -> None:
        if dataset_size < 1 or range_size < 1 or first_epoch < 0:
            raise ValueError(f"TrainedPrompts: dataset_size = {dataset_size} and range_size = {range_size} must be "
                             f">= 1, first_epoch = {first_epoch} >= 0")
        self.dataset_size = int(dataset_size)
        self.range_size = int(range_size)
        self.seed = int(seed)
        self.ranges_per_epoch = -(-self.dataset_size // self.range_size)
        self.low = int(first_epoch)
        self._bits: dict[int, bytearray] = {}  # epoch -> [ceil(dataset_size / 8)] bits, for epochs >= low
        self._counts: dict[int, int] = {}
        self._missing_since: dict[int, int] = {}  # range id -> audit that first found it missing
        self._audits = 0
        self._position_behind = position_behind
        self._reissued: dict[int, int] = {}  # range id -> times audit re-issued it
        self.abandoned = 0
        self.last_given_up: list[str] = []

    def _parse(self, record_id: str) -> tuple[int, int] | None:
        match = _RECORD_ID.fullmatch(record_id)
        if match is None or int(match.group(2)) >= self.dataset_size:
            return None
        return int(match.group(1)), int(match.group(2))

    def is_trained(self, record_id: str) -> bool:
        """Whether the prompt of ``record_id`` (``e<epoch>-i<index>``) was trained in that epoch; False
        for ids of another form (not made from claims)."""
        parsed = self._parse(record_id)
        if parsed is None:
            return False
        epoch, index = parsed
        if epoch < self.low:
            return True
        bits = self._bits.get(epoch)
        return bits is not None and bool(bits[index >> 3] & (1 << (index & 7)))

    def mark(self, record_ids: Iterable[str]) -> None:
        """Count ``record_ids`` as trained (every rank, with the ids every rank trained this step)."""
        for record_id in record_ids:
            parsed = self._parse(record_id)
            if parsed is None or parsed[0] < self.low:
                continue
            epoch, index = parsed
            bits = self._bits.setdefault(epoch, bytearray(-(-self.dataset_size // 8)))
            if not bits[index >> 3] & (1 << (index & 7)):
                bits[index >> 3] |= 1 << (index & 7)
                self._counts[epoch] = self._counts.get(epoch, 0) + 1
        while self._counts.get(self.low, 0) == self.dataset_size:
            del self._bits[self.low], self._counts[self.low]
            self.low += 1
            self._missing_since.clear()
            self._reissued.clear()

    def untrained_ranges(self, epoch: int) -> list[int]:
        """Global ids of the ranges of ``epoch`` with at least one untrained prompt."""
        if epoch < self.low:
            return []
        bits = self._bits.get(epoch)
        if bits is None:
            return [epoch * self.ranges_per_epoch + p for p in range(self.ranges_per_epoch)]
        order = epoch_permutation(self.dataset_size, self.seed, epoch)
        ranges = []
        for p in range(self.ranges_per_epoch):
            if any(not bits[i >> 3] & (1 << (i & 7)) for i in order[p * self.range_size:(p + 1) * self.range_size]):
                ranges.append(epoch * self.ranges_per_epoch + p)
        return ranges

    def _untrained_ids(self, range_ids: Iterable[int]) -> list[str]:
        """The record ids of the untrained prompts of ``range_ids``."""
        ids = []
        for range_id in range_ids:
            epoch, position = divmod(range_id, self.ranges_per_epoch)
            order = epoch_permutation(self.dataset_size, self.seed, epoch)
            ids += [f"e{epoch}-i{i}" for i in order[position * self.range_size:(position + 1) * self.range_size]
                    if not self.is_trained(f"e{epoch}-i{i}")]
        return ids

    def _give_up(self, range_id: int) -> list[str]:
        """Count the untrained prompts of ``range_id`` as settled (untrained); returns their record ids."""
        ids = self._untrained_ids([range_id])
        self.give_up(ids)
        self.last_given_up += ids
        return ids

    def give_up(self, record_ids: list[str]) -> None:
        """Count ``record_ids`` as settled without training (counted in :attr:`abandoned`): what
        :meth:`audit` gave up on one rank (:attr:`last_given_up`), applied on the other ranks so that
        every rank keeps the same account."""
        self.abandoned += sum(1 for r in record_ids if not self.is_trained(r))
        self.mark(record_ids)

    def audit(self, claims: PromptClaims, grace_steps: int, max_reissues: int = 3,
              untrain: Callable[[list[str]], int] | None = None) -> list[int]:
        """Check the claims against this account and repair them; call it once a step on one rank.

        A range of epoch :attr:`low` that the claims handed out (below their position), that is not in
        flight and has an untrained prompt for ``grace_steps`` audits in a row is re-issued (its records
        were lost: a claim deleted or marked done, the position moved past it). Choose ``grace_steps``
        at least the steps the trainer needs to take everything the queue may hold (``max_pending /
        records_per_step``, plus one): a finished range's records may wait that long. A position
        behind epoch :attr:`low` is moved forward to it; claims keys that hold what the library never
        writes (or settings other than this account's) are reset to epoch :attr:`low`, with an error.

        A range re-issued ``max_reissues`` times that still has untrained prompts (prompts the rollout
        side skips as bad samples, records dead-lettered every time, or a writer that keeps defeating
        it) is given up: its untrained prompts count as settled so that the epoch can end, counted in
        :attr:`abandoned` and named in an error.

        ``untrain`` (the queue's :meth:`~cosmos_primitives.queue.RedisRolloutQueue.untrain`) is given
        the untrained prompts' record ids of every range re-issued: an id the queue marks trained
        (``S:done``, unsigned) although this account never trained it would make the queue drop its
        records again, so it is un-marked first.

        Returns:
            the range ids re-issued by this call.
        """
        if claims.dataset_size != self.dataset_size or claims.range_size != self.range_size or \
                claims.seed != self.seed:
            raise ValueError(f"TrainedPrompts (dataset_size {self.dataset_size}, range_size {self.range_size}, seed "
                             f"{self.seed}) audits PromptClaims made with other settings ({claims.dataset_size}, "
                             f"{claims.range_size}, {claims.seed}): give both the run's settings")
        self._audits += 1
        self.last_given_up = []
        start = self.low * self.ranges_per_epoch
        try:
            position = claims.position()
            stored = (position["dataset_size"], position["range_size"], position["seed"])
            if stored != (self.dataset_size, self.range_size, self.seed):
                raise ValueError(f"key {claims.keys['meta']} holds dataset_size, range_size, seed {stored}, not this "
                                 f"run's {(self.dataset_size, self.range_size, self.seed)}")
            in_flight = claims.in_flight()
        except ValueError as error:
            log.error("the prompt claims of %s hold what cosmos_primitives never writes (%s): someone else writes "
                      "the run's Redis. Reset them to epoch %d (range %d); its prompts not trained yet are generated "
                      "again", claims.prefix, error, self.low, start)
            claims.reset(start)
            self._missing_since.clear()
            return []
        if position["next_range"] >= start:
            self._position_behind = False
        elif not self._position_behind and claims.raise_next(start):
            log.warning("the prompt claims position of %s was range %d, behind epoch %d that the trainer is on (its "
                        "earlier epochs are all trained): moved it to range %d", claims.prefix,
                        position["next_range"], self.low, start)
        handed_out = min(max(position["next_range"], start), start + self.ranges_per_epoch)
        missing = [r for r in self.untrained_ranges(self.low) if r < handed_out and r not in in_flight]
        self._missing_since = {r: self._missing_since.get(r, self._audits) for r in missing}
        due = [r for r, since in self._missing_since.items() if self._audits - since >= grace_steps]
        low = self.low
        for r in [r for r in due if self._reissued.get(r, 0) >= max_reissues]:
            due.remove(r)
            self._missing_since.pop(r, None)
            log.error("prompt range %d of epoch %d still has untrained prompts %s after %d re-issues (bad samples, "
                      "records dead-lettered each time, or someone rewriting the run's Redis): given up, counted as "
                      "abandoned", r, low, self._give_up(r), max_reissues)
        if self.low != low:  # the given-up prompts were the epoch's last: the next epoch is audited next step
            return []
        if due:
            if untrain is not None:
                marked = untrain(self._untrained_ids(due))
                if marked:
                    log.error("%d untrained prompts of the ranges handed out again were marked trained in the queue of "
                              "%s (S:done): someone else writes the run's Redis. Un-marked, so that their records are "
                              "trained", marked, claims.prefix)
            requeued = claims.reissue(due)
            for r in due:
                self._missing_since[r] = self._audits
                self._reissued[r] = self._reissued.get(r, 0) + 1
            log.warning("prompt ranges %s%s of epoch %d were handed out, are not in flight and still have untrained "
                        "prompts after %d steps (their claims were lost or altered): %d handed out again",
                        due[:8], "..." if len(due) > 8 else "", self.low, grace_steps, requeued)
        return due

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint's ``extra`` (the same on every rank)."""
        return {"low": self.low, "settings": [self.dataset_size, self.range_size, self.seed],
                "abandoned": self.abandoned,
                "epochs": {str(e): base64.b64encode(bytes(b)).decode() for e, b in self._bits.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back :meth:`state_dict` (a resume); raises ``ValueError`` for another run's settings."""
        settings = list(state.get("settings", []))
        if settings != [self.dataset_size, self.range_size, self.seed]:
            raise ValueError(f"the checkpoint's trained prompts were counted with dataset_size, range_size, seed "
                             f"{settings}, this run has {[self.dataset_size, self.range_size, self.seed]}: resume with "
                             "the dataset and settings of the checkpoint's run")
        self.low = int(state["low"])
        self.abandoned = int(state.get("abandoned", 0))
        self._position_behind = False
        self._reissued = {}
        self._bits, self._counts, self._missing_since = {}, {}, {}
        for epoch, encoded in state.get("epochs", {}).items():
            bits = bytearray(base64.b64decode(encoded))
            if len(bits) != -(-self.dataset_size // 8):
                raise ValueError(f"the checkpoint's trained prompts of epoch {epoch} hold {len(bits)} bytes, not "
                                 f"{-(-self.dataset_size // 8)} for {self.dataset_size} prompts: a damaged checkpoint")
            self._bits[int(epoch)] = bits
            self._counts[int(epoch)] = sum(bin(b).count("1") for b in bits)
