"""Context parallel for the world-model transformer: the tiny ``WanTransformer3DModel`` with its video
tokens split over 2 gloo ranks (diffusers' Ulysses, set up from our mesh) against one process, for
one flow-matching step: the loss to 1e-6 and, after averaging the gradients over the cp group, every
parameter's gradient to 1e-4 relative + 1e-6 absolute (float32; sums in another order); the same with
FSDP2 over dp_shard x cp (whose gradient average does the cp reduction). Cosmos-Predict2.5's
transformer has no context-parallel plan in diffusers and is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.policy import ParallelismConfig

pytestmark = pytest.mark.slow


def _step_inputs() -> dict[str, torch.Tensor]:
    """Latents ``[2, 4, 3, 8, 8]`` (3 x 4 x 4 = 48 tokens after the 1 x 2 x 2 patch), text, sigma."""
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(2, 4, 3, 8, 8, generator=g)
    noise = torch.randn(2, 4, 3, 8, 8, generator=g)
    sigma = torch.tensor([0.3, 0.7])
    return {"clean": clean, "noise": noise, "sigma": sigma, "text": torch.randn(2, 5, 32, generator=g)}


def _flow_step(policy: cp.policy.DiffusionPolicy, group=None) -> tuple[float, dict[str, torch.Tensor]]:
    """Flow-matching loss ``|v(x_sigma) - (noise - clean)|^2`` and the gradients (whole tensors)."""
    x = _step_inputs()
    s = x["sigma"].view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x["clean"] + s * x["noise"]
    velocity = policy.velocity_fn()(noisy, x["sigma"] * 1000.0, x["text"])
    loss = ((velocity.float() - (x["noise"] - x["clean"])) ** 2).mean()
    loss.backward()
    if group is not None:
        from cosmos_primitives.parallel.context_parallel import all_reduce_context_parallel_grads

        all_reduce_context_parallel_grads(policy.transformer, group)
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
             for n, p in policy.transformer.named_parameters()}
    return float(loss.detach()), {n: g.detach().clone() for n, g in grads.items()}


def _cp_worker(fsdp: bool) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    """cp = 2; with ``fsdp``, FSDP2 over dp_shard x cp too (its gradient average replaces the cp all-reduce)."""
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(cp_size=2), device_type="cpu")
    policy = cp.policy.DiffusionPolicy(cpt.tiny_wan_transformer(seed=0)).enable_context_parallel(mesh)
    if fsdp:
        policy.shard(mesh.fsdp_mesh)
    tokens: list[int] = []  # the sequence length each block's self-attention sees on this rank
    for block in cp.policy.transformer_blocks(policy.transformer):
        block.attn1.register_forward_pre_hook(lambda m, args, kwargs: tokens.append(
            kwargs.get("hidden_states", args[0] if args else None).shape[1]), with_kwargs=True)
    return (*_flow_step(policy, None if fsdp else mesh.group("cp")), tokens)


@pytest.mark.parametrize("fsdp", [False, True], ids=["cp2", "fsdp-x-cp2"])
def test_wan_transformer_context_parallel_matches_one_process(fsdp: bool) -> None:
    ref_loss, ref_grads = _flow_step(cp.policy.DiffusionPolicy(cpt.tiny_wan_transformer(seed=0)))
    per_rank = cpt.run_distributed(_cp_worker, 2, (fsdp,), timeout_s=400)
    for rank, (loss, grads, tokens) in enumerate(per_rank):
        assert tokens == [24, 24], tokens  # 48 video tokens, half on each rank, in both blocks
        assert abs(loss - ref_loss) < 1e-6, (rank, loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"rank {rank} {name}")


def _refusals() -> list[str]:
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(cp_size=2), device_type="cpu")
    errors = []
    for build in (cpt.tiny_cosmos_transformer, lambda: cpt.tiny_wan_transformer(seed=0)):
        transformer = build()
        try:
            cp.policy.enable_transformer_context_parallel(transformer, mesh)
            if errors:  # Wan: a latent whose 3 x 3 x 3 = 27 tokens do not split over 2 ranks
                transformer(hidden_states=torch.zeros(1, 4, 3, 6, 6), encoder_hidden_states=torch.zeros(1, 5, 32),
                            timestep=torch.tensor([500.0]))
            errors.append("")
        except (NotImplementedError, ValueError) as error:
            errors.append(str(error))
    torch.distributed.barrier()  # no collective follows the refusals: keep rank 0's store up for the others
    return errors


def test_cosmos_transformer_and_uneven_tokens_are_refused() -> None:
    cosmos, uneven = cpt.run_distributed(_refusals, 2, timeout_s=400)[0]
    assert "CosmosTransformer3DModel has no context-parallel plan" in cosmos and "cp_size = 1" in cosmos
    assert "27 video tokens" in uneven and "cp_size = 2" in uneven


def test_recipe_with_context_parallel_trains_as_one_process(tmp_path) -> None:
    """examples/wfm_rl.py with ``policy.parallelism.cp_size = 2`` (the guide's ``[model_parallel]
    context_parallel_size``) on 2 gloo ranks: both ranks of the cp group take the same prompts and noise,
    FSDP2 over dp_shard x cp, and two FlowGRPO steps log what one process logs (policy loss, gradient
    norm, rewards after the first update) to 1e-4 relative."""
    from cosmos_primitives.logging import read_metrics
    from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

    root = Path(__file__).resolve().parents[1]
    common = ["logging.logger=[]", "train.max_steps=2", "wfm.num_samples_per_prompt=4", "wfm.num_inference_steps=4",
              "wfm.eval_num_inference_steps=0", "wfm.sampler.sde_window_size=0", "train.ckpt.enable_checkpoint=false"]
    runs = {}
    for nproc in (1, 2):
        out, log = tmp_path / f"out{nproc}", tmp_path / f"log{nproc}.txt"
        proc = launch_recipe(root / "examples" / "wfm_rl.py", root / "examples" / "configs" / "wfm_flowgrpo_tiny.toml",
                             [*common, f"train.output_dir={out}", f"policy.parallelism.cp_size={nproc}"], log,
                             cwd=root, nproc=nproc, env={"COSMOS_DEVICE": "cpu", "OMP_NUM_THREADS": "1"})
        finish(proc, log)
        runs[nproc] = read_metrics(only_run_dir(out))
    assert [r["step"] for r in runs[2]] == [r["step"] for r in runs[1]] == [1, 2]
    for one, two in zip(runs[1], runs[2]):
        for key in ("policy_loss", "grad_norm", "reward_mean"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), (one["step"], key)
