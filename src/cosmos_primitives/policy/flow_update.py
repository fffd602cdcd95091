"""One world-model RL update of a :class:`DiffusionPolicy` on a rollout batch: FlowGRPO (+ DDRL's data
term) on the recorded SDE steps, or DiffusionNFT on the clean samples alone.

Both split the batch into ``[wfm] num_minibatches`` mini-batches with one optimizer step each,
clip the gradient norm, and guard the step with ``cp.policy.check_finite`` (``[train] nonfinite``).
They return the mean of each metric over the mini-batches (and trained steps / forward-process points).

Gradient accumulation: each mini-batch runs forward / backward in micro-batches of ``micro_batch``
samples (``[train.train_policy] mini_batch`` in ``examples/wfm_rl.py``; ``None``: the whole
mini-batch at once). Every loss here is a mean over samples, so each micro-batch's loss is scaled
by its share of the mini-batch (``samples / mini-batch samples``) and the accumulated gradient is
the mini-batch's own; the random draws (trained steps, DDRL noise, DiffusionNFT points) are made
for the whole mini-batch before it is split, so the result does not depend on ``micro_batch``
(up to float rounding). Only one micro-batch's activations (one trained step, one forward pass)
are alive at a time: with the transformer's gradient checkpointing that is its block inputs plus
one block recomputed in backward. Under FSDP2 each backward reduce-scatters the (LoRA) gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_primitives.algo.ddrl import ddrl_data_loss, noisy_latents
from cosmos_primitives.algo.diffusion_nft import diffusion_nft_loss
from cosmos_primitives.algo.flow_grpo import flow_grpo_loss, listed_train_steps, select_train_steps
from cosmos_primitives.algo.flow_sde import gaussian_mean_kl
from cosmos_primitives.algo.flow_step import FlowTrajectory, VelocityFn, recompute_step, replace_condition_frames
from cosmos_primitives.config.wfm import WFMConfig
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_
from cosmos_primitives.policy.diffusion import DiffusionPolicy
from cosmos_primitives.policy.nonfinite import check_finite


def _optimizer_step(policy: DiffusionPolicy, optimizer: Any, loss: torch.Tensor, grad_clip: float, *, step: int,
                    nonfinite: str) -> float:
    """Clip, check, step (the gradients are already there); returns the gradient norm."""
    grad_norm = clip_grad_norm_(policy.trainable_parameters(), grad_clip)
    # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips the update
    if check_finite(loss, grad_norm, step=step, mode=nonfinite):
        optimizer.step()
    return float(grad_norm)


def split_rows(rows: slice, size: int | None) -> list[slice]:
    """``rows`` (a ``slice`` with start and stop) cut into consecutive slices of at most ``size`` rows
    (``None``: one slice, the whole range)."""
    if size is not None and size < 1:
        raise ValueError(f"micro-batch size must be >= 1 ([train.train_policy] mini_batch); got {size}")
    step = rows.stop - rows.start if size is None else size
    return [slice(i, min(i + step, rows.stop)) for i in range(rows.start, rows.stop, max(step, 1))]


def minibatch_rows(batch: int, num_minibatches: int) -> list[slice]:
    """The rows of each of ``num_minibatches`` mini-batches of a ``batch``-sample rollout batch, as
    ``torch.arange(batch).chunk(num_minibatches)`` cuts them (contiguous, the last may be shorter)."""
    return [slice(int(c[0]), int(c[-1]) + 1) for c in torch.arange(batch).chunk(num_minibatches)]


class _WeightedMeans:
    """Per-key weighted sums of 0-d tensors (one ``.item()`` per key when read): the mean of a metric
    over a mini-batch from its micro-batches' means, each weighted by its share of the samples."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, values: dict[str, torch.Tensor], weight: float) -> None:
        for key, value in values.items():
            value = value.detach().float() * weight
            self.sums[key] = self.sums[key] + value if key in self.sums else value

    def flush_into(self, metrics: dict[str, list[float]]) -> None:
        for key, value in self.sums.items():
            metrics.setdefault(key, []).append(value.item())
        self.sums = {}


