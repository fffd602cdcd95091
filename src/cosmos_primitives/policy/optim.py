"""AdamW (fused kernels where torch has them; float32 moments also for bfloat16 master weights) and
the warmup + cosine / linear / sqrt / constant learning-rate schedule (``[train] optm_*``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler

from cosmos_primitives.config.train import TrainConfig
from cosmos_primitives.logging.console import get_logger

log = get_logger()

DECAY_TYPES = ("cosine", "linear", "sqrt", "constant")
OPTIMIZER_IMPLS = ("fused", "foreach", "for-loop")
"""Values of ``[train] optm_impl`` (cosmos-rl's)."""

FUSED_ADAMW_DEVICE_TYPES = ("cuda", "cpu", "xpu")
"""Device types with fused AdamW kernels in torch (>= 2.4 for the CPU; all of them take DTensors)."""


def lr_factor(step: int, *, warmup_steps: int, total_steps: int | None, decay_type: str,
              min_lr_factor: float) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based): cosmos-rl's schedule
    (``build_lr_schedulers`` of ``cosmos_rl/policy/trainer/optm``, whole-run decay, warmup from 0).

    ``W = min(warmup_steps, total_steps)`` (clamped, so a run shorter than its warmup still reaches
    the peak at its last step). Warmup: ``step / (W - 1)`` for ``step < W`` (0 at the first step, 1
    at step ``W - 1``; 1 when ``W = 1``). Then, with ``progress = (step - W) / (total_steps - W)``
    clamped to [0, 1]: cosine ``m + (1 - m) * (1 + cos(pi * progress)) / 2``, linear
    ``m + (1 - m) * (1 - progress)``, sqrt ``m + (1 - m) * (1 - sqrt(progress))``, constant ``1``;
    ``m = min_lr_factor``, reached one step after the last (``total_steps``), as cosmos-rl's
    schedule ends.
    """
    warmup = warmup_steps if total_steps is None else min(warmup_steps, total_steps)
    if step < warmup:
        return 1.0 if warmup == 1 else step / (warmup - 1)
    if decay_type == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"optm_decay_type = {decay_type!r} needs the total number of steps (total_steps)")
    progress = min(max((step - warmup) / max(total_steps - warmup, 1), 0.0), 1.0)
    if decay_type == "cosine":
        return min_lr_factor + (1.0 - min_lr_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if decay_type == "linear":
        return min_lr_factor + (1.0 - min_lr_factor) * (1.0 - progress)
    if decay_type == "sqrt":
        return min_lr_factor + (1.0 - min_lr_factor) * (1.0 - math.sqrt(progress))
    raise ValueError(f"unknown [train] optm_decay_type {decay_type!r}; use one of {', '.join(DECAY_TYPES)}")


class WarmupDecayLR(LRScheduler):
    """``lr = base_lr * lr_factor(step)``; call ``step()`` once after every ``optimizer.step()``.

    ``state_dict()`` / ``load_state_dict()`` carry the step and the schedule's settings, so a
    resumed run continues the exact learning-rate sequence (restore the optimizer first).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_steps: int = 0, total_steps: int | None = None,
                 decay_type: str = "constant", min_lr_factor: float = 0.0, last_epoch: int = -1) -> None:
        if decay_type not in DECAY_TYPES:
            raise ValueError(f"unknown [train] optm_decay_type {decay_type!r}; use one of {', '.join(DECAY_TYPES)}")
        if decay_type != "constant" and total_steps is None:
            raise ValueError(
                f"optm_decay_type = {decay_type!r} needs total_steps "
                "(e.g. [train] max_steps, or epochs x steps per epoch)"
            )
        if warmup_steps < 0 or not 0.0 <= min_lr_factor <= 1.0:
            raise ValueError(
                f"optm_warmup_steps must be >= 0 (got {warmup_steps}) and optm_min_lr_factor in [0, 1] "
                f"(got {min_lr_factor})"
            )
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay_type = decay_type
        self.min_lr_factor = min_lr_factor
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int | None = None) -> float:
        return lr_factor(self.last_epoch if step is None else step, warmup_steps=self.warmup_steps,
                         total_steps=self.total_steps, decay_type=self.decay_type, min_lr_factor=self.min_lr_factor)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        f = self.factor()
        return [base * f for base in self.base_lrs]


