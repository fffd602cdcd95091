"""``[disaggregated]``: rollout and trainer roles of one ``torchrun`` job (``examples/grpo_vlm_disaggregated.py``)."""

from __future__ import annotations

from typing import Literal

from cosmos_primitives.config.base import Section


class DisaggregatedConfig(Section):
    """``[disaggregated]``: how a disaggregated GRPO job splits its ranks and paces itself.

    The last ``num_rollout_ranks`` ranks of the job generate rollouts and put them on the Redis
    queue of ``[redis]`` (address: ``[redis] url``, else ``$COSMOS_REDIS_URL``); the other ranks
    train on them (FSDP2 over the trainer ranks only, sized by ``[policy.parallelism]``) and
    broadcast new weights back after every optimizer step. Staleness (``[grpo]
    allowed_outdated_steps`` / ``on_policy``) bounds how old a trained-on record may be.
    """

    # ranks that generate (the last ones of the job); the others train
    num_rollout_ranks: int = 1
    # records (one record = one prompt's group of num_samples_per_prompt completions) consumed per
    # optimizer step by all trainer ranks together; None: [grpo] rollout_batch_size per trainer rank
    records_per_step: int | None = None
    # prompts per generate call of one rollout rank; None: [grpo] rollout_batch_size
    prompts_per_rollout: int | None = None
    # rank 0 starts a private redis-server on a free loopback port for this job and stops it at the end
    # (CPU demos and tests; needs redis-server on PATH). [redis] url and $COSMOS_REDIS_URL are ignored then
    start_local_redis: bool = False
    # a fresh run (no resume) deletes what an earlier run left under the [redis] stream's keys (records,
    # trained ids, dead letters, weight version, stop flag); runs sharing one Redis need distinct streams
    clear_stream_at_start: bool = True
    # the trainer fails with a clear error when no record arrives for this long (seconds)
    get_timeout_s: float = 600.0
    # how often a waiting rollout rank checks for new weights, the stop flag and the queue depth (seconds)
    poll_s: float = 0.05
    # weight broadcast: bucket size (MiB) and dtype of floating tensors on the wire ("auto": [policy] dtype,
    # what the rollout engine holds; the trainer's float32 master weights are cast before sending)
    bucket_mb: int = 256
    transfer_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
