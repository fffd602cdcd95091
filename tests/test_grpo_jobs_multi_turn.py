"""Multi-turn episodes in the independent jobs: ``examples/grpo_rollout_job.py`` runs the episodes of
``[rollout.multi_turn_config]`` (the colocated recipe's helper, ``cp.rollout.episodes``) and
``examples/grpo_trainer_job.py`` trains their records with only the model's tokens in the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams
from cosmos_primitives.rollout.episodes import generate_rollouts
from cosmos_primitives.rollout.multi_turn import EnvReply
from cosmos_primitives.testing.recipe_runs import only_run_dir
from test_grpo_jobs import run_job_pair_reading_records

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny_jobs.toml"
SECRET = "jobs-test-run-secret-" + "0" * 32

ENVIRONMENT = '''import numpy as np

from cosmos_primitives.rollout.multi_turn import IMAGE_PLACEHOLDER, EnvReply


def reply(episode):
    return EnvReply(text=" look again", reward=0.5, done=len(episode.turns) >= 2)


def show(episode):  # a VLM turn receives an image from the environment
    frame = np.full((56, 56, 3), 40 * len(episode.turns), dtype=np.uint8)
    return EnvReply(text=f" look: {IMAGE_PLACEHOLDER}", reward=0.5, done=len(episode.turns) >= 2, images=[frame])
'''


def test_a_turn_is_cut_to_max_tokens_per_turn_leaving_room_for_the_replies() -> None:
    tokenizer, model = cp.testing.qwen_tokenizer(), cp.testing.tiny_qwen3(seed=0)
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)
    params = SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=32, seed=0)
    env = lambda episode: EnvReply(text=" again", reward=1.0, done=len(episode.turns) >= 3)  # noqa: E731
    for per_turn, turns in ((0, 1), (5, 3)):  # 0: a turn may take the episode's whole budget (cosmos-rl)
        multi = cp.load_config(None, ["rollout.multi_turn_config.enable=true",
                                      f"rollout.multi_turn_config.max_tokens_per_turn={per_turn}"]
                               ).rollout.multi_turn_config
        (group,) = generate_rollouts(engine, tokenizer, [Prompt(conversation="1 + 1 =")], params, env, multi=multi,
                                     max_response_length=32)
        for c in group.completions:
            runs = [m for m, prev in zip(c.loss_mask, [0, *c.loss_mask]) if m and not prev]
            assert len(runs) == turns, c.loss_mask
            assert per_turn == 0 or c.loss_mask.count(1) <= per_turn * turns


@pytest.mark.slow
@pytest.mark.parametrize("env", ["reply", "show"])
def test_the_rollout_job_puts_episodes_and_the_trainer_trains_only_model_tokens(
        env: str, grpo_assets, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer job and a rollout job on a real redis-server with ``[rollout.multi_turn_config]``: the
    records on the queue (read while they wait to be trained) are two-turn episodes whose loss masks
    hold the environment's reply as 0s (log-prob 0 there), and the trainer's step-1 log-probs of the
    trained tokens match the rollout's (``rollout_kl_k3``, on weights version 0 both): a reply token
    in the loss would sit at log-prob 0 on the rollout side and far below it on the trainer's. With
    ``show`` the environment returns an image the next turn sees: it travels in the record, and the
    trainer's forward over the row with it reproduces the rollout's log-probs."""
    monkeypatch.setenv("COSMOS_RUN_SECRET", SECRET)
    (tmp_path / "look_env.py").write_text(ENVIRONMENT)
    small = ["grpo.rollout_batch_size=2", "grpo.num_samples_per_prompt=2", "rollout.max_response_length=48",
             "train.max_steps=2", "train.optm_warmup_steps=0", "train.ckpt.export_safetensors=false",
             "rollout.multi_turn_config.enable=true", "rollout.multi_turn_config.max_assistant_turns=2",
             "rollout.multi_turn_config.max_tokens_per_turn=4",
             f"rollout.multi_turn_config.environment={tmp_path / 'look_env.py'}:{env}"]
    common = ["--run-name", "episodes", "--redis", redis_url, *grpo_assets(CONFIG), *small]
    seen, logs = run_job_pair_reading_records(common, tmp_path, redis_url, "episodes", SECRET)
    assert seen, "no record was read off the queue"
    for record in seen.values():
        assert len(record.loss_masks) == 2 and len(record.turn_rewards) == 2, record
        for mask, ids, lps, turns in zip(record.loss_masks, record.completion_token_ids, record.logprobs,
                                         record.turn_rewards):
            assert len(mask) == len(ids) and 0 in mask and mask[0] == 1 and mask[-1] == 1, mask
            assert mask.count(1) <= 8 and turns == [0.5, 0.5]
            assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        assert [len(images) for images in record.episode_images] == ([1, 1] if env == "show" else []), record
    metrics = only_run_dir(tmp_path / "trainer") / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["rollout_kl_k3"] < 1e-3 and rows[0]["rollout_ratio_min"] > 0.9, rows[0]
    assert "episode/turns 2.00" in (logs / "rollout.log").read_text(errors="replace")
