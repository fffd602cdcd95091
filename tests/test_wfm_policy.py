"""The diffusion policy: LoRA on attention projections, its reference, full fine-tuning, gradient
checkpointing, and one FSDP2 training step over 2 gloo processes."""

from __future__ import annotations

import warnings

import msgspec
import pytest
import torch

from cosmos_primitives.algo.flow_grpo import flow_grpo_loss
from cosmos_primitives.algo.flow_sde import SDEParams
from cosmos_primitives.algo.flow_step import recompute_step
from cosmos_primitives.config.policy import DIFFUSERS_LORA_TARGETS, LoraConfig
from cosmos_primitives.policy.diffusion import DiffusionPolicy, apply_lora
from cosmos_primitives.rollout.flow_sampler import flow_sigmas, sample_flow
from cosmos_primitives.testing import run_distributed, tiny_flow_scheduler, tiny_wan_transformer
from cosmos_primitives.testing.models import tiny_cosmos_transformer

LATENTS = torch.randn(4, 4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
TEXT = torch.randn(4, 5, 32, generator=torch.Generator().manual_seed(1))
TIMESTEP = torch.tensor([900.0, 600.0, 300.0, 50.0])
LORA = LoraConfig(r=4, lora_alpha=8.0, target_modules=list(DIFFUSERS_LORA_TARGETS))


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: torch's thread pool costs more than the maths (and 2 shared cores thrash)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _perturb_lora(policy: DiffusionPolicy, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_lora_trains_only_adapters_on_attention_projections_and_reference_is_the_base():
    base = tiny_wan_transformer(seed=0)
    policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=LORA)
    names = [n for n, p in policy.transformer.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert {n.split(".lora_")[0].split(".", 3)[-1] for n in names} == {
        "to_q", "to_k", "to_v", "to_out.0"}
    assert policy.num_trainable() == sum(p.numel() for n, p in policy.transformer.named_parameters() if "lora_" in n)
    with torch.no_grad():
        expected = base(hidden_states=LATENTS, timestep=TIMESTEP, encoder_hidden_states=TEXT, return_dict=False)[0]
        torch.testing.assert_close(policy.velocity_fn()(LATENTS, TIMESTEP, TEXT), expected)  # B = 0 at init
        _perturb_lora(policy)
        adapted = policy.velocity_fn()(LATENTS, TIMESTEP, TEXT)
        assert not torch.allclose(adapted, expected, atol=1e-4)
        with policy.reference() as reference:
            torch.testing.assert_close(reference(LATENTS, TIMESTEP, TEXT), expected)
        torch.testing.assert_close(policy.velocity_fn()(LATENTS, TIMESTEP, TEXT), adapted)  # adapters back on


def test_lora_target_that_matches_nothing_is_reported():
    with pytest.raises(ValueError, match="q_proj"):
        apply_lora(tiny_wan_transformer(), LoraConfig(target_modules=["q_proj"]))


def test_full_finetuning_reference_is_a_frozen_copy():
    policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=None, keep_reference=True)
    assert policy.num_trainable() == sum(p.numel() for p in policy.transformer.parameters())
    with torch.no_grad():
        before = policy.velocity_fn()(LATENTS, TIMESTEP, TEXT)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.1)
    policy.velocity_fn()(LATENTS, TIMESTEP, TEXT).pow(2).mean().backward()
    optimizer.step()
    with policy.reference() as reference:
        torch.testing.assert_close(reference(LATENTS, TIMESTEP, TEXT), before)
    with torch.no_grad():
        assert not torch.allclose(policy.velocity_fn()(LATENTS, TIMESTEP, TEXT), before)
    without = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=msgspec.structs.replace(LORA, enabled=False))
    with pytest.raises(RuntimeError, match="keep_reference"), without.reference():
        pass


def test_gradient_checkpointing_gives_the_same_lora_gradients():
    grads = []
    for checkpointing in (False, True):
        policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=LORA,
                                 gradient_checkpointing=checkpointing)
        _perturb_lora(policy)
        policy.transformer.train()
        policy.velocity_fn()(LATENTS, TIMESTEP, TEXT).pow(2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in policy.transformer.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)


