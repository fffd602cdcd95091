"""``python -m cosmos_primitives.rollout.check`` (issue 29) on CPU: every check passes on the HF engine,
and each check fails against an engine with the defect it is there to catch."""

from __future__ import annotations

import pytest
import torch

from cosmos_primitives.data.records import Prompt, RolloutGroup, SamplingParams
from cosmos_primitives.rollout import check
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine


def verdicts_by_name(verdicts) -> dict[str, check.Verdict]:
    return {v.name: v for v in verdicts}


@pytest.mark.slow
def test_command_passes_on_the_hf_engine(tiny_vl_dir, capsys) -> None:
    code = check.main([str(tiny_vl_dir), "--backend", "hf", "--device", "cpu", "--dtype", "float32",
                       "--max-response-length", "4"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]
    names = [line.split(":")[0][5:] for line in lines]
    assert names == [f"logprobs/{kind}/top_p={p}" for kind in ("text", "image", "video") for p in ("1", "0.9")] + [
        "weight_update/repeated_image", "seeds/independent"], out
    assert all(line.startswith("PASS") for line in lines), out
    assert code == 0


class FilterBlindEngine(HFRolloutEngine):
    """Reports log-probs before top-p filtering (the HF engine before issue 29)."""

    def generate(self, prompts, params):
        groups = super().generate(prompts, params)
        if params.top_p >= 1.0:
            return groups
        from cosmos_primitives.data.rollout_batch import collate_rollouts
        from cosmos_primitives.policy.lm_policy import token_logprobs

        batch = collate_rollouts(groups, self.processor)
        with torch.no_grad():
            full = token_logprobs(self.model, batch.inputs, mask=batch.completion_mask,
                                  temperature=params.temperature).logprobs
        out, row = [], 0
        for g in groups:
            completions = []
            for c in g.completions:
                start = len(g.prompt_token_ids)
                lps = full[row, start:start + len(c.token_ids)].tolist()
                completions.append(type(c)(text=c.text, token_ids=c.token_ids, logprobs=lps,
                                           finish_reason=c.finish_reason))
                row += 1
            out.append(RolloutGroup(prompt=g.prompt, prompt_token_ids=g.prompt_token_ids, completions=completions,
                                    weight_version=g.weight_version))
        return out


class StaleEncoderEngine(HFRolloutEngine):
    """Drops vision-tower updates, as an engine whose encoder cache outlives a weight update behaves."""

    def update_weights(self, named_tensors, version):
        super().update_weights([(n, t) for n, t in named_tensors if "visual" not in n], version)


class SeedPerPromptEngine(HFRolloutEngine):
    """Seeds prompt k of a request with ``seed + k``: request ``seed``'s second prompt repeats request
    ``seed + 1``'s first."""

    def generate(self, prompts, params):
        if params.seed is None:
            return super().generate(prompts, params)
        import attrs

        groups = []
        for k, prompt in enumerate(prompts):
            groups.extend(HFRolloutEngine.generate(self, [prompt], attrs.evolve(params, seed=params.seed + k)))
        return groups


def engines(model_dir):
    from cosmos_primitives.policy.hf_loading import load_hf_model, load_processor

    processor = load_processor(model_dir)
    trainer = load_hf_model(model_dir, dtype="float32").eval()
    return processor, trainer, lambda cls: cls(load_hf_model(model_dir, dtype="float32").eval(), processor)


@pytest.mark.slow
def test_each_check_fails_on_its_defect(tiny_vl_dir) -> None:
    processor, trainer, build = engines(tiny_vl_dir)
    prompts = check.check_prompts(vision=True)
    logprobs = verdicts_by_name(check.check_logprobs(build(FilterBlindEngine), trainer, processor,
                                                     {"image": prompts["image"]}, max_response_length=4,
                                                     kl_tolerance=1e-3, seed=0))
    assert logprobs["logprobs/image/top_p=1"].status == "PASS"
    assert logprobs["logprobs/image/top_p=0.9"].status == "FAIL", logprobs
    stale = check.check_weight_update(build(StaleEncoderEngine), trainer, processor, prompts["image"], backend="hf",
                                      max_response_length=4, kl_tolerance=1e-3, seed=0)
    assert stale.status == "FAIL", stale
    fresh = check.check_weight_update(build(HFRolloutEngine), trainer, processor, prompts["image"], backend="hf",
                                      max_response_length=4, kl_tolerance=1e-3, seed=0)
    assert fresh.status == "PASS", fresh
    seeds = check.check_seeds(build(SeedPerPromptEngine), prompts["text"], max_response_length=4, seed=0)
    assert seeds.status == "FAIL" and "shared with seed + 1: 2" in seeds.figures, seeds


def test_prompts_cover_text_image_video() -> None:
    prompts = check.check_prompts(vision=True)
    assert sorted(prompts) == ["image", "text", "video"]
    assert isinstance(prompts["video"], Prompt) and prompts["video"].video_fps == [2.0]
    assert list(check.check_prompts(vision=False)) == ["text"]
    assert SamplingParams(num_samples_per_prompt=1).top_p == 1.0


@pytest.mark.slow
def test_command_passes_on_the_vllm_standin_and_catches_raw_logprobs(standin_vllm, tmp_path, capsys,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM adapter against the stand-in (tiny Qwen3-VL: the stand-in expands its media as vLLM does):
    every check passes; the same engine asked for vLLM's ``raw_logprobs`` (before temperature, top-k and
    top-p) fails the log-prob checks and the command exits non-zero."""
    from cosmos_primitives import testing as cpt

    folder = str(cpt.save_tiny_qwen3_vl(tmp_path / "model"))
    argv = [folder, "--backend", "vllm", "--device", "cpu", "--dtype", "float32", "--max-response-length", "4"]
    assert check.main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]
    assert len(lines) == 8 and all(line.startswith("PASS") for line in lines), lines

    real_init = standin_vllm.LLM.__init__
    monkeypatch.setattr(standin_vllm.LLM, "__init__",
                        lambda self, *a, **kw: real_init(self, *a, **{**kw, "logprobs_mode": "raw_logprobs"}))
    assert check.main(argv) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert any(line.startswith("FAIL logprobs/text/top_p=0.9") for line in failed), failed
