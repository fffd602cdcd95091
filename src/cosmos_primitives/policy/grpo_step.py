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
from cosmos_primitives.algo.grpo_objective import grpo_loss, grpo_token_loss
from cosmos_primitives.algo.logprobs import ScoredPositions, TokenLogProbs, scored_positions
from cosmos_primitives.algo.prefix_filter import mask_shared_prefixes
from cosmos_primitives.algo.rollout_correction import rollout_mismatch_metrics
from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.data.rollout_batch import RolloutBatch
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_
from cosmos_primitives.parallel.mesh import ParallelMesh
from cosmos_primitives.policy.build import build_policy
from cosmos_primitives.policy.lm_policy import token_logprobs
from cosmos_primitives.policy.lora import adapters_disabled
from cosmos_primitives.policy.nonfinite import check_finite

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config

LOGGED_METRICS = ("kl", "clip_fraction", "entropy", "loss", "behaviour_weight_mean", "behaviour_capped_fraction",
                  "off_policy_masked_fraction")
"""The ``grpo_loss`` metrics an update reports; ``kl`` only when there is a reference."""

MISMATCH_METRICS = ("rollout_kl_k3", "rollout_ratio_max", "rollout_ratio_min", "rollout_truncated_fraction",
                    "rollout_masked_fraction", "rollout_rejected_fraction")
"""The rollout-vs-trainer drift an update reports every step (``cp.algo.rollout_mismatch_metrics`` of the
engine's log-probs against the trainer's at the start of the update): token-weighted means, except
``rollout_ratio_max`` / ``_min`` (max / min over the micro-batches)."""


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


def _logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: slice, positions: ScoredPositions, *,
              temperature: float, chunk_size: int, top_k: int = -1, top_p: float = 1.0) -> TokenLogProbs:
    """Log-probs of the completion tokens of ``batch`` rows ``rows``: ``[rows, T]`` float32."""
    return token_logprobs(model, batch.rows(rows), mask=batch.completion_mask[rows], chunk_size=chunk_size,
                          temperature=temperature, top_k=top_k, top_p=top_p, positions=positions)


def _context_parallel(policy: torch.nn.Module) -> bool:
    group = getattr(policy, "cp_group", None)
    return group is not None and torch.distributed.get_world_size(group) > 1


