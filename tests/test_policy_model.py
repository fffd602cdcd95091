"""cp.policy on one process: loading, dtypes, freeze patterns, log-probs vs the HF model, SFT loss
gradients vs HF's own loss (tied embeddings included), gradient checkpointing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.sft_objective import sft_loss
from cosmos_primitives.config.policy import PolicyConfig
from cosmos_primitives.testing.tokenizer import IMAGE_PAD_ID, VISION_END_ID, VISION_START_ID


def text_batch(seed: int = 0, batch: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 5000, (batch, length), generator=g)
    labels = ids.clone()
    labels[:, : length // 3] = -100
    return {"input_ids": ids, "labels": labels}


def image_batch(seed: int = 0, patch_size: int = 14, token_types: bool = False) -> dict[str, torch.Tensor]:
    """One image of 4x4 patches (56x56 at Qwen2.5-VL's 14 px, 64x64 at Qwen3-VL's ``patch_size=16``;
    4 merged tokens) inside a short prompt + answer; ``token_types`` adds the ``mm_token_type_ids``
    (1 = image token) Qwen3-VL's mRoPE needs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([
        torch.randint(0, 5000, (3,), generator=g),
        torch.tensor([VISION_START_ID, *[IMAGE_PAD_ID] * 4, VISION_END_ID]),
        torch.randint(0, 5000, (6,), generator=g),
    ])[None]
    labels = ids.clone()
    labels[:, :10] = -100
    batch = {
        "input_ids": ids,
        "labels": labels,
        "pixel_values": torch.randn(16, 3 * 2 * patch_size * patch_size, generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 4]]),
    }
    if token_types:
        batch["mm_token_type_ids"] = (ids == IMAGE_PAD_ID).int()
    return batch


