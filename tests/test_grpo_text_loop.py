"""``examples/grpo_text_loop.py``: a user's own GRPO loop for a text model is a short script of
library calls that runs in one plain process on a model built in memory, with no process group,
no mesh and nothing read from or written to disk."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
import torch.distributed as dist

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams

LOOP = Path(__file__).resolve().parents[1] / "examples" / "grpo_text_loop.py"
MIN_GAIN = 0.1  # measured gains (seed 0, 1, 2): see the example's docstring


def test_the_loop_trains_in_one_process_without_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    main = runpy.run_path(str(LOOP))["main"]
    history = main(steps=2, rollout_batch_size=2)
    assert [h["step"] for h in history] == [1, 2]
    assert all(h["grad_norm"] > 0 and "clip_fraction" in h and 0 <= h["reward"] <= 1 for h in history), history
    assert not dist.is_initialized()
    assert list(tmp_path.iterdir()) == []
    assert len(LOOP.read_text().splitlines()) < 80  # short: a script of library calls, not a framework


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~90 s of CPU time; the limit leaves room for a machine shared with other jobs
def test_the_loop_raises_its_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the example promises a user who runs it as it is: over its default 20 steps, the mean
    reward of the last five steps beats the first five's by at least MIN_GAIN (seed 0; about 90 s
    of CPU time, warm-up included)."""
    monkeypatch.chdir(tmp_path)
    history = runpy.run_path(str(LOOP))["main"]()
    rewards = [h["reward"] for h in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert len(rewards) == 20
    assert last >= first + MIN_GAIN, f"reward did not rise by {MIN_GAIN}: first five {first:.3f}, last five " \
        f"{last:.3f}; per step {[round(r, 3) for r in rewards]}"


def test_sft_warmup_teaches_answers_the_engine_then_writes(qwen_tokenizer) -> None:
    """A few ``cp.policy.sft_warmup`` steps teach a random model its answers' form (and most
    answers) as the HF engine then decodes greedily: the warm-up tokenizes prompts as the engine
    does and ends each answer with the end-of-text token."""
    model = cp.testing.tiny_qwen3(seed=0)
    pairs = [("1 + 1 =", " 2"), ("2 + 1 =", " 3"), ("0 + 0 =", " 0")]
    losses = cp.policy.sft_warmup(model, qwen_tokenizer, pairs, steps=60, lr=1e-2, batch_size=6)
    assert len(losses) == 60 and losses[-1] < losses[0] / 10, losses
    engine = cp.rollout.HFRolloutEngine(model, qwen_tokenizer)
    groups = engine.generate([Prompt(conversation=p) for p, _ in pairs],
                             SamplingParams(num_samples_per_prompt=1, max_response_length=4, temperature=0.0, seed=0))
    texts = [g.completions[0].text for g in groups]
    # the answers' form, " <digit>" and then the end-of-text token (else the 4 tokens would run on)
    assert all(re.fullmatch(r" \d", text) for text in texts), texts
    assert sum(text == answer for text, (_, answer) in zip(texts, pairs)) >= 2, texts
    with pytest.raises(ValueError, match="at least one"):
        cp.policy.sft_warmup(model, qwen_tokenizer, [], steps=1)


def test_tiny_qwen3_takes_an_initializer_range() -> None:
    wide, default = cp.testing.tiny_qwen3(initializer_range=0.2), cp.testing.tiny_qwen3()
    assert wide.config.initializer_range == 0.2
    assert 0.15 < float(wide.model.layers[0].mlp.up_proj.weight.std()) < 0.25
    assert float(default.model.layers[0].mlp.up_proj.weight.std()) < 0.03
