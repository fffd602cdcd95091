"""One GRPO update of a policy on a rollout batch: micro-batches, old / reference / current
log-probs, the ``[grpo]`` loss, optimizer steps and the loss metrics to log.

It needs the policy's log-probs, so it sits in ``policy`` (``algo`` holds the loss it calls).
Colocated and disaggregated trainers run the same update::

    reference = cp.policy.grpo_reference(policy, device, mesh, kl_beta=cfg.grpo.kl_beta,
                                         policy_cfg=cfg.policy, train=cfg.train)  # None without a KL term
    settings = cp.policy.GRPOUpdateSettings.from_config(cfg)
    update = cp.policy.grpo_update(policy, reference, optimizer, batch, advantages, settings, mesh.group("dp"))
    tracker.log_metrics({**update.metrics, "grad_norm": update.grad_norm}, step)
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import torch

from cosmos_primitives.algo.aggregation import dp_mean_token_count
from cosmos_primitives.algo.grpo_objective import grpo_loss, grpo_token_loss, resolve_loss_type
from cosmos_primitives.algo.logprobs import ScoredPositions, TokenLogProbs, scored_positions
from cosmos_primitives.algo.prefix_filter import mask_shared_prefixes
from cosmos_primitives.algo.rollout_correction import rollout_mismatch_metrics
from cosmos_primitives.config.grpo import GRPOConfig
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.data.rollout_batch import RolloutBatch
from cosmos_primitives.data.token_budget import pad_micro_batch_count, token_budget_micro_batches
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


@attrs.frozen
class GRPOUpdateSettings:
    """What :func:`grpo_update` reads besides its ``[grpo]`` section, as plain values.

    Built from a run's config by :meth:`from_config`; a loop of one's own may make it directly.
    """

    grpo: GRPOConfig  # the [grpo] section: loss, iterations, old log-probs, prefix filter
    temperature: float  # the distribution the log-probs are of ([grpo] temperature, else the sampler's)
    top_k: int = -1  # the sampler's top-k / top-p filter: the engines report log-probs of the filtered distribution
    top_p: float = 1.0
    logprob_chunk_size: int = 1024  # [policy] logprob_chunk_size: tokens per chunk of the log-prob head
    mini_batch: int = 1  # [train.train_policy] mini_batch: rows per forward / backward
    grad_norm_clip: float = 1.0  # [train] optm_grad_norm_clip (<= 0: no clipping)
    nonfinite: str = "stop"  # [train] nonfinite: "stop" or "skip" a step whose loss or gradient norm is not finite
    # [train.train_policy] max_token_len_per_mini_batch: micro-batches by a token budget instead of mini_batch rows
    max_token_len_per_mini_batch: int | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> GRPOUpdateSettings:
        """The settings a run's config gives: ``[grpo]``, the trainer-side temperature (``[grpo]
        temperature``, cosmos-rl's ``train_policy.temperature``; unset: ``[rollout.sampling_config]
        temperature``), the sampler's ``top_k`` / ``top_p``, ``[policy] logprob_chunk_size``,
        ``[train.train_policy] mini_batch`` and ``max_token_len_per_mini_batch``, ``[train]
        optm_grad_norm_clip`` and ``nonfinite``."""
        sampling = cfg.rollout.sampling_config
        temperature = cfg.grpo.temperature if cfg.grpo.temperature is not None else sampling.temperature
        return cls(grpo=cfg.grpo, temperature=temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                   logprob_chunk_size=cfg.policy.logprob_chunk_size, mini_batch=cfg.train.train_policy.mini_batch,
                   grad_norm_clip=cfg.train.optm_grad_norm_clip, nonfinite=cfg.train.nonfinite,
                   max_token_len_per_mini_batch=cfg.train.train_policy.max_token_len_per_mini_batch)


def grpo_reference(policy: torch.nn.Module, device: torch.device | str, mesh: ParallelMesh | None = None, *,
                   kl_beta: float, policy_cfg: PolicyConfig, train: TrainConfig) -> torch.nn.Module | None:
    """The KL reference of ``[grpo] kl_beta``: None without a KL term; with ``[policy.lora]`` the
    policy itself (run with its adapters off, no memory); else a frozen copy of the starting
    weights in ``[policy] dtype`` (``policy_cfg``), sharded like the policy over ``mesh`` (TP, FSDP2
    with ``[train] fsdp_offload``: ``1 / dp_shard`` of the model per rank), or whole on ``device``
    without a mesh."""
    if not kl_beta:
        return None
    if policy_cfg.lora is not None:
        return policy
    return build_policy(policy_cfg, mesh, device=device, train=train, frozen=True)


_ROW_MEAN_LOSSES = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""The built-in aggregations that average over a micro-batch's rows (``[grpo] loss_type``)."""