def hf_reference_logprobs(hf_model, batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = hf_model(**inputs, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def test_load_dtype_and_clear_errors(tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    model = cp.policy.load_hf_model(tiny_qwen2_dir, dtype="bfloat16")
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert {p.dtype for p in cp.policy.load_hf_model(tiny_qwen2_dir, dtype="float32").parameters()} == {torch.float32}
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        cp.policy.load_hf_model(tmp_path)
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        cp.policy.load_hf_model(tiny_qwen2_dir, dtype="fp8")


def test_one_loader_serves_training_and_evaluation(tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    """Evaluation loads through cp.policy's loader: no second load_hf_model / load_processor under cp.eval."""
    assert not hasattr(cp.eval, "load_hf_model") and not hasattr(cp.eval, "load_processor")
    assert cp.policy.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert cp.policy.resolve_dtype("auto", torch.device("cpu")) == cp.policy.resolve_dtype("auto") == torch.float32
    engine = cp.eval.load_eval_engine(str(tiny_qwen2_dir), dtype="auto", device="cpu")
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32} and not engine.model.training
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        cp.policy.load_processor(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        cp.eval.load_eval_engine(tmp_path)


def test_vision_language_folder_loads_the_vl_class(tiny_vl_dir: Path) -> None:
    model = cp.policy.load_hf_model(tiny_vl_dir, dtype="float32")
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert cp.policy.is_vision_language(model.config)


def test_freeze_and_trainable_patterns(tiny_vl_model) -> None:
    visual = sum(p.numel() for n, p in tiny_vl_model.named_parameters() if n.startswith("model.visual."))
    total = sum(p.numel() for p in tiny_vl_model.parameters())
    summary = cp.policy.apply_trainable_patterns(tiny_vl_model, freeze_patterns=[r"^model\.visual\."])
    assert summary.frozen_params == visual and summary.trainable_params == total - visual
    assert not any(p.requires_grad for n, p in tiny_vl_model.named_parameters() if ".visual." in n)
    assert "trainable params" in str(summary)

    # only the attention projections train, and freezing wins over trainable
    summary = cp.policy.apply_trainable_patterns(
        tiny_vl_model, trainable_patterns=[r"self_attn\.[qkvo]_proj"], freeze_patterns=[r"layers\.1\."]
    )
    trainable = {n for n, p in tiny_vl_model.named_parameters() if p.requires_grad}
    assert trainable and all("self_attn" in n and "layers.0." in n for n in trainable)
    assert summary.trainable_params == sum(p.numel() for n, p in tiny_vl_model.named_parameters() if n in trainable)

    with pytest.raises(ValueError, match=r"freeze_patterns: pattern '\^visual\\\.' matches no parameter"):
        cp.policy.apply_trainable_patterns(tiny_vl_model, freeze_patterns=[r"^visual\."])
    with pytest.raises(ValueError, match="invalid regular expression"):
        cp.policy.apply_trainable_patterns(tiny_vl_model, trainable_patterns=["("])


def test_text_logprobs_entropy_and_sft_gradients_match_hf(tiny_qwen2_dir: Path) -> None:
    cfg = PolicyConfig(model_name_or_path=str(tiny_qwen2_dir), dtype="float32", logprob_chunk_size=5)
    policy = cp.policy.build_policy(cfg)
    hf = policy.hf_model
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    batch = text_batch()
    out = cp.policy.token_logprobs(policy, batch, with_entropy=True)
    scored = batch["labels"] != -100
    scored[:, 0] = False
    reference = hf_reference_logprobs(hf, batch)
    torch.testing.assert_close(out.logprobs[scored], reference[scored], atol=1e-5, rtol=1e-5)
    assert torch.all(out.logprobs[~scored] == 0) and torch.all(out.entropy[~scored] == 0)
    assert torch.all(out.entropy[scored] > 0)

    loss, stats = sft_loss(out.logprobs, batch["labels"])
    loss.backward()
    ours = {n: p.grad.clone() for n, p in hf.named_parameters()}
    hf.zero_grad()
    hf_loss = hf(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss
    hf_loss.backward()
    torch.testing.assert_close(stats["loss"], hf_loss.detach(), atol=1e-5, rtol=1e-5)
    assert stats["tokens"] == scored.sum()
    for name, param in hf.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_vl_logprobs_with_an_image_match_hf(tiny_vl_dir: Path) -> None:
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=str(tiny_vl_dir), dtype="float32"))
    batch = image_batch()
    out = cp.policy.token_logprobs(policy, batch)
    reference = hf_reference_logprobs(policy.hf_model, batch)
    torch.testing.assert_close(out.logprobs[:, 10:], reference[:, 10:], atol=1e-5, rtol=1e-5)
    # the same positions through the plain HF model (no wrapper)
    torch.testing.assert_close(cp.policy.token_logprobs(policy.hf_model, batch).logprobs, out.logprobs)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_qwen2_dir: Path) -> None:
    grads = []
    for checkpointing in (False, True):
        cfg = PolicyConfig(model_name_or_path=str(tiny_qwen2_dir), dtype="float32",
                           model_gradient_checkpointing=checkpointing)
        policy = cp.policy.build_policy(cfg)
        blocks = [m for m in policy.hf_model.modules() if type(m).__name__ == "Qwen2DecoderLayer"]
        assert blocks and all(b.gradient_checkpointing is checkpointing for b in blocks)
        batch = text_batch(seed=3)
        sft_loss(cp.policy.token_logprobs(policy, batch).logprobs, batch["labels"])[0].backward()
        grads.append(policy.hf_model.model.layers[0].mlp.up_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_bfloat16_policy_without_mesh(tiny_qwen2_dir: Path) -> None:
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=str(tiny_qwen2_dir), dtype="bfloat16"))
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    out = cp.policy.token_logprobs(policy, text_batch())
    assert out.logprobs.dtype == torch.float32 and torch.isfinite(out.logprobs).all()


def test_build_policy_needs_a_model_and_takes_lora_on_a_text_model(tiny_qwen2_model) -> None:
    # (a copy: build_policy adds the adapters to the model it is given)
    policy = cp.policy.build_policy(PolicyConfig(dtype="float32", lora=cp.config.LoraConfig(r=2)),
                                    hf_model=copy.deepcopy(tiny_qwen2_model))
    trainable = [n for n, p in policy.hf_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert not cp.policy.has_lora(tiny_qwen2_model) and cp.policy.has_lora(policy.hf_model)
    with pytest.raises(ValueError, match="model_name_or_path is empty"):
        cp.policy.build_policy(PolicyConfig())


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.linear(x))


def test_activation_checkpointing_of_plain_modules_recomputes_blocks() -> None:
    grads, calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(_Block(), _Block(), torch.nn.Linear(6, 1))
        if checkpointing:
            assert cp.parallel.apply_activation_checkpointing(model, block_classes=[_Block]) == 2
        model(torch.ones(3, 6)).sum().backward()
        grads.append(model[0].linear.weight.grad)
        calls.append(model[0].calls)
    torch.testing.assert_close(grads[0], grads[1])
    assert calls == [1, 2]  # forward once, plus once more in backward when checkpointed
    with pytest.raises(ValueError, match="declares no transformer block classes"):
        cp.parallel.find_blocks(torch.nn.Linear(2, 2))
