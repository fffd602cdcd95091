"""Context parallel for the world-model transformers, against one process, for one flow-matching step.

Wan (``WanTransformer3DModel``, diffusers' Ulysses set up from our mesh): cp = 2, FSDP2 over dp_shard x
cp with cp = 2, and cp = 4 (4 heads). Cosmos-Predict2.5 (``CosmosTransformer3DModel``, our split,
``policy/cosmos_context_parallel.py``): cp = 2 (2 heads), cp = 4 (4 heads, learnable position
embedding, gradient checkpointing) and FSDP2 over dp_shard 2 x cp 2 (world 4, each dp rank one
sample), each for text-to-world, video-to-world (one conditioning frame in the condition mask) and a
per-frame ``[B, 1, T, 1, 1]`` timestep (per-token time embeddings).

Tolerances (float32; the sums run in another order): the loss to 1e-6 absolute and, after averaging
the gradients over the cp group (or FSDP2's average), every parameter's gradient to 1e-4 relative +
1e-6 absolute. Measured (CPU, torch 2.14, diffusers 0.42.1): Cosmos loss errors <= 1.2e-7, gradient
errors <= 4.5e-8 absolute, <= 7.2e-7 of the tensor's largest entry (run with ``-s`` to see them).
Uneven tokens and heads are refused with errors naming the sizes. Two recipe runs (Wan with
``cp_size = 2``; a tiny Cosmos-Predict2.5 folder with the guide's ``[model_parallel]
context_parallel_size = 2``) log one process's first two steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config.policy import ParallelismConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _step_inputs() -> dict[str, torch.Tensor]:
    """Latents ``[2, 4, 3, 8, 8]`` (3 x 4 x 4 = 48 tokens after the 1 x 2 x 2 patch), text, sigma."""
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(2, 4, 3, 8, 8, generator=g)
    noise = torch.randn(2, 4, 3, 8, 8, generator=g)
    sigma = torch.tensor([0.3, 0.7])
    return {"clean": clean, "noise": noise, "sigma": sigma, "text": torch.randn(2, 5, 32, generator=g)}


def _gradients(model: torch.nn.Module, group=None) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, whole (averaged over ``group`` first when given); then zeroed."""
    if group is not None:
        from cosmos_primitives.parallel.context_parallel import all_reduce_context_parallel_grads

        all_reduce_context_parallel_grads(model, group)
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _flow_step(policy: cp.policy.DiffusionPolicy, group=None) -> tuple[float, dict[str, torch.Tensor]]:
    """Flow-matching loss ``|v(x_sigma) - (noise - clean)|^2`` and the gradients (whole tensors)."""
    x = _step_inputs()
    s = x["sigma"].view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x["clean"] + s * x["noise"]
    velocity = policy.velocity_fn()(noisy, x["sigma"] * 1000.0, x["text"])
    loss = ((velocity.float() - (x["noise"] - x["clean"])) ** 2).mean()
    loss.backward()
    return float(loss.detach()), _gradients(policy.transformer, group)


def _cp_worker(cp_size: int, fsdp: bool) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    """cp = ``cp_size`` (2 heads, or 4 for cp = 4); with ``fsdp``, FSDP2 over dp_shard x cp too (its gradient
    average replaces the cp all-reduce)."""
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(cp_size=cp_size), device_type="cpu")
    wan = cpt.tiny_wan_transformer(seed=0, num_attention_heads=max(2, cp_size))
    policy = cp.policy.DiffusionPolicy(wan).enable_context_parallel(mesh)
    if fsdp:
        policy.shard(mesh.fsdp_mesh)
    tokens: list[int] = []  # the sequence length each block's self-attention sees on this rank
    for block in cp.policy.transformer_blocks(policy.transformer):
        block.attn1.register_forward_pre_hook(lambda m, args, kwargs: tokens.append(
            kwargs.get("hidden_states", args[0] if args else None).shape[1]), with_kwargs=True)
    return (*_flow_step(policy, None if fsdp else mesh.group("cp")), tokens)