def grpo_micro_batch_loss(
    policy: torch.nn.Module,
    inputs: dict[str, Any],
    mask: torch.Tensor,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    *,
    positions: ScoredPositions | None = None,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    token_count: float | torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    chunk_size: int | None = None,
    fused: bool = True,
    engine_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The forward and ``[grpo]`` loss of one micro-batch: ``(loss to back-propagate, metrics)``.

    With ``fused`` (and a loss that is a sum of per-token terms, :func:`cp.algo.grpo_token_loss`;
    not under context parallelism) the LM head forms the loss's gradient in its forward (three head
    GEMMs instead of four); the loss's value, its gradient and the metrics are those of
    ``cp.algo.grpo_loss`` on the log-probs and entropy either way.

    Args:
        policy: the trained policy (``cp.policy.CausalLMPolicy``).
        inputs: the micro-batch's model inputs (``batch.rows(rows)``: ``input_ids`` ``[R, T]`` and more).
        mask: ``[R, T]`` completion mask.
        advantages: ``[R]`` (or ``[R, T]``).
        positions: the scored positions, ``cp.algo.scored_positions(input_ids, mask=mask)`` found on
            the host from CPU copies; None: found from ``inputs`` / ``mask`` where they are (a host
            sync on a GPU).
        old_logprobs: ``[R, T]`` the PPO ratio's old policy; None: this forward's (on-policy).
        ref_logprobs, rollout_logprobs, token_count: ``grpo_loss``'s ``ref_logprobs``,
            ``rollout_logprobs`` and ``dp_token_count``.
        temperature, top_k, top_p, chunk_size: for ``token_logprobs`` (the rollout's sampling
            distribution, which the engines' log-probs are of).
        engine_logprobs: ``[R, T]`` the engine's log-probs: when given, the metrics also hold
            ``cp.algo.rollout_mismatch_metrics`` of this forward's log-probs against them (pass them
            before the first optimizer step of an update, when this forward is the update's start).

    Returns:
        ``grpo_loss``'s ``(loss, metrics)``; the metrics are detached device tensors.
    """
    if positions is None:
        positions = scored_positions(inputs["input_ids"], mask=mask)
    token_loss = None
    if fused and not _context_parallel(policy):
        token_loss = grpo_token_loss(old_logprobs, advantages, mask, positions.to(mask.device), cfg=cfg,
                                     ref_logprobs=ref_logprobs, rollout_logprobs=rollout_logprobs,
                                     dp_token_count=token_count)
    out = token_logprobs(policy, inputs, mask=mask, chunk_size=chunk_size, with_entropy=True,
                         temperature=temperature, top_k=top_k, top_p=top_p, token_loss=token_loss,
                         positions=positions)
    old = out.logprobs.detach() if old_logprobs is None else old_logprobs
    loss, metrics = grpo_loss(out.logprobs, old, advantages, mask, cfg=cfg, ref_logprobs=ref_logprobs,
                              rollout_logprobs=rollout_logprobs, entropy=out.entropy, dp_token_count=token_count,
                              weighted_sum=out.weighted_sum)
    if engine_logprobs is not None:
        metrics.update(rollout_mismatch_metrics(out.logprobs.detach(), engine_logprobs, mask, cfg))
    return loss, metrics


def step_slices(rollouts: int, rollouts_per_step: int | None) -> list[slice]:
    """The row ranges of a generation's ``rollouts`` rows that each make one optimizer step:
    ``[grpo] rollouts_per_step`` rows each (None: one step of them all).

    Raises:
        ValueError: ``rollouts_per_step`` does not divide ``rollouts`` evenly.
    """
    size = rollouts if rollouts_per_step is None else rollouts_per_step
    if size < 1 or rollouts % size:
        raise ValueError(f"[grpo] rollouts_per_step = {rollouts_per_step} does not divide the {rollouts} rollouts of "
                         "a generation evenly")
    return [slice(start, start + size) for start in range(0, rollouts, size)]


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
    token mean over every micro-batch of every data-parallel rank of ``dp_group``. Each micro-batch
    runs :func:`grpo_micro_batch_loss` (the fused head where the loss allows it).

    Host syncs: the scored positions of every micro-batch are found once, on the host, from one
    copy of ``input_ids`` and ``completion_mask``; the metrics come back in one transfer after the
    last backward; so the forwards and backwards wait for the GPU nowhere (the gradient clipping and
    the finite check between optimizer steps do, and one synchronisation ends the old / reference
    log-prob phase so that ``times`` are the GPU's).

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
    behaviour_logprobs = (grpo.rollout_correction is not None or grpo.rollout_rejection is not None
                          or grpo.off_policy_masking_delta is not None)
    # the trainer-side temperature ([grpo] temperature, cosmos-rl's train_policy.temperature); unset: the sampler's
    temperature = grpo.temperature if grpo.temperature is not None else cfg.rollout.sampling_config.temperature
    # the engines report log-probs of the top-k / top-p filtered distribution: the trainer scores the same one
    top_k, top_p = cfg.rollout.sampling_config.top_k, cfg.rollout.sampling_config.top_p
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
    device = batch.completion_mask.device
    host_ids, host_mask = batch.inputs["input_ids"].cpu(), batch.completion_mask.cpu()
    positions = [scored_positions(host_ids[r], mask=host_mask[r]).to(device) for r in rows]
    shares = [float(host_mask[r].sum() / host_mask.sum()) for r in rows]  # of the metrics' token-weighted means
    # None: this update's first forward is the old policy (free when there is one iteration)
    old = [batch.rollout_logprobs[r] for r in rows]
    with torch.no_grad():
        if behaviour_logprobs or grpo.old_logprobs == "recompute":
            old = [_logprobs(policy, batch, r, p, temperature=temperature, chunk_size=chunk, top_k=top_k,
                             top_p=top_p).logprobs
                   for r, p in zip(rows, positions, strict=True)] if grpo.mu_iterations > 1 else None
        with adapters_disabled(policy.hf_model) if reference is policy else contextlib.nullcontext():
            ref = [_logprobs(reference, batch, r, p, temperature=temperature, chunk_size=chunk, top_k=top_k,
                             top_p=top_p).logprobs
                   for r, p in zip(rows, positions, strict=True)] if reference is not None else None
    if device.type == "cuda" and (old is not None or ref is not None):
        torch.cuda.synchronize(device)
    times["logprobs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    micro_metrics: list[dict[str, torch.Tensor]] = []
    for iteration in range(grpo.mu_iterations):
        iteration_loss = torch.zeros((), device=advantages.device)
        for i, r in enumerate(rows):
            loss, metrics = grpo_micro_batch_loss(
                policy, batch.rows(r), batch.completion_mask[r], advantages[r], grpo, positions=positions[i],
                old_logprobs=old[i] if old else None, ref_logprobs=ref[i] if ref else None,
                rollout_logprobs=batch.rollout_logprobs[r] if behaviour_logprobs else None,
                token_count=token_count, temperature=temperature, top_k=top_k, top_p=top_p, chunk_size=chunk,
                # the drift is measured against the weights at the start of the update: the first iteration
                engine_logprobs=batch.rollout_logprobs[r] if iteration == 0 else None)
            loss.backward()
            iteration_loss += loss.detach()
            micro_metrics.append(metrics)
        grad_norm = clip_grad_norm_(policy.parameters(), cfg.train.optm_grad_norm_clip)
        # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips this step
        if check_finite(iteration_loss, grad_norm, step=step, mode=cfg.train.nonfinite, group=dp_group):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    values = iter(torch.stack([v for m in micro_metrics for v in m.values()]).tolist())
    metric_sums: dict[str, float] = {}
    for i, metrics in enumerate(micro_metrics):
        for k in metrics:
            value = next(values)
            if k == "rollout_ratio_max":
                metric_sums[k] = max(metric_sums.get(k, float("-inf")), value)
            elif k == "rollout_ratio_min":
                metric_sums[k] = min(metric_sums.get(k, float("inf")), value)
            elif k in MISMATCH_METRICS:  # first iteration only
                metric_sums[k] = metric_sums.get(k, 0.0) + value * shares[i % len(rows)]
            else:
                metric_sums[k] = metric_sums.get(k, 0.0) + value * shares[i % len(rows)] / grpo.mu_iterations
    times["update"] = time.perf_counter() - t0
    return GRPOUpdate({k: metric_sums[k] for k in LOGGED_METRICS + MISMATCH_METRICS if k in metric_sums},
                      float(grad_norm), times)
