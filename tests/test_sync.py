"""In-process weight sync (colocated trainer and engine), name maps, checksums and bucket layout."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.sync.buckets import ALIGN, layout_buckets
from cosmos_primitives.sync.checks import add_checksums


def module_with(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype = torch.float32) -> nn.Module:
    """A module whose ``named_parameters()`` are exactly ``shapes`` (an engine stand-in with any names)."""
    root = nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, nn.Parameter(torch.zeros(shape, dtype=dtype)))
    return root


class RecordingEngine:
    """A ``RolloutEngine`` stand-in: ``update_weights`` copies into ``model`` (or a dict) by name,
    optionally corrupting one tensor the way a buggy loader would."""

    def __init__(self, model: nn.Module | None = None, corrupt: str | None = None) -> None:
        self.model = model
        self.weight_version = -1
        self.received: dict[str, torch.Tensor] = {}
        self.calls: list[int] = []
        self.corrupt = corrupt

    def generate(self, prompts, params):  # not needed by weight sync
        raise NotImplementedError

    def update_weights(self, named_tensors, version: int) -> None:
        params = dict(self.model.named_parameters()) if self.model is not None else {}
        for name, tensor in named_tensors:
            value = tensor + 1e-3 if name == self.corrupt else tensor
            if name in params:
                params[name].data.copy_(value)
            self.received[name] = value.clone()
        self.weight_version = version
        self.calls.append(version)


def _step(model: nn.Module, seed: int = 0) -> None:
    """One SGD step with random gradients (what the trainer's optimizer does between syncs)."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
    torch.optim.SGD(params, lr=0.1).step()


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return cp.sync.bitwise_equal(a, b)


# the VL families, each as (builder, config kwargs, prefix of the vision tower in a checkpoint on disk);
# Qwen3-VL both ways its checkpoints come: tied head (Cosmos-Reason2-2B) and untied (-8B)
VL_FAMILIES = {
    "qwen2_5_vl": (cpt.tiny_qwen2_5_vl, {}, "visual."),
    "qwen3_vl_tied": (cpt.tiny_qwen3_vl, {}, "model.visual."),
    "qwen3_vl_untied": (cpt.tiny_qwen3_vl, {"tie_word_embeddings": False}, "model.visual."),
}


@pytest.fixture(scope="module", params=sorted(VL_FAMILIES))
def vl_pair(request):
    """``(variant, trainer, engine model, on-disk vision prefix)`` of one VL family: two seeds."""
    build, kwargs, visual_on_disk = VL_FAMILIES[request.param]
    return request.param, build(seed=0, **kwargs), build(seed=1, **kwargs), visual_on_disk


def _tied(model: nn.Module) -> bool:
    return model.lm_head.weight is model.model.language_model.embed_tokens.weight


def test_share_aliases_trainer_storage_and_follows_optimizer_steps(vl_pair):
    variant, trainer, engine_model, _ = vl_pair
    holder = SimpleNamespace(weight_version=-1)
    sync = cp.sync.InProcessSync(trainer, engine_model, engine=holder)
    assert {e.mode for e in sync.plan} == {"share"}
    first = sync.sync(version=1)
    assert first.verified and first.num_shared == len(sync.plan) and first.bytes_moved == 0
    trainer_params = dict(trainer.named_parameters())
    for name, param in engine_model.named_parameters():
        assert param.data_ptr() == trainer_params[name].data_ptr(), name
    assert _tied(engine_model) == (variant != "qwen3_vl_untied")
    assert engine_model.lm_head.weight.data_ptr() == trainer.lm_head.weight.data_ptr()
    _step(trainer, seed=1)
    second = sync.sync(version=2)
    assert (second.version, second.bytes_moved, second.verified, holder.weight_version) == (2, 0, False, 2)
    for name, param in engine_model.named_parameters():
        assert torch.equal(param, trainer_params[name]), name
    assert second.metrics()["sync/version"] == 2.0 and second.metrics()["sync/time_s"] >= 0.0


def test_copy_with_cast_into_preallocated_engine_tensors():
    trainer = cpt.tiny_qwen2(seed=0)
    engine_model = cpt.tiny_qwen2(seed=1).to(torch.bfloat16)
    ptrs = {n: p.data_ptr() for n, p in engine_model.named_parameters()}
    sync = cp.sync.InProcessSync(trainer, engine_model)
    assert {e.mode for e in sync.plan} == {"copy"} and {e.dtype for e in sync.plan} == {torch.bfloat16}
    rows = sync.describe()
    assert rows[0] == {"name": "model.embed_tokens.weight", "sources": ["model.embed_tokens.weight"],
                       "shape": [151936, 64], "dtype": "torch.bfloat16", "mode": "copy"}
    for version in (1, 2):
        result = sync.sync(version)
        assert result.verified == (version == 1)
        assert result.bytes_moved == sum(p.numel() * 2 for p in engine_model.parameters())
        source = dict(trainer.named_parameters())
        for name, param in engine_model.named_parameters():
            assert _bits_equal(param.data, source[name].detach().to(torch.bfloat16)), name
            assert param.data_ptr() == ptrs[name], f"{name} was reallocated"
        _step(trainer, seed=version)


def test_checkpoint_layout_matches_save_pretrained_and_feeds_a_load_weights_engine(vl_pair, tmp_path: Path):
    from safetensors import safe_open

    _, trainer, _, visual_on_disk = vl_pair
    trainer.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        on_disk = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
        saved = {k: f.get_tensor(k) for k in on_disk}
    engine = RecordingEngine()
    sync = cp.sync.InProcessSync(trainer, engine, layout="hf_checkpoint", read_back=lambda n: engine.received[n])
    assert {e.target: e.shape for e in sync.plan} == on_disk
    assert ("lm_head.weight" in on_disk) != _tied(trainer)  # tied: left out, as save_pretrained does
    assert sync.sync(version=7).verified and engine.calls == [7]
    assert set(engine.received) == set(on_disk)
    for name, value in engine.received.items():  # bit for bit what save_pretrained wrote, every tensor
        assert _bits_equal(value, saved[name]), name
    assert torch.equal(engine.received[f"{visual_on_disk}blocks.0.attn.qkv.weight"],
                       trainer.model.visual.blocks[0].attn.qkv.weight)


def test_qwen2_checkpoint_layout_matches_its_files(tmp_path: Path):
    from safetensors import safe_open

    model = cpt.tiny_qwen2(seed=0)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    names = [n for n, _ in model.named_parameters()]
    specs = cp.models.map_names(names, "hf_checkpoint", cp.models.get_family("qwen2"), tied=True)
    assert {s.name for s in specs} == keys


def test_vllm_layout_fuses_qkv_and_gate_up_into_an_engine_with_fused_params(vl_pair):
    variant, trainer, _, _ = vl_pair
    names = [n for n, _ in trainer.named_parameters()]
    params = dict(trainer.named_parameters())
    specs = cp.models.map_names(names, "vllm", cp.models.get_family(trainer.config.model_type), tied=_tied(trainer))
    shapes = {s.name: (sum(params[x].shape[0] for x in s.sources), *params[s.sources[0]].shape[1:]) for s in specs}
    engine_model = module_with(shapes)
    sync = cp.sync.InProcessSync(trainer, engine_model, layout="vllm")
    modes = {e.target: e.mode for e in sync.plan}
    assert modes["language_model.model.layers.0.self_attn.qkv_proj.weight"] == "copy"
    assert modes["language_model.model.embed_tokens.weight"] == "share"
    assert sync.sync(version=1).verified
    engine_params = dict(engine_model.named_parameters())
    attn = trainer.model.language_model.layers[1].self_attn
    expected_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert _bits_equal(engine_params["language_model.model.layers.1.self_attn.qkv_proj.weight"], expected_qkv)
    mlp = trainer.model.language_model.layers[0].mlp
    assert _bits_equal(engine_params["language_model.model.layers.0.mlp.gate_up_proj.weight"],
                       torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    vision_mlp = trainer.model.visual.blocks[0].mlp
    if variant == "qwen2_5_vl":  # a gated vision MLP, fused as in the language model; q / k / v with biases
        expected_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        assert torch.equal(engine_params["language_model.model.layers.1.self_attn.qkv_proj.bias"], expected_bias)
        assert torch.equal(engine_params["visual.blocks.0.mlp.gate_up_proj.weight"],
                           torch.cat([vision_mlp.gate_proj.weight, vision_mlp.up_proj.weight]))
    else:  # Qwen3-VL: an ungated vision MLP and deepstack mergers, kept whole; q / k norms, no biases
        assert torch.equal(engine_params["visual.blocks.0.mlp.linear_fc1.weight"], vision_mlp.linear_fc1.weight)
        merger = trainer.model.visual.deepstack_merger_list[0]
        assert torch.equal(engine_params["visual.deepstack_merger_list.0.linear_fc1.weight"], merger.linear_fc1.weight)
        assert torch.equal(engine_params["language_model.model.layers.1.self_attn.q_norm.weight"], attn.q_norm.weight)
        assert not any(n.endswith("qkv_proj.bias") for n in shapes)
    # tied: vLLM ties it to the embedding itself; untied (8B): a tensor of its own, fed from lm_head
    assert ("language_model.lm_head.weight" in shapes) != _tied(trainer)
    if not _tied(trainer):
        assert _bits_equal(engine_params["language_model.lm_head.weight"], trainer.lm_head.weight)


def test_engine_target_gets_named_tensors_in_transfer_dtype_and_the_version():
    trainer = cpt.tiny_qwen2(seed=0)
    engine = RecordingEngine(model=cpt.tiny_qwen2(seed=1).to(torch.bfloat16))
    sync = cp.sync.InProcessSync(trainer, engine, dtype=torch.bfloat16)
    result = sync.sync(version=3)
    assert result.verified and engine.weight_version == 3 and engine.calls == [3]
    assert {t.dtype for t in engine.received.values()} == {torch.bfloat16}
    for name, param in engine.model.named_parameters():
        assert _bits_equal(param.data, dict(trainer.named_parameters())[name].detach().to(torch.bfloat16))


def test_first_sync_check_names_the_corrupted_tensor():
    trainer = cpt.tiny_qwen2(seed=0)
    bad = "model.layers.1.mlp.up_proj.weight"
    engine = RecordingEngine(model=cpt.tiny_qwen2(seed=1), corrupt=bad)
    sync = cp.sync.InProcessSync(trainer, engine)
    with pytest.raises(cp.sync.WeightMismatchError, match=rf"'{bad}'.*elements differ"):
        sync.sync(version=1)


def test_check_needs_a_way_to_read_the_engine_back():
    with pytest.raises(ValueError, match="read_back"):
        cp.sync.InProcessSync(cpt.tiny_qwen2(seed=0), RecordingEngine(model=None))


class _Mystery(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(model_type="mystery_lm", tie_word_embeddings=False)
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)


def test_unknown_family_error_lists_known_families_and_identity_still_works():
    with pytest.raises(cp.models.UnknownFamilyError) as info:
        cp.sync.InProcessSync(_Mystery(), _Mystery(), layout="hf_checkpoint")
    message = str(info.value)
    assert "'mystery_lm'" in message and "'qwen2'" in message and "'qwen2_5_vl'" in message
    assert "'qwen3_vl'" in message
    assert "register_family" in message
    trainer, engine_model = _Mystery(), _Mystery()
    assert cp.sync.InProcessSync(trainer, engine_model).sync(version=1).num_shared == 4
    assert engine_model.head.weight.data_ptr() == trainer.head.weight.data_ptr()


def test_register_family_adds_a_family():
    family = cp.models.FamilyNameMap(
        model_type="mystery_lm",
        prefixes={"hf_checkpoint": (("body.", "encoder."), ("head.", "lm_head."))},
    )
    cp.models.register_family(family, replace=True)
    try:
        assert "mystery_lm" in cp.models.known_families()
        trainer = _Mystery()
        engine = RecordingEngine()
        sync = cp.sync.InProcessSync(trainer, engine, layout="hf_checkpoint", read_back=lambda n: engine.received[n])
        sync.sync(version=1)
        assert sorted(engine.received) == ["encoder.bias", "encoder.weight", "lm_head.bias", "lm_head.weight"]
        with pytest.raises(cp.models.NameMapError, match="already registered"):
            cp.models.register_family(family)
    finally:
        from cosmos_primitives.models import name_maps

        name_maps._FAMILIES.pop("mystery_lm", None)


def test_name_map_errors_say_what_and_where():
    family = cp.models.get_family("qwen2_5_vl")
    with pytest.raises(cp.models.NameMapError, match=r"'extra\.scale' matches no 'vllm' prefix rule"):
        cp.models.map_names(["model.visual.x", "extra.scale"], "vllm", family)
    with pytest.raises(cp.models.NameMapError, match=r"unknown weight layout 'sglang'"):
        cp.models.map_names(["a"], "sglang", family)
    with pytest.raises(cp.models.NameMapError, match=r"needs \['self_attn.q_proj'.*no \['self_attn.v_proj'\]"):
        cp.models.map_names(["model.language_model.layers.0.self_attn.q_proj.weight",
                           "model.language_model.layers.0.self_attn.k_proj.weight"], "vllm", family)
    trainer = cpt.tiny_qwen2(seed=0)
    with pytest.raises(cp.models.NameMapError, match="not parameters of the engine model"):
        cp.sync.InProcessSync(trainer, cpt.tiny_qwen2(seed=1), layout="vllm")


def test_checksum_pieces_add_up_and_catch_swaps():
    x = torch.randn(1000).to(torch.bfloat16)
    whole = cp.sync.checksum(x)
    assert add_checksums(cp.sync.checksum(x[:317]), cp.sync.checksum(x[317:], element_offset=317)) == whole
    swapped = x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert cp.sync.checksum(swapped) != whole
    nudged = x.clone()
    nudged.view(torch.int16)[500] += 1  # the smallest change: one bit of one value
    assert cp.sync.checksum(nudged)[0] != whole[0]


def test_bucket_layout_covers_every_element_once_within_capacity():
    rng = random.Random(0)
    targets = []
    for t in range(40):
        esize = rng.choice([1, 2, 4, 8])
        targets.append((esize, [(3 * t + k, rng.randint(0, 300)) for k in range(rng.choice([1, 1, 2, 3]))]))
    for bucket_bytes in (ALIGN, 100, 1000, 10**6):
        layout = layout_buckets(targets, bucket_bytes)
        assert all(0 < used <= bucket_bytes for used in layout.bucket_used)
        covered: dict[int, list[tuple[int, int]]] = {}
        ends: dict[int, tuple[int, int]] = {}
        for p in layout.pieces:
            esize = targets[p.target][0]
            assert p.byte_offset + p.numel * esize <= layout.bucket_used[p.bucket]
            covered.setdefault(p.source, []).append((p.source_offset, p.numel))
            if p.target in ends and ends[p.target][0] == p.bucket:  # contiguous within a bucket
                assert p.byte_offset == ends[p.target][1]
            ends[p.target] = (p.bucket, p.byte_offset + p.numel * esize)
        for _, sources in targets:
            for s, numel in sources:
                spans = sorted(covered.get(s, []))
                assert sum(n for _, n in spans) == numel
                assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
    assert json.dumps(layout_buckets(targets, 1000).bucket_used)  # plain ints, as the wire plan needs
