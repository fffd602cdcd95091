"""One world-model RL update of a :class:`DiffusionPolicy` on a rollout batch: FlowGRPO (+ DDRL's data
term) on the recorded SDE steps, or DiffusionNFT on the clean samples alone.

Both split the batch into ``[wfm] num_minibatches`` mini-batches with one optimizer step each,
clip the gradient norm, and guard the step with ``cp.checkpoint.check_finite`` (``[train] nonfinite``).
They return the mean of each metric over the mini-batches.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_primitives.algo.ddrl import ddrl_data_loss, noisy_latents
from cosmos_primitives.algo.diffusion_nft import diffusion_nft_loss
from cosmos_primitives.algo.flow_grpo import flow_grpo_loss, select_train_steps
from cosmos_primitives.checkpoint.nonfinite import check_finite
from cosmos_primitives.config.wfm import WFMConfig
from cosmos_primitives.parallel.grad_norm import clip_grad_norm_
from cosmos_primitives.policy.diffusion import DiffusionPolicy
from cosmos_primitives.rollout.flow_sampler import (
    FlowTrajectory,
    VelocityFn,
    recompute_step,
    replace_condition_frames,
)
from cosmos_primitives.rollout.flow_sde import gaussian_mean_kl


def _optimizer_step(policy: DiffusionPolicy, optimizer: Any, loss: torch.Tensor, grad_clip: float, *, step: int,
                    nonfinite: str) -> float:
    """Clip, check, step (the gradients are already there); returns the gradient norm."""
    grad_norm = clip_grad_norm_(policy.trainable_parameters(), grad_clip)
    # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips the update
    if check_finite(loss, grad_norm, step=step, mode=nonfinite):
        optimizer.step()
    return float(grad_norm)


def flow_grpo_update(policy: DiffusionPolicy, velocity: VelocityFn, optimizer: Any, traj: FlowTrajectory,
                     text: torch.Tensor, negative: torch.Tensor | None, advantages: torch.Tensor,
                     clips: torch.Tensor | None, w: WFMConfig, grad_clip: float, rng: dict[str, torch.Generator],
                     *, step: int, nonfinite: str) -> dict[str, float]:
    """The FlowGRPO loss over a random ``train_step_fraction`` of the trajectory's SDE steps (``rng["train_steps"]``),
    + ``data_beta`` x the DDRL data loss on ``clips`` ``[B, C, T, H, W]`` (latents; ``rng["ddrl"]``) when given.

    ``text`` ``[B, L, D]``, ``advantages`` ``[B]``; ``negative`` the guidance's ``[1, L, D]`` or None.
    The trajectory's conditioning frames (image- / video-to-world) stay out of the log-probs, the KL and
    the data loss (the clips' first frames are the condition there).
    """
    num_train_timesteps = policy.num_train_timesteps
    positions = select_train_steps(traj.sde_steps.numel(), w.train_step_fraction, generator=rng["train_steps"])
    k = traj.num_condition_frames
    metrics: dict[str, list[float]] = {}
    for mb in torch.arange(traj.batch_size).chunk(w.num_minibatches):
        sub, sub_text, sub_adv = traj.select(mb), text[mb], advantages[mb]
        optimizer.zero_grad(set_to_none=True)
        mb_loss = torch.zeros((), device=text.device)
        for pos in positions.tolist():
            now = recompute_step(velocity, sub, int(sub.sde_steps[pos]), sub_text, negative)
            kl = None
            if w.kl_beta > 0:
                with policy.reference() as ref_velocity:
                    ref = recompute_step(ref_velocity, sub, int(sub.sde_steps[pos]), sub_text, negative)
                kl = gaussian_mean_kl(now.mean[:, :, k:], ref.mean[:, :, k:], now.std, reduction=w.kl_reduction)
            out = flow_grpo_loss(now.log_prob, sub.log_probs[:, pos], sub_adv, clip_range=w.clip_range,
                                 adv_clip_max=w.adv_clip_max, kl=kl, kl_beta=w.kl_beta)
            loss = out.loss
            if clips is not None:
                with torch.set_grad_enabled(w.data_beta > 0):  # with data_beta = 0 it is only measured
                    data = ddrl_data_loss(velocity, clips[mb], sub_text,
                                          noise=sub.initial_noise if w.ddrl_rollout_noise else None,
                                          sigma=now.sigma if w.ddrl_rollout_sigma else None,
                                          generator=rng["ddrl"], num_train_timesteps=num_train_timesteps,
                                          weighting=w.ddrl_loss_weighting, num_condition_frames=k)
                loss = loss + w.data_beta * data.loss
                metrics.setdefault("data_loss", []).append(data.loss.item())
            (loss / len(positions)).backward()
            mb_loss += loss.detach() / len(positions)
            for key in ("policy_loss", "kl", "clip_fraction", "approx_kl", "ratio_mean"):
                metrics.setdefault(key, []).append(getattr(out, key).item())
        metrics.setdefault("grad_norm", []).append(
            _optimizer_step(policy, optimizer, mb_loss, grad_clip, step=step, nonfinite=nonfinite))
    return {k: sum(v) / len(v) for k, v in metrics.items()}


def diffusion_nft_update(policy: DiffusionPolicy, velocity: VelocityFn, optimizer: Any, samples: torch.Tensor,
                         text: torch.Tensor, advantages: torch.Tensor, w: WFMConfig, grad_clip: float,
                         generator: torch.Generator, *, step: int, nonfinite: str,
                         condition: torch.Tensor | None = None) -> dict[str, float]:
    """DiffusionNFT (``cp.algo.diffusion_nft_loss``) on the clean rollout samples ``[B, C, T, H, W]``.

    Each sample gets ``[wfm] nft_num_timesteps`` forward-process points ``x_t = (1 - t) x0 + t eps``
    (``t`` uniform in ``[nft_t_min, nft_t_max]``, ``eps`` Gaussian, both from ``generator``); the
    sampling policy's velocity there (``v_old``) is taken before the first optimizer step, so later
    mini-batches are pulled relative to the policy that generated the batch. No guidance (CFG-free).
    ``condition`` ``[B, C, K, H, W]`` (image- / video-to-world): the clean first ``K`` latent frames of
    every ``x_t`` (the model's condition); the loss covers the generated frames ``K:`` only.
    """
    nt = policy.num_train_timesteps
    b = samples.shape[0]
    k = 0 if condition is None else condition.shape[2]
    draws = []
    for _ in range(w.nft_num_timesteps):
        t = w.nft_t_min + (w.nft_t_max - w.nft_t_min) * torch.rand(b, generator=generator)
        eps = torch.randn(samples.shape, generator=generator)
        x_t, _ = noisy_latents(samples.float().cpu(), eps, t)
        draws.append((replace_condition_frames(x_t.to(samples.device), condition), t.to(samples.device)))

    def v_at(fn: VelocityFn, x_t: torch.Tensor, t: torch.Tensor, mb: Any = slice(None)) -> torch.Tensor:
        """The velocity at ``x_t[mb]``, ``t[mb]``; ``[mb, C, T, H, W]``."""
        if k:
            return fn(x_t[mb], t[mb] * nt, text[mb], num_condition_frames=k)
        return fn(x_t[mb], t[mb] * nt, text[mb])

    with torch.no_grad():
        v_old = [v_at(velocity, x_t, t) for x_t, t in draws]
    metrics: dict[str, list[float]] = {}
    for mb in torch.arange(b).chunk(w.num_minibatches):
        optimizer.zero_grad(set_to_none=True)
        mb_loss = torch.zeros((), device=text.device)
        for (x_t, t), old in zip(draws, v_old):
            v_theta = v_at(velocity, x_t, t, mb)[:, :, k:]
            v_ref = None
            if w.kl_beta > 0:
                with policy.reference() as ref_velocity:
                    v_ref = v_at(ref_velocity, x_t, t, mb)[:, :, k:]
            out = diffusion_nft_loss(v_theta, old[mb][:, :, k:], x_t[mb][:, :, k:], samples[mb][:, :, k:], t[mb],
                                     advantages[mb], beta=w.nft_beta, adv_clip_max=w.adv_clip_max, v_ref=v_ref,
                                     kl_beta=w.kl_beta)
            (out.loss / len(draws)).backward()
            mb_loss += out.loss.detach() / len(draws)
            for key in ("policy_loss", "positive_loss", "negative_loss", "kl"):
                metrics.setdefault(key, []).append(getattr(out, key).item())
        metrics.setdefault("grad_norm", []).append(
            _optimizer_step(policy, optimizer, mb_loss, grad_clip, step=step, nonfinite=nonfinite))
    return {k: sum(v) / len(v) for k, v in metrics.items()}
