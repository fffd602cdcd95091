"""Supervised fine-tuning of a (vision-)language model, e.g. Cosmos-Reason1 (Qwen2.5-VL) on video QA.

    python examples/sft.py --config examples/configs/sft_tiny.toml
    torchrun --nproc_per_node 2 examples/sft.py --config examples/configs/sft_tiny.toml train.epoch=2

    python examples/sft.py --config sft.toml --dataset tools/dataset/cosmos_sft.py   # a cosmos-rl dataset script

Read top to bottom: set up, train, save. Every block comes from cosmos_primitives; copy this file
and edit it for your own recipe. One optimizer step takes ``[train] train_batch_per_replica``
samples per data-parallel rank, packed into rows of at most ``packing_budget`` tokens (when
``sequence_packing``) and run as micro-batches of ``[train.train_policy] mini_batch`` rows; the loss
is the token mean over every micro-batch of every data-parallel rank. With ``[validation] enable``,
the mean token loss of the validation split (``[validation.dataset]``, or the part of the training
data ``[train.train_policy.dataset] test_size`` holds out) is logged as ``val/avg_loss`` every
``freq`` steps, after the last and, with ``val_before_train``, before the first. Metrics go to
``<output_dir>/<timestamp>/metrics.jsonl`` and, when the run ends, their plot to ``curves.png``
beside it (loss, val/avg_loss, grad_norm, lr; README, "What a run leaves behind"). A SIGTERM or
SIGUSR1 (``[train] signal_to_handle``) saves a checkpoint when the step in progress ends and stops the
run with exit status 75; ``train.resume=true`` goes on from it as if never stopped. Ctrl-C stops at
once (exit status 130, the checkpoints left whole) and prints the command that resumes the run.
"""

from __future__ import annotations

import math
import time

import torch

import cosmos_primitives as cp
from cosmos_primitives.algo.sft_objective import sft_loss, sft_token_weights, trained_mask
from cosmos_primitives.checkpoint import CheckpointManager
from cosmos_primitives.data import (
    BadSampleBudgetExceeded,
    all_ranks_have_batch,
    build_sft_datasets,
    build_sft_loader,
    build_sft_validation_loader,
)
from cosmos_primitives.policy import sft_validation_loss, without_labels


