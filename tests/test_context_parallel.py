"""Context parallel (Ulysses) for the VLM / LM policy: 2 and 4 gloo processes against one process.

A packed Qwen2.5-VL batch encoded by its processor (a video sample, an image sample and a text sample
in two rows, mRoPE position ids, length not a multiple of the cp size) and a packed Qwen2 text batch
go through ``CausalLMPolicy(cp_group=...)``; every rank must return the single-process log-probs and
entropy, the same loss, and (after summing over the cp group) the same gradients. The fused SFT loss
path (``loss_weights``) is checked the same way. Both VL families (Qwen2.5-VL, Qwen3-VL with its
deepstack features) are checked on batches built directly as tensors: packed media rows with the
model's own mRoPE positions, an image row beside a text-only row without position ids, and text-only
rows with nothing but ``input_ids``. The attention function alone is checked with grouped KV heads (8
query / 4 KV heads: two per rank; 6 / 3: KV heads that do not split). Tolerance: 1e-5 absolute on
float32 log-probs / losses, 1e-4 relative + 1e-5 absolute on gradients (sums in a different order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.algo.sft_objective import sft_token_weights
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.packing import collate_packed
from cosmos_primitives.data.qwen_vl_encoding import encode_conversation
from cosmos_primitives.policy.lm_policy import CausalLMPolicy
from cosmos_primitives.testing.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID, VISION_END_ID, VISION_START_ID
from test_data_packing import IMAGE_CONV, PAD, TEXT_CONV, VIDEO_CONV
from test_fsdp_policy import rank_batches

WATCHED = ("embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.1.self_attn.k_proj.weight",
           "layers.1.mlp.down_proj.weight", "visual.blocks.0.attn.qkv.weight",
           "visual.deepstack_merger_list.0.linear_fc2.weight")


def _loss(out, batch) -> torch.Tensor:
    """The same scalar on every rank: mean log-prob of trained tokens plus a small entropy bonus."""
    trained = (batch["labels"] != -100).float()
    return -(out.logprobs * trained).sum() / trained.sum() - 0.01 * (out.entropy * trained).sum() / trained.sum()


def _run(policy, batch, group=None, fused: bool = True) -> dict:
    """Log-probs, entropy, loss and watched gradients of ``batch``; with ``fused``, also the fused SFT loss
    (``loss_weights``) and its gradients."""
    from cosmos_primitives.parallel.context_parallel import all_reduce_context_parallel_grads

    def watched_grads() -> dict[str, torch.Tensor]:
        if group is not None:
            all_reduce_context_parallel_grads(policy, group)
        grads = {w: p.grad.detach().clone() for n, p in policy.hf_model.named_parameters()
                 for w in WATCHED if n.endswith(w) and p.grad is not None}
        policy.zero_grad()
        return grads

    out = cp.policy.token_logprobs(policy, batch, with_entropy=True)
    loss = _loss(out, batch)
    loss.backward()
    result = {"logprobs": out.logprobs.detach(), "entropy": out.entropy.detach(), "loss": float(loss.detach()),
              "grads": watched_grads()}
    if fused:
        weighted = cp.policy.token_logprobs(policy, batch, loss_weights=sft_token_weights(batch["labels"]))
        weighted.weighted_sum.backward()
        result.update(fused_loss=float(weighted.weighted_sum.detach()), fused_grads=watched_grads())
    return result


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


@pytest.mark.slow
@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_matches_one_process(setup, cp_size: int) -> None:
    dirs, files, reference = setup
    per_rank = cpt.run_distributed(_worker, cp_size, (dirs, files), timeout_s=400)
    assert "visual.blocks.0.attn.qkv.weight" in reference["vl"]["grads"]
    _assert_matches(reference, per_rank, f"cp={cp_size}")


def _assert_matches(reference: dict[str, dict], per_rank: list[dict], label: str) -> None:
    """Every rank's :func:`_run` results equal the one-process ``reference`` (per batch name)."""
    for name, ref in reference.items():
        # the comparisons below loop over the reference's gradients: each list must hold every watched
        # weight the plain loss reaches, the fused loss's the same ones, and none may be all zeros
        assert ref["grads"] and ref.get("fused_grads", ref["grads"]).keys() == ref["grads"].keys(), name
        for key in ("grads", "fused_grads") if "fused_grads" in ref else ("grads",):
            assert all(bool(g.any()) for g in ref[key].values()), f"{name} {key}"
        for rank, result in enumerate(per_rank):
            got = result[name]
            where = f"{name} {label} rank {rank}"
            torch.testing.assert_close(got["logprobs"], ref["logprobs"], atol=1e-5, rtol=0, msg=where)
            torch.testing.assert_close(got["entropy"], ref["entropy"], atol=1e-5, rtol=0, msg=where)
            assert abs(got["loss"] - ref["loss"]) < 1e-5, where
            assert got.keys() == ref.keys(), where
            if "fused_loss" in ref:
                assert abs(got["fused_loss"] - ref["fused_loss"]) < 1e-5, where
            for key in ("grads", "fused_grads") if "fused_grads" in ref else ("grads",):
                assert got[key].keys() == ref[key].keys(), where
                for w, g in ref[key].items():
                    torch.testing.assert_close(got[key][w], g, rtol=1e-4, atol=1e-5, msg=f"{where} {key} {w}")


