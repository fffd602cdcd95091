"""``python -m cosmos_primitives.rollout.check MODEL``: does the rollout engine agree with the trainer?

Run it on the machine and with the engine you train with (``--backend vllm`` on a GPU) before a long
run. Each check prints one verdict line, ``PASS`` / ``FAIL`` / ``SKIP``, with its figures; the exit
status is 1 when any check fails.

- ``logprobs/<kind>/top_p=<p>``, for ``kind`` in text, image, video (image and video for a
  vision-language model) and ``top_p`` 1 and 0.9: the engine samples completions and reports their
  log-probs; the trainer's forward (``cp.policy.token_logprobs`` on the collated rollout, at the same
  temperature / top-k / top-p) scores the same tokens. Figures: the token mean of the k3 estimate
  of KL(engine || trainer) (the ``rollout_kl_k3`` a GRPO run logs) and the largest
  ``|logp_engine - logp_trainer|``. FAIL when the k3 mean exceeds ``--kl-tolerance``.
- ``weight_update/repeated_image``: the same image prompt before and after a weight update that
  changes the vision encoder only: the engine's log-probs must follow the trainer's new weights
  (k3 within ``--kl-tolerance`` and below a tenth of the k3 between new and old weights; an engine
  whose encoder cache outlives the update still embeds the image with the old ones). The original
  weights are put back afterwards.
- ``seeds/independent``: one request holding the same prompt twice (``n = 2``): its four
  completions differ from one another, the same seed gives the same four, and the next seed
  shares none of them (per-request seeds that overlap would repeat the previous request's noise).

Figures are in nats. The trainer model is loaded in ``--trainer-dtype`` (default float32) on
``--device``; the engine as ``[rollout] backend`` builds it (``--dtype``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from cosmos_primitives.data.records import Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.utils.renamed import renamed_keyword


class Verdict(NamedTuple):
    """One check's result: ``status`` is ``"PASS"``, ``"FAIL"`` or ``"SKIP"``; ``figures`` its numbers."""

    name: str
    status: str
    figures: str

    def line(self) -> str:
        return f"{self.status:4s} {self.name}: {self.figures}"


def check_image(seed: int = 0, size: int = 56) -> Any:
    """A deterministic RGB test image (PIL), ``size`` x ``size``: colour gradients plus a seeded pattern."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    pixels = np.stack([x * 255 // size, y * 255 // size, rng.integers(0, 256, (size, size))], -1)
    return Image.fromarray(pixels.astype(np.uint8))


def check_video(frames: int = 4, size: int = 56) -> np.ndarray:
    """``[frames, size, size, 3]`` uint8: a square moving across a gradient."""
    video = np.zeros((frames, size, size, 3), dtype=np.uint8)
    video[..., 0] = np.arange(size, dtype=np.uint8)[None, None, :] * (255 // size)
    for f in range(frames):
        start = f * size // (2 * frames)
        video[f, start:start + size // 4, start:start + size // 4] = 255
    return video


def check_prompts(vision: bool) -> dict[str, Prompt]:
    """The prompts of each kind: text always, image and video for a vision-language model."""
    prompts = {"text": Prompt(conversation=[{"role": "user", "content": "Write a few words about the sea."}],
                              prompt_id="check-text")}
    if vision:
        prompts["image"] = Prompt(conversation=[{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "Describe the image."}]}], prompt_id="check-image",
            images=[check_image()])
        prompts["video"] = Prompt(conversation=[{"role": "user", "content": [
            {"type": "video"}, {"type": "text", "text": "What moves?"}]}], prompt_id="check-video",
            videos=[check_video()], video_fps=[2.0])
    return prompts


def trainer_logprobs(model: torch.nn.Module, processor: Any, groups: Sequence[RolloutGroup],
                     params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(trainer [N, T], engine [N, T], mask [N, T])`` log-probs of the groups' completions, on the CPU."""
    from cosmos_primitives.data.rollout_batch import collate_rollouts
    from cosmos_primitives.policy.lm_policy import token_logprobs

    batch = collate_rollouts(groups, processor)
    with torch.no_grad():
        out = token_logprobs(model, batch.inputs, mask=batch.completion_mask, temperature=params.temperature,
                             top_k=params.top_k, top_p=params.top_p)
    return out.logprobs.float().cpu(), batch.rollout_logprobs, batch.completion_mask


