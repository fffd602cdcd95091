"""A training step's forward and backward make no host sync: an SFT step and a GRPO micro-batch of a
tiny Qwen2 run on the ``meta`` device (standing in for a GPU) with the loader's batch on the CPU,
under ``HostSyncCounter``, which raises at the first op that would make the host wait for the device.

transformers' own causal-mask builder syncs (``find_packed_sequence_indices`` and the padding check
call ``.all()`` on device tensors), so the model gets a prepared mask mapping
(``{"full_attention": None}``: plain causal sdpa, one sample per row); the varlen attention path
replaces that builder.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights
from cosmos_primitives.config import GRPOConfig
from cosmos_primitives.testing.host_sync import HostSyncCounter, HostSyncError

CAUSAL = {"full_attention": None}  # a prepared mask mapping: transformers skips its mask builder


@pytest.fixture
def meta_policy(tiny_qwen2_model):
    return cp.policy.CausalLMPolicy(tiny_qwen2_model, chunk_size=8).to("meta")


def _ids(rows: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, 1000, (rows, length), generator=torch.Generator().manual_seed(0))


def test_the_counter_catches_what_syncs_and_ignores_host_work() -> None:
    host = torch.tensor([1, 0, 3])
    device = torch.zeros(3, device="meta")
    with HostSyncCounter() as syncs:
        host.nonzero(), int(host.max()), host[host > 0], host.to("meta", non_blocking=True), device + 1
    assert not syncs.counts  # the host's own tensors, a host-to-device copy, device work: no sync
    for sync, kind in ((lambda: device.nonzero(), "nonzero"), (lambda: float(device.sum()), "_local_scalar_dense"),
                       (lambda: device.to("cpu"), "device-to-host copy"),
                       (lambda: device[device > 0], "index with a boolean mask"),
                       (lambda: device.masked_select(device > 0), "masked_select")):
        with pytest.raises(HostSyncError, match=f"host sync on a meta tensor: {kind}"), HostSyncCounter():
            sync()


def test_sft_step_forward_and_backward_make_no_host_sync(meta_policy) -> None:
    ids = _ids()
    labels = ids.clone()
    labels[:, :7] = -100  # the prompt
    batch = {"input_ids": ids, "labels": labels, "attention_mask": CAUSAL}
    weights = sft_token_weights(labels)  # on the host, from the loader's labels
    with HostSyncCounter() as syncs:
        out = cp.policy.token_logprobs(meta_policy, batch, loss_weights=weights)
        loss, _ = sft_loss(out.logprobs, labels.to("meta", non_blocking=True), weighted_sum=out.weighted_sum)
        loss.backward()
    assert not syncs.counts, syncs.places
    assert out.logprobs.device.type == "meta"
    assert meta_policy.hf_model.get_output_embeddings().weight.grad is not None


@pytest.mark.parametrize("variant", ["grpo", "gspo"])  # fused head / general head + grpo_loss
def test_grpo_micro_batch_forward_loss_and_backward_make_no_host_sync(meta_policy, variant: str) -> None:
    ids = _ids(rows=3, length=20)
    mask = torch.zeros(3, 20)
    mask[0, 6:] = mask[1, 9:15] = mask[2, 12:] = 1.0
    positions = cp.algo.scored_positions(ids, mask=mask)  # on the host, as grpo_update does
    on_device = {name: t.to("meta", non_blocking=True) for name, t in
                 dict(mask=mask, ref=-torch.rand(3, 20), rollout=-torch.rand(3, 20), advantages=torch.randn(3),
                      token_count=mask.sum()).items()}
    cfg = GRPOConfig(variant=variant, kl_beta=0.05, entropy_coeff=0.01,
                     behav_imp_weight_cap=2.0 if variant == "grpo" else None)
    with HostSyncCounter() as syncs:
        loss, metrics = cp.policy.grpo_micro_batch_loss(
            meta_policy, {"input_ids": ids, "attention_mask": CAUSAL}, on_device["mask"], on_device["advantages"],
            cfg, positions=positions.to("meta"), ref_logprobs=on_device["ref"],
            rollout_logprobs=on_device["rollout"] if variant == "grpo" else None,
            token_count=on_device["token_count"], temperature=0.7)
        loss.backward()
    assert not syncs.counts, syncs.places
    assert {"loss", "kl", "entropy", "clip_fraction"} <= metrics.keys()


def test_packed_sft_step_with_varlen_attention_makes_no_host_sync(tiny_qwen2_model, monkeypatch) -> None:
    """Packed rows (positions restarting per sample, no mask) through the varlen attention: the sample
    offsets come from the loader's CPU positions and transformers' mask builder is skipped, so the
    whole forward and backward waits for the device nowhere. The varlen kernel stands in for CUDA's
    (meta tensors run its shape function)."""
    varlen = importlib.import_module("cosmos_primitives.parallel.varlen_attention")
    cp.parallel.enable_varlen_attention(tiny_qwen2_model)
    policy = cp.policy.CausalLMPolicy(tiny_qwen2_model, chunk_size=8).to(device="meta", dtype=torch.bfloat16)
    monkeypatch.setattr(varlen, "varlen_kernel_name", lambda *args, **kwargs: "aten._flash_attention_forward")
    ids = _ids(rows=2, length=24)
    positions = torch.cat([torch.arange(10), torch.arange(14)]).expand(2, 24).clone()
    positions[1] = torch.cat([torch.arange(5), torch.arange(19)])
    labels = ids.clone()
    labels[positions == 0] = -100
    batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
    weights = sft_token_weights(labels)
    with HostSyncCounter() as syncs:
        out = cp.policy.token_logprobs(policy, batch, loss_weights=weights)
        loss, _ = sft_loss(out.logprobs, labels.to("meta", non_blocking=True), weighted_sum=out.weighted_sum)
        loss.backward()
    assert not syncs.counts, syncs.places
    assert policy.hf_model.model.layers[0].self_attn.q_proj.weight.grad is not None
