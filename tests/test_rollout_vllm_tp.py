"""Rollout tensor parallel: ``[rollout.parallelism] tp_size = 2`` with ``backend = "vllm"`` in a 2-rank
gloo job, against the vLLM stand-in's TP semantics (each rank holds its shard of every weight; the
ranks of a TP group must submit the same requests; ``load_weights`` takes full tensors and keeps the
rank's slice), for a text model (tiny Qwen2) and a VL one (tiny Qwen3-VL: vLLM nests its language model
as ``language_model.model.*`` and holds the vision tower whole). Real vLLM cannot run here: this checks
the adapter's calls, not vLLM's kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.testing.models import QWEN_VOCAB_SIZE

STANDINS = str(Path(__file__).parent / "standins")
TRAINER_SEED = 11
# per family: (save a model, build one, its processor, the language model's prefix in HF / in vLLM names)
FAMILIES = {
    "qwen2": (cpt.save_tiny_qwen2, cpt.tiny_qwen2, cpt.qwen_tokenizer, "model.", "model."),
    "qwen3_vl": (cpt.save_tiny_qwen3_vl, cpt.tiny_qwen3_vl, cpt.tiny_qwen3_vl_processor, "model.language_model.",
                 "language_model.model."),
}
PROMPTS = {  # each rank's own prompts: rank 1 has more than rank 0, so the gathered slices differ in length
    0: [Prompt(conversation=[{"role": "user", "content": "hi"}], prompt_id="r0-a")],
    1: [Prompt(conversation=[{"role": "user", "content": "bye"}], prompt_id="r1-a"),
        Prompt(conversation=[{"role": "user", "content": "what colour is the sky"}], prompt_id="r1-b")],
}


def _params(rank: int) -> SamplingParams:
    return SamplingParams(num_samples_per_prompt=2, temperature=0.8, max_response_length=4, seed=100 + rank)


def _completions(groups) -> list[tuple[str, list[list[int]], list[list[float]]]]:
    return [(g.prompt.prompt_id, [c.token_ids for c in g.completions], [c.logprobs for c in g.completions])
            for g in groups]


def _tp_rank(folder: str, family: str) -> dict:
    """One rank: build the TP engine from the config, feed it the trainer's weights in process, generate
    this rank's prompts; then show that a sync leaving a tensor unloaded is caught."""
    sys.path.insert(0, STANDINS)
    import torch.distributed as dist

    import cosmos_primitives as cp
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine
    from cosmos_primitives.sync import InProcessSync, WeightMismatchError

    _, build, processor_of, hf, held_prefix = FAMILIES[family]
    rank = dist.get_rank()
    tokenizer = processor_of()
    cfg = cp.load_config(overrides=["rollout.backend=vllm", "rollout.parallelism.tp_size=2"]).rollout
    # a different seed per rank, as the examples pass: the TP group must still sample with one
    engine, _ = cp.rollout.build_rollout_engine(cfg, folder, tokenizer, dtype="float32", seed=7 + rank)
    trainer = build(seed=TRAINER_SEED)
    result = InProcessSync(trainer, engine, layout=cp.rollout.sync_layout(cfg), dtype=torch.float32).sync(1)

    held = dict(engine.llm.worker.model_runner.model.named_parameters())
    full = dict(trainer.named_parameters())
    q, k = full[f"{hf}layers.0.self_attn.q_proj.weight"], full[f"{hf}layers.0.self_attn.k_proj.weight"]
    half_q, half_k = q.shape[0] // 2, k.shape[0] // 2
    expected_qkv = torch.cat([q[rank * half_q:(rank + 1) * half_q], k[rank * half_k:(rank + 1) * half_k],
                              full[f"{hf}layers.0.self_attn.v_proj.weight"][rank * half_k:(rank + 1) * half_k]])
    down = full[f"{hf}layers.0.mlp.down_proj.weight"]
    half_in = down.shape[1] // 2
    shards_ok = {
        "qkv_proj": torch.equal(held[f"{held_prefix}layers.0.self_attn.qkv_proj.weight"], expected_qkv),
        "down_proj": torch.equal(held[f"{held_prefix}layers.0.mlp.down_proj.weight"],
                                 down[:, rank * half_in:(rank + 1) * half_in]),
        "norm": torch.equal(held[f"{held_prefix}norm.weight"], full[f"{hf}norm.weight"]),
    }
    visual = sorted(n for n in full if n.startswith("model.visual."))
    if visual:  # the vision tower is replicated: every rank holds it whole
        shards_ok["visual"] = all(torch.equal(held[n[len("model."):]], full[n]) for n in visual)
    shapes = {n[len(held_prefix):]: tuple(held[n].shape) for n in (
        f"{held_prefix}embed_tokens.weight", f"{held_prefix}layers.0.self_attn.qkv_proj.weight",
        f"{held_prefix}layers.0.self_attn.o_proj.weight", f"{held_prefix}norm.weight")}
    groups = engine.generate(PROMPTS[rank], _params(rank))

    other = VLLMRolloutEngine(folder, tokenizer, tensor_parallel_size=2, seed=0, dtype="float32")
    real_update = other.update_weights
    other.update_weights = lambda named, version: real_update(
        ((n, t) for n, t in named if n != f"{hf}norm.weight"), version)
    try:
        InProcessSync(trainer, other, layout="hf_checkpoint").sync(1)
        caught = ""
    except WeightMismatchError as error:
        caught = str(error)
    return {"verified": result.verified, "shards_ok": shards_ok, "shapes": shapes, "groups": _completions(groups),
            "seed": sys.modules["vllm"].CALLS[0][1]["seed"], "caught": caught}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tp2_engine_generates_what_the_tp1_engine_does(standin_vllm, tmp_path, family,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, one TP group: each holds half of every sharded weight (a VL model's vision tower whole)
    after an in-process sync of the trainer's full tensors, and each gets for its own prompts exactly
    the completions (tokens, and log-probs to 1e-6 in float32) a tp=1 engine with the trainer's weights
    gives for them."""
    from cosmos_primitives.rollout import vllm_engine
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    save, _, processor_of, _, held_prefix = FAMILIES[family]
    folder = str(save(tmp_path / "start", seed=0))
    got = cpt.run_distributed(_tp_rank, 2, args=(folder, family), timeout_s=500)

    reference = VLLMRolloutEngine(str(save(tmp_path / "trained", seed=TRAINER_SEED)), processor_of(),
                                  seed=0, dtype="float32")
    vocab, hidden = QWEN_VOCAB_SIZE, 64
    for rank, out in enumerate(got):
        # each request's seed includes the rank that owns it: generate as that rank
        monkeypatch.setattr(vllm_engine, "_global_rank", lambda rank=rank: rank)
        assert out["verified"] and all(out["shards_ok"].values()), out["shards_ok"]
        assert ("visual" in out["shards_ok"]) == (family == "qwen3_vl")
        assert out["shapes"] == {"embed_tokens.weight": (vocab // 2, hidden),
                                 "layers.0.self_attn.qkv_proj.weight": ((hidden + 2 * 32) // 2, hidden),
                                 "layers.0.self_attn.o_proj.weight": (hidden, hidden // 2),
                                 "norm.weight": (hidden,)}
        assert out["seed"] == 7, "the TP group samples with its first rank's engine seed"
        expected = _completions(reference.generate(PROMPTS[rank], _params(rank)))
        assert [(pid, tokens) for pid, tokens, _ in out["groups"]] == [(pid, tokens) for pid, tokens, _ in expected]
        for (_, _, logprobs), (_, _, want) in zip(out["groups"], expected):
            for a, b in zip(logprobs, want):
                assert a == pytest.approx(b, abs=1e-6)
        assert f"'{held_prefix}norm.weight'" in out["caught"] and "not loaded" in out["caught"], out["caught"]


def test_tp_size_must_divide_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM lays the job out as engines of tp_size consecutive ranks: 3 ranks cannot take tp_size = 2."""
    from cosmos_primitives.rollout.vllm_engine import launcher_settings

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"tp_size = 2 does not divide the 3 ranks"):
        launcher_settings(None, 2)