def agreement(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """``(mean k3 of KL(engine || trainer), max |engine - trainer|)`` over the completion tokens."""
    on = mask.bool()
    diff = (trainer - engine)[on].double()
    if diff.numel() == 0:
        return 0.0, 0.0
    k3 = diff.clamp(-20, 20).exp() - 1.0 - diff
    return float(k3.mean()), float(diff.abs().max())


def check_logprobs(engine: Any, model: torch.nn.Module, processor: Any, prompts: dict[str, Prompt], *,
                   max_response_length: int, kl_tolerance: float, seed: int) -> list[Verdict]:
    verdicts = []
    for kind, prompt in prompts.items():
        for top_p in (1.0, 0.9):
            params = SamplingParams(num_samples_per_prompt=4, temperature=1.0, top_p=top_p, top_k=-1,
                                    max_response_length=max_response_length, seed=seed)
            name = f"logprobs/{kind}/top_p={top_p:g}"
            try:
                groups = engine.generate([prompt], params)
                trainer, rollout, mask = trainer_logprobs(model, processor, groups, params)
            except Exception as exc:
                verdicts.append(failed(name, exc))
                continue
            kl, worst = agreement(trainer, rollout, mask)
            status = "PASS" if kl <= kl_tolerance else "FAIL"
            verdicts.append(Verdict(name, status, f"k3 mean {kl:.3e} (tolerance {kl_tolerance:g}), max |diff| "
                                                  f"{worst:.3e} over {int(mask.sum())} tokens"))
    return verdicts


def failed(name: str, exc: BaseException) -> Verdict:
    """The FAIL verdict of a check that raised."""
    return Verdict(name, "FAIL", f"raised {type(exc).__name__}: {exc}")


def engine_named(model: torch.nn.Module, named: Sequence[tuple[str, torch.Tensor]], backend: str) -> list[Any]:
    """``named`` (trainer names) in the names the engine of ``backend`` takes."""
    from cosmos_primitives.config.rollout import RolloutConfig
    from cosmos_primitives.models.name_maps import resolve_family
    from cosmos_primitives.rollout.engine_factory import sync_layout

    layout = sync_layout(RolloutConfig(backend=backend))
    if layout == "hf":
        return list(named)
    family = resolve_family(model, None, layout)
    return [(family.rename(name, layout), tensor) for name, tensor in named]


def check_weight_update(engine: Any, model: torch.nn.Module, processor: Any, prompt: Prompt | None, *,
                        backend: str, max_response_length: int, kl_tolerance: float, seed: int) -> Verdict:
    name = "weight_update/repeated_image"
    if prompt is None:
        return Verdict(name, "SKIP", "text-only model: no image encoder to cache")
    vision = [(n, p) for n, p in model.named_parameters() if "visual" in n or "vision" in n]
    if not vision:
        return Verdict(name, "SKIP", "no parameter named '*visual*' / '*vision*' to perturb")
    params = SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=max_response_length,
                            seed=seed)
    engine.generate([prompt], params)  # the image is now in any cache the engine keeps
    originals = [(n, p.detach().clone()) for n, p in vision]
    generator = torch.Generator().manual_seed(seed)
    version = getattr(engine, "weight_version", 0)
    try:
        with torch.no_grad():
            for _, p in vision:
                noise = torch.randn(p.shape, generator=generator).to(p.device, p.dtype)
                p.add_(noise * (p.detach().float().std().clamp(min=1e-2) * 2.0).to(p.dtype))
        engine.update_weights(engine_named(model, [(n, p.detach()) for n, p in vision], backend), version + 1)
        groups = engine.generate([prompt], params)
        trainer, rollout, mask = trainer_logprobs(model, processor, groups, params)
        kl_new, worst_new = agreement(trainer, rollout, mask)
        with torch.no_grad():
            for (_, p), (_, saved) in zip(vision, originals):
                p.copy_(saved)
        before, _, _ = trainer_logprobs(model, processor, groups, params)
        moved, _ = agreement(before, trainer, mask)
    finally:
        with torch.no_grad():
            for (_, p), (_, saved) in zip(vision, originals):
                p.copy_(saved)
        engine.update_weights(engine_named(model, originals, backend), version + 2)
    if moved <= 1e-7:
        return Verdict(name, "FAIL", f"the perturbation moved the trainer's log-probs by only k3 {moved:.3e}: "
                                     "the check cannot tell new weights from old; use a larger model or image")
    # the engine must follow the new weights, and be much closer to them than to the old ones
    status = "PASS" if kl_new <= min(kl_tolerance, moved / 10) else "FAIL"
    return Verdict(name, status, f"after the update: k3 mean {kl_new:.3e} against the new weights (tolerance "
                                 f"{kl_tolerance:g}), max |diff| {worst_new:.3e}; new vs old weights k3 {moved:.3e}")