def _gqa_inputs(heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    """``q [1, heads, 8, 4]``, ``k`` / ``v [1, kv_heads, 8, 4]`` and a weight for the loss, the same on every rank."""
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q, k, v = (torch.randn(1, h, 8, 4, generator=g) for h in (heads, kv_heads, kv_heads))
    return q, k, v, torch.randn(1, 8, heads, 4, generator=g)


def _gqa_attention_worker(shapes: list[tuple[int, int]]) -> list[dict]:
    from cosmos_primitives.parallel.context_parallel import context_parallel_attention, context_parallel_split

    group = torch.distributed.group.WORLD
    out = []
    for heads, kv_heads in shapes:
        q, k, v, weight = _gqa_inputs(heads, kv_heads)
        with context_parallel_split(group, 8, torch.arange(8)[None]) as split:
            local = [x[:, :, split.local].clone().requires_grad_() for x in (q, k, v)]
            got, _ = context_parallel_attention(torch.nn.Module().eval(), *local, None)
            (got * weight[:, split.local]).sum().backward()
        out.append({"local": split.local, "out": got.detach(), "grads": [x.grad for x in local]})
    return out


def test_ulysses_attention_expands_grouped_kv_heads_per_query_head() -> None:
    """8 query / 4 KV heads at cp = 2 (two KV heads per rank, as a 7B model has) and 6 / 3 (KV heads
    that do not split): each rank's output and input gradients equal one process's GQA attention."""
    shapes = [(8, 4), (6, 3)]
    per_rank = cpt.run_distributed(_gqa_attention_worker, 2, (shapes,), timeout_s=120)
    for i, (heads, kv_heads) in enumerate(shapes):
        q, k, v, weight = (x.requires_grad_() for x in _gqa_inputs(heads, kv_heads))
        group = heads // kv_heads  # query head h reads KV head h // group
        ref = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                             is_causal=True).transpose(1, 2)
        (ref * weight).sum().backward()
        for rank, got in enumerate(r[i] for r in per_rank):
            part = got["local"]
            torch.testing.assert_close(got["out"], ref[:, part].detach(), msg=f"{heads}/{kv_heads} rank {rank}")
            for name, mine, full in zip("qkv", got["grads"], (q.grad, k.grad, v.grad), strict=True):
                torch.testing.assert_close(mine, full[:, :, part], msg=f"{heads}/{kv_heads} rank {rank} d{name}")


def _fsdp_cp_worker(text_dir: str) -> dict:
    from torch.distributed.tensor import DTensor

    from cosmos_primitives.algo.sft_objective import sft_loss
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


@pytest.mark.slow
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


def _padded_vl_batch(processor, question: str) -> dict:
    """Two right-padded VL prompts with an image each (the second asks ``question``), as the processor
    returns them: an ``attention_mask`` and ``mm_token_type_ids``, no ``position_ids``."""
    def conversation(question: str) -> list:
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]

    texts = [processor.apply_chat_template(conversation(q), tokenize=False, add_generation_prompt=True)
             for q in ("Which colour?", question)]
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


# per VL family: (save the tiny model + processor, its processor, a question that makes the batch an
# even length: 34 tokens with Qwen2.5-VL's template, 22 with Qwen3-VL's)
PADDED_FAMILIES = {
    "qwen2_5_vl": (cpt.save_tiny_qwen2_5_vl, cpt.tiny_qwen2_5_vl_processor,
                   "Which colour is this small square, please?"),
    "qwen3_vl": (cpt.save_tiny_qwen3_vl, cpt.tiny_qwen3_vl_processor, "Which colour is this square, please?"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PADDED_FAMILIES))
