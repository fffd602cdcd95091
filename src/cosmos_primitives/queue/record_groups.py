"""Queue records -> rollout groups -> the training batch, on the trainer side of disaggregated GRPO.

A :class:`~cosmos_primitives.queue.record.RolloutRecord` carries token ids and media REFERENCES, not
pixels. The trainer rebuilds each prompt from the record's conversation (re-reading its images /
videos with the same media settings the rollout side used), so that :func:`collate_rollouts`
produces exactly the batch it would have produced from the original rollout groups; that function
also checks that the re-encoded prompt gives the token ids the engine generated from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker
from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.prompt_inputs import encode_prompts
from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup
from cosmos_primitives.data.rollout_batch import (
    RolloutBatch,
    collate_rollouts,
    same_prompt_tokens,
    vision_block_markers,
)
from cosmos_primitives.policy.nonfinite import NonFiniteError
from cosmos_primitives.queue.base import RolloutQueue
from cosmos_primitives.queue.record import RolloutRecord, decode_episode_image, record_from_group
from cosmos_primitives.queue.staleness import StalenessFilter
from cosmos_primitives.utils.renamed import renamed_keyword

log = logging.getLogger("cosmos.queue")

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.rewards.group_scores import GroupScores


def group_from_record(record: RolloutRecord, settings: MediaSettings | None = None,
                      media_dir: str | Path | None = None) -> RolloutGroup:
    """The :class:`RolloutGroup` a record was made from, media re-loaded from its references.

    Args:
        record: a record made by :func:`~cosmos_primitives.queue.record.record_from_group` with its
            conversation included.
        settings: how to read media (``MediaSettings.from_config`` of the dataset the rollout side
            read); the conversation holds each part's own keys as the rollout side read them, so
            the same settings take the same frames.
        media_dir: folder for relative references (conversations from ``cp.data`` adapters hold
            absolute paths, so it is usually not needed).

    Returns:
        A group whose prompt has the record's conversation (or plain text), ``prompt_id``, ``reference``
        (``meta["reference"]``) and re-loaded ``images`` / ``videos``; its ``row`` is empty.

    Raises:
        ValueError: the record has no conversation (emptied after it was made), or its
            conversation names different media than ``record.media``.
        BadSampleError: a referenced media file is missing or unreadable (names the record).
    """
    if not record.conversation:
        raise ValueError(
            f"record {record.record_id} (prompt {record.prompt_id!r}) carries no conversation, so its prompt "
            "cannot be rebuilt; put records made by record_from_group, which carry it"
        )
    reference = str(record.meta.get("reference", ""))
    if isinstance(record.conversation, str):  # plain text: nothing to re-load
        prompt = Prompt(conversation=record.conversation, prompt_id=record.prompt_id, reference=reference)
    else:
        settings = settings or MediaSettings()
        sample_id = f"record {record.record_id} (prompt {record.prompt_id!r})"
        try:
            loaded = load_conversation(record.conversation, media_dir, settings, sample_id=sample_id)
        except BadSampleError as exc:
            raise BadSampleError(sample_id, f"cannot re-load its media: {exc}") from exc
        if record.media and len(record.media) != len(loaded.media_paths):
            raise ValueError(f"{sample_id}: media lists {len(record.media)} references but its conversation "
                             f"holds {len(loaded.media_paths)} media parts")
        prompt = Prompt(conversation=loaded.conversation, prompt_id=record.prompt_id, images=loaded.images,
                        videos=loaded.videos, video_fps=loaded.video_fps,
                        video_metadata=loaded.video_metadata, reference=reference)
    n = len(record.completions)
    masks = record.loss_masks or [None] * n
    turns = record.turn_rewards or [[] for _ in range(n)]
    pictures = [[decode_episode_image(data, f"record {record.record_id} (prompt {record.prompt_id!r}): "
                                            f"episode_images[{i}][{k}]") for k, data in enumerate(images)]
                for i, images in enumerate(record.episode_images or [[] for _ in range(n)])]
    completions = [
        Completion(text=text, token_ids=list(ids), logprobs=list(lps), finish_reason=reason,
                   loss_mask=None if mask is None else list(mask), turn_rewards=list(turn), images=images)
        for text, ids, lps, reason, mask, turn, images in zip(record.completions, record.completion_token_ids,
                                                              record.logprobs, record.finish_reasons, masks, turns,
                                                              pictures)
    ]
    return RolloutGroup(prompt=prompt, prompt_token_ids=list(record.prompt_token_ids), completions=completions,
                        weight_version=record.weight_version)



def _renamed_samples_per_prompt(value: int | None, old: int | None, where: str) -> int | None:
    """``num_samples_per_prompt``, taking the older keyword ``num_completions`` with a ``FutureWarning``."""
    return renamed_keyword(value, old, new="num_samples_per_prompt", old="num_completions", where=where, stacklevel=4)


def check_trainable(record: RolloutRecord, group: RolloutGroup, processor: Any = None,
                    num_samples_per_prompt: int | None = None, *, num_completions: int | None = None) -> None:
    """Check what :func:`collate_rollouts` needs of one record beyond :func:`check_record`.

    Args:
        record, group: the record and the group :func:`group_from_record` rebuilt from it.
        processor: when given, the prompt is re-encoded alone (one extra processor pass) and must
            give the record's ``prompt_token_ids``, up to where vision blocks open and close (as
            :func:`collate_rollouts` allows: vLLM's Qwen3-VL video prompts lack the template's outer pair).
        num_samples_per_prompt: when given (``[grpo] num_samples_per_prompt``), the record must hold
            this many completions (one batch holds groups of one size).
        num_completions: the older name of ``num_samples_per_prompt`` (``FutureWarning``).

    Raises:
        ValueError: naming what differs.
    """
    num_samples_per_prompt = _renamed_samples_per_prompt(num_samples_per_prompt, num_completions, "check_trainable")
    if num_samples_per_prompt is not None and record.num_completions != num_samples_per_prompt:
        raise ValueError(f"it holds {record.num_completions} completions; this run samples "
                         f"{num_samples_per_prompt} per prompt ([grpo] num_samples_per_prompt)")
    if processor is not None:
        encoded = encode_prompts(processor, [group.prompt])
        ids = encoded["input_ids"][0][encoded["attention_mask"][0].bool()].tolist()
        markers = vision_block_markers(getattr(processor, "tokenizer", processor))
        if not same_prompt_tokens(ids, record.prompt_token_ids, markers):
            raise ValueError(f"re-encoding its prompt gives {len(ids)} token ids that differ from its "
                             f"{len(record.prompt_token_ids)} prompt_token_ids; is the same processor / chat "
                             "template used on the rollout side?")


def fetch_records(queue: RolloutQueue, stale: StalenessFilter, want: int, *, trainer_step: int,
                  settings: MediaSettings, bad: BadSampleTracker, timeout_s: float, processor: Any = None,
                  num_samples_per_prompt: int | None = None,
                  on_dropped: Callable[[list[RolloutRecord]], None] | None = None,
                  num_completions: int | None = None,
                  already_trained: Callable[[str], bool] | None = None,
                  ) -> tuple[list[RolloutRecord], list[RolloutGroup]]:
    """``want`` records to train on at ``trainer_step``, and their groups rebuilt with ``settings``.

    Records over the staleness bound, or sampled with weights newer than ``trainer_step``, are
    handed to ``on_dropped`` (which must consume them: the independent trainer job returns them and
    has their prompts generated again) or, without it, acknowledged as dropped (consumed untrained,
    counted apart by the queue and by ``stale``); records
    whose media cannot be re-read (e.g. deleted since the rollout) are recorded in ``bad`` and
    acknowledged; records that cannot be trained on (``ValueError`` of :func:`group_from_record`
    or :func:`check_trainable` with ``processor`` / ``num_samples_per_prompt``; ``num_completions`` is
    its older name) are dead-lettered with
    that reason (``queue.reject``), so that one of them cannot stop the trainer when the batch is
    collated. Records whose id ``already_trained`` says the trainer trained before (its own account,
    :class:`~cosmos_primitives.queue.trained_prompts.TrainedPrompts`, which the run's Redis cannot
    alter) are acknowledged and skipped. The kept records are not acknowledged: ack them after the step.

    Raises:
        TimeoutError: no record arrived for ``timeout_s`` seconds (names the step and the key
            ``[disaggregated] get_timeout_s``).
        BadSampleBudgetExceeded: from ``bad``, past its budget.
    """
    num_samples_per_prompt = _renamed_samples_per_prompt(num_samples_per_prompt, num_completions, "fetch_records")
    records: list[RolloutRecord] = []
    groups: list[RolloutGroup] = []
    while len(records) < want:
        got = queue.get(want - len(records), timeout=timeout_s)
        if not got:
            raise TimeoutError(f"no rollout record arrived for {timeout_s}s at trainer step {trainer_step} "
                               "([disaggregated] get_timeout_s); are the rollout ranks alive?")
        if already_trained is not None:
            repeated = [r for r in got if already_trained(r.record_id)]
            if repeated:
                log.warning("skipped %d delivered records whose prompts this trainer trained before (%s...): "
                            "generated again by someone", len(repeated), [r.record_id for r in repeated[:3]])
                queue.ack(repeated)
                got = [r for r in got if not already_trained(r.record_id)]
        kept, dropped = stale.split(got, trainer_step=trainer_step)
        if dropped and on_dropped is not None:
            on_dropped(dropped)
        elif dropped:
            queue.ack(dropped, dropped=True)
        for record in kept:
            try:
                group = group_from_record(record, settings)
                check_trainable(record, group, processor, num_samples_per_prompt)
            except BadSampleError as error:
                bad.record(error, sample=record.record_id)
                queue.ack([record])
                continue
            except ValueError as error:
                queue.reject([record], f"cannot be trained on: {error}")
                continue
            groups.append(group)
            records.append(record)
    return records, groups


@contextlib.contextmanager
def dead_letter_on_nonfinite(queue: RolloutQueue, records: Sequence[RolloutRecord], step: int) -> Iterator[None]:
    """Around one training step on ``records``: when it raises :class:`NonFiniteError` (a NaN / inf loss
    or gradient norm under ``[train] nonfinite = "stop"``), move ``records`` to the dead letters with
    that reason (``queue.reject``: acknowledged, never delivered again), then re-raise.

    Records that pass every check of :func:`~cosmos_primitives.queue.record.check_record` can still
    make a step non-finite (advantages of 1e38 overflow the gradient norm). Without this the stopped
    trainer leaves them unacknowledged, its restart takes them again and stops at the same step,
    for ever; with it the restart goes past them. Which record of the batch did it cannot be told
    apart, so the whole batch is dead-lettered, each with the step and the error.
    """
    try:
        yield
    except NonFiniteError as error:
        queue.reject(records, f"trainer step {step} on the batch holding this record was non-finite ({error}); "
                     "the whole batch was dead-lettered so that a resumed trainer does not stop on it again")
        raise


def collate_records(records: Sequence[RolloutRecord], processor: Any, settings: MediaSettings | None = None,
                    media_dir: str | Path | None = None, pad_token_id: int | None = None) -> RolloutBatch:
    """The training batch of ``records``: :func:`collate_rollouts` of their rebuilt groups.

    Rows are in record order, each record's completions adjacent (``N = sum of n``), so
    :func:`record_advantages` / :func:`record_rewards` line up with the rows.

    Raises:
        ValueError: no records, records with different numbers of completions, or a prompt whose
            re-encoding differs from the record's ``prompt_token_ids`` (different processor / template).
        BadSampleError: a referenced media file is missing (see :func:`group_from_record`).
    """
    if not records:
        raise ValueError("collate_records: no records")
    groups = [group_from_record(r, settings, media_dir) for r in records]
    return collate_rollouts(groups, processor, pad_token_id=pad_token_id)


def record_advantages(records: Sequence[RolloutRecord], device: torch.device | str | None = None) -> torch.Tensor:
    """The advantages the rollout side computed, one per batch row: ``[N]`` float32 in record order."""
    return torch.tensor([a for r in records for a in r.advantages], dtype=torch.float32, device=device)


def record_rewards(records: Sequence[RolloutRecord], device: torch.device | str | None = None) -> torch.Tensor:
    """The rewards of every completion, one per batch row: ``[N]`` float32 in record order."""
    return torch.tensor([x for r in records for x in r.rewards], dtype=torch.float32, device=device)


def records_from_scores(groups: Sequence[RolloutGroup], scored: GroupScores, reward_names: Sequence[str], *,
                        record_ids: Sequence[str] | None = None,
                        meta: Mapping[str, str | int | float | bool] | None = None) -> list[RolloutRecord]:
    """The queue records of scored ``groups`` (rollout side), one per group that dynamic sampling kept.

    Args:
        groups: ``G`` groups of ``n`` completions each, in the order ``scored`` scored them.
        scored: :func:`~cosmos_primitives.rewards.score_groups` of ``groups``: ``[G * n]`` rewards,
            advantages and keep flags (a group is kept or dropped whole).
        reward_names: the ``[grpo] reward_function`` names; each record's ``meta`` carries the group's
            mean of each as ``"reward/<name>"`` (the trainer logs them).
        record_ids: one id per group (e.g. deterministic per prompt and epoch, so that a group
            produced twice is trained once); default fresh ids.
        meta: extras put on every record (e.g. ``{"producer": job_id}``).
    """
    if record_ids is not None and len(record_ids) != len(groups):
        raise ValueError(f"records_from_scores: {len(record_ids)} record ids for {len(groups)} groups")
    records, start = [], 0
    for i, group in enumerate(groups):
        rows = slice(start, start + len(group.completions))
        start = rows.stop
        if not scored.keep[rows.start]:  # dynamic sampling dropped the whole group
            continue
        n = rows.stop - rows.start
        means = {f"reward/{name}": sum(scored.batch.values(name)[rows]) / n for name in reward_names}
        records.append(record_from_group(group, scored.rewards[rows], scored.advantages[rows],
                                         record_id=None if record_ids is None else record_ids[i],
                                         meta={**means, **(meta or {})}))
    return records