def _ddrl_draws(clips: torch.Tensor, w: WFMConfig,
                generator: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The data term's fresh noise ``[n, C, T, H, W]`` and sigma ``[n]`` for a mini-batch's clips (each None
    where the rollout's own is reused), drawn as ``ddrl_data_loss`` would draw them for the whole mini-batch."""
    noise = sigma = None
    if not w.ddrl_rollout_noise:
        noise = torch.randn(clips.shape, generator=generator, device=clips.device, dtype=torch.float32)
    if not w.ddrl_rollout_sigma:
        sigma = torch.rand(clips.shape[0], generator=generator, device=clips.device)
    return noise, sigma


def flow_grpo_update(policy: DiffusionPolicy, velocity: VelocityFn, optimizer: Any, *,
                     trajectory: FlowTrajectory, text: torch.Tensor, advantages: torch.Tensor,
                     negative: torch.Tensor | None = None, clips: torch.Tensor | None = None,
                     wfm: WFMConfig, grad_clip: float, nonfinite: str, micro_batch: int | None = None,
                     rng: dict[str, torch.Generator], step: int) -> dict[str, float]:
    """The FlowGRPO loss over a random ``train_step_fraction`` of the trajectory's SDE steps (``rng["train_steps"]``;
    or the steps ``[wfm] train_steps`` lists), + ``data_beta`` x the DDRL data loss on ``clips``
    ``[B, C, T, H, W]`` (latents; ``rng["ddrl"]``) when given; the gradient is that of ``loss_scale`` x the loss.

    Arguments, all by keyword after the policy, its velocity function and optimizer:

    - the batch: ``trajectory`` (the rollout's ``FlowTrajectory``), ``text`` ``[B, L, D]``,
      ``advantages`` ``[B]``, ``negative`` the guidance's ``[1, L, D]`` or None, ``clips`` (DDRL).
    - the settings: ``wfm`` (the ``[wfm]`` section), ``grad_clip`` (``[train] optm_grad_norm_clip``),
      ``nonfinite`` (``[train] nonfinite``), ``micro_batch`` (samples per forward / backward, module
      docstring; None: a whole mini-batch).
    - the run's state: ``rng`` (generators ``"train_steps"`` and, with ``clips``, ``"ddrl"``), ``step``
      (the training step, named when a non-finite loss stops the run).
    The trajectory's conditioning frames (image- / video-to-world) stay out of the log-probs, the KL and
    the data loss (the clips' first frames are the condition there).

    Per mini-batch of ``n`` samples and ``P`` trained steps the loss is
    ``1/P sum_steps [policy loss + kl_beta KL + data_beta data loss]``, each term a mean over the ``n``
    samples. The data term runs its own forward / backward after the policy term's, so the two
    forward graphs are never alive together.
    """
    num_train_timesteps = policy.num_train_timesteps
    if wfm.train_steps:
        positions = listed_train_steps(wfm.train_steps, trajectory.sde_steps, generator=rng["train_steps"])
    else:
        positions = select_train_steps(trajectory.sde_steps.numel(), wfm.train_step_fraction,
                                       generator=rng["train_steps"])
    k = trajectory.num_condition_frames
    metrics: dict[str, list[float]] = {}
    for rows in minibatch_rows(trajectory.batch_size, wfm.num_minibatches):
        n = rows.stop - rows.start
        optimizer.zero_grad(set_to_none=True)
        mb_loss = torch.zeros((), device=text.device)
        for pos in positions.tolist():
            sde_step = int(trajectory.sde_steps[pos])
            noise, sigma = _ddrl_draws(clips[rows], wfm, rng["ddrl"]) if clips is not None else (None, None)
            step_means = _WeightedMeans()
            for micro in split_rows(rows, micro_batch):
                share = (micro.stop - micro.start) / n  # the micro-batch's weight in the mini-batch mean
                sub, sub_text = trajectory.select(micro), text[micro]
                now = recompute_step(velocity, sub, sde_step, sub_text, negative)
                kl = None
                if wfm.kl_beta > 0:
                    with policy.reference() as ref_velocity:
                        ref = recompute_step(ref_velocity, sub, sde_step, sub_text, negative)
                    kl = gaussian_mean_kl(now.mean[:, :, k:], ref.mean[:, :, k:], now.std, reduction=wfm.kl_reduction)
                out = flow_grpo_loss(now.log_prob, sub.log_probs[:, pos], advantages[micro], clip_range=wfm.clip_range,
                                     adv_clip_max=wfm.adv_clip_max, kl=kl, kl_beta=wfm.kl_beta)
                (out.loss * (wfm.loss_scale * share / len(positions))).backward()
                mb_loss += out.loss.detach() * (share / len(positions))
                step_means.add({key: getattr(out, key) for key in ("policy_loss", "kl", "clip_fraction", "approx_kl",
                                                                    "ratio_mean")}, share)
                if clips is not None:
                    offset = slice(micro.start - rows.start, micro.stop - rows.start)  # into the mini-batch's draws
                    with torch.set_grad_enabled(wfm.data_beta > 0):  # with data_beta = 0 it is only measured
                        data = ddrl_data_loss(velocity, clips[micro], sub_text,
                                              noise=sub.initial_noise if noise is None else noise[offset],
                                              sigma=now.sigma if sigma is None else sigma[offset],
                                              num_train_timesteps=num_train_timesteps,
                                              weighting=wfm.ddrl_loss_weighting, num_condition_frames=k)
                    if wfm.data_beta > 0:
                        (data.loss * (wfm.loss_scale * wfm.data_beta * share / len(positions))).backward()
                    mb_loss += data.loss.detach() * (wfm.data_beta * share / len(positions))
                    step_means.add({"data_loss": data.loss}, share)
            step_means.flush_into(metrics)
        metrics.setdefault("grad_norm", []).append(
            _optimizer_step(policy, optimizer, mb_loss, grad_clip, step=step, nonfinite=nonfinite))
    return {k: sum(v) / len(v) for k, v in metrics.items()}


def nft_grid_points(sigmas: torch.Tensor | None, batch: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``[batch, count]`` float32 noise levels: per sample, the nonzero sigmas of the rollout's grid
    (``sigmas`` ``[S + 1]``, descending to 0) in a random order, the first ``count`` of them (cosmos-rl's
    DiffusionNFT trains each sample at the sampler's timesteps, shuffled per sample).

    Raises:
        ValueError: without ``sigmas``, or ``count`` above the grid's ``S`` points (naming the keys).
    """
    if sigmas is None:
        raise ValueError('[wfm] nft_timesteps = "sampler" needs the rollout\'s sigma grid (pass sigmas=)')
    grid = sigmas.detach().float().cpu()[:-1]
    if count > grid.numel():
        raise ValueError(f"[wfm] nft_num_timesteps = {count} is more than the {grid.numel()} sampler steps "
                         '([wfm] num_inference_steps) that nft_timesteps = "sampler" draws from')
    order = torch.stack([torch.randperm(grid.numel(), generator=generator)[:count] for _ in range(batch)])
    return grid[order]


def diffusion_nft_update(policy: DiffusionPolicy, velocity: VelocityFn, optimizer: Any, *,
                         samples: torch.Tensor, text: torch.Tensor, advantages: torch.Tensor,
                         condition: torch.Tensor | None = None, sigmas: torch.Tensor | None = None,
                         wfm: WFMConfig, grad_clip: float, nonfinite: str, micro_batch: int | None = None,
                         generator: torch.Generator, step: int) -> dict[str, float]:
    """DiffusionNFT (``cp.algo.diffusion_nft_loss``) on the clean rollout samples ``[B, C, T, H, W]``.

    Each sample gets ``[wfm] nft_num_timesteps`` forward-process points ``x_t = (1 - t) x0 + t eps``
    (``t`` uniform in ``[nft_t_min, nft_t_max]``, or with ``nft_timesteps = "sampler"`` the rollout's
    sigma grid ``sigmas`` ``[S + 1]`` (its ``S`` nonzero values) in a random order per sample;
    ``eps`` Gaussian; both from ``generator``); the
    sampling policy's velocity there (``v_old``) is taken before the first optimizer step, so later
    mini-batches are pulled relative to the policy that generated the batch. No guidance (CFG-free).
    ``condition`` ``[B, C, K, H, W]`` (image- / video-to-world): the clean first ``K`` latent frames of
    every ``x_t`` (the model's condition); the loss covers the generated frames ``K:`` only.
    ``micro_batch``: samples per forward / backward, for ``v_old`` too (module docstring); None: a
    whole mini-batch (``v_old``: the whole batch).
    """
    nt = policy.num_train_timesteps
    b = samples.shape[0]
    k = 0 if condition is None else condition.shape[2]
    draws = []
    grid = nft_grid_points(sigmas, b, wfm.nft_num_timesteps, generator) if wfm.nft_timesteps == "sampler" else None
    for j in range(wfm.nft_num_timesteps):
        if grid is not None:
            t = grid[:, j]
        else:
            t = wfm.nft_t_min + (wfm.nft_t_max - wfm.nft_t_min) * torch.rand(b, generator=generator)
        eps = torch.randn(samples.shape, generator=generator)
        x_t, _ = noisy_latents(samples.float().cpu(), eps, t)
        draws.append((replace_condition_frames(x_t.to(samples.device), condition), t.to(samples.device)))

    def v_at(fn: VelocityFn, x_t: torch.Tensor, t: torch.Tensor, rows: slice) -> torch.Tensor:
        """The velocity at ``x_t[rows]``, ``t[rows]``; ``[rows, C, T, H, W]``."""
        if k:
            return fn(x_t[rows], t[rows] * nt, text[rows], num_condition_frames=k)
        return fn(x_t[rows], t[rows] * nt, text[rows])

    with torch.no_grad():
        v_old = [torch.cat([v_at(velocity, x_t, t, rows) for rows in split_rows(slice(0, b), micro_batch)])
                 for x_t, t in draws]
    metrics: dict[str, list[float]] = {}
    for rows in minibatch_rows(b, wfm.num_minibatches):
        n = rows.stop - rows.start
        optimizer.zero_grad(set_to_none=True)
        mb_loss = torch.zeros((), device=text.device)
        for (x_t, t), old in zip(draws, v_old):
            point_means = _WeightedMeans()
            for micro in split_rows(rows, micro_batch):
                share = (micro.stop - micro.start) / n
                v_theta = v_at(velocity, x_t, t, micro)[:, :, k:]
                v_ref = None
                if wfm.kl_beta > 0:
                    with policy.reference() as ref_velocity:
                        v_ref = v_at(ref_velocity, x_t, t, micro)[:, :, k:]
                out = diffusion_nft_loss(v_theta, old[micro][:, :, k:], x_t[micro][:, :, k:],
                                         samples[micro][:, :, k:], t[micro], advantages[micro], beta=wfm.nft_beta,
                                         adv_clip_max=wfm.adv_clip_max, v_ref=v_ref, kl_beta=wfm.kl_beta)
                (out.loss * (wfm.loss_scale * share / len(draws))).backward()
                mb_loss += out.loss.detach() * (share / len(draws))
                point_means.add({key: getattr(out, key) for key in ("policy_loss", "positive_loss", "negative_loss",
                                                                     "kl")}, share)
            point_means.flush_into(metrics)
        metrics.setdefault("grad_norm", []).append(
            _optimizer_step(policy, optimizer, mb_loss, grad_clip, step=step, nonfinite=nonfinite))
    return {k: sum(v) / len(v) for k, v in metrics.items()}
