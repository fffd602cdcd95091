"""Bucketed weight broadcast from FSDP2-sharded trainer ranks to a rollout rank (3 gloo processes).

Ranks 0 and 1 train (the model is ``fully_shard``-ed over them); rank 2 is the rollout engine.
One process start covers every scenario, run in sequence. The model is a small plain-torch
module with Qwen2 parameter names (odd sizes, so that FSDP shards unevenly), which keeps
``transformers`` out of the three processes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from cosmos_primitives.testing import run_distributed

HIDDEN, VOCAB, KV, FFN, LAYERS = 12, 51, 6, 21, 2


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN) + 0.1 * torch.randn(HIDDEN))


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(HIDDEN, HIDDEN)
        self.self_attn.k_proj = nn.Linear(HIDDEN, KV)
        self.self_attn.v_proj = nn.Linear(HIDDEN, KV)
        self.self_attn.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.mlp.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.mlp.down_proj = nn.Linear(FFN, HIDDEN, bias=False)
        self.input_layernorm = _Norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, m = self.self_attn, self.mlp
        h = x * self.input_layernorm.weight
        x = x + a.o_proj(a.q_proj(h)) + (a.k_proj(h) * a.v_proj(h)).sum(-1, keepdim=True)
        return x + m.down_proj(torch.nn.functional.silu(m.gate_proj(h)) * m.up_proj(h))


class TinyQwen2Like(nn.Module):
    """Qwen2 parameter names and shapes (q / k / v / o, gate / up / down, norms, tied lm_head)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.config = SimpleNamespace(model_type="qwen2", tie_word_embeddings=True)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.model.norm = _Norm()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(x * self.model.norm.weight)


