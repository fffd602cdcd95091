"""Your own multi-turn GRPO loop: the model answers, an environment (a plain Python callable, async
allowed) grades the answer and asks a follow-up, the model answers again; one episode is one training
row whose environment tokens are context, not trained (``cp.rollout.multi_turn.run_episodes``).

    python examples/grpo_multi_turn_loop.py          # a tiny random Qwen3 on CPU, 20 steps

The task extends ``examples/grpo_text_loop.py``'s: "a + b =" is answered with the sum's digit, then
the environment replies with the next sum, " c + d =", graded the same way (1 for the right digit, less
for a digit further off, 0 otherwise); an episode's reward is the mean of its two turns' rewards. The
warm-up shows only the answer's form, for a first and a second turn, with random digits. What to
expect, the mean reward of the first five steps -> of the last five (measured, ``--seed`` 0): 0.17 -> 0.57;
tests/test_grpo_multi_turn_loop.py holds seed 0 to a rise of at least 0.2, and the second turn's to a rise too.

For a tool: the environment reads ``episode.turns[-1]`` (the model's last turn, text), runs the tool
and returns its output as ``EnvReply(text=...)``, formatted into the chat with ``reply_template``.
"""

from __future__ import annotations

import argparse
import random

import torch

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts
from cosmos_primitives.rollout.multi_turn import EnvReply, Episode, episode_rewards, run_episodes

SUMS = [(f"{a} + {b} =", a + b) for a in range(3) for b in range(3)]


def grade(answer: str, right: int) -> float:
    """1 for the right digit, 0.5 - 0.1 per unit off for another digit, 0 for anything else."""
    answer = answer.strip()
    if not (len(answer) == 1 and answer.isdigit()):
        return 0.0
    return 1.0 if int(answer) == right else 0.5 - 0.1 * abs(int(answer) - right)


def quiz(episode: Episode) -> EnvReply:
    """Grade the last answer; after the first, ask the follow-up sum (which one: from the prompt's row)."""
    first, follow_up = episode.prompt.row["sums"]
    right = SUMS[first][1] if len(episode.turns) == 1 else SUMS[follow_up][1]
    reward = grade(episode.turns[-1], right) / 2  # the episode's reward is the mean of its two turns'
    return EnvReply(text=f" {SUMS[follow_up][0]}", reward=reward, done=len(episode.turns) == 2)


def main(steps: int = 20, rollout_batch_size: int = 8, seed: int = 0) -> list[dict[str, float]]:
    cp.utils.seed_everything(seed)
    model, tokenizer = cp.testing.tiny_qwen3(seed=seed), cp.testing.qwen_tokenizer()
    digits = random.Random(seed)  # the warm-up shows the form of both turns, not the sums
    forms = [(q, f" {digits.randint(0, 4)}") for q, _ in SUMS * 2] + [
        (f"{q} {digits.randint(0, 4)}{tokenizer.eos_token} {q2}", f" {digits.randint(0, 4)}")
        for q, _ in SUMS for q2, _ in random.Random(seed).sample(SUMS, 3)]
    cp.policy.sft_warmup(model, tokenizer, forms, steps=40, lr=1e-2)
    cfg = cp.load_config(None, ["grpo.num_samples_per_prompt=8", "rollout.max_response_length=3",
                                "train.optm_lr=5e-3", f"train.train_policy.mini_batch={rollout_batch_size * 8}"])
    policy = cp.policy.build_policy(cfg.policy, hf_model=model)
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    settings = cp.policy.GRPOUpdateSettings.from_config(cfg)  # what grpo_update reads of the config
    rng = torch.Generator().manual_seed(seed)
    history = []
    for step in range(1, steps + 1):
        pairs = torch.randint(0, len(SUMS), (rollout_batch_size, 2), generator=rng).tolist()
        prompts = [Prompt(conversation=SUMS[a][0], row={"sums": (a, b)}) for a, b in pairs]
        params = SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt, seed=step)
        groups = run_episodes(engine, tokenizer, prompts, params, quiz, max_turns=2)
        rewards = torch.tensor(episode_rewards(groups))
        advantages = cp.algo.compute_advantages(rewards, cfg=cfg.grpo)
        update = cp.policy.grpo_update(policy, None, optimizer, collate_rollouts(groups, tokenizer), advantages,
                                       settings, step=step)
        second = [c.turn_rewards[1] * 2 for g in groups for c in g.completions if len(c.turn_rewards) == 2]
        history.append({"step": step, "reward": float(rewards.mean()), "grad_norm": update.grad_norm,
                        "second_turn_reward": sum(second) / max(len(second), 1)})
        print(f"step {step}: reward {history[-1]['reward']:.3f} (second turn {history[-1]['second_turn_reward']:.3f}),"
              f" grad norm {update.grad_norm:.4f}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.steps, seed=args.seed)
