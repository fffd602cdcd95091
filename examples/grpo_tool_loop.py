"""Your own tool-use GRPO loop: the model decides whether to call a tool, in Qwen's format (the
``<tool_call>`` token); an async environment runs the tool (a plain Python callable) and answers with
a ``<tool_response>`` turn (``QWEN_TOOL_REPLY``); the model then answers. Only the model's tokens are
trained: the tool response is context (``loss_mask`` 0), as ``cp.rollout.multi_turn.run_episodes`` builds it.

    python examples/grpo_tool_loop.py          # a tiny random Qwen3 on CPU, 20 steps

The task: "k3 =" asks for the digit stored under key 3 of a table drawn afresh for every prompt, so
the prompt lacks the fact and only the tool (``lookup``) knows it. An answer without a call is right by
chance (1 in 5); with a call, the digit is in the tool response and the model has to copy it. Reward:
1 for the right final digit, 0 otherwise, less ``CALL_COST`` per call, so both "call the tool" and
"use its answer" have to be learned by GRPO. The warm-up shows only the forms (a direct answer; a call,
a response and an answer), with random digits that do not match the response.

Measured (``--seed`` 0, 20 steps, the CPU test's setting), first five steps -> last five: mean reward
0.116 -> 0.275, call rate 0.034 -> 0.004, "called and answered right" 0.006 -> 0.000
(the reward ends near a direct guess's 1 in 5). It does NOT learn
the tool yet: the call rate after the warm-up is low (~0.12 at step 1) and, as an answer after a tool
response is no more often right than a direct guess until copying is learned, GRPO drives calls to zero;
with ``CALL_COST`` 0.05 the same collapse happens faster. tests/test_grpo_tool_loop.py states the target
and is marked xfail (strict) until it does.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import torch

import cosmos_primitives as cp
from cosmos_primitives.data import Prompt, SamplingParams, collate_rollouts
from cosmos_primitives.rollout.multi_turn import QWEN_TOOL_REPLY, EnvReply, Episode, episode_rewards, run_episodes

CALL = "<tool_call>"  # one special token in the Qwen tokenizer
CALL_COST = 0.0
DIGITS = 5


def lookup(table: list[int], key: int) -> str:
    """The tool: the fact the prompt lacks."""
    return str(table[key])


def grade(answer: str, right: int) -> float:
    """1 for the right digit alone, 0 otherwise."""
    answer = answer.strip()
    return 1.0 if answer.isdigit() and len(answer) == 1 and int(answer) == right else 0.0


def make_env(tool_works: bool = True):
    """The async environment: a call gets the tool's output; anything else is graded as the answer."""
    async def env(episode: Episode) -> EnvReply:
        table, key = episode.prompt.row["table"], episode.prompt.row["key"]
        turn = episode.turns[-1]
        if CALL in turn and len(episode.turns) == 1:
            await asyncio.sleep(0)  # a real tool would await I/O here
            text = lookup(table, key) if tool_works else "unavailable"
            return EnvReply(text=text, reward=-CALL_COST, done=False)
        return EnvReply(reward=grade(turn, table[key]), done=True)
    return env


def main(steps: int = 20, prompts_per_step: int = 8, seed: int = 0, tool_works: bool = True) -> list[dict[str, float]]:
    cp.utils.seed_everything(seed)
    model, tokenizer = cp.testing.tiny_qwen3(seed=seed), cp.testing.qwen_tokenizer()
    noise = random.Random(seed)  # the warm-up shows the forms, never a right answer on purpose
    forms = []
    for key in range(DIGITS):
        forms += [(f" k{key} =", f" {noise.randrange(DIGITS)}")] + [(f" k{key} =", CALL)] * 3
        for _ in range(3):
            reply = QWEN_TOOL_REPLY.format(text=noise.randrange(DIGITS))
            forms.append((f" k{key} ={CALL}{tokenizer.eos_token}{reply}", f" {noise.randrange(DIGITS)}"))
    cp.policy.sft_warmup(model, tokenizer, forms, steps=40, lr=1e-2)
    cfg = cp.load_config(None, ["grpo.num_samples_per_prompt=8", "rollout.max_response_length=2",
                                "train.optm_lr=5e-3", f"train.train_policy.mini_batch={prompts_per_step * 8}"])
    policy = cp.policy.build_policy(cfg.policy, hf_model=model)
    engine = cp.rollout.HFRolloutEngine(model, tokenizer)
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    settings = cp.policy.GRPOUpdateSettings.from_config(cfg)
    rng, env = torch.Generator().manual_seed(seed), make_env(tool_works)
    history = []
    for step in range(1, steps + 1):
        keys = torch.randint(0, DIGITS, (prompts_per_step,), generator=rng).tolist()
        tables = torch.randint(0, DIGITS, (prompts_per_step, DIGITS), generator=rng).tolist()
        prompts = [Prompt(conversation=f" k{k} =", row={"key": k, "table": t}) for k, t in zip(keys, tables)]
        params = SamplingParams.from_config(cfg.rollout, cfg.grpo.num_samples_per_prompt, seed=step)
        groups = run_episodes(engine, tokenizer, prompts, params, env, max_turns=2, reply_template=QWEN_TOOL_REPLY)
        rewards = torch.tensor(episode_rewards(groups))
        advantages = cp.algo.compute_advantages(rewards, cfg=cfg.grpo)
        update = cp.policy.grpo_update(policy, None, optimizer, collate_rollouts(groups, tokenizer), advantages,
                                       settings, step=step)
        done = [c for g in groups for c in g.completions]
        called_right = [len(c.turn_rewards) == 2 and c.turn_rewards[1] == 1.0 for c in done]
        called = [len(c.turn_rewards) == 2 for c in done]
        history.append({"step": step, "reward": float(rewards.mean()), "grad_norm": update.grad_norm,
                        "call_rate": sum(called) / len(done), "call_and_right_rate": sum(called_right) / len(done)})
        h = history[-1]
        print(f"step {step}: reward {h['reward']:.3f}, calls {h['call_rate']:.2f},"
              f" called and right {h['call_and_right_rate']:.2f}, grad norm {update.grad_norm:.4f}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tool", action="store_true", help="the tool answers 'unavailable' (a control)")
    args = parser.parse_args()
    main(args.steps, seed=args.seed, tool_works=not args.no_tool)
