"""Keep every prompt of an epoch when the independent trainer job resumes from a checkpoint or drops records.

A trainer killed after its last checkpoint loses the steps it took since: their records were
acknowledged as trained, but the weights that learned from them are gone. A record sampled with
weights newer than the trainer's (made from those lost weights) or older than the staleness bound
cannot be trained either. Neither may silently lose its prompt. The trainer therefore

- on resume from step ``k``: takes back the training of every record acknowledged at a step after
  ``k`` (:meth:`RedisRolloutQueue.untrain`) and has the prompt ranges that gave them generated again
  (:meth:`PromptClaims.reissue`) — :func:`roll_back_to`;
- for a record it drops: returns it unconsumed (:meth:`RedisRolloutQueue.return_records`) and has its
  range generated again — :func:`regenerate`.

A re-issued range is claimed before any new range; its prompts that were trained are skipped by the
queue as duplicates (record ids are fixed by epoch and prompt, ``e<epoch>-i<index>``), so each prompt
is trained once. Ranges are re-issued before records are returned or un-trained: a crash in between
leaves a range generated twice (trained once by id), never a prompt without a range.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cosmos_primitives.queue.prompt_claims import PromptClaims
from cosmos_primitives.queue.record import RolloutRecord
from cosmos_primitives.queue.redis_queue import RedisRolloutQueue

log = logging.getLogger("cosmos.queue")


def _ranges(claims: PromptClaims, record_ids: Sequence[str]) -> tuple[set[int], list[str]]:
    ranges: set[int] = set()
    unknown: list[str] = []
    for record_id in record_ids:
        range_id = claims.range_of(record_id)
        if range_id is None:
            unknown.append(record_id)
        else:
            ranges.add(range_id)
    return ranges, unknown


def roll_back_to(queue: RedisRolloutQueue, claims: PromptClaims, step: int) -> list[str]:
    """Return the queue to the state of a checkpoint at ``step``: the records acknowledged at a later step
    (``queue.ack(step=...)``) are no longer trained, and their ranges are handed out again. Run it once
    on the resumed trainer's rank 0 before any rank takes records. Returns the record ids rolled back.
    """
    record_ids = queue.trained_after(step)
    if not record_ids:
        return []
    ranges, unknown = _ranges(claims, record_ids)
    if unknown:  # not made from claims (another producer): its producer must send it again
        log.warning("%d records trained after step %d have ids that name no prompt range (%s...); their training "
                    "was rolled back but nothing will generate them again", len(unknown), step, unknown[:3])
    requeued = claims.reissue(ranges)
    queue.untrain(record_ids)
    log.warning("rolled back %d records trained after checkpoint step %d (their training died with the weights "
                "that were not saved); %d prompt ranges handed out again", len(record_ids), step, requeued)
    return record_ids


def regenerate(queue: RedisRolloutQueue, claims: PromptClaims, records: Sequence[RolloutRecord],
               counter: str = "returned") -> int:
    """Hand delivered ``records`` back untrained and have their prompts generated again (a trainer that
    must not train them: sampled with weights newer than its own or older than the staleness bound).
    Records whose ids name no prompt range are acknowledged as dropped instead (counted, logged).
    Counted under ``counter`` in ``queue.group_counters()``. Returns how many were returned."""
    ranges, unknown = _ranges(claims, [r.record_id for r in records])
    try:
        claims.reissue(ranges)
    except ValueError as error:  # claims keys damaged by another writer: TrainedPrompts.audit re-issues them
        log.error("could not hand %d prompt ranges out again: %s", len(ranges), error)
    known = [r for r in records if r.record_id not in set(unknown)]
    if unknown:
        log.warning("dropped %d records whose ids name no prompt range (%s...): nothing can generate them again",
                    len(unknown), unknown[:3])
        queue.ack([r for r in records if r.record_id in set(unknown)], dropped=True)
    return queue.return_records(known, counter) if known else 0
