"""Your own GRPO loop for a text model, from library calls: one process, a model built in memory, no
folder on disk, no mesh or process group.

    python examples/grpo_text_loop.py            # a tiny random Qwen3 on CPU, a few seconds per step

Swap ``cp.testing.tiny_qwen3()`` / ``qwen_tokenizer()`` for
``AutoModelForCausalLM.from_pretrained(...)`` / ``AutoTokenizer.from_pretrained(...)``, and the
sums for your prompts: a plain string is used as it is, a list of chat messages goes through the
tokenizer's chat template. The recipes (``examples/grpo_vlm.py``) add sharding, checkpoints,
validation and logging around the same calls.
"""

from __future__ import annotations

import argparse

import torch

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts


def reward_sum(completion: str, reference: str) -> float:
    """1 for the right sum; a wrong answer loses a little per character, so that even a random
    model's completions differ in reward (GRPO learns from differences within a group)."""
    return 1.0 if completion.strip() == reference else -0.01 * len(completion)


def main(steps: int = 5, prompts_per_step: int = 4, seed: int = 0) -> list[dict[str, float]]:
    cp.utils.seed_everything(seed)
    model, tokenizer = cp.testing.tiny_qwen3(seed=seed), cp.testing.qwen_tokenizer()
    cfg = cp.load_config(None, ["grpo.num_samples_per_prompt=4", "rollout.max_response_length=6",
                                "train.optm_lr=1e-3", "train.train_policy.mini_batch=16"])
    policy = cp.policy.build_policy(cfg.policy, hf_model=model)  # trainable, CausalLMPolicy over `model`
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)  # the same module: it always sees the new weights
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    rewards = cp.rewards.RewardSet({"sum": 1.0}, functions={"sum": reward_sum})
    rng = torch.Generator().manual_seed(seed)
    history = []
    for step in range(1, steps + 1):
        sums = torch.randint(0, 50, (prompts_per_step, 2), generator=rng).tolist()
        prompts = [Prompt(conversation=f"{a} + {b} =", reference=str(a + b)) for a, b in sums]
        groups = engine.generate(prompts, SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt,
                                                                     seed=step))
        scored = cp.rewards.score_groups(groups, rewards, cfg.grpo, cfg.rollout.max_response_length)
        batch = collate_rollouts(groups, tokenizer)
        update = cp.policy.grpo_update(policy, None, optimizer, batch, scored.advantages, cfg, step=step)
        history.append({"step": step, "reward": float(scored.rewards.mean()), "grad_norm": update.grad_norm,
                        **update.metrics})
        print(f"step {step}: reward {history[-1]['reward']:.3f}, grad norm {update.grad_norm:.4f}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    main(parser.parse_args().steps)
