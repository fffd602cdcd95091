"""Your own GRPO loop for a text model, from library calls: one process, a model built in memory, no
folder on disk, no mesh or process group.

    python examples/grpo_text_loop.py            # a tiny random Qwen3 on CPU, 20 steps

The task: answer "a + b =" (a, b in 0..2) with the sum's digit. A random model never writes a digit,
so a short supervised warm-up (``cp.policy.sft_warmup``) first shows it the answer's form, with a
random digit as every answer; GRPO then has to find the right digits from the reward alone (1 for
the right one, less for a digit further off, 0 for anything else). What to expect, the mean reward
of the first five steps -> of the last five (measured, ``--seed`` 0 / 1 / 2): 0.31 -> 0.55,
0.11 -> 0.48, 0.44 -> 0.58; about 90 s of CPU time. Before the warm-up and this task, the loop on
two-digit sums stayed flat (-0.31 -> -0.33 over 20 steps). tests/test_grpo_text_loop.py holds
seed 0 to a rise of at least 0.1.

Swap ``cp.testing.tiny_qwen3()`` / ``qwen_tokenizer()`` for ``AutoModelForCausalLM.from_pretrained(...)``
/ ``AutoTokenizer.from_pretrained(...)`` and the sums for your prompts (a plain string is used as it
is, a list of chat messages goes through the tokenizer's chat template); a real model needs no
warm-up. The recipes (``examples/grpo_vlm.py``) add sharding, checkpoints, validation and logging.
"""

from __future__ import annotations

import argparse
import random

import torch

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts

SUMS = [(f"{a} + {b} =", str(a + b)) for a in range(3) for b in range(3)]


def reward_sum(completion: str, reference: str) -> float:
    """1 for the right digit, 0.5 - 0.1 per unit off for another digit, 0 for anything else: even
    wrong answers differ in reward, and GRPO learns from differences within a group."""
    answer = completion.strip()
    if answer == reference:
        return 1.0
    return 0.5 - 0.1 * abs(int(answer) - int(reference)) if len(answer) == 1 and answer.isdigit() else 0.0


def main(steps: int = 20, rollout_batch_size: int = 8, seed: int = 0) -> list[dict[str, float]]:
    cp.utils.seed_everything(seed)
    model, tokenizer = cp.testing.tiny_qwen3(seed=seed), cp.testing.qwen_tokenizer()
    digits = random.Random(seed)  # the warm-up shows the form " <digit>", not the sums
    cp.policy.sft_warmup(model, tokenizer, [(p, f" {digits.randint(0, 4)}") for p, _ in SUMS * 4], steps=30, lr=1e-2)
    cfg = cp.load_config(None, ["grpo.num_samples_per_prompt=8", "rollout.max_response_length=3",
                                "train.optm_lr=5e-3", f"train.train_policy.mini_batch={rollout_batch_size * 8}"])
    policy = cp.policy.build_policy(cfg.policy, hf_model=model)  # trainable, CausalLMPolicy over `model`
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)  # the same module: it always sees the new weights
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    rewards = cp.rewards.RewardSet({"sum": 1.0}, functions={"sum": reward_sum})
    rng = torch.Generator().manual_seed(seed)
    history = []
    for step in range(1, steps + 1):
        picked = torch.randint(0, len(SUMS), (rollout_batch_size,), generator=rng).tolist()
        prompts = [Prompt(conversation=SUMS[i][0], reference=SUMS[i][1]) for i in picked]
        groups = engine.generate(prompts, SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt,
                                                                     seed=step))
        scored = cp.rewards.score_groups(groups, rewards, cfg.grpo, cfg.rollout.max_response_length)
        batch = collate_rollouts(groups, tokenizer)
        update = cp.policy.grpo_update(policy, None, optimizer, batch, scored.advantages,
                                       cp.policy.GRPOUpdateSettings.from_config(cfg), step=step)
        history.append({"step": step, "reward": float(scored.rewards.mean()), "grad_norm": update.grad_norm,
                        **update.metrics})
        print(f"step {step}: reward {history[-1]['reward']:.3f}, grad norm {update.grad_norm:.4f}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.steps, seed=args.seed)
