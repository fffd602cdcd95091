"""Flow-matching rollouts with per-step log-probs (Flow-GRPO / DDRL).

A rollout runs the transformer on the scheduler's sigma grid from pure noise (``sigma = 1``) to the
sample (``sigma = 0``). Steps in the SDE set are stochastic and record the log-probability of the
latents they produced; the others are deterministic Euler steps and record nothing. Everything the
trainer needs to recompute a step's log-prob is stored in the
:class:`~cosmos_primitives.algo.flow_step.FlowTrajectory` (latents, sigmas, timesteps, guidance
scale, SDE parameters), so training (:func:`cosmos_primitives.algo.flow_step.recompute_step`) never
re-derives them from live scheduler state.

Noise comes from one ``torch.Generator`` per sample seeded with that sample's seed: the same seed
gives the same trajectory whatever else is in the batch.

Image- and video-to-world (Cosmos-Predict2.5's frame replacement): a rollout may be given the
clean latents of its first ``K`` latent frames (``condition``, from the VAE-encoded clip). They
replace those frames of the initial noise and of every step's result, so every stored latent holds
them; the model sees them clean (and, for Cosmos, flagged by the condition-mask channel), and the
log-probs (and every training loss) cover the generated frames ``K:`` only.

Classifier-free guidance is always evaluated as two forward passes (conditional, then
unconditional) in rollouts and in training alike, so that the first update recomputes exactly the
stored log-probs; in training the unconditional pass runs without autograd (its branch is detached).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from cosmos_primitives.algo.flow_sde import SDEParams, gaussian_log_prob, ode_step, sde_step_stats
from cosmos_primitives.algo.flow_step import (
    FlowTrajectory,
    VelocityFn,
    guided_velocity,
    replace_condition_frames,
    to_diffusers_guidance,
)


def flow_sigmas(scheduler: Any, num_inference_steps: int, *, shift: float | None = None,
                **set_timesteps_kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The sigma grid and model timesteps of a diffusers flow-matching scheduler.

    Args:
        scheduler: ``FlowMatchEulerDiscreteScheduler`` (Wan) or ``UniPCMultistepScheduler`` with
            ``use_flow_sigmas`` (Cosmos-Predict2.5); it is not modified (a copy with ``shift``
            applied is configured).
        shift: overrides the scheduler's ``shift`` (``flow_shift`` for UniPC).
        set_timesteps_kwargs: passed to ``set_timesteps`` (e.g. ``mu`` for dynamic shifting).

    Returns:
        ``(sigmas [S + 1] float32, descending from 1 to 0, timesteps [S] float32 in [0, 1000])``;
        a scheduler that rounds its timesteps to integers (UniPC) gives ``sigma * num_train_timesteps``
        unrounded instead, so a model fed ``timestep / num_train_timesteps`` sees the exact sigma.
    """
    overrides = {}
    if shift is not None:
        key = next((k for k in ("shift", "flow_shift") if k in scheduler.config), None)
        if key is None:
            raise ValueError(f"{type(scheduler).__name__} has no shift / flow_shift setting; leave [wfm.sampler] "
                             "shift unset")
        overrides[key] = shift
    sched = type(scheduler).from_config(scheduler.config, **overrides)
    sched.set_timesteps(num_inference_steps, device="cpu", **set_timesteps_kwargs)
    sigmas = sched.sigmas.detach().float().clone()
    timesteps = sched.timesteps.detach().float().clone()
    if not sched.timesteps.is_floating_point():
        timesteps = sigmas[:-1] * float(sched.config.num_train_timesteps)
    if sigmas.shape != (num_inference_steps + 1,) or timesteps.shape != (num_inference_steps,):
        raise ValueError(
            f"{type(scheduler).__name__} gave {tuple(sigmas.shape)} sigmas and {tuple(timesteps.shape)} timesteps "
            f"for {num_inference_steps} steps; expected S + 1 sigmas ending at 0 and S timesteps"
        )
    return sigmas, timesteps