@pytest.mark.parametrize(("cp_size", "fsdp"), [(2, False), (2, True), (4, False)], ids=["cp2", "fsdp-x-cp2", "cp4"])
def test_wan_transformer_context_parallel_matches_one_process(cp_size: int, fsdp: bool) -> None:
    wan = cpt.tiny_wan_transformer(seed=0, num_attention_heads=max(2, cp_size))
    ref_loss, ref_grads = _flow_step(cp.policy.DiffusionPolicy(wan))
    per_rank = cpt.run_distributed(_cp_worker, cp_size, (cp_size, fsdp), timeout_s=400)
    for rank, (loss, grads, tokens) in enumerate(per_rank):
        assert tokens == [48 // cp_size] * 2, tokens  # 48 video tokens, N / cp on each rank, in both blocks
        assert abs(loss - ref_loss) < 1e-6, (rank, loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"rank {rank} {name}")


COSMOS_CASES = ("text-to-world", "video-to-world", "per-frame-timestep")


def _cosmos(cp_size: int) -> cp.policy.DiffusionPolicy:
    """The tiny Cosmos-Predict2.5 transformer for cp = 2; for cp = 4 one with 4 heads and learnable positions,
    with gradient checkpointing (the blocks, split and all-to-alls included, run again in backward)."""
    if cp_size == 2:
        return cp.policy.DiffusionPolicy(cpt.tiny_cosmos_transformer(seed=0))
    return cp.policy.DiffusionPolicy(
        cpt.tiny_cosmos_transformer(seed=0, num_attention_heads=4, extra_pos_embed_type="learnable"),
        gradient_checkpointing=True)


def _cosmos_steps(policy: cp.policy.DiffusionPolicy, samples: slice = slice(None),
                  group=None) -> dict[str, tuple[float, dict[str, torch.Tensor]]]:
    """Per case of ``COSMOS_CASES``: the flow-matching loss on ``samples`` of the batch and the gradients.

    Text- and video-to-world go through ``cosmos_velocity_fn`` as the recipe does (video-to-world: the
    first latent frame marked as conditioning in the condition-mask channel); the per-frame case calls
    the transformer with a ``[B, 1, T, 1, 1]`` timestep (0 on the conditioning frame), which gives it
    per-token time embeddings."""
    x = {k: v[samples] for k, v in _step_inputs().items()}
    s = x["sigma"].view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x["clean"] + s * x["noise"]
    b, _, t, h, w = noisy.shape
    out = {}
    for case in COSMOS_CASES:
        if case == "per-frame-timestep":
            timestep = s.expand(b, 1, t, 1, 1).clone()
            timestep[:, :, 0] = 0.0
            mask = torch.zeros(b, 1, t, h, w)
            mask[:, :, 0] = 1.0
            velocity = policy.transformer(hidden_states=noisy, timestep=timestep, encoder_hidden_states=x["text"],
                                          condition_mask=mask, padding_mask=torch.zeros(1, 1, h, w),
                                          return_dict=False)[0]
        else:
            velocity = policy.velocity_fn()(noisy, x["sigma"] * 1000.0, x["text"],
                                            num_condition_frames=int(case == "video-to-world"))
        loss = ((velocity.float() - (x["noise"] - x["clean"])) ** 2).mean()
        loss.backward()
        out[case] = (float(loss.detach()), _gradients(policy.transformer, group))
    return out


def _cosmos_cp_worker(cp_size: int, dp_shard: int) -> tuple[dict, list[int]]:
    """cp = ``cp_size``; with ``dp_shard > 1``, FSDP2 over dp_shard x cp (its gradient average replaces the cp
    all-reduce) and dp rank ``d`` takes sample ``d``; also the token count each attention saw on this rank."""
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(cp_size=cp_size, dp_shard_size=dp_shard), device_type="cpu")
    policy = _cosmos(cp_size).enable_context_parallel(mesh)
    tokens: list[int] = []
    for block in cp.policy.transformer_blocks(policy.transformer):
        for attn in (block.attn1, block.attn2):
            attn.register_forward_pre_hook(lambda m, args, kwargs: tokens.append(
                kwargs.get("hidden_states", args[0] if args else None).shape[1]), with_kwargs=True)
    if dp_shard > 1:
        policy.shard(mesh.fsdp_mesh)
        return _cosmos_steps(policy, slice(mesh.dp_rank, mesh.dp_rank + 1)), tokens
    return _cosmos_steps(policy, group=mesh.group("cp")), tokens