def optimizer_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters split into decayed (matrices) and not decayed (biases, norm scales), and
    each of those into plain tensors and DTensors when it holds both: a multi-tensor or fused kernel
    takes one kind (tensor parallelism without FSDP2 leaves the norms and embeddings plain)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError(
            f"{type(model).__name__} has no trainable parameters: check [policy] freeze_patterns / trainable_patterns"
        )
    groups = []
    # the decayed group is kept even when empty, as before: a saved optimizer state's groups must match
    for params, decay_value, keep_empty in ((decay, weight_decay, True), (no_decay, 0.0, False)):
        plain = [p for p in params if not isinstance(p, DTensor)]
        sharded = [p for p in params if isinstance(p, DTensor)]
        if plain and sharded:
            groups += [{"params": plain, "weight_decay": decay_value}, {"params": sharded, "weight_decay": decay_value}]
        elif params or keep_empty:
            groups.append({"params": params, "weight_decay": decay_value})
    return groups


def fused_supported(params: Iterable[torch.Tensor]) -> bool:
    """Whether ``torch.optim.AdamW(fused=True)`` can step ``params``: every one floating point and on
    a device type of :data:`FUSED_ADAMW_DEVICE_TYPES` (a DTensor by its local device)."""
    return all(p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICE_TYPES for p in params)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (sharing its storage), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def round_stochastic_(target: torch.Tensor, value: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """Write float32 ``value`` into bfloat16 ``target`` rounded up or down at random, with the
    probability of rounding up equal to the fraction of the bfloat16 step that ``value`` covers,
    so the rounding is exact in expectation (``E[target] = value``).

    bfloat16 is the upper half of a float32: adding uniform noise in ``[0, 2**16)`` to the lower
    16 bits of the pattern and clearing them rounds the magnitude up with that probability
    (inf stays inf, a carry moves to the next exponent as it should).
    """
    bits = value.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    target.copy_(noise.add_(bits).bitwise_and_(-65536).view(torch.float32))  # in place: no more temporaries


UPDATE_CHUNK = 1 << 22
"""Elements per slice of a :class:`BFloat16AdamW` update (its float32 temporaries: 16 MiB each)."""


class BFloat16AdamW(torch.optim.Optimizer):
    """AdamW for bfloat16 master weights (``[train] master_dtype = "bfloat16"``).

    The two moments are float32 (``exp_avg_sq`` in bfloat16 would stop decaying: ``0.999 * v``
    rounds back to ``v``, as bfloat16 has 8 bits of mantissa) and the update
    ``w <- w (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)`` is computed in float32 from the
    weight and gradient upcast, then rounded stochastically (:func:`round_stochastic_`) into the
    bfloat16 weight: a learning rate of 1e-6 moves a weight of 0.02 by far less than its bfloat16
    step (1.2e-4), which round-to-nearest would drop every time. The formulas are
    ``torch.optim.AdamW``'s, and the state has its names (``step``, ``exp_avg``, ``exp_avg_sq``;
    DTensors sharded like the weights), so distributed checkpoints save it the same way. The
    rounding noise comes from a per-rank generator seeded with ``seed + rank``; its state is not part
    of the (sharded) ``state_dict`` but of :meth:`rank_state_dict`, which ``CheckpointManager`` saves
    per rank, so a resumed run rounds as the uninterrupted one would. Each tensor is
    updated in slices of :data:`UPDATE_CHUNK` elements, so the float32 temporaries stay a few
    tens of MiB however large the tensor (the embedding). With ``foreach`` (``[train] optm_impl``
    other than ``"for-loop"``), consecutive slices of one parameter group up to :data:`UPDATE_CHUNK`
    elements in all (the biases and norm scales of every layer, small matrices) are updated
    together: the moments with one multi-tensor kernel per operation, the rest on one
    concatenated buffer with the same element-wise operations, and the rounding noise drawn per
    slice in the same order, so the result is the slice-by-slice one (bit for bit on the CPU) with
    about 20 kernel launches per bucket instead of about 14 per slice.

    Memory per trainable parameter: 2 (weight) + 2 (gradient) + 8 (moments) = 12 bytes, against
    16 with float32 master weights.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, seed: int = 0, foreach: bool = True) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.foreach = foreach
        self._seed = seed + (dist.get_rank() if dist.is_initialized() else 0)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._restored: dict[torch.device, torch.Tensor] = {}  # loaded states of generators not made yet

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            generator = torch.Generator(device=device)
            restored = self._restored.pop(device, None)
            if restored is None:
                generator.manual_seed(self._seed)
            else:
                generator.set_state(restored)
            self._generators[device] = generator
        return self._generators[device]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict``, keeping the moments float32 as saved (torch casts
        floating state to its parameter's dtype, which would round them to bfloat16)."""
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        moments = {param: {k: v for k, v in state_dict["state"].get(i, {}).items() if k in ("exp_avg", "exp_avg_sq")}
                   for i, param in zip(saved_ids, params)}
        super().load_state_dict(state_dict)
        for param, saved in moments.items():
            for key, value in saved.items():
                self.state[param][key] = value.to(device=param.device, dtype=torch.float32)

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's rounding-noise generator states, ``{"generators": {device: uint8 state}}``
        (copies): what the sharded optimizer state does not hold."""
        states = {str(d): s.clone() for d, s in self._restored.items()}
        states.update({str(d): g.get_state() for d, g in self._generators.items()})
        return {"generators": states}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the rounding noise from :meth:`rank_state_dict` (each generator resumes on first use)."""
        self._generators = {}
        self._restored = {torch.device(d): s.clone() for d, s in state["generators"].items()}

    def _update(self, weight: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                group: dict[str, Any], step: float) -> None:
        """AdamW on one slice of a weight (in place), from its gradient and float32 moments."""
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        grad = grad.float()
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        denom = exp_avg_sq.sqrt().div_(math.sqrt(1.0 - beta2**step)).add_(eps)
        updated = weight.float().mul_(1.0 - lr * weight_decay)
        updated.addcdiv_(exp_avg, denom, value=-lr / (1.0 - beta1**step))
        if weight.dtype == torch.bfloat16:
            round_stochastic_(weight, updated, self._generator(weight.device))
        else:
            weight.copy_(updated)

    def _update_bucket(self, pieces: list[tuple[torch.Tensor, ...]], *, group: dict[str, Any], step: float) -> None:
        """:meth:`_update` on several slices at once, element for element the same operations:
        the moments in place with multi-tensor kernels, the rest on concatenated float32 buffers."""
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        weights, grads, exp_avgs, exp_avg_sqs = (list(t) for t in zip(*pieces))
        sizes = [w.numel() for w in weights]

        def views(flat: torch.Tensor) -> list[torch.Tensor]:
            return [v.view(w.shape) for v, w in zip(flat.split(sizes), weights)]

        grad = torch.cat([g.reshape(-1) for g in grads]).float()
        grad_views = views(grad)
        torch._foreach_lerp_(exp_avgs, grad_views, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grad_views, grad_views, value=1.0 - beta2)
        denom = torch.cat([v.reshape(-1) for v in exp_avg_sqs]).sqrt_().div_(math.sqrt(1.0 - beta2**step)).add_(eps)
        updated = torch.cat([w.reshape(-1) for w in weights]).float().mul_(1.0 - lr * weight_decay)
        updated.addcdiv_(torch.cat([m.reshape(-1) for m in exp_avgs]), denom, value=-lr / (1.0 - beta1**step))
        rounded = [i for i, w in enumerate(weights) if w.dtype == torch.bfloat16]
        if rounded:
            # one draw per slice, in slice order: the generators advance as they do slice by slice
            bits = updated.view(torch.int32)
            noise = torch.empty_like(bits)
            bit_views, noise_views = views(bits), views(noise)
            for i in rounded:
                torch.randint(0, 1 << 16, weights[i].shape, dtype=torch.int32, device=noise.device,
                              generator=self._generator(weights[i].device), out=noise_views[i])
            if len(rounded) == len(weights):
                bits.add_(noise).bitwise_and_(-65536)
            else:  # float32 weights in the bucket are copied as they are
                for i in rounded:
                    bit_views[i].add_(noise_views[i]).bitwise_and_(-65536)
        torch._foreach_copy_(weights, views(updated))

    def _pieces(self, param: torch.Tensor, state: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
        """This rank's ``(weight, grad, exp_avg, exp_avg_sq)`` in slices of :data:`UPDATE_CHUNK`
        elements (the float32 temporaries stay small for the embedding); whole when not contiguous."""
        tensors = [_local(t) for t in (param, param.grad, state["exp_avg"], state["exp_avg_sq"])]
        if not all(t.is_contiguous() for t in tensors):
            return [tuple(tensors)]
        flat = [t.view(-1) for t in tensors]
        return [tuple(t[start:start + UPDATE_CHUNK] for t in flat) for start in range(0, flat[0].numel(), UPDATE_CHUNK)]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # a bucket: slices of one group with one step count (bias corrections) on one device,
            # UPDATE_CHUNK elements at most; a single slice goes through _update
            bucket: list[tuple[torch.Tensor, ...]] = []
            bucket_step, bucket_size = 0.0, 0
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                state["step"] += 1
                step = float(state["step"])
                for piece in self._pieces(param, state):
                    size = piece[0].numel()
                    if bucket and (not self.foreach or step != bucket_step or bucket_size + size > UPDATE_CHUNK
                                   or piece[0].device != bucket[0][0].device):
                        self._flush(bucket, group=group, step=bucket_step)
                        bucket, bucket_size = [], 0
                    bucket.append(piece)
                    bucket_step, bucket_size = step, bucket_size + size
            self._flush(bucket, group=group, step=bucket_step)
        return loss

    def _flush(self, bucket: list[tuple[torch.Tensor, ...]], *, group: dict[str, Any], step: float) -> None:
        if len(bucket) == 1:
            self._update(*bucket[0], group=group, step=step)
        elif bucket:
            self._update_bucket(bucket, group=group, step=step)


def build_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters from ``[train]``: ``optm_lr``, ``optm_betas``,
    ``optm_weight_decay`` (not applied to 1-D tensors), ``optm_eps``: ``torch.optim.AdamW``, or
    :class:`BFloat16AdamW` (float32 moments, stochastic rounding) with ``master_dtype = "bfloat16"``.
    ``optm_name = "Adam"`` gives ``torch.optim.Adam`` (weight decay added to the gradient, as
    cosmos-rl's "Adam"); without weight decay it is the AdamW update and takes the path above.

    ``optm_impl`` picks the kernels: ``"fused"`` gives ``torch.optim.AdamW(fused=True)`` when
    :func:`fused_supported` (else ``"foreach"``, logged), ``"foreach"`` the multi-tensor kernels,
    ``"for-loop"`` one tensor at a time; :class:`BFloat16AdamW` buckets small slices unless
    ``"for-loop"``. The choice survives ``load_state_dict`` (torch would take the saved state's).
    Before each step the optimizer reshards the FSDP2 units of ``model`` that a no-grad forward left
    gathered (see ``fsdp_reshard_after_forward``), so the next forward gathers the new weights.

    Build it after ``apply_fsdp`` so that it holds the sharded parameters.
    """
    if train.optm_name not in ("AdamW", "Adam"):
        raise ValueError(f"[train] optm_name = {train.optm_name!r} is not supported; use 'AdamW' or 'Adam'")
    # without weight decay the two are one update, so the AdamW kernels serve "Adam" too
    adam_l2 = train.optm_name == "Adam" and train.optm_weight_decay != 0
    if len(train.optm_betas) != 2:
        raise ValueError(f"[train] optm_betas must hold two numbers, got {train.optm_betas}")
    if train.optm_impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"[train] optm_impl = {train.optm_impl!r}; use one of {', '.join(OPTIMIZER_IMPLS)}")
    groups = optimizer_param_groups(model, train.optm_weight_decay)
    betas = (float(train.optm_betas[0]), float(train.optm_betas[1]))
    if train.master_dtype == "bfloat16":
        if adam_l2:
            raise ValueError(
                f'[train] optm_name = "Adam" with optm_weight_decay = {train.optm_weight_decay} and master_dtype = '
                '"bfloat16": the bfloat16 master-weight optimizer decays as AdamW does; set optm_name = "AdamW", '
                'optm_weight_decay = 0 or master_dtype = "float32"')
        return _resharding_before_step(model, BFloat16AdamW(groups, lr=train.optm_lr, betas=betas, eps=train.optm_eps,
                                                            weight_decay=train.optm_weight_decay,
                                                            seed=0 if train.seed is None else train.seed,
                                                            foreach=train.optm_impl != "for-loop"))
    params = [p for group in groups for p in group["params"]]
    fused = train.optm_impl == "fused" and fused_supported(params)
    if train.optm_impl == "fused" and not fused:
        kinds = sorted({f"{p.dtype} on {p.device.type}" for p in params})
        log.info(f"[train] optm_impl = 'fused': torch has no fused AdamW for {', '.join(kinds)}; using 'foreach'")
    foreach = train.optm_impl != "for-loop" and not fused
    optimizer_cls = torch.optim.Adam if adam_l2 else torch.optim.AdamW
    optimizer = optimizer_cls(groups, lr=train.optm_lr, betas=betas, eps=train.optm_eps,
                              weight_decay=train.optm_weight_decay, fused=fused, foreach=foreach)

    def keep_implementation(opt: torch.optim.Optimizer) -> None:
        # a loaded state brings its groups' fused / foreach flags, and torch places each step counter
        # for those: put back this run's choice (fused: on the parameter's device, else on the CPU)
        for group in opt.param_groups:
            group["fused"], group["foreach"] = fused, foreach
            for param in group["params"]:
                state = opt.state.get(param)
                if state and torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(dtype=torch.float32, device=param.device if fused else "cpu")

    optimizer.register_load_state_dict_post_hook(keep_implementation)
    return _resharding_before_step(model, optimizer)


def _resharding_before_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` resharding every FSDP2 unit of ``model`` before it steps.

    A unit that keeps its gathered weights after forward (``[train] fsdp_reshard_after_forward``)
    is resharded by its backward; after a no-grad forward (validation, old log-probs) it stays
    gathered, and once the step has changed the master weights the next forward would run on that
    copy of the old ones. Resharding an already sharded unit does nothing.
    """
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if units:
        def drop_gathered_weights(*_: Any) -> None:
            for unit in units:
                unit.reshard()

        optimizer.register_step_pre_hook(drop_gathered_weights)
    return optimizer


def build_lr_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig,
                       total_steps: int | None = None) -> WarmupDecayLR:
    """:class:`WarmupDecayLR` from ``[train]``: ``optm_warmup_steps``, ``optm_decay_type``,
    ``optm_min_lr_factor``; ``total_steps`` defaults to ``[train] max_steps``.

    ``optm_warmup_steps`` written as a float up to 1.0 (``0.03``) is a fraction of the total steps
    (cosmos-rl's meaning): ``int(fraction * total_steps)`` warmup steps."""
    total = total_steps if total_steps is not None else train.max_steps
    warmup = train.optm_warmup_steps
    if isinstance(warmup, float) and warmup <= 1.0:
        if total is None:
            raise ValueError(f"[train] optm_warmup_steps = {warmup} is a fraction of the total steps, which are "
                             "unknown here: pass total_steps or set [train] max_steps")
        warmup = int(warmup * total)
    return WarmupDecayLR(
        optimizer,
        warmup_steps=int(warmup),
        total_steps=total,
        decay_type=train.optm_decay_type,
        min_lr_factor=train.optm_min_lr_factor,
    )