def _policy_and_batch() -> tuple[DiffusionPolicy, torch.Tensor, object]:
    policy = DiffusionPolicy(tiny_wan_transformer(seed=0), lora=LORA)
    _perturb_lora(policy)
    sigmas, timesteps = flow_sigmas(tiny_flow_scheduler(), 4)
    traj = sample_flow(policy.velocity_fn(), TEXT, latent_shape=(4, 1, 4, 4), sigmas=sigmas, timesteps=timesteps,
                       seeds=[0, 1, 2, 3], sde=SDEParams())
    return policy, TEXT, traj


def _train_step(policy: DiffusionPolicy, text: torch.Tensor, traj, rows: slice) -> None:
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75])[rows]
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)  # the update is the averaged gradient
    sub = traj.select(rows)
    for k, step in enumerate(sub.sde_steps.tolist()):
        now = recompute_step(policy.velocity_fn(), sub, step, text[rows])
        out = flow_grpo_loss(now.log_prob, sub.log_probs[:, k], advantages, clip_range=1e-3)
        (out.loss / sub.sde_steps.numel()).backward()
    optimizer.step()


def _fsdp_step_matches_single_process() -> float:
    import torch.distributed as dist

    rank = dist.get_rank()
    torch.set_num_threads(1)
    single, text, traj = _policy_and_batch()
    before = single.adapter_state_dict()
    _train_step(single, text, traj, slice(0, 4))
    expected = single.adapter_state_dict()

    sharded, text, traj = _policy_and_batch()
    sharded.shard()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's note about view outputs of the wrapped root
        _train_step(sharded, text, traj, slice(2 * rank, 2 * rank + 2))  # each rank: its half of the batch
    got = sharded.adapter_state_dict()
    assert got.keys() == expected.keys()
    moved = max((expected[k] - before[k]).abs().max().item() for k in expected)
    return max((got[k] - expected[k]).abs().max().item() for k in expected), moved


def test_fsdp2_training_step_equals_the_single_process_step():
    results = run_distributed(_fsdp_step_matches_single_process, 2)
    for diff, moved in results:
        assert moved > 1e-3  # the step changed the adapters ...
        assert diff < 1e-6  # ... identically with the batch split over two ranks


def _checkpointed_bf16_step_without_fsdp_recompute_cast() -> str:
    """A bf16 FSDP2 step with diffusers' checkpointing where FSDP2 does not cast a recompute's inputs
    (torch 2.11 skips it in backward, 2.14 casts): every block call, recompute included, must still
    get bf16 inputs, else checkpointing's metadata check fails."""
    from torch.distributed.fsdp._fully_shard import _fsdp_state

    original = _fsdp_state.FSDPState._cast_forward_inputs

    def cast_outside_backward(self, args, kwargs):  # torch 2.11's behaviour
        if self._training_state == _fsdp_state.TrainingState.PRE_BACKWARD:
            return args, kwargs
        return original(self, args, kwargs)

    _fsdp_state.FSDPState._cast_forward_inputs = cast_outside_backward
    torch.manual_seed(0)
    policy = DiffusionPolicy(tiny_cosmos_transformer(latent_channels=4, text_dim=32), gradient_checkpointing=True,
                             lora=LoraConfig(r=4, lora_alpha=8.0, target_modules=["to_q", "to_k", "to_v"]))
    policy.shard(param_dtype=torch.bfloat16)
    seen: set[torch.dtype] = set()
    for block in policy.transformer.transformer_blocks:
        block.register_forward_pre_hook(
            lambda module, args, kwargs: seen.update(t.dtype for t in [*args, *kwargs.values()]
                                                     if isinstance(t, torch.Tensor) and t.is_floating_point()),
            with_kwargs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's note about view outputs of the wrapped root
        out = policy.velocity_fn()(torch.randn(1, 4, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 8, 32))
        out.float().square().mean().backward()
    return ",".join(sorted(str(d) for d in seen))


def test_checkpointed_blocks_recompute_in_the_compute_dtype_under_fsdp2():
    assert run_distributed(_checkpointed_bf16_step_without_fsdp_recompute_cast, 1) == ["torch.bfloat16"]
