"""Your own on-policy distillation loop for a text model: the student samples, a teacher scores each
sampled token, and the student learns from the per-token reverse KL as its advantage (cosmos-rl's
``[distillation]`` with ``top_k = 0``; verl / NeMo-RL's on-policy distillation). One process, models
built in memory, no folder on disk.

    python examples/distill_text_loop.py          # tiny random Qwen3 student and teacher on CPU

The task is ``examples/grpo_text_loop.py``'s ("a + b =" -> the sum's digit), but no reward: a teacher
that was shown the right digits scores the student's answers. The student's warm-up shows it only the
answer's form (random digits). What the loop reports each step is the token mean of the sampled
reverse KL ``log p_student(y) - log p_teacher(y)`` of the student's own tokens; it falls as the
student takes on the teacher's answers (measured, ``--seed`` 0: see tests/test_distill_text_loop.py).

Swap the tiny models for ``AutoModelForCausalLM.from_pretrained(...)`` (the teacher must share the
student's tokenizer) and the sums for your prompts. Add a reward by passing its group advantages as
``advantages`` to ``distillation_advantages``.
"""

from __future__ import annotations

import argparse
import random

import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.distillation import distillation_advantages, reverse_kl_per_token
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts
from cosmos_primitives.policy.teacher import teacher_logprobs

SUMS = [(f"{a} + {b} =", str(a + b)) for a in range(3) for b in range(3)]


def main(steps: int = 15, rollout_batch_size: int = 8, seed: int = 0) -> list[dict[str, float]]:
    cp.utils.seed_everything(seed)
    tokenizer = cp.testing.qwen_tokenizer()
    teacher = cp.testing.tiny_qwen3(seed=seed + 1)
    cp.policy.sft_warmup(teacher, tokenizer, [(p, f" {a}") for p, a in SUMS * 6], steps=40, lr=1e-2)
    teacher.eval()
    student = cp.testing.tiny_qwen3(seed=seed)
    digits = random.Random(seed)  # the student is shown the form " <digit>", not the sums
    cp.policy.sft_warmup(student, tokenizer, [(p, f" {digits.randint(0, 4)}") for p, _ in SUMS * 4], steps=30, lr=1e-2)
    cfg = cp.load_config(None, ["grpo.num_samples_per_prompt=4", "rollout.max_response_length=3",
                                "train.optm_lr=5e-3", f"train.train_policy.mini_batch={rollout_batch_size * 4}"])
    policy = cp.policy.build_policy(cfg.policy, hf_model=student)
    engine = cp.rollout.HFRolloutEngine(student, tokenizer)
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    settings = cp.policy.GRPOUpdateSettings.from_config(cfg)  # what grpo_update reads of the config
    rng = torch.Generator().manual_seed(seed)
    history = []
    for step in range(1, steps + 1):
        picked = torch.randint(0, len(SUMS), (rollout_batch_size,), generator=rng).tolist()
        prompts = [Prompt(conversation=SUMS[i][0], reference=SUMS[i][1]) for i in picked]
        groups = engine.generate(prompts, SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt,
                                                                     seed=step))
        batch = collate_rollouts(groups, tokenizer)
        scores = teacher_logprobs(teacher, batch)  # [N, T]: the teacher's log-prob of each sampled token
        divergence = reverse_kl_per_token(batch.rollout_logprobs, scores)
        advantages, metrics = distillation_advantages(divergence, batch.completion_mask)
        update = cp.policy.grpo_update(policy, None, optimizer, batch, advantages, settings, step=step)
        history.append({"step": step, "teacher_kl": float(metrics["teacher_kl"]), "grad_norm": update.grad_norm})
        print(f"step {step}: reverse KL to the teacher {history[-1]['teacher_kl']:.3f}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.steps, seed=args.seed)