def _module_with(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> nn.Module:
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


def _fused_engine(dtype: torch.dtype) -> nn.Module:
    """vLLM-style engine module: qkv_proj and gate_up_proj fused."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.qkv_proj.weight": (HIDDEN + 2 * KV, HIDDEN),
            p + "self_attn.qkv_proj.bias": (HIDDEN + 2 * KV,),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN), p + "mlp.gate_up_proj.weight": (2 * FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN), p + "input_layernorm.weight": (HIDDEN,),
        })
    return _module_with(shapes, dtype)


class _Engine:
    """RolloutEngine stand-in: records what ``update_weights`` gets (optionally corrupting one
    tensor, like a buggy loader) into ``model`` when it has one."""

    def __init__(self, model: nn.Module | None = None, corrupt: str | None = None) -> None:
        self.model, self.corrupt, self.weight_version = model, corrupt, -1
        self.received: dict[str, torch.Tensor] = {}
        self.calls = 0

    def update_weights(self, named_tensors, version: int) -> None:
        params = dict(self.model.named_parameters()) if self.model is not None else {}
        for name, tensor in named_tensors:
            value = tensor * 2 if name == self.corrupt else tensor
            if name in params:
                params[name].data.copy_(value)
            self.received[name] = value.clone()
        self.weight_version = version
        self.calls += 1


def _raw(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """A tensor as picklable bytes (tensors cannot leave a finished child process)."""
    t = t.detach().contiguous()
    return str(t.dtype), tuple(t.shape), t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _state(named) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {n: _raw(t) for n, t in named}


def _broadcast_scenarios() -> dict:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from cosmos_primitives.sync import InProcessSync, WeightMismatchError
    from cosmos_primitives.sync.broadcast import WeightBroadcaster, WeightReceiver, new_sync_group
    from cosmos_primitives.sync.sources import full_tensor

    rank = dist.get_rank()
    group = new_sync_group(src=0, receivers=[2])
    trainer_group = dist.new_group([0, 1])
    out: dict = {"rank": rank}
    if rank < 2:
        model = TinyQwen2Like(seed=0)
        mesh = DeviceMesh.from_group(trainer_group, "cpu")
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def full_state():
            return _state((n, full_tensor(p)) for n, p in model.named_parameters())

        # colocated engine next to each FSDP trainer rank: gathered, then copied
        local = TinyQwen2Like(seed=5)
        inproc = InProcessSync(model, local)
        out["inproc_modes"] = sorted({e.mode for e in inproc.plan})
        out["inproc_verified"] = inproc.sync(version=1).verified
        out["inproc"] = _state(local.named_parameters())

        # 1: identity layout, one default-size bucket, two syncs around an optimizer step
        sender = WeightBroadcaster(model, group)
        out["s1_first"] = sender.sync(version=1)
        out["s1_full_first"] = full_state()
        torch.manual_seed(100 + rank)
        loss = model(torch.randint(0, VOCAB, (2, 5))).square().mean()
        loss.backward()
        optim.step()
        out["s1_second"] = sender.sync(version=2)
        out["s1_full_second"] = full_state()
        sender.close()
        # 2: fused vLLM layout, tiny buckets (tensors split across buckets), bf16 on the wire,
        #    to an engine that takes update_weights per bucket
        out["s2"] = WeightBroadcaster(model, group, layout="vllm", bucket_bytes=256,
                                      transfer_dtype=torch.bfloat16).sync(version=3)
        # 3: fused layout into a bf16 engine module, fp32 on the wire, no overlap
        out["s3"] = WeightBroadcaster(model, group, layout="vllm", bucket_bytes=1000, overlap=False).sync(version=4)
        # 4: a loader that corrupts one tensor must be caught on the first sync
        try:
            WeightBroadcaster(model, group, bucket_bytes=4096).sync(version=5)
        except WeightMismatchError as exc:
            out["s4_error"] = str(exc)
        # 5: in_place on both sides (plain trainer model on rank 0): buckets are slices of the
        #    parameters themselves; values survive the move, and later in-place updates and a
        #    replaced storage both reach the engine
        if rank == 0:
            plain = TinyQwen2Like(seed=7)
            before = _state(plain.named_parameters())
            sender = WeightBroadcaster(plain, group, layout="vllm", bucket_bytes=512, in_place=True)
            out["s5_values_kept"] = _state(plain.named_parameters()) == before
            out["s5_first"] = sender.sync(version=6)
            out["s5_full_first"] = _state(plain.named_parameters())
            with torch.no_grad():
                plain.model.layers[0].mlp.up_proj.weight.mul_(3.0)
                plain.model.norm.weight.data = plain.model.norm.weight.data + 1.0
            out["s5_second"] = sender.sync(version=7)
            out["s5_full_second"] = _state(plain.named_parameters())
        return out

    engine_model = TinyQwen2Like(seed=1)
    receiver = WeightReceiver(engine_model, group, engine=(holder := SimpleNamespace(weight_version=-1)))
    out["s1_first"] = receiver.sync()
    out["s1_received_first"] = _state(engine_model.named_parameters())
    out["s1_second"] = receiver.sync()
    out["s1_received_second"] = _state(engine_model.named_parameters())
    out["s1_holder_version"] = holder.weight_version
    out["s1_after_close"] = receiver.sync()

    engine = _Engine()
    out["s2"] = WeightReceiver(engine, group).sync()
    out["s2_received"] = _state(engine.received.items())
    out["s2_calls"] = engine.calls
    out["s2_version"] = engine.weight_version

    fused = _fused_engine(torch.bfloat16)
    out["s3"] = WeightReceiver(fused, group, overlap=False).sync()
    out["s3_received"] = _state(fused.named_parameters())

    bad = _Engine(model=TinyQwen2Like(seed=2), corrupt="model.layers.1.mlp.up_proj.weight")
    try:
        WeightReceiver(bad, group).sync()
    except WeightMismatchError as exc:
        out["s4_error"] = str(exc)

    fused_fp32 = _fused_engine(torch.float32)
    receiver = WeightReceiver(fused_fp32, group, in_place=True)
    out["s5_first"] = receiver.sync()
    out["s5_received_first"] = _state(fused_fp32.named_parameters())
    out["s5_second"] = receiver.sync()
    out["s5_received_second"] = _state(fused_fp32.named_parameters())
    return out


def _tensor(raw: tuple[str, tuple[int, ...], bytes]) -> torch.Tensor:
    dtype = getattr(torch, raw[0].removeprefix("torch."))
    return torch.frombuffer(bytearray(raw[2]), dtype=torch.uint8).view(dtype).reshape(raw[1]).clone()


def _same_bits(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and a[2] == b[2]


def _fused(full: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trainer's full weights as a vLLM-style engine holds them, computed independently here."""
    t = {n: _tensor(v) for n, v in full.items()}
    out = {"model.embed_tokens.weight": t["model.embed_tokens.weight"], "model.norm.weight": t["model.norm.weight"]}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for leaf in ("weight", "bias"):
            out[f"{p}self_attn.qkv_proj.{leaf}"] = torch.cat(
                [t[f"{p}self_attn.{x}_proj.{leaf}"] for x in ("q", "k", "v")])
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]])
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            out[p + name] = t[p + name]
    return {n: v.to(dtype) for n, v in out.items()}