def check_seeds(engine: Any, prompt: Prompt, *, max_response_length: int, seed: int) -> Verdict:
    params = SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=max_response_length,
                            seed=seed)

    def completions(p: SamplingParams) -> list[tuple[int, ...]]:
        return [tuple(c.token_ids) for g in engine.generate([prompt, prompt], p) for c in g.completions]

    first = completions(params)
    again = completions(params)
    following = completions(SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                           max_response_length=max_response_length, seed=seed + 1))
    distinct = len(set(first))
    shared = len(set(first) & set(following))
    ok = distinct == len(first) and first == again and shared == 0
    return Verdict("seeds/independent", "PASS" if ok else "FAIL",
                   f"{distinct} distinct of {len(first)} completions in one request, same seed reproduces: "
                   f"{first == again}, shared with seed + 1: {shared}")


def run_checks(engine: Any, model: torch.nn.Module, processor: Any, *, backend: str = "hf",
               max_response_length: int | None = None, kl_tolerance: float = 1e-3, seed: int = 0,
               max_new_tokens: int | None = None) -> list[Verdict]:
    """Every check against ``engine`` with ``model`` as the trainer (module docstring); one verdict each.
    ``max_response_length`` (None: 8) new tokens per completion; ``max_new_tokens`` is its older
    keyword (``FutureWarning``)."""
    max_response_length = renamed_keyword(max_response_length, max_new_tokens, new="max_response_length",
                                          old="max_new_tokens", where="run_checks")
    if max_response_length is None:
        max_response_length = 8
    vision = getattr(processor, "image_processor", None) is not None
    prompts = check_prompts(vision)
    verdicts = check_logprobs(engine, model, processor, prompts, max_response_length=max_response_length,
                              kl_tolerance=kl_tolerance, seed=seed)
    try:
        verdicts.append(check_weight_update(engine, model, processor, prompts.get("image"), backend=backend,
                                            max_response_length=max_response_length, kl_tolerance=kl_tolerance,
                                            seed=seed))
    except Exception as exc:
        verdicts.append(failed("weight_update/repeated_image", exc))
    try:
        verdicts.append(check_seeds(engine, prompts["text"], max_response_length=max_response_length, seed=seed))
    except Exception as exc:
        verdicts.append(failed("seeds/independent", exc))
    return verdicts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.rollout.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a HF model folder or Hub name (the policy you train)")
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="[rollout] backend")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype (as [policy] dtype)")
    parser.add_argument("--trainer-dtype", default="float32", help="the trainer forward's dtype")
    parser.add_argument("--max-response-length", "--max-new-tokens", type=int, default=16,
                        help="new tokens per completion (--max-new-tokens: its older spelling)")
    parser.add_argument("--kl-tolerance", type=float, default=1e-3,
                        help="largest acceptable token mean of k3 KL(engine || trainer), in nats")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from cosmos_primitives.config.rollout import RolloutConfig
    from cosmos_primitives.policy.hf_loading import load_hf_model, load_processor
    from cosmos_primitives.rollout.engine_factory import build_rollout_engine

    processor = load_processor(args.model)
    engine, _ = build_rollout_engine(RolloutConfig(backend=args.backend), args.model, processor, dtype=args.dtype,
                                     device=args.device, seed=args.seed, colocated=False)
    model = load_hf_model(args.model, dtype=args.trainer_dtype, device=args.device).eval()
    verdicts = run_checks(engine, model, processor, backend=args.backend, max_response_length=args.max_response_length,
                          kl_tolerance=args.kl_tolerance, seed=args.seed)
    for verdict in verdicts:
        print(verdict.line(), flush=True)
    failed = [v.name for v in verdicts if v.status == "FAIL"]
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} checks did not fail" +
          (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
