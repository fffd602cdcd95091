"""What bounds the activation memory of a world-model RL update, on the tiny Cosmos transformer in float32:

- gradient accumulation (``micro_batch`` of ``cp.policy.flow_grpo_update`` / ``diffusion_nft_update``,
  ``[train.train_policy] mini_batch`` in the recipe) gives the gradients, losses and metrics of the
  whole mini-batch at once, for FlowGRPO (guidance, KL), DDRL's data term (fresh noise and sigma)
  and DiffusionNFT, with uneven micro-batches and two mini-batches;
- the transformer's gradient checkpointing (diffusers' own, non-reentrant, per block, LoRA layers
  inside) keeps under a fifth of the saved activations of a trained step, and its recompute gives
  the same gradients.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from cosmos_primitives.algo.flow_sde import SDEParams
from cosmos_primitives.algo.flow_step import recompute_step
from cosmos_primitives.config.policy import LoraConfig
from cosmos_primitives.config.wfm import WFMConfig
from cosmos_primitives.policy import DiffusionPolicy, diffusion_nft_update, flow_grpo_update
from cosmos_primitives.policy.flow_update import minibatch_rows, split_rows
from cosmos_primitives.rollout.flow_sampler import sample_flow
from cosmos_primitives.testing import tiny_cosmos_transformer
from cosmos_primitives.testing.activation_memory import SavedTensorBytes

pytest.importorskip("diffusers")
pytest.importorskip("torchvision")  # the Cosmos transformer resizes its padding mask with it

B = 6
LATENT = (4, 2, 4, 4)  # C, T, H, W: 2 x 2 x 2 = 8 video tokens per sample
LORA = LoraConfig(r=4, lora_alpha=8.0, target_modules=["to_q", "to_k", "to_v", "to_out.0"])


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class GradientRecorder:
    """An optimizer that records the gradients it is asked to step with and changes nothing, so every
    mini-batch of two runs sees the same weights."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params, self.steps = params, []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.steps.append([p.grad.detach().clone() for p in self.params])


def _policy(seed: int = 0, *, checkpointing: bool = False, dtype: torch.dtype = torch.float32) -> DiffusionPolicy:
    policy = DiffusionPolicy(tiny_cosmos_transformer(seed=seed).to(dtype), lora=LORA, keep_reference=True,
                             gradient_checkpointing=checkpointing)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # LoRA B = 0 at init would leave every lora_A gradient 0
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    policy.transformer.train()
    return policy


def _batch():
    gen = torch.Generator().manual_seed(7)
    text = torch.randn(B, 8, 32, generator=gen)
    negative = torch.randn(1, 8, 32, generator=gen)
    advantages = torch.randn(B, generator=gen)
    clips = torch.randn(B, *LATENT, generator=gen)
    return text, negative, advantages, clips


