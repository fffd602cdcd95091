"""One flow-matching rollout step as training sees it: the stored trajectory and the step's
Gaussian transition recomputed under the current network (Flow-GRPO / DDRL).

A rollout (:func:`cosmos_primitives.rollout.flow_sampler.sample_flow`) records a
:class:`FlowTrajectory`; training calls :func:`recompute_step` on its stochastic steps, which
evaluates the velocity with classifier-free guidance (:func:`guided_velocity`) and the SDE step's
mean, std and log-prob (:mod:`cosmos_primitives.algo.flow_sde`). Guidance is always two forward
passes (conditional, then unconditional without autograd), in rollouts and in training alike, so
that the first update recomputes exactly the stored log-probs.

Image- and video-to-world: the clean latents of the first ``K`` latent frames (``condition``)
replace those frames of every stored latent (:func:`replace_condition_frames`); log-probs cover
the generated frames ``K:`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import torch

from cosmos_primitives.algo.flow_sde import SDEParams, gaussian_log_prob, sde_step_stats

VelocityFn = Callable[..., torch.Tensor]
"""``fn(latents [B, C, T, H, W], timestep [B] in [0, 1000], text [B, L, D]) -> velocity [B, C, T, H, W]``;
with conditioning frames also called with ``num_condition_frames=K`` (the first ``K`` latent frames are clean)."""


def replace_condition_frames(latents: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
    """``latents`` ``[B, C, T, H, W]`` with its first ``K`` frames replaced by ``condition`` ``[B, C, K, H, W]``
    (``None``: unchanged)."""
    if condition is None:
        return latents
    k = condition.shape[2]
    if condition.shape[:2] != latents.shape[:2] or condition.shape[3:] != latents.shape[3:] or k > latents.shape[2]:
        raise ValueError(f"conditioning latents {tuple(condition.shape)} do not fit latents {tuple(latents.shape)}")
    return torch.cat([condition.to(latents.dtype), latents[:, :, k:]], dim=2)


def _call(velocity_fn: VelocityFn, x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
          num_condition_frames: int) -> torch.Tensor:
    if num_condition_frames:  # only conditioned rollouts need a velocity that knows the keyword
        return velocity_fn(x, timestep, text, num_condition_frames=num_condition_frames)
    return velocity_fn(x, timestep, text)


def to_diffusers_guidance(scale: float, convention: Literal["diffusers", "cosmos"]) -> float:
    """A guidance scale in the diffusers convention (``v = v_u + g (v_c - v_u)``, 1 = off).

    Cosmos writes ``v = v_c + g (v_c - v_u)`` (0 = off), which is diffusers' ``g + 1``.
    """
    if convention == "diffusers":
        return float(scale)
    if convention == "cosmos":
        return float(scale) + 1.0
    raise ValueError(
        f"guidance convention must be 'diffusers' or 'cosmos' ([wfm] guidance_convention); got {convention!r}"
    )


def guided_velocity(velocity_fn: VelocityFn, x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                    negative_text: torch.Tensor | None, guidance_scale: float,
                    num_condition_frames: int = 0) -> torch.Tensor:
    """Classifier-free guided velocity, float32 ``[B, C, T, H, W]``.

    ``guidance_scale`` is in the diffusers convention (1 = no guidance, the unconditional pass is
    skipped). The unconditional pass runs without autograd: gradients flow through the conditional
    branch only. ``negative_text`` is ``[B, L, D]`` or ``[1, L, D]`` (broadcast). ``num_condition_frames``
    (> 0: image- / video-to-world) is passed on to ``velocity_fn``.
    """
    v_cond = _call(velocity_fn, x, timestep, text, num_condition_frames).float()
    if guidance_scale == 1.0 or negative_text is None:
        return v_cond
    if negative_text.shape[0] == 1 and x.shape[0] > 1:
        negative_text = negative_text.expand(x.shape[0], *negative_text.shape[1:])
    with torch.no_grad():
        v_uncond = _call(velocity_fn, x, timestep, negative_text, num_condition_frames).float()
    return v_uncond + guidance_scale * (v_cond - v_uncond)


@attrs.define
class FlowTrajectory:
    """A batch of rollouts.

    Attributes:
        latents: ``[B, S + 1, C, T, H, W]`` float32; ``latents[:, 0]`` is the initial noise,
            ``latents[:, -1]`` the generated sample, ``latents[:, i + 1]`` the result of step ``i``.
        sigmas: ``[S + 1]`` float32, the grid the steps ran on (``sigmas[i] -> sigmas[i + 1]``).
        timesteps: ``[S]`` float32, what the model was given at each step (in ``[0, 1000]``).
        sde_steps: ``[K]`` int64, the steps that were stochastic (ascending); only they have log-probs.
        log_probs: ``[B, K]`` float32, the log-prob of ``latents[:, sde_steps[k] + 1]``, averaged over the
            elements of the generated frames.
        seeds: ``[B]`` int64, each sample's noise seed.
        guidance_scale: the guidance used, diffusers convention (1 = none).
        sde: the SDE parameters of the stochastic steps.
        condition: ``[B, C, F, H, W]`` the clean conditioning latent frames every latent starts with
            (image- / video-to-world), or None (text-to-world).
    """

    latents: torch.Tensor
    sigmas: torch.Tensor
    timesteps: torch.Tensor
    sde_steps: torch.Tensor
    log_probs: torch.Tensor
    seeds: torch.Tensor
    guidance_scale: float
    sde: SDEParams
    condition: torch.Tensor | None = None

    @property
    def num_condition_frames(self) -> int:
        """How many leading latent frames are conditioning (held fixed, outside the log-probs); 0 for text-to-world."""
        return 0 if self.condition is None else int(self.condition.shape[2])

    @property
    def samples(self) -> torch.Tensor:
        """The generated latents ``[B, C, T, H, W]``."""
        return self.latents[:, -1]

    @property
    def initial_noise(self) -> torch.Tensor:
        """The noise each rollout started from, ``[B, C, T, H, W]``."""
        return self.latents[:, 0]

    @property
    def batch_size(self) -> int:
        return self.latents.shape[0]

    def select(self, index: torch.Tensor | Sequence[int] | slice) -> FlowTrajectory:
        """The trajectories of some samples (e.g. a mini-batch); per-step fields are shared."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long, device=self.latents.device)
        return attrs.evolve(self, latents=self.latents[index], log_probs=self.log_probs[index],
                            seeds=self.seeds[index.cpu() if isinstance(index, torch.Tensor) else index],
                            condition=None if self.condition is None else self.condition[index])


