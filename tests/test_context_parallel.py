"""Context parallel (Ulysses) for the VLM / LM policy: 2 and 4 gloo processes against one process.

A packed Qwen2.5-VL batch (a video sample, an image sample and a text sample in two rows, mRoPE
position ids, length not a multiple of the cp size) and a packed Qwen2 text batch go through
``CausalLMPolicy(cp_group=...)``; every rank must return the single-process log-probs and entropy,
the same loss, and (after summing over the cp group) the same gradients. The fused SFT loss path
(``loss_weights``) is checked the same way. Tolerance: 1e-5 absolute on float32 log-probs / losses,
1e-4 relative + 1e-5 absolute on gradients (sums in a different order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.algo.sft_loss import sft_token_weights
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.packing import collate_packed
from cosmos_primitives.data.qwen_vl_encoding import encode_conversation
from cosmos_primitives.policy.lm_policy import CausalLMPolicy
from test_data_packing import IMAGE_CONV, PAD, TEXT_CONV, VIDEO_CONV
from test_fsdp_policy import rank_batches

pytestmark = pytest.mark.slow

WATCHED = ("embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.1.self_attn.k_proj.weight",
           "layers.1.mlp.down_proj.weight", "visual.blocks.0.attn.qkv.weight")


def _loss(out, batch) -> torch.Tensor:
    """The same scalar on every rank: mean log-prob of trained tokens plus a small entropy bonus."""
    trained = (batch["labels"] != -100).float()
    return -(out.logprobs * trained).sum() / trained.sum() - 0.01 * (out.entropy * trained).sum() / trained.sum()


def _run(policy, batch, group=None) -> dict:
    out = cp.policy.token_logprobs(policy, batch, with_entropy=True)
    loss = _loss(out, batch)
    loss.backward()
    if group is not None:
        from cosmos_primitives.parallel.context_parallel import all_reduce_context_parallel_grads

        all_reduce_context_parallel_grads(policy, group)
    grads = {w: p.grad.detach().clone() for n, p in policy.hf_model.named_parameters()
             for w in WATCHED if n.endswith(w) and p.grad is not None}
    policy.zero_grad()
    weights = sft_token_weights(batch["labels"])
    fused = cp.policy.token_logprobs(policy, batch, loss_weights=weights)
    fused.weighted_sum.backward()
    if group is not None:
        all_reduce_context_parallel_grads(policy, group)
    fused_grads = {w: p.grad.detach().clone() for n, p in policy.hf_model.named_parameters()
                   for w in WATCHED if n.endswith(w) and p.grad is not None}
    policy.zero_grad()
    return {"logprobs": out.logprobs.detach(), "entropy": out.entropy.detach(), "loss": float(loss.detach()),
            "grads": grads, "fused_loss": float(fused.weighted_sum), "fused_grads": fused_grads}


def _worker(model_dirs: dict[str, str], batch_files: dict[str, str]) -> dict:
    import torch.distributed as dist

    results = {}
    for name, model_dir in model_dirs.items():
        hf = cp.policy.load_hf_model(model_dir, dtype="float32")
        policy = CausalLMPolicy(hf, chunk_size=16, cp_group=dist.group.WORLD)
        results[name] = _run(policy, torch.load(batch_files[name]), group=dist.group.WORLD)
    return results


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_vl_dir: Path, tiny_qwen2_dir: Path, tiny_vl_processor):
    spec = MRopeSpec.from_config(cpt.tiny_qwen2_5_vl(seed=0).config)
    video = np.stack([cpt.frame_index_pattern(i, (56, 84)) for i in range(6)])
    samples = [encode_conversation(tiny_vl_processor, VIDEO_CONV, mrope=spec, videos=[video], video_fps=[2.0]),
               encode_conversation(tiny_vl_processor, IMAGE_CONV, mrope=spec, images=[cpt.color_image("red")]),
               encode_conversation(tiny_vl_processor, TEXT_CONV, mrope=spec)]
    vl_batch = collate_packed([[samples[0]], [samples[1], samples[2]]], PAD)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 3000, (2, 23), generator=g)
    positions = torch.cat([torch.arange(9), torch.arange(14)]).expand(2, -1).clone()
    labels = ids.clone()
    labels[:, [0, 9]] = -100  # first token of each packed sample
    labels[1, 15:] = -100
    text_batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
    folder = tmp_path_factory.mktemp("cp_batches")
    files = {}
    for name, batch in (("vl", vl_batch), ("text", text_batch)):
        files[name] = str(folder / f"{name}.pt")
        torch.save(batch, files[name])
    dirs = {"vl": str(tiny_vl_dir), "text": str(tiny_qwen2_dir)}
    reference = {}
    for name in dirs:
        policy = CausalLMPolicy(cp.policy.load_hf_model(dirs[name], dtype="float32"), chunk_size=16)
        reference[name] = _run(policy, torch.load(files[name]))
    assert vl_batch["input_ids"].shape[1] % 4 != 0 or text_batch["input_ids"].shape[1] % 4 != 0  # padding runs
    return dirs, files, reference


@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_matches_one_process(setup, cp_size: int) -> None:
    dirs, files, reference = setup
    per_rank = cpt.run_distributed(_worker, cp_size, (dirs, files), timeout_s=400)
    for name, ref in reference.items():
        assert ref["grads"], name
        if name == "vl":
            assert "visual.blocks.0.attn.qkv.weight" in ref["grads"]
        for rank, result in enumerate(per_rank):
            got = result[name]
            where = f"{name} cp={cp_size} rank {rank}"
            torch.testing.assert_close(got["logprobs"], ref["logprobs"], atol=1e-5, rtol=0, msg=where)
            torch.testing.assert_close(got["entropy"], ref["entropy"], atol=1e-5, rtol=0, msg=where)
            assert abs(got["loss"] - ref["loss"]) < 1e-5, where
            assert abs(got["fused_loss"] - ref["fused_loss"]) < 1e-5, where
            for key in ("grads", "fused_grads"):
                assert got[key].keys() == ref[key].keys(), where
                for w, g in ref[key].items():
                    torch.testing.assert_close(got[key][w], g, rtol=1e-4, atol=1e-5, msg=f"{where} {key} {w}")


def _fsdp_cp_worker(text_dir: str) -> dict:
    from torch.distributed.tensor import DTensor

    from cosmos_primitives.algo.sft_loss import sft_loss
    from cosmos_primitives.config.policy import ParallelismConfig, PolicyConfig

    parallelism = ParallelismConfig(dp_shard_size=2, cp_size=2)
    mesh = cp.parallel.ParallelMesh(parallelism, device_type="cpu")
    policy = cp.policy.build_policy(PolicyConfig(model_name_or_path=text_dir, dtype="float32",
                                                 parallelism=parallelism), mesh)
    batch = rank_batches()[mesh.dp_rank]
    out = cp.policy.token_logprobs(policy, batch)
    loss, stats = sft_loss(out.logprobs, batch["labels"], group=mesh.group("dp"))
    loss.backward()
    norm = float(cp.parallel.clip_grad_norm_(policy.parameters(), 1e9))
    grads = {w: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
             for n, p in policy.hf_model.named_parameters() for w in WATCHED if n.endswith(w)}
    return {"loss": float(stats["loss"]), "norm": norm, "grads": grads, "dp_rank": mesh.dp_rank}


def test_fsdp_times_context_parallel_matches_one_process(tiny_qwen2_dir: Path) -> None:
    """dp_shard=2 x cp=2 on 4 ranks: the global token-mean SFT loss, gradient norm and gradients of
    one process training on both batches."""
    policy = CausalLMPolicy(cp.policy.load_hf_model(tiny_qwen2_dir, dtype="float32"), chunk_size=16)
    batches = rank_batches()
    total = sum(int((b["labels"] != -100).sum()) for b in batches)
    loss = sum(-(cp.policy.token_logprobs(policy, b).logprobs * (b["labels"] != -100)).sum() for b in batches) / total
    loss.backward()
    ref_grads = {w: p.grad for n, p in policy.hf_model.named_parameters() for w in WATCHED if n.endswith(w)}
    ref_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in policy.parameters()])))
    per_rank = cpt.run_distributed(_fsdp_cp_worker, 4, (str(tiny_qwen2_dir),), timeout_s=400)
    assert sorted(r["dp_rank"] for r in per_rank) == [0, 0, 1, 1]
    for rank, got in enumerate(per_rank):
        assert abs(got["loss"] - float(loss.detach())) < 1e-5, rank
        assert abs(got["norm"] - ref_norm) < 1e-4 * ref_norm, (rank, got["norm"], ref_norm)
        for w, g in ref_grads.items():
            torch.testing.assert_close(got["grads"][w], g, rtol=1e-4, atol=1e-5, msg=f"rank {rank} {w}")


def _padded_vl_batch(processor) -> dict:
    """Two right-padded Qwen2.5-VL prompts with an image each, as the processor returns them: an
    ``attention_mask`` and ``mm_token_type_ids``, no ``position_ids``; 34 tokens, a multiple of 2."""
    def conversation(question: str) -> list:
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]

    texts = [processor.apply_chat_template(conversation(q), tokenize=False, add_generation_prompt=True)
             for q in ("Which colour?", "Which colour is this small square, please?")]
    batch = dict(processor(text=texts, images=[cpt.color_image("red"), cpt.color_image("blue")], padding=True,
                           return_tensors="pt"))
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return batch


def _padded_worker(model_dir: str, batch_file: str) -> dict:
    import torch.distributed as dist

    from cosmos_primitives.policy.lm_policy import backbone_of

    policy = CausalLMPolicy(cp.policy.load_hf_model(model_dir, dtype="float32"), chunk_size=16,
                            cp_group=dist.group.WORLD)
    given: list[list[str]] = []
    backbone_of(policy.hf_model).register_forward_pre_hook(
        lambda module, args, kwargs: given.append(sorted(k for k, v in kwargs.items() if v is not None)),
        with_kwargs=True)
    out = cp.policy.token_logprobs(policy, torch.load(batch_file))
    return {"logprobs": out.logprobs.detach(), "backbone_inputs": given[0]}


def test_padded_vl_batch_without_position_ids_keeps_its_masks(tiny_vl_dir: Path, tiny_vl_processor, tmp_path) -> None:
    """Regression (commit 8964077): a padded batch whose length is already a multiple of the cp size
    needs no padding, and its attention_mask / mm_token_type_ids used to be dropped then; without
    mm_token_type_ids Qwen2.5-VL numbers the image tokens as text, so the log-probs differed from one
    process. Tolerance 1e-5 absolute (float32)."""
    batch = _padded_vl_batch(tiny_vl_processor)
    assert batch["input_ids"].shape[1] % 2 == 0 and "position_ids" not in batch
    assert (batch["attention_mask"] == 0).any()
    policy = CausalLMPolicy(cp.policy.load_hf_model(tiny_vl_dir, dtype="float32"), chunk_size=16)
    reference = cp.policy.token_logprobs(policy, batch).logprobs.detach()
    torch.save(batch, tmp_path / "batch.pt")
    per_rank = cpt.run_distributed(_padded_worker, 2, (str(tiny_vl_dir), str(tmp_path / "batch.pt")), timeout_s=400)
    scored = batch["labels"] != -100
    for rank, got in enumerate(per_rank):
        torch.testing.assert_close(got["logprobs"][scored], reference[scored], atol=1e-5, rtol=0, msg=f"rank {rank}")
        assert {"attention_mask", "mm_token_type_ids"} <= set(got["backbone_inputs"]), (rank, got["backbone_inputs"])