def test_fsdp2_weights_reach_the_rollout_rank_bitwise():
    trainer, other_trainer, rollout = run_distributed(_broadcast_scenarios, 3, timeout_s=240)

    # colocated in-process sync from the FSDP2 shards: every tensor gathered and copied
    assert trainer["inproc_modes"] == ["copy"] and trainer["inproc_verified"]
    for name, raw in trainer["inproc"].items():
        assert _same_bits(raw, trainer["s1_full_first"][name]), name
    assert other_trainer["inproc"] == trainer["inproc"]

    # 1: bitwise equal after the first sync and after an optimizer step + second sync
    first, second = trainer["s1_full_first"], trainer["s1_full_second"]
    assert set(first) == set(rollout["s1_received_first"]) and "lm_head.weight" not in first  # tied
    for name in first:
        assert _same_bits(rollout["s1_received_first"][name], first[name]), name
        assert _same_bits(rollout["s1_received_second"][name], second[name]), name
    assert any(first[n][2] != second[n][2] for n in first), "the optimizer step changed nothing"
    assert other_trainer["s1_full_second"] == second
    assert rollout["s1_first"].verified and not rollout["s1_second"].verified and trainer["s1_first"].verified
    assert (rollout["s1_first"].version, rollout["s1_second"].version, rollout["s1_holder_version"]) == (1, 2, 2)
    assert rollout["s1_first"].num_buckets == 1 and rollout["s1_after_close"] is None
    assert rollout["s1_first"].bytes_moved == trainer["s1_first"].bytes_moved > 0

    # 2: fused names, many small buckets, bf16 on the wire, update_weights per bucket
    expected_bf16 = _fused(second, torch.bfloat16)
    assert set(rollout["s2_received"]) == set(expected_bf16)
    for name, value in expected_bf16.items():
        assert _same_bits(rollout["s2_received"][name], _raw(value)), name
    assert rollout["s2"].verified and rollout["s2_version"] == 3
    assert trainer["s2"].num_buckets > 20 and rollout["s2_calls"] > 1
    largest = max(np.prod(v[1]) * 2 for v in rollout["s2_received"].values())
    assert largest > 256, "no tensor was split across buckets"

    # 3: fp32 on the wire written into a bf16 fused engine
    for name, value in expected_bf16.items():
        assert _same_bits(rollout["s3_received"][name], _raw(value)), name
    assert rollout["s3"].verified and rollout["s3"].version == 4

    # 4: the corrupted tensor is named on the rollout rank and on the sender
    assert "'model.layers.1.mlp.up_proj.weight'" in rollout["s4_error"]
    assert "'model.layers.1.mlp.up_proj.weight'" in trainer["s4_error"]
    assert "s4_error" not in other_trainer  # outside the sync group: it only joined the gathers

    # 5: in_place on both sides, fused layout, tensors split across 512-byte buckets
    assert trainer["s5_values_kept"] and trainer["s5_first"].num_buckets > 10
    for which in ("first", "second"):
        expected = _fused(trainer[f"s5_full_{which}"], torch.float32)
        received = rollout[f"s5_received_{which}"]
        assert set(received) == set(expected)
        for name, value in expected.items():
            assert _same_bits(received[name], _raw(value)), (which, name)
    assert trainer["s5_full_first"] != trainer["s5_full_second"]
    assert rollout["s5_first"].verified and (rollout["s5_second"].version, rollout["s5_second"].verified) == (7, False)