def _update(algorithm: str, micro_batch: int | None,
            dtype: torch.dtype = torch.float32) -> tuple[list[list[torch.Tensor]], dict[str, float]]:
    """The gradients of each mini-batch of one update, and its metrics (the sampler's maths in float32,
    the transformer and its LoRA weights in ``dtype``)."""
    policy = _policy(dtype=dtype)
    text, negative, advantages, clips = _batch()
    velocity = policy.velocity_fn()
    optimizer = GradientRecorder(policy.trainable_parameters())
    rng = {"train_steps": torch.Generator().manual_seed(1), "ddrl": torch.Generator().manual_seed(2)}
    if algorithm == "diffusion_nft":
        w = WFMConfig(algorithm="diffusion_nft", num_minibatches=2, nft_num_timesteps=2, kl_beta=0.1)
        samples = torch.randn(B, *LATENT, generator=torch.Generator().manual_seed(3))
        metrics = diffusion_nft_update(policy, velocity, optimizer, samples=samples, text=text, advantages=advantages,
                                       wfm=w, grad_clip=1e9, nonfinite="stop", micro_batch=micro_batch,
                                       generator=torch.Generator().manual_seed(4), step=1)
        return optimizer.steps, metrics
    ddrl = algorithm == "ddrl"
    w = WFMConfig(algorithm=algorithm, num_minibatches=2, train_step_fraction=0.5, kl_beta=0.05,
                  data_beta=1.0 if ddrl else 0.0, ddrl_rollout_noise=not ddrl, ddrl_rollout_sigma=not ddrl,
                  clip_range=0.2)
    sigmas = torch.linspace(1.0, 0.0, 5)
    with torch.no_grad():
        traj = sample_flow(velocity, text, latent_shape=LATENT, sigmas=sigmas, timesteps=sigmas[:-1] * 1000,
                           seeds=list(range(B)), negative_text=negative, guidance_scale=2.0, sde=SDEParams())
    metrics = flow_grpo_update(policy, velocity, optimizer, trajectory=traj, text=text, advantages=advantages,
                               negative=negative, clips=clips if ddrl else None, wfm=w, grad_clip=1e9,
                               nonfinite="stop", micro_batch=micro_batch, rng=rng, step=1)
    return optimizer.steps, metrics


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# float64 shows the accumulation is exact; in float32 the forward of 1, 2 or 3 rows rounds differently
# (the relative differences measured: 3e-7 .. 2e-6 per weight tensor, the rounding floor of 2 blocks + backward)
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("algorithm", ["flow_grpo", "ddrl", "diffusion_nft"])
def test_micro_batches_give_the_gradients_of_the_whole_mini_batch(algorithm: str, dtype: torch.dtype):
    whole, whole_metrics = _update(algorithm, None, dtype)
    assert len(whole) == 2  # two mini-batches of 3 samples: one optimizer step each
    assert all(g.abs().sum() > 0 for g in whole[0])  # every LoRA weight gets a gradient
    for micro_batch in (1, 2):  # 3 samples as 1 + 1 + 1 and as 2 + 1
        steps, metrics = _update(algorithm, micro_batch, dtype)
        for mini, (got, want) in enumerate(zip(steps, whole)):
            worst = max(_relative_error(g, w) for g, w in zip(got, want))
            assert worst < TOLERANCE[dtype], f"micro_batch {micro_batch}, mini-batch {mini}: relative error {worst:.2e}"
        assert metrics.keys() == whole_metrics.keys()
        for key, value in whole_metrics.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_micro_batch_larger_than_the_mini_batch_is_the_whole_mini_batch():
    whole, _ = _update("flow_grpo", None)
    large, _ = _update("flow_grpo", 100)
    for got, want in zip(large, whole):
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_rows_of_mini_and_micro_batches():
    assert minibatch_rows(7, 2) == [slice(0, 4), slice(4, 7)]  # as torch.arange(7).chunk(2)
    assert split_rows(slice(4, 7), 2) == [slice(4, 6), slice(6, 7)]
    assert split_rows(slice(4, 7), None) == [slice(4, 7)]
    with pytest.raises(ValueError, match="mini_batch"):
        split_rows(slice(0, 4), 0)


# --- activation checkpointing -------------------------------------------------------------------------


def _trained_step(checkpointing: bool) -> tuple[int, list[torch.Tensor]]:
    """Saved-activation bytes of one trained step's forward (guided, as the recipe's), and its LoRA gradients."""
    policy = _policy(checkpointing=checkpointing)
    text, negative, advantages, _ = _batch()
    sigmas = torch.linspace(1.0, 0.0, 5)
    with torch.no_grad():
        traj = sample_flow(policy.velocity_fn(), text, latent_shape=LATENT, sigmas=sigmas,
                           timesteps=sigmas[:-1] * 1000, seeds=list(range(B)), negative_text=negative,
                           guidance_scale=2.0, sde=SDEParams())
    with SavedTensorBytes(policy.transformer) as saved:
        now = recompute_step(policy.velocity_fn(), traj, 1, text, negative)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "None of the inputs have requires_grad=True" (reentrant checkpoints)
        (-(advantages * now.log_prob).mean()).backward()
    return saved.bytes, [p.grad for p in policy.trainable_parameters()]


def test_checkpointing_keeps_under_a_fifth_of_the_activations_and_recomputes_the_same_gradients():
    plain, plain_grads = _trained_step(checkpointing=False)
    kept, grads = _trained_step(checkpointing=True)
    # 2 blocks of 32 wide: without checkpointing each keeps ~20 tensors per token, with it only its input
    # (and the output layers and the sampler's float32 maths stay outside the blocks either way)
    assert kept < 0.2 * plain, f"checkpointing keeps {kept} of {plain} saved bytes"
    tokens, hidden = B * 8, 32
    assert kept >= 2 * tokens * hidden * 4  # the two blocks' inputs are counted
    for got, want in zip(grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_saved_tensor_bytes_counts_storages_once_and_leaves_weights_out():
    linear = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    with SavedTensorBytes(linear) as saved:
        y = linear(x)
        (y * y).sum()  # y saved twice by mul: one storage
    assert saved.bytes == x.numel() * 4 + y.numel() * 4