def main() -> None:
    cfg, config_path = cp.config.load_recipe_config(__doc__, dataset_plugin=True)  # --config, --dataset
    # process group, demo assets, config checks, memory plan, seed; the run folder and the checkpoint to
    # resume from, decided together (a resume continues in its own run's folder); <run_dir>/config.toml
    run = cp.run.start(cfg, config_path, memory_plan="sft", prefix="[SFT] ")
    cfg, info, run_dir = run.cfg, run.info, run.run_dir
    log = cp.logging.get_logger()
    mesh = cp.parallel.ParallelMesh(cfg.policy.parallelism, device_type=info.device.type)

    # Model, data, optimizer.
    processor = cp.policy.load_processor(cfg.policy.model_name_or_path)
    policy = cp.policy.build_policy(cfg.policy, mesh, train=cfg.train)
    # val_set: None unless [validation] enable
    train_set, val_set = build_sft_datasets(cfg.train.train_policy, cfg.validation, seed=cfg.train.seed,
                                            processor=processor, setup_config=cfg)
    loader = build_sft_loader(cfg.train.train_policy, processor, policy.config,
                              model_max_length=cfg.policy.model_max_length, seed=cfg.train.seed,
                              rank=mesh.dp_rank, world_size=mesh.dp_size, dataset=train_set)
    val_loader = None if val_set is None else build_sft_validation_loader(
        cfg.train.train_policy, processor, policy.config, val_set, model_max_length=cfg.policy.model_max_length,
        seed=cfg.train.seed, rank=mesh.dp_rank, world_size=mesh.dp_size)
    steps_per_epoch = math.ceil(len(loader.sampler) / cfg.train.train_batch_per_replica)
    total_steps = cfg.train.max_steps or cfg.train.epoch * steps_per_epoch
    optimizer = cp.policy.build_optimizer(policy, cfg.train)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps)
    ckpt = CheckpointManager(cfg.train.ckpt, run_dir, model=policy, optimizer=optimizer, scheduler=scheduler,
                             sampler=loader, processor=processor)
    state = ckpt.resume(run.resume_from)
    step = state.step if state else 0
    tracker = cp.logging.MetricsTracker(run_dir, cfg.logging, run_config=cp.config.config_to_dict(cfg),
                                        total_steps=total_steps, prefix="[SFT] ",
                                        resumed_step=step if cfg.train.resume else None)  # replayed rows go
    log.info(f"run dir {run_dir}; {total_steps} steps of {cfg.train.train_batch_per_replica} samples per rank; {mesh}")

    dp_group = mesh.group("dp")
    validated_at = None

    def validate(at: int) -> None:
        """Every rank scores its share of the validation split; rank 0 logs the token-mean loss."""
        nonlocal validated_at
        result = sft_validation_loss(policy, val_loader, samples_per_pass=cfg.train.train_batch_per_replica,
                                     device=info.device, group=dp_group, chunk_size=cfg.policy.logprob_chunk_size)
        tracker.log_metrics({"val/avg_loss": result.loss, "val/tokens": result.tokens}, at)
        tracker.log_text(f"[SFT] Validation loss: {result.loss} for train step {at}/{total_steps}, "
                         f"epoch {loader.epoch}")
        validated_at = at

    if val_loader is not None and step == 0 and cfg.validation.val_before_train:
        validate(0)
    # a SIGTERM / SIGUSR1 ([train] signal_to_handle) saves the step in progress once it ends, then stops
    preemption = cp.checkpoint.Preemption.from_config(cfg.train, device=info.device)
    done = step >= total_steps
    epoch_start = (step, loader.sampler.position == 0)  # an epoch without one step: every sample was bad
    while not done and loader.epoch < cfg.train.epoch:
        start = time.perf_counter()
        micro_batches = loader.next_step(cfg.train.train_batch_per_replica)
        while micro_batches == []:  # every sample of the step was bad: take the next ones
            micro_batches = loader.next_step(cfg.train.train_batch_per_replica)
        if not all_ranks_have_batch(micro_batches is not None, device=info.device, group=dp_group):
            if epoch_start == (step, True):  # as GRPO's prompt stream: stop rather than export an untrained model
                raise BadSampleBudgetExceeded(f"no optimizer step in epoch {loader.epoch}: every sample (of at least "
                                              f"one rank's share) was bad.\n{loader.bad_samples.report()}")
            loader.start_next_epoch()
            epoch_start = (step, True)
            continue
        # FSDP needs the same number of forward / backward passes on every rank: pad with copies
        # that train on nothing
        count = torch.tensor([len(micro_batches)], device=info.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        micro_batches += [without_labels(micro_batches[0]) for _ in range(int(count) - len(micro_batches))]
        # token mean over every micro-batch of every data-parallel rank
        tokens = sum(int(trained_mask(b["labels"]).sum()) for b in micro_batches)
        global_tokens = cp.parallel.all_reduce_sum(torch.tensor([tokens], device=info.device), dp_group).item()
        nll_sum = torch.zeros((), device=info.device)
        for batch in micro_batches:
            # the batch stays on the host: token_logprobs finds the scored positions and the packed
            # samples' offsets there before moving it, so the step makes no host sync on a GPU
            labels = batch["labels"].to(info.device, non_blocking=True)
            # the LM head computes this loss's gradient in its forward: one GEMM less than autograd
            weights = sft_token_weights(labels, group=dp_group, token_count=global_tokens)
            out = cp.policy.token_logprobs(policy, batch, chunk_size=cfg.policy.logprob_chunk_size,
                                           loss_weights=weights)
            loss, stats = sft_loss(out.logprobs, labels, group=dp_group, token_count=global_tokens,
                                   weighted_sum=out.weighted_sum)
            loss.backward()
            nll_sum += stats["loss"].detach() * stats["tokens"]
        grad_norm = cp.parallel.clip_grad_norm_(policy.parameters(), cfg.train.optm_grad_norm_clip)
        nll_sum = float(nll_sum)  # once per step, after the backward passes
        # a NaN / inf loss or gradient stops the run ([train] nonfinite = "stop") or skips the update
        if cp.policy.check_finite(torch.tensor(nll_sum, device=info.device), grad_norm, step=step + 1,
                                      mode=cfg.train.nonfinite, group=dp_group):
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tracker.log_metrics({"loss": nll_sum / max(global_tokens, 1), "grad_norm": grad_norm,
                             "lr": scheduler.get_last_lr()[0], "tokens": global_tokens, "epoch": loader.epoch,
                             "step_time": time.perf_counter() - start,
                             "bad_samples": loader.bad_samples.count}, step)
        done = step >= total_steps
        if val_loader is not None and step % cfg.validation.freq == 0 and not done:
            validate(step)
        ckpt.maybe_save(step, epoch=loader.epoch, force=step == total_steps)
        if preemption.stop_here(ckpt, step, epoch=loader.epoch):
            break

    if val_loader is not None and validated_at != step and not preemption.stopped:
        validate(step)  # after the last step, as cosmos-rl does
    # safetensors/final (unless preempted), checkpoints and uploads settled, <run dir>/curves.png, exit status
    run.finish(ckpt, tracker, preemption, step=step, total_steps=total_steps,
               plot=["loss", "val/avg_loss", "grad_norm", "lr"])


if __name__ == "__main__":
    with cp.checkpoint.exit_on_interrupt():  # Ctrl-C: no traceback; prints the command that resumes the run
        main()