def sde_window(num_steps: int, window_size: int = 0, window_range: Sequence[int] = (),
               generator: torch.Generator | None = None) -> list[int]:
    """The stochastic steps of a rollout batch.

    ``window_size = 0``: every step. Otherwise ``window_size`` consecutive steps whose first step is
    drawn uniformly so that the window lies inside ``window_range = [lo, hi)`` (empty: all steps).
    """
    if window_size <= 0:
        return list(range(num_steps))
    lo, hi = (0, num_steps) if not window_range else (int(window_range[0]), int(window_range[1]))
    if not 0 <= lo < hi <= num_steps or hi - lo < window_size:
        raise ValueError(
            f"SDE window of {window_size} steps does not fit in sde_window_range [{lo}, {hi}) of a "
            f"{num_steps}-step rollout ([wfm.sampler] sde_window_size / sde_window_range)"
        )
    start = lo + int(torch.randint(0, hi - lo - window_size + 1, (1,), generator=generator).item())
    return list(range(start, start + window_size))


def sliding_sde_window(num_steps: int, window_size: int, iteration: int, *, shift_interval: int, stride: int = 1,
                       window_range: Sequence[int] = ()) -> list[int]:
    """MixGRPO's progressive window: ``window_size`` stochastic steps starting at the first step of
    ``window_range = [lo, hi)`` (empty: all steps), moved ``stride`` steps later every ``shift_interval``
    training iterations (``iteration`` counts from 0), and back to ``lo`` once it has passed the last
    position that fits (MixGRPO's ``roll_back``). Every step outside the window is an ODE step.
    """
    if window_size <= 0 or shift_interval <= 0 or stride <= 0:
        raise ValueError(f"a sliding SDE window needs window_size, shift_interval and stride > 0; got {window_size}, "
                         f"{shift_interval}, {stride} ([wfm.sampler] sde_window_size / sde_window_shift_interval / "
                         "sde_window_stride)")
    lo, hi = (0, num_steps) if not window_range else (int(window_range[0]), int(window_range[1]))
    if not 0 <= lo < hi <= num_steps or hi - lo < window_size:
        raise ValueError(f"SDE window of {window_size} steps does not fit in sde_window_range [{lo}, {hi}) of a "
                         f"{num_steps}-step rollout ([wfm.sampler] sde_window_size / sde_window_range)")
    positions = hi - lo - window_size + 1
    start = lo + ((iteration // shift_interval) * stride) % positions
    return list(range(start, start + window_size))


def _noise(generators: Sequence[torch.Generator], shape: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.stack([torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
                        for g in generators])


@torch.no_grad()
def sample_flow(
    velocity_fn: VelocityFn,
    text: torch.Tensor,
    *,
    latent_shape: Sequence[int],
    sigmas: torch.Tensor,
    timesteps: torch.Tensor,
    seeds: Sequence[int] | torch.Tensor,
    negative_text: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    guidance_convention: Literal["diffusers", "cosmos"] = "diffusers",
    sde: SDEParams | None = None,
    sde_steps: Sequence[int] | None = None,
    condition: torch.Tensor | None = None,
    noise_seeds: Sequence[int] | torch.Tensor | None = None,
) -> FlowTrajectory:
    """Generate ``B`` latents, recording every step.

    Args:
        velocity_fn: see :data:`VelocityFn` (e.g. :func:`diffusers_velocity_fn`).
        text: ``[B, L, D]`` prompt embeddings; negative_text: ``[B or 1, L, D]`` (unconditional
            branch of guidance; ignored when guidance is off).
        latent_shape: ``(C, T, H, W)`` of one sample's latents.
        sigmas: ``[S + 1]`` descending to 0 and timesteps ``[S]``, e.g. from :func:`flow_sigmas`.
        seeds: ``[B]`` one seed per sample: its initial noise and its SDE steps' noise.
        noise_seeds: ``[B]`` seeds of the initial noise alone (e.g. one per prompt group, so that a
            group starts from the same noise); None: ``seeds``.
        guidance_scale: read in ``guidance_convention``.
        sde: stochastic-step parameters; ``None`` with ``sde_steps`` unset gives a plain ODE rollout.
        sde_steps: which steps are stochastic (``None``: all of them when ``sde`` is given); see
            :func:`sde_window`. A stochastic step whose std is 0 (CPS to sigma 0) is deterministic
            and gets no log-prob.
        condition: ``[B, C, F, H, W]`` clean latents of the first ``F`` latent frames (image- /
            video-to-world, e.g. ``encode_video(vae, clip)[:, :, :F]``): they replace those frames of
            the noise and of every step's result; log-probs cover frames ``F:`` only. None: text-to-world.

    Returns:
        a :class:`FlowTrajectory` on ``text``'s device.
    """
    device = text.device
    batch = text.shape[0]
    seeds = torch.as_tensor(seeds, dtype=torch.long).cpu()
    if seeds.shape != (batch,):
        raise ValueError(f"need one seed per sample: {batch} prompts, seeds of shape {tuple(seeds.shape)}")
    sigmas = sigmas.detach().float().cpu()
    timesteps = timesteps.detach().float().cpu()
    num_steps = timesteps.shape[0]
    if sigmas.shape != (num_steps + 1,):
        raise ValueError(
            f"sigmas must be [S + 1] = [{num_steps + 1}] for {num_steps} timesteps; got {tuple(sigmas.shape)}"
        )
    if bool((sigmas[1:] >= sigmas[:-1]).any()):
        raise ValueError(f"sigmas must strictly decrease (from 1 to 0); got {sigmas.tolist()}")
    guidance = to_diffusers_guidance(guidance_scale, guidance_convention)
    if sde_steps is not None:
        stochastic = {int(i) for i in sde_steps}
    else:
        stochastic = set() if sde is None else set(range(num_steps))
    if not stochastic <= set(range(num_steps)):
        raise ValueError(f"sde_steps {sorted(stochastic)} reach outside the {num_steps} steps of this rollout")
    sde = sde or SDEParams()

    k = 0
    if condition is not None:
        condition = condition.detach().float().to(device)
        k = condition.shape[2]
        if condition.shape != (batch, latent_shape[0], k, *latent_shape[2:]) or not 0 < k < latent_shape[1]:
            raise ValueError(f"condition must be [B, C, F, H, W] = [{batch}, {latent_shape[0]}, F, "
                             f"{', '.join(map(str, latent_shape[2:]))}] with 0 < F < {latent_shape[1]} latent frames "
                             f"(at least one frame left to generate); got {tuple(condition.shape)}")
    generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    if noise_seeds is None:
        x = _noise(generators, latent_shape, device)
    else:
        noise_seeds = torch.as_tensor(noise_seeds, dtype=torch.long).cpu()
        if noise_seeds.shape != (batch,):
            raise ValueError(f"need one noise seed per sample: {batch} prompts, noise_seeds of shape "
                             f"{tuple(noise_seeds.shape)}")
        x = _noise([torch.Generator(device=device).manual_seed(int(s)) for s in noise_seeds], latent_shape, device)
    x = replace_condition_frames(x, condition)
    latents = [x]
    recorded: list[int] = []
    log_probs: list[torch.Tensor] = []
    sigma_1 = sigmas[1] if num_steps > 1 else sigmas[-1]
    for i in range(num_steps):
        t = timesteps[i].to(device).expand(batch)
        v = guided_velocity(velocity_fn, x, t, text, negative_text, guidance, k)
        if i in stochastic:
            stats = sde_step_stats(x, v, sigmas[i].to(device), sigmas[i + 1].to(device), sigma_1.to(device), sde)
            if bool((stats.std > 0).all()):
                x = stats.mean + stats.std * _noise(generators, latent_shape, device)
                log_probs.append(gaussian_log_prob(x[:, :, k:], stats.mean[:, :, k:], stats.std))
                recorded.append(i)
            else:
                x = stats.mean
        else:
            x = ode_step(x, v, sigmas[i].to(device), sigmas[i + 1].to(device))
        x = replace_condition_frames(x, condition)
        latents.append(x)
    return FlowTrajectory(
        latents=torch.stack(latents, dim=1),
        sigmas=sigmas.to(device),
        timesteps=timesteps.to(device),
        sde_steps=torch.tensor(recorded, dtype=torch.long, device=device),
        log_probs=torch.stack(log_probs, dim=1) if log_probs else torch.zeros(batch, 0, device=device),
        seeds=seeds,
        guidance_scale=guidance,
        sde=sde,
        condition=condition,
    )