def _logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: slice, positions: ScoredPositions, *,
              temperature: float, chunk_size: int, top_k: int = -1, top_p: float = 1.0) -> TokenLogProbs:
    """Log-probs of the completion tokens of ``batch`` rows ``rows``: ``[rows, T]`` float32."""
    return token_logprobs(model, batch.rows(rows), mask=batch.completion_mask[rows], chunk_size=chunk_size,
                          temperature=temperature, top_k=top_k, top_p=top_p, positions=positions)


def _context_parallel(policy: torch.nn.Module) -> bool:
    group = getattr(policy, "cp_group", None)
    return group is not None and torch.distributed.get_world_size(group) > 1


def _micro_batches(batch: RolloutBatch, advantages: torch.Tensor, settings: GRPOUpdateSettings, policy: torch.nn.Module,
                   dp_group: Any) -> tuple[list[RolloutBatch], list[torch.Tensor], list[float], list[bool]]:
    """The micro-batches of one update: ``(batches, their advantages, loss scales, padding flags)``.

    ``settings.max_token_len_per_mini_batch`` unset: contiguous runs of ``mini_batch``
    rows at the batch's full width. Set: :func:`cp.data.token_budget_micro_batches` of the rows'
    lengths with that budget per context-parallel rank (times the CP size, as cosmos-rl), each cut
    to its longest row, the count raised to the most of any rank of ``dp_group`` with padding
    micro-batches (the shortest row with nothing to train) so every rank runs the same collectives.

    The loss equals the fixed-row-count one: ``token-mean`` divides by the all-reduced token count
    whatever the grouping; the sequence means average over a micro-batch's rows, so a micro-batch of
    ``R`` rows is scaled by ``R / mini_batch``: every row weighs ``1 / mini_batch``, as in
    micro-batches of ``mini_batch`` rows (exactly when ``mini_batch`` divides the batch).
    ``token-sum`` (cosmos-rl's) scales each micro-batch of ``R`` of the ``N`` rows by ``R / N``, as
    cosmos-rl scales each mini-batch; it depends on the grouping, so a token budget refuses it.
    """
    micro = max(1, settings.mini_batch)
    budget = settings.max_token_len_per_mini_batch
    loss_type = resolve_loss_type(settings.grpo)
    if budget is None:
        parts = [batch.subset(slice(i, min(i + micro, len(batch)))) for i in range(0, len(batch), micro)]
        advantages_of = [advantages[i : i + micro] for i in range(0, len(batch), micro)]
        scales = [len(p) / len(batch) if loss_type == "token-sum" else 1.0 for p in parts]
        return parts, advantages_of, scales, [False] * len(parts)
    if loss_type not in _ROW_MEAN_LOSSES and loss_type != "token-mean":
        raise ValueError(f"[train.train_policy] max_token_len_per_mini_batch: [grpo] loss_type '{loss_type}' is not "
                         f"one whose loss is known not to depend on the micro-batching (token-mean, "
                         f"{', '.join(_ROW_MEAN_LOSSES)}); unset max_token_len_per_mini_batch to use it")
    if _context_parallel(policy):
        budget *= torch.distributed.get_world_size(policy.cp_group)
    lengths = batch.lengths().cpu()
    index_lists = pad_micro_batch_count(token_budget_micro_batches(lengths.tolist(), budget), dp_group)
    parts, advantages_of, scales, padding = [], [], [], []
    for index in index_lists:
        if index:
            part = batch.select(index)
        else:  # the rank's shortest row, masked out: the forward / backward run, nothing trains
            part = batch.select([int(lengths.argmin())])
            part = attrs.evolve(part, completion_mask=torch.zeros_like(part.completion_mask),
                                rollout_logprobs=torch.zeros_like(part.rollout_logprobs))
        rows = torch.tensor(index or [int(lengths.argmin())], dtype=torch.long, device=advantages.device)
        part_advantages = advantages[rows]
        if part_advantages.ndim == 2:
            part_advantages = part_advantages[:, : part.completion_mask.shape[1]]
        parts.append(part)
        advantages_of.append(part_advantages)
        scales.append(len(index) / micro if loss_type in _ROW_MEAN_LOSSES else 1.0)
        padding.append(not index)
    return parts, advantages_of, scales, padding


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
                batch: RolloutBatch, advantages: torch.Tensor, settings: GRPOUpdateSettings,
                dp_group: Any = None, *, step: int = 0) -> GRPOUpdate:
    """One GRPO update on ``batch``: ``[grpo] mu_iterations`` optimizer steps over its micro-batches
    of ``settings.mini_batch`` rows, or, with ``settings.max_token_len_per_mini_batch`` set, of rows
    grouped by length under that token budget (``cp.data.token_budget_micro_batches``; the same loss
    and gradient, less padding) (gradient clipped to ``settings.grad_norm_clip``).

    Log-probs are taken at ``settings.temperature`` (with its ``top_k`` / ``top_p``) in chunks of
    ``settings.logprob_chunk_size``. The PPO ratio's old policy is the engine's log-probs
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
        settings: ``[grpo]`` and the values the update reads from other sections
            (:meth:`GRPOUpdateSettings.from_config` of the run's config).
        step: the training step this update makes (1-based), named when a NaN / inf loss or gradient
            norm stops the run or skips an optimizer step (``[train] nonfinite``).

    Returns:
        A :class:`GRPOUpdate`; when no rank has a token to train, no step is taken and its metrics
        are empty.
    """
    grpo = settings.grpo
    behaviour_logprobs = (grpo.rollout_correction is not None or grpo.rollout_rejection is not None
                          or grpo.off_policy_masking_delta is not None)
    temperature, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
    chunk = settings.logprob_chunk_size
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
    parts, part_advantages, scales, padding = _micro_batches(batch, advantages, settings, policy, dp_group)
    host_parts = [(p.inputs["input_ids"].cpu(), p.completion_mask.cpu()) for p in parts]
    positions = [scored_positions(ids, mask=mask).to(device) for ids, mask in host_parts]
    total_tokens = max(1.0, sum(float(mask.sum()) for _, mask in host_parts))
    shares = [float(mask.sum()) / total_tokens for _, mask in host_parts]  # of the metrics' token-weighted means
    # None: this update's first forward is the old policy (free when there is one iteration)
    old = [p.rollout_logprobs for p in parts]
    with torch.no_grad():
        if behaviour_logprobs or grpo.old_logprobs == "recompute":
            old = [_logprobs(policy, part, slice(None), p, temperature=temperature, chunk_size=chunk, top_k=top_k,
                             top_p=top_p).logprobs
                   for part, p in zip(parts, positions, strict=True)] if grpo.mu_iterations > 1 else None
        with adapters_disabled(policy.hf_model) if reference is policy else contextlib.nullcontext():
            ref = [_logprobs(reference, part, slice(None), p, temperature=temperature, chunk_size=chunk,
                             top_k=top_k, top_p=top_p).logprobs
                   for part, p in zip(parts, positions, strict=True)] if reference is not None else None
    if device.type == "cuda" and (old is not None or ref is not None):
        torch.cuda.synchronize(device)
    times["logprobs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    micro_metrics: list[tuple[float, dict[str, torch.Tensor]]] = []  # (token share, metrics)
    for iteration in range(grpo.mu_iterations):
        iteration_loss = torch.zeros((), device=advantages.device)
        for i, part in enumerate(parts):
            loss, metrics = grpo_micro_batch_loss(
                policy, part.rows(slice(None)), part.completion_mask, part_advantages[i], grpo,
                positions=positions[i], old_logprobs=old[i] if old else None, ref_logprobs=ref[i] if ref else None,
                rollout_logprobs=part.rollout_logprobs if behaviour_logprobs else None,
                token_count=token_count, temperature=temperature, top_k=top_k, top_p=top_p, chunk_size=chunk,
                # the drift is measured against the weights at the start of the update: the first iteration
                engine_logprobs=part.rollout_logprobs if iteration == 0 else None)
            if scales[i] != 1.0:
                loss = loss * scales[i]
            loss.backward()
            iteration_loss += loss.detach()
            if not padding[i]:
                micro_metrics.append((shares[i], metrics))
        grad_norm = clip_grad_norm_(policy.parameters(), settings.grad_norm_clip)
        # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips this step
        if check_finite(iteration_loss, grad_norm, step=step, mode=settings.nonfinite, group=dp_group):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    values = iter(torch.stack([v for _, m in micro_metrics for v in m.values()]).tolist())
    metric_sums: dict[str, float] = {}
    for share, metrics in micro_metrics:
        for k in metrics:
            value = next(values)
            if k == "rollout_ratio_max":
                metric_sums[k] = max(metric_sums.get(k, float("-inf")), value)
            elif k == "rollout_ratio_min":
                metric_sums[k] = min(metric_sums.get(k, float("inf")), value)
            elif k in MISMATCH_METRICS:  # first iteration only
                metric_sums[k] = metric_sums.get(k, 0.0) + value * share
            else:
                metric_sums[k] = metric_sums.get(k, 0.0) + value * share / grpo.mu_iterations
    times["update"] = time.perf_counter() - t0
    return GRPOUpdate({k: metric_sums[k] for k in LOGGED_METRICS + MISMATCH_METRICS if k in metric_sums},
                      float(grad_norm), times)
