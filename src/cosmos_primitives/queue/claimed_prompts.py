"""A rollout job's side of the prompt claims: claim the next range and read its prompts, then mark it
done, carrying on (with an error log) when someone else has damaged the run's claims keys.

The claims are unsigned Lua state (docs/disaggregated.md, trust model); the trainer audits them
against its own account of the prompts it trained and resets damaged keys
(:class:`~cosmos_primitives.queue.trained_prompts.TrainedPrompts`), so a rollout job only has to
survive until then: it waits instead of crashing, and puts what it generated either way (a record
put twice is trained once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker, bad_sample_boundary
from cosmos_primitives.queue.prompt_claims import Claim, PromptClaims


def claim_prompts(claims: PromptClaims, job_id: str, dataset: Sequence[Any], bad: BadSampleTracker,
                  log: logging.Logger) -> tuple[str, Claim | None, list[Any], list[str]]:
    """Claim ``job_id``'s next range of prompts and read them from ``dataset`` (indexable).

    A row that fails to load (:class:`BadSampleError`) is recorded in ``bad`` and skipped. When the
    claim expired (and went to another job) while the rows were read, no prompts are returned.

    Returns:
        ``(action, claim, prompts, record_ids)``: ``"claim"`` with the claim, its readable prompts
        and their record ids (fixed by epoch and prompt); ``"stop"`` when every epoch is handed out;
        ``"wait"`` when the claims keys hold what the library never writes (logged: the trainer's
        next audit resets them).
    """
    try:
        claim = claims.claim(job_id)
    except ValueError as error:
        log.error(f"[rollout] {job_id}: {error}; trying again")
        return "wait", None, [], []
    if claim is None:
        return "stop", None, [], []
    prompts, ids = [], []
    for index in claim.indices:
        try:
            with bad_sample_boundary(f"sample {index}"):
                prompts.append(dataset[index])
            ids.append(claims.record_id(claim, index))
        except BadSampleError as error:
            bad.record(error, sample=index)
    try:
        held = claims.holds(claim)
    except ValueError as error:  # damaged keys: putting anyway risks only duplicates, trained once
        log.error(f"[rollout] {job_id}: {error}")
        held = True
    return ("claim", claim, prompts, ids) if held else ("claim", claim, [], [])


def finish_claim(claims: PromptClaims, claim: Claim, job_id: str, log: logging.Logger) -> bool:
    """Mark ``claim`` done; returns whether it was late (it had expired and gone to another job, or the
    claims keys are damaged: the trainer re-issues what it did not train)."""
    try:
        return not claims.complete(claim)
    except ValueError as error:
        log.error(f"[rollout] {job_id}: {error}")
        return True