def test_padded_vl_batch_without_position_ids_keeps_its_masks(family: str, tmp_path) -> None:
    """Regression (commit 8964077): a padded batch whose length is already a multiple of the cp size
    needs no padding, and its attention_mask / mm_token_type_ids used to be dropped then; without
    mm_token_type_ids the model numbers the image tokens as text, so the log-probs differed from one
    process. Both VL families, batches encoded by their own processors (Qwen3-VL: 16-px patches,
    deepstack features on the image tokens). Tolerance 1e-5 absolute (float32)."""
    save, processor_of, question = PADDED_FAMILIES[family]
    model_dir = save(tmp_path / "model")
    batch = _padded_vl_batch(processor_of(), question)
    assert batch["input_ids"].shape[1] % 2 == 0 and "position_ids" not in batch
    assert (batch["attention_mask"] == 0).any()
    policy = CausalLMPolicy(cp.policy.load_hf_model(model_dir, dtype="float32"), chunk_size=16)
    reference = cp.policy.token_logprobs(policy, batch).logprobs.detach()
    torch.save(batch, tmp_path / "batch.pt")
    per_rank = cpt.run_distributed(_padded_worker, 2, (str(model_dir), str(tmp_path / "batch.pt")), timeout_s=400)
    scored = batch["labels"] != -100
    for rank, got in enumerate(per_rank):
        torch.testing.assert_close(got["logprobs"][scored], reference[scored], atol=1e-5, rtol=0, msg=f"rank {rank}")
        assert {"attention_mask", "mm_token_type_ids"} <= set(got["backbone_inputs"]), (rank, got["backbone_inputs"])


VL_FAMILIES = {"qwen2_5_vl": cpt.tiny_qwen2_5_vl, "qwen3_vl": cpt.tiny_qwen3_vl}