def _max_errors(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest absolute gradient error and the largest one relative to its tensor's largest entry."""
    diffs = [((grads[n] - g).abs().max().item(), g.abs().max().item()) for n, g in ref.items()]
    return max(d for d, _ in diffs), max(d / m for d, m in diffs if m > 0)


@pytest.mark.parametrize(("cp_size", "dp_shard"), [(2, 1), (4, 1), (2, 2)], ids=["cp2", "cp4", "fsdp2-x-cp2"])
def test_cosmos_transformer_context_parallel_matches_one_process(cp_size: int, dp_shard: int) -> None:
    ref = _cosmos_steps(_cosmos(cp_size))
    world = cp_size * dp_shard
    per_rank = cpt.run_distributed(_cosmos_cp_worker, world, (cp_size, dp_shard), timeout_s=400)
    per_block = [48 // cp_size] * 2  # 48 video tokens (3 x 4 x 4), N / cp on each rank, attn1 and attn2
    calls = 2 * len(COSMOS_CASES) * (2 if cp_size == 4 else 1)  # 2 blocks; checkpointing runs them again
    for rank, (steps, tokens) in enumerate(per_rank):
        assert tokens == per_block * calls, (rank, tokens)
        for case, (ref_loss, ref_grads) in ref.items():
            loss, grads = steps[case]
            if dp_shard > 1:  # each dp rank's loss is its sample's; their mean is the batch's
                loss = sum(per_rank[r][0][case][0] for r in range(rank % cp_size, world, cp_size)) / dp_shard
            assert abs(loss - ref_loss) < 1e-6, (rank, case, loss, ref_loss)
            assert grads.keys() == ref_grads.keys()
            for name, g in ref_grads.items():
                torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"rank {rank} {case} {name}")
            print(f"cosmos cp={cp_size} dp_shard={dp_shard} rank {rank} {case}: loss error {abs(loss - ref_loss):.2e}, "
                  "gradient max abs / relative error {:.2e} / {:.2e}".format(*_max_errors(grads, ref_grads)))


def _refusals() -> list[str]:
    mesh = cp.parallel.ParallelMesh(ParallelismConfig(cp_size=2), device_type="cpu")
    errors = []
    builds = (lambda: cpt.tiny_cosmos_transformer(seed=0, num_attention_heads=3), cpt.tiny_cosmos_transformer,
              lambda: cpt.tiny_wan_transformer(seed=0), lambda: torch.nn.Linear(4, 4))  # the last: no plan at all
    for build in builds:
        transformer = build()
        try:
            cp.policy.enable_transformer_context_parallel(transformer, mesh)
            # a latent whose 3 x 3 x 3 = 27 tokens do not split over 2 ranks (refused before the forward)
            transformer(hidden_states=torch.zeros(1, 4, 3, 6, 6), encoder_hidden_states=torch.zeros(1, 5, 32),
                        timestep=torch.tensor([0.5]))
            errors.append("")
        except (NotImplementedError, ValueError) as error:
            errors.append(str(error))
    torch.distributed.barrier()  # no collective follows the refusals: keep rank 0's store up for the others
    return errors


def test_uneven_heads_and_tokens_and_unknown_classes_are_refused() -> None:
    heads, cosmos_uneven, wan_uneven, no_plan = cpt.run_distributed(_refusals, 2, timeout_s=400)[0]
    assert "diffusers' Linear has no context-parallel plan" in no_plan and "cp_size = 1" in no_plan
    assert "cp_size = 2 does not divide CosmosTransformer3DModel's 3 attention heads" in heads
    for uneven, name in ((cosmos_uneven, "CosmosTransformer3DModel"), (wan_uneven, "WanTransformer3DModel")):
        assert f"{name}: 27 video tokens ((3, 6, 6) latents, patch (1, 2, 2))" in uneven and "cp_size = 2" in uneven


def _recipe_metrics(config: Path, overrides: list[str], nproc: int, out: Path) -> list[dict]:
    """examples/wfm_rl.py for two FlowGRPO steps on ``nproc`` gloo ranks (torchrun); its metrics records."""
    from cosmos_primitives.logging import read_metrics
    from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

    common = ["logging.logger=[]", "train.max_steps=2", "wfm.num_samples_per_prompt=4", "wfm.num_inference_steps=4",
              "wfm.eval_num_inference_steps=0", "wfm.sampler.sde_window_size=0", "train.ckpt.enable_checkpoint=false"]
    log = out.with_suffix(".log")
    proc = launch_recipe(ROOT / "examples" / "wfm_rl.py", config, [*common, f"train.output_dir={out}", *overrides], log,
                         cwd=ROOT, nproc=nproc, env={"COSMOS_DEVICE": "cpu", "OMP_NUM_THREADS": "1"})
    finish(proc, log)
    return read_metrics(only_run_dir(out))


def _assert_same_first_steps(one: list[dict], two: list[dict]) -> None:
    """Two steps each, the same policy loss, gradient norm and rewards to 1e-4 relative."""
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    for a, b in zip(one, two):
        for key in ("policy_loss", "grad_norm", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)


def test_recipe_with_context_parallel_trains_as_one_process(tmp_path) -> None:
    """examples/wfm_rl.py with ``policy.parallelism.cp_size = 2`` (the guide's ``[model_parallel]
    context_parallel_size``) on 2 gloo ranks: both ranks of the cp group take the same prompts and noise,
    FSDP2 over dp_shard x cp, and two FlowGRPO steps log what one process logs (policy loss, gradient
    norm, rewards after the first update) to 1e-4 relative."""
    config = ROOT / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"
    runs = {nproc: _recipe_metrics(config, [f"policy.parallelism.cp_size={nproc}"], nproc, tmp_path / f"out{nproc}")
            for nproc in (1, 2)}
    _assert_same_first_steps(runs[1], runs[2])


def test_cosmos_predict2_5_recipe_with_the_guides_context_parallel_snippet(tmp_path) -> None:
    """The world-model guide's ``[model_parallel] context_parallel_size = 2`` for a (tiny) Cosmos-Predict2.5
    folder: examples/wfm_rl.py on 2 gloo ranks splits the Cosmos transformer's video tokens and logs the
    first two FlowGRPO steps as one process does without the snippet."""
    from test_wfm_recipes import CONFIGS, write_folder

    folder = write_folder(tmp_path / "tiny-cosmos-diffusers", cpt.tiny_cosmos_transformer(seed=0),
                          cpt.tiny_unipc_flow_scheduler())
    base = CONFIGS / "wfm_flowgrpo_tiny.toml"
    snippet = tmp_path / "wfm_flowgrpo_tiny_cp2.toml"
    snippet.write_text(base.read_text() + "\n[model_parallel]\ncontext_parallel_size = 2\n")
    model = [f"policy.model_name_or_path={folder}"]
    one = _recipe_metrics(base, model, 1, tmp_path / "out1")
    _assert_same_first_steps(one, _recipe_metrics(snippet, model, 2, tmp_path / "out2"))
