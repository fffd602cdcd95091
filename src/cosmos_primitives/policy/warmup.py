"""``sft_warmup``: a few supervised steps on (prompt, answer) text pairs, for a user's own loop.

RL learns from differences between a group's completions; a random or untuned model whose
completions never come near the answer's format gives it none. A short warm-up on pairs that show
the format (or the answers) first is what the recipes do with ``examples/sft.py``; this is the
same in a few lines for a model held in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def sft_warmup(model: torch.nn.Module, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, steps: int,
               lr: float = 1e-3, batch_size: int = 16, seed: int = 0) -> list[float]:
    """Train ``model`` in place to continue each prompt with its answer and the end-of-text token.

    Each step draws ``batch_size`` pairs (with replacement, from ``seed``), tokenizes
    ``prompt + answer + eos`` as the rollout engine sees a plain-text prompt (no chat template),
    and takes one AdamW step on the token-mean negative log-likelihood of the answer and eos tokens
    (the prompt's tokens are not trained).

    Args:
        model: a causal LM returning ``.logits`` ``[B, T, V]`` (a HF model; the module a
            ``cp.policy.CausalLMPolicy`` wraps, so the policy sees the new weights).
        tokenizer: its tokenizer; ``eos_token_id`` ends each answer.
        pairs: ``(prompt, answer)`` texts; the answer is appended to the prompt as it is (include a
            leading space if the model should write one).
        steps: optimizer steps.

    Returns:
        the loss (mean NLL per answer token) of each step.
    """
    if not pairs:
        raise ValueError("sft_warmup needs at least one (prompt, answer) pair")
    if tokenizer.eos_token_id is None:
        raise ValueError("sft_warmup: the tokenizer has no eos_token_id to end the answers with; set one")
    device = next(model.parameters()).device
    encoded = []
    for prompt, answer in pairs:
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = [*tokenizer(answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        encoded.append((prompt_ids, answer_ids))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.train()
    losses = []
    for _ in range(steps):
        rows = [encoded[i] for i in torch.randint(0, len(encoded), (batch_size,), generator=rng).tolist()]
        length = max(len(p) + len(a) for p, a in rows)
        input_ids = torch.full((len(rows), length), tokenizer.pad_token_id or 0, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        labels = torch.full_like(input_ids, -100)
        for r, (p, a) in enumerate(rows):  # right-padded: positions count from 0 in every row
            input_ids[r, :len(p) + len(a)] = torch.tensor(p + a)
            attention_mask[r, :len(p) + len(a)] = 1
            labels[r, len(p):len(p) + len(a)] = torch.tensor(a)
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 labels[:, 1:].flatten().to(device), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.train(was_training)
    return losses