def _sample(model, generator: torch.Generator, before: int, after: int, kind: str | None = None,
            grid: tuple[int, int, int] = (1, 4, 4)) -> dict:
    """One sample as the model reads it, built from tensors: ``before`` text tokens, a vision block of
    ``kind`` ("image" / "video"; None: text only) with ``grid`` patches (t, h, w), ``after`` text tokens.

    Returns ``input_ids`` / ``mm_token_type_ids`` ``[L]``, ``position_ids`` ``[4, L]`` (text row 0..L-1,
    then the model's own mRoPE rows from its ``get_rope_index``), ``labels`` ``[L]`` (-100 on the first
    token and the media tokens), ``pixels`` ``[t h w, C]`` (random patches) and ``grid`` when media.
    """
    def text(n: int) -> torch.Tensor:
        return torch.randint(0, 3000, (n,), generator=generator)

    out: dict = {}
    if kind is None:
        ids = text(before + after)
        types = torch.zeros_like(ids)
    else:
        vision = model.config.vision_config
        pad, type_id = (IMAGE_PAD_ID, 1) if kind == "image" else (VIDEO_PAD_ID, 2)
        patches = grid[0] * grid[1] * grid[2]
        ids = torch.cat([text(before), torch.tensor([VISION_START_ID]),
                         torch.full((patches // vision.spatial_merge_size ** 2,), pad),
                         torch.tensor([VISION_END_ID]), text(after)])
        types = (ids == pad).long() * type_id
        width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
        out = {"pixels": torch.randn(patches, width, generator=generator), "grid": torch.tensor([grid])}
    grids = {f"{kind}_grid_thw": out["grid"]} if kind else {}
    mrope, _ = model.model.get_rope_index(ids[None], mm_token_type_ids=types[None], **grids)
    labels = ids.masked_fill(types != 0, -100)
    labels[0] = -100
    return {**out, "kind": kind, "input_ids": ids, "mm_token_type_ids": types, "labels": labels,
            "position_ids": torch.cat([torch.arange(len(ids))[None], mrope[:, 0]])}


def _media_inputs(samples: list[dict]) -> dict:
    """``pixel_values`` / ``image_grid_thw`` (and the video twins) of ``samples`` in batch order."""
    out = {}
    for kind, pixels_key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        chosen = [s for s in samples if s["kind"] == kind]
        if chosen:
            out[pixels_key] = torch.cat([s["pixels"] for s in chosen])
            out[f"{kind}_grid_thw"] = torch.cat([s["grid"] for s in chosen])
    return out


def _vl_batches(model) -> dict[str, dict]:
    """Three batches for ``model`` (a tiny Qwen2.5-VL or Qwen3-VL), lengths not multiples of 4, visual
    runs crossing the cp=2 / cp=4 slice boundaries (tokens 8, 16, 24):

    - ``packed``: two rows of two samples each (image + video, text + image) with 4-row position ids;
    - ``own_positions``: an image row beside a right-padded text-only row, no position ids (the model
      builds its mRoPE positions from ``mm_token_type_ids``);
    - ``text_only``: two text rows with nothing but ``input_ids`` (the model numbers them 0..T-1).
    """
    g = torch.Generator().manual_seed(5)
    rows = [[_sample(model, g, 5, 4, "image"), _sample(model, g, 6, 2, "video", (1, 4, 6))],
            [_sample(model, g, 10, 0), _sample(model, g, 3, 10, "image", (1, 6, 4))]]
    packed = {key: torch.stack([torch.cat([s[key] for s in row], dim=-1) for row in rows], dim=-2)
              for key in ("input_ids", "mm_token_type_ids", "labels", "position_ids")}
    packed.update(_media_inputs([s for row in rows for s in row]))

    image, text = _sample(model, g, 6, 10, "image"), _sample(model, g, 16, 0)
    extra = len(image["input_ids"]) - len(text["input_ids"])
    own = {"input_ids": torch.stack([image["input_ids"], F.pad(text["input_ids"], (0, extra), value=PAD)]),
           "mm_token_type_ids": torch.stack([image["mm_token_type_ids"], F.pad(text["mm_token_type_ids"], (0, extra))]),
           "attention_mask": torch.ones(2, len(image["input_ids"]), dtype=torch.long),
           "labels": torch.stack([image["labels"], F.pad(text["labels"], (0, extra), value=-100)]),
           **_media_inputs([image])}
    own["attention_mask"][1, -extra:] = 0

    ids = torch.randint(0, 3000, (2, 21), generator=g)
    return {"packed": packed, "own_positions": own, "text_only": {"input_ids": ids, "labels": ids.clone()}}


def _vl_family_worker(family: str, batch_file: str) -> dict:
    import torch.distributed as dist

    policy = CausalLMPolicy(VL_FAMILIES[family](seed=0), chunk_size=16, cp_group=dist.group.WORLD)
    return {name: _run(policy, batch, group=dist.group.WORLD, fused=False)
            for name, batch in torch.load(batch_file).items()}


@pytest.fixture(scope="module", params=list(VL_FAMILIES))
def vl_family_setup(request, tmp_path_factory) -> tuple[str, str, dict]:
    family = request.param
    model = VL_FAMILIES[family](seed=0)
    batches = _vl_batches(model)
    for batch in batches.values():
        assert batch["input_ids"].shape[1] % 4 != 0  # the cp padding runs
        if "mm_token_type_ids" in batch:  # some visual run crosses every slice boundary of cp=2 and cp=4
            media = batch["mm_token_type_ids"] != 0
            for boundary in (8, 16, 24) if batch["input_ids"].shape[1] > 24 else (8,):
                assert (media[:, boundary - 1] & media[:, boundary]).any(), (boundary, media)
    batch_file = str(tmp_path_factory.mktemp(f"cp_{family}") / "batches.pt")
    torch.save(batches, batch_file)
    policy = CausalLMPolicy(model, chunk_size=16)
    reference = {name: _run(policy, batch, fused=False) for name, batch in batches.items()}
    for name in ("packed", "own_positions"):
        assert "visual.blocks.0.attn.qkv.weight" in reference[name]["grads"], name
        if family == "qwen3_vl":  # the deepstack features reach the loss only through the decoder's first layer
            assert "visual.deepstack_merger_list.0.linear_fc2.weight" in reference[name]["grads"], name
    return family, batch_file, reference


@pytest.mark.parametrize("cp_size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_vl_family_context_parallel_matches_one_process(vl_family_setup, cp_size: int) -> None:
    """Both VL families under cp: media rows (Qwen3-VL's deepstack features split with their tokens),
    model-built positions, and text-only rows without position ids (each slice keeps its global
    positions; they restarted at 0 per rank before: log-probs off by 2e-3 on Qwen2.5-VL, 8e-2 on
    Qwen3-VL) give the one-process log-probs, entropy, losses and gradients. (The fused loss path does
    not depend on the family; the processor-encoded test above checks it.)"""
    family, batch_file, reference = vl_family_setup
    per_rank = cpt.run_distributed(_vl_family_worker, cp_size, (family, batch_file), timeout_s=400)
    _assert_matches(reference, per_rank, f"{family} cp={cp_size}")