@attrs.define
class StepRecompute:
    """One stored step evaluated under the current network.

    ``log_prob``: ``[B]`` float32 (differentiable); ``mean``: ``[B, C, T, H, W]``; ``std``:
    ``[B, 1, 1, 1, 1]``; ``sigma``: ``[B]``, the step's sigma per sample.
    """

    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    sigma: torch.Tensor


def recompute_step(velocity_fn: VelocityFn, trajectory: FlowTrajectory, step: int | torch.Tensor,
                   text: torch.Tensor, negative_text: torch.Tensor | None = None) -> StepRecompute:
    """Recompute a stored stochastic step's mean, std and log-prob with the current network.

    Args:
        step: the step index (one of ``trajectory.sde_steps``), or ``[B]`` one per sample.
        text, negative_text: the embeddings the rollout used (``[B, L, D]``; negative may be ``[1, L, D]``).

    Guidance, sigmas, timesteps, SDE parameters and conditioning frames come from the trajectory
    (``log_prob`` covers the generated frames only; ``mean`` and ``std`` are whole). Runs with autograd
    when enabled (the unconditional pass never does).
    """
    batch = trajectory.batch_size
    steps = torch.as_tensor(step, dtype=torch.long, device=trajectory.latents.device)
    steps = steps.expand(batch) if steps.ndim == 0 else steps
    known = set(trajectory.sde_steps.tolist())
    if not set(steps.tolist()) <= known:
        raise ValueError(f"steps {sorted(set(steps.tolist()) - known)} were deterministic in this rollout "
                         f"(stochastic steps: {sorted(known)}); only stochastic steps have a log-prob")
    rows = torch.arange(batch, device=steps.device)
    x, x_next = trajectory.latents[rows, steps], trajectory.latents[rows, steps + 1]
    sigma, sigma_next = trajectory.sigmas[steps], trajectory.sigmas[steps + 1]
    sigma_1 = trajectory.sigmas[1] if trajectory.sigmas.shape[0] > 2 else trajectory.sigmas[-1]
    k = trajectory.num_condition_frames
    v = guided_velocity(velocity_fn, x, trajectory.timesteps[steps], text, negative_text, trajectory.guidance_scale, k)
    stats = sde_step_stats(x, v, sigma, sigma_next, sigma_1, trajectory.sde)
    return StepRecompute(log_prob=gaussian_log_prob(x_next[:, :, k:], stats.mean[:, :, k:], stats.std),
                         mean=stats.mean, std=stats.std, sigma=sigma)
