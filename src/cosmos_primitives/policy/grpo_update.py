"""One GRPO update of a policy on a rollout batch: micro-batches, old / reference / current
log-probs, the ``[grpo]`` loss, optimizer steps and the loss metrics to log.

It needs the policy's log-probs, so it sits in ``policy`` (``algo`` holds the loss it calls).
Colocated and disaggregated trainers run the same update::

    reference = cp.policy.grpo_reference(cfg, policy, device, mesh)      # None without a KL term
    update = cp.policy.grpo_update(policy, reference, optimizer, batch, advantages, cfg, mesh.group("dp"))
    tracker.log_metrics({**update.metrics, "grad_norm": update.grad_norm}, step)
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import torch

from cosmos_primitives.algo.aggregation import dp_mean_token_count
from cosmos_primitives.algo.grpo_loss import grpo_loss
from cosmos_primitives.algo.logprobs import TokenLogProbs
from cosmos_primitives.algo.prefix_filter import mask_shared_prefixes
from cosmos_primitives.checkpoint.nonfinite import check_finite
from cosmos_primitives.data.rollout_batch import RolloutBatch
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_
from cosmos_primitives.parallel.mesh import ParallelMesh
from cosmos_primitives.policy.build import build_policy
from cosmos_primitives.policy.lm_policy import token_logprobs
from cosmos_primitives.policy.lora import adapters_disabled

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config

LOGGED_METRICS = ("kl", "clip_fraction", "entropy", "loss", "behaviour_weight_mean", "behaviour_capped_fraction",
                  "off_policy_masked_fraction")
"""The ``grpo_loss`` metrics an update reports; ``kl`` only when there is a reference."""


class GRPOUpdate(NamedTuple):
    """What one :func:`grpo_update` did."""

    metrics: dict[str, float]  # token-weighted means of LOGGED_METRICS over the micro-batches and iterations
    grad_norm: float  # the last optimizer step's gradient norm before clipping
    times: dict[str, float]  # seconds: "logprobs" (old / reference), "update" (forward, backward, steps)


def grpo_reference(cfg: Config, policy: torch.nn.Module, device: torch.device | str,
                   mesh: ParallelMesh | None = None) -> torch.nn.Module | None:
    """The KL reference of ``[grpo] kl_beta``: None without a KL term; with ``[policy.lora]`` the
    policy itself (run with its adapters off, no memory); else a frozen copy of the starting
    weights in ``[policy] dtype``, sharded like the policy over ``mesh`` (TP, FSDP2 with
    ``[train] fsdp_offload``: ``1 / dp_shard`` of the model per rank), or whole on ``device``
    without a mesh."""
    if not cfg.grpo.kl_beta:
        return None
    if cfg.policy.lora is not None:
        return policy
    return build_policy(cfg.policy, mesh, device=device, train=cfg.train, frozen=True)


def _logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: slice, *, temperature: float, chunk_size: int,
              with_entropy: bool = False) -> TokenLogProbs:
    """Log-probs (and entropy) of the completion tokens of ``batch`` rows ``rows``: ``[rows, T]`` float32."""
    return token_logprobs(model, batch.rows(rows), mask=batch.completion_mask[rows], chunk_size=chunk_size,
                          with_entropy=with_entropy, temperature=temperature)


def grpo_update(policy: torch.nn.Module, reference: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                batch: RolloutBatch, advantages: torch.Tensor, cfg: Config,
                dp_group: Any = None, *, step: int = 0) -> GRPOUpdate:
    """One GRPO update on ``batch``: ``[grpo] mu_iterations`` optimizer steps over its micro-batches
    of ``[train.train_policy] mini_batch`` rows (gradient clipped to ``[train] optm_grad_norm_clip``).

    Log-probs are taken at the rollout's sampling temperature (``[rollout.sampling_config]``) in
    chunks of ``[policy] logprob_chunk_size``. The PPO ratio's old policy is the engine's log-probs
    (``[grpo] old_logprobs = "rollout"``) or, with ``"recompute"``, the policy's weights at the start
    of the update. With ``[grpo] behav_imp_weight_cap`` or ``off_policy_masking_delta`` set, the
    engine's log-probs go to the loss as the behaviour policy (AReaL behaviour weights / off-policy
    masking) and the ratio's old policy is the weights at the start of the update. The loss is the
    token mean over every micro-batch of every data-parallel rank of ``dp_group``.

    Args:
        policy: the trained policy (``cp.policy.CausalLMPolicy``, FSDP2-sharded or not).
        reference: the KL reference (:func:`grpo_reference`), or None for no KL term; when it is
            ``policy`` (LoRA), its adapters are switched off for the reference forward.
        batch: ``N`` rows; rows whose ``completion_mask`` is all 0 train nothing but still run, so
            every rank runs the same collectives.
        advantages: ``[N]`` float32, one per row, on the batch's device.
        step: the training step this update makes (1-based), named when a NaN / inf loss or gradient
            norm stops the run or skips an optimizer step (``[train] nonfinite``).

    Returns:
        A :class:`GRPOUpdate`; when no rank has a token to train, no step is taken and its metrics
        are empty.
    """
    grpo = cfg.grpo
    behaviour_logprobs = grpo.behav_imp_weight_cap is not None or grpo.off_policy_masking_delta is not None
    # the trainer-side temperature ([grpo] temperature, cosmos-rl's train_policy.temperature); unset: the sampler's
    temperature = grpo.temperature if grpo.temperature is not None else cfg.rollout.sampling_config.temperature
    chunk = cfg.policy.logprob_chunk_size
    micro = max(1, cfg.train.train_policy.mini_batch)
    rows = [slice(i, min(i + micro, len(batch))) for i in range(0, len(batch), micro)]
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    if grpo.min_filter_prefix_tokens is not None:  # shared prefixes of differently rewarded completions
        ends = getattr(getattr(policy.hf_model, "generation_config", None), "eos_token_id", None)
        batch = attrs.evolve(batch, completion_mask=mask_shared_prefixes(
            batch.completion_mask, batch.inputs["input_ids"], batch.group_index, advantages,
            grpo.min_filter_prefix_tokens, [ends] if isinstance(ends, int) else list(ends or ())))
    token_count = dp_mean_token_count(batch.completion_mask, dp_group)
    if float(token_count) == 0.0:  # every group of every rank was dropped (all-reduced: all ranks agree)
        return GRPOUpdate({}, 0.0, {"logprobs": time.perf_counter() - t0, "update": 0.0})
    # None: this update's first forward is the old policy (free when there is one iteration)
    old = [batch.rollout_logprobs[r] for r in rows]
    with torch.no_grad():
        if behaviour_logprobs or grpo.old_logprobs == "recompute":
            old = [_logprobs(policy, batch, r, temperature=temperature, chunk_size=chunk).logprobs
                   for r in rows] if grpo.mu_iterations > 1 else None
        with adapters_disabled(policy.hf_model) if reference is policy else contextlib.nullcontext():
            ref = [_logprobs(reference, batch, r, temperature=temperature, chunk_size=chunk).logprobs
                   for r in rows] if reference is not None else None
    times["logprobs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    metric_sums: dict[str, float] = {}
    for _ in range(grpo.mu_iterations):
        iteration_loss = torch.zeros((), device=advantages.device)
        for i, r in enumerate(rows):
            out = _logprobs(policy, batch, r, temperature=temperature, chunk_size=chunk, with_entropy=True)
            loss, metrics = grpo_loss(
                out.logprobs, old[i] if old else out.logprobs.detach(), advantages[r],
                batch.completion_mask[r], cfg=grpo, ref_logprobs=ref[i] if ref else None,
                rollout_logprobs=batch.rollout_logprobs[r] if behaviour_logprobs else None,
                entropy=out.entropy, dp_token_count=token_count)
            loss.backward()
            iteration_loss += loss.detach()
            weight = float(batch.completion_mask[r].sum() / batch.completion_mask.sum())
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + float(v) * weight / grpo.mu_iterations
        grad_norm = clip_grad_norm_(policy.parameters(), cfg.train.optm_grad_norm_clip)
        # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips this step
        if check_finite(iteration_loss, grad_norm, step=step, mode=cfg.train.nonfinite, group=dp_group):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times["update"] = time.perf_counter() - t0
    return GRPOUpdate({k: metric_sums[k] for k in LOGGED_METRICS if k in metric_sums}, float(grad_norm), times)
