"""Bucketed weight broadcast from trainer ranks to rollout ranks over ``torch.distributed``.

Roles (one process group per job, created by every rank with :func:`new_sync_group`):

- every trainer rank builds a :class:`WeightBroadcaster` over its (possibly FSDP2-sharded) model
  and calls ``sync(version)`` after each optimizer step. All trainer ranks take part because
  gathering a sharded parameter (``DTensor.full_tensor()``) is a collective of its mesh; only the
  sending rank (``src``, a trainer rank) packs and broadcasts;
- every rollout rank builds a :class:`WeightReceiver` over its engine (an ``nn.Module`` whose
  tensors are written, or a ``RolloutEngine`` whose ``update_weights`` is called per bucket) and
  calls ``sync()`` the same number of times.

Wire protocol, per sync: a header ``[version, plan fingerprint, verify flag, plan length]``
(int64); on the first sync the plan itself (engine names, shapes, wire dtypes, piece offsets;
msgspec JSON, no pickle) and an accept / reject round; then the buckets, each a flat ``uint8``
buffer of at most ``bucket_bytes``; on a checked sync, per-tensor checksums and a pass / fail round.

Memory: the sender holds ``num_buffers`` buckets (2 with ``overlap``: one being sent while the
next is packed) plus one gathered full parameter at a time, never the whole model. Parameters
larger than a bucket are split across buckets.

``in_place=True`` (either side, independently) moves that side's parameters once into one
contiguous block laid out like the buckets end to end (:func:`~cosmos_primitives.sync.buckets.arena_starts`):
values and ``Parameter`` objects stay the same, and every bucket is then a slice of real parameter
storage, sent or received with no packing copy and no extra buffer. It needs plain (unsharded)
tensors whose dtype is the wire dtype; where a copy costs as much as the wire (CPU / gloo) it is
what brings bucketed sends to the flat-buffer bandwidth.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import msgspec
import torch
import torch.distributed as dist
from torch import nn

from cosmos_primitives.models.name_maps import NameMapError
from cosmos_primitives.parallel.param_names import clean_name
from cosmos_primitives.sync.buckets import BucketLayout, Piece, arena_size, arena_starts
from cosmos_primitives.sync.checks import WeightMismatchError, add_checksums, bitwise_equal, checksum
from cosmos_primitives.sync.result import SyncResult
from cosmos_primitives.sync.send_plan import DEFAULT_BUCKET_BYTES, SendPlan, WirePlan, wire_dtype
from cosmos_primitives.sync.send_plan import fingerprint as fingerprint_of
from cosmos_primitives.sync.sources import full_tensor, is_sharded

_CLOSED = -1

# wire dtype -> engine dtypes that hold every value of it exactly (so reading the engine tensor
# back and casting it to the wire dtype gives the sent bits)
_EXACT_WIDENING = {
    torch.bfloat16: {torch.bfloat16, torch.float32, torch.float64},
    torch.float16: {torch.float16, torch.float32, torch.float64},
    torch.float32: {torch.float32, torch.float64},
}


@attrs.frozen
class SyncGroup:
    """The process group of one weight broadcast: ``src`` (a trainer rank) and the rollout ranks.

    ``group`` is ``None`` on ranks outside it (the other trainer ranks). With ``stateless``,
    ``group`` is a process group of its own (a ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` built on
    a store, not registered in any default world: see
    :mod:`~cosmos_primitives.sync.stateless_group`) and ``src``, ``ranks``, ``rank`` are ranks
    inside it; its collectives are called on the group object itself.
    """

    group: Any
    src: int
    ranks: tuple[int, ...]
    rank: int
    stateless: bool = False

    @property
    def is_member(self) -> bool:
        return self.rank in self.ranks

    @property
    def is_src(self) -> bool:
        return self.rank == self.src

    def broadcast(self, t: torch.Tensor, async_op: bool = False) -> Any:
        """Broadcast ``t`` from ``src`` (in place on the others); the work handle with ``async_op``."""
        if not self.stateless:
            return dist.broadcast(t, src=self.src, group=self.group, async_op=async_op)
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = self.src, 0
        work = self.group.broadcast([t], opts)
        if async_op:
            return work
        work.wait()
        return None

    def max_of(self, flag: int, device: torch.device) -> int:
        """Max of ``flag`` over the group's members."""
        t = torch.tensor([flag], dtype=torch.int64, device=device)
        if self.stateless:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.MAX
            self.group.allreduce([t], opts).wait()
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())


def new_sync_group(src: int, receivers: Sequence[int], *, backend: str | None = None) -> SyncGroup:
    """Create the broadcast group of ``src`` and ``receivers`` (global ranks).

    Every rank of the default group must call this, with the same arguments, in the same order
    relative to its other ``new_group`` calls (``dist.new_group`` is collective).

    Args:
        src: the trainer rank that sends (usually 0).
        receivers: the rollout ranks.
        backend: e.g. ``"nccl"`` or ``"gloo"``; default: the default group's (nccl for CUDA
            tensors, gloo for CPU tensors under ``cp.parallel.init_distributed``).
    """
    receivers = tuple(int(r) for r in receivers)
    if src in receivers or not receivers:
        raise ValueError(f"the sync group needs a sender outside its receivers: src={src}, receivers={receivers}")
    ranks = (src, *receivers)
    group = dist.new_group(sorted(ranks), backend=backend)
    rank = dist.get_rank()
    return SyncGroup(group if rank in ranks else None, src, ranks, rank)


def _broadcast(t: torch.Tensor, group: SyncGroup, async_op: bool = False) -> Any:
    return group.broadcast(t, async_op=async_op)


def _any_rank(flag: int, group: SyncGroup, device: torch.device) -> int:
    """Max of ``flag`` over the sync group (0 everywhere means all is well)."""
    return group.max_of(flag, device)


def send_header(group: SyncGroup, device: torch.device, version: int, fingerprint: int, verify: bool,
                blob: bytes, num_targets: int) -> None:
    """Sender: the header of one sync, and the plan ``blob`` with its accept round when not empty.

    Raises:
        RuntimeError: a receiver rejected the plan.
    """
    header = torch.tensor([version, fingerprint, int(verify), len(blob)], dtype=torch.int64, device=device)
    _broadcast(header, group)
    if blob:
        _broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device), group)
        rejected = _any_rank(0, group, device)
        if rejected:
            raise RuntimeError(
                f"rollout rank {rejected - 1} rejected the weight plan ({num_targets} tensors); "
                "its own error says which tensor does not fit"
            )


def send_checksums(group: SyncGroup, device: torch.device, sums: list[tuple[int, int]],
                   target_names: list[str]) -> None:
    """Sender: the per-tensor checksums of a checked sync, and the receivers' pass / fail round.

    Raises:
        WeightMismatchError: a receiver holds a tensor that differs (named).
    """
    table = torch.tensor(sums, dtype=torch.int64, device=device)
    _broadcast(table, group)
    bad = _any_rank(0, group, device)
    if bad:
        raise WeightMismatchError(
            f"weight sync check failed: a rollout rank received engine tensor '{target_names[bad - 1]}' "
            "different from the trainer's (checksums differ); see the rollout rank's error"
        )


class WeightBroadcaster:
    """Trainer side: gathers full parameters and broadcasts them in flat buckets.

    Args:
        model: the trainer's model (plain or FSDP2). The plan (order, names, shapes) is built here,
            identically on every trainer rank.
        group: from :func:`new_sync_group`; on trainer ranks outside it, ``sync`` only joins the gathers.
        layout: engine names on the receivers (``"hf"``, ``"hf_checkpoint"``, ``"vllm"``).
        family: HF ``model_type`` of the name map (default: the model's).
        bucket_bytes: bucket capacity (default 256 MiB).
        transfer_dtype: cast floating tensors to this dtype on the wire (e.g. ``torch.bfloat16``);
            default: each tensor's own dtype.
        overlap: pack the next bucket while the previous one is in flight (two buffers).
        verify_first: check the first sync with per-tensor checksums.
        in_place: on the sending rank, move the parameters into the bucket layout once and send
            bucket slices of them without packing (plain tensors whose dtype is the wire dtype only).

    Raises:
        ValueError: ``in_place`` with a sharded parameter or one cast on the wire (names it).
    """

    def __init__(self, model: nn.Module, group: SyncGroup, *, layout: str = "hf", family: str | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, transfer_dtype: torch.dtype | None = None,
                 overlap: bool = True, verify_first: bool = True, in_place: bool = False) -> None:
        self.group = group
        plan = SendPlan(model, layout=layout, family=family, bucket_bytes=bucket_bytes,
                        transfer_dtype=transfer_dtype)
        self._send_plan = plan
        self._sources = plan.sources
        self._source_names = plan.source_names
        self._wire = plan.wire
        self._place = plan.place
        self._layout: BucketLayout = plan.layout
        self._plan_blob = plan.blob
        self.fingerprint = plan.fingerprint
        self.target_names = plan.target_names
        self._buckets = plan.buckets
        self._num_buffers = 2 if overlap else 1
        self._device = plan.device
        self._buffers: list[torch.Tensor] = []
        self._plan_sent = False
        self._verify_pending = verify_first
        self.weight_version: int | None = None
        self._bucket_bytes = bucket_bytes
        self._arena: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        if in_place and group.is_src:
            self._lay_out_in_place()

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    def sync(self, version: int) -> SyncResult:
        """Send the current weights tagged ``version`` (>= 0). Call on every trainer rank.

        Raises:
            WeightMismatchError: the first-sync check failed on a rollout rank (names the tensor).
            RuntimeError: a rollout rank rejected the plan (its own error says why).
        """
        if version < 0:
            raise ValueError(f"weight versions are >= 0, got {version}")
        start = time.perf_counter()
        is_src = self.group.is_src
        verify = self._verify_pending
        active = [b for b, used in enumerate(self._layout.bucket_used) if used > 0]
        with torch.no_grad():
            if is_src:
                self._send_header(version, verify)
            if self._arena is not None:
                sums = self._send_in_place(active, verify)
            else:
                sums = self._send_packed(active, verify)
            if self._device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if verify and is_src:
                self._check(sums)
        self._verify_pending = False
        self.weight_version = version
        sent = sum(self._layout.bucket_used) if is_src else 0
        return SyncResult(version=version, seconds=seconds, bytes_moved=sent, num_copied=len(self.target_names),
                          num_buckets=len(active) if is_src else 0, verified=verify and is_src)

    def _send_packed(self, active: list[int], verify: bool) -> list[tuple[int, int]]:
        """Gather (every trainer rank), pack and send (``src``) bucket by bucket."""
        is_src = self.group.is_src
        sums: list[tuple[int, int]] = [(0, 0)] * len(self.target_names)
        works: dict[int, Any] = {}
        current, flat = -1, torch.empty(0)
        for i, b in enumerate(active):
            if is_src:
                if i - self._num_buffers in works:  # this buffer's previous bucket must be out first
                    works.pop(i - self._num_buffers).wait()
                buf = self._get_buffers()[i % self._num_buffers]
            for p in self._buckets[b]:
                if p.source != current:
                    current, flat = p.source, full_tensor(self._sources[p.source]).reshape(-1)
                    if verify and is_src:
                        t, offset = self._place[p.source]
                        sums[t] = add_checksums(sums[t], checksum(flat.to(self._wire[t]), offset))
                if is_src:
                    self._send_plan.pack(buf, p, flat)
            if is_src:
                works[i] = _broadcast(buf[:self._layout.bucket_used[b]], self.group, async_op=True)
        for work in works.values():
            work.wait()
        return sums

    def _lay_out_in_place(self) -> None:
        for s_index, src in enumerate(self._sources):
            t, _ = self._place[s_index]
            name = self._source_names[s_index]
            if is_sharded(src):
                raise ValueError(f"in_place needs plain parameters, but '{name}' is sharded (FSDP2 / TP); "
                                 "use in_place=False, which gathers and packs")
            if src.dtype != self._wire[t]:
                raise ValueError(f"in_place sends parameters as they are, but '{name}' is {src.dtype} and goes on "
                                 f"the wire as {self._wire[t]}; drop transfer_dtype or use in_place=False")
        starts = arena_starts(self._layout, self._bucket_bytes, len(self.target_names))
        self._arena = torch.empty(arena_size(self._layout, self._bucket_bytes), dtype=torch.uint8,
                                  device=self._device)
        for s_index, src in enumerate(self._sources):
            t, offset = self._place[s_index]
            esize = src.element_size()
            begin = starts[t] + offset * esize if starts[t] >= 0 else 0
            view = self._arena[begin:begin + src.numel() * esize].view(src.dtype).view(src.shape)
            view.copy_(src.detach())
            src.data = view
            self._views.append(view)

    def _send_in_place(self, active: list[int], verify: bool) -> list[tuple[int, int]]:
        assert self._arena is not None
        sums: list[tuple[int, int]] = [(0, 0)] * len(self.target_names)
        for s_index, (src, view) in enumerate(zip(self._sources, self._views, strict=True)):
            if src.data_ptr() != view.data_ptr():  # the trainer replaced this parameter's storage
                if src.shape != view.shape or src.dtype != view.dtype:
                    raise ValueError(
                        f"parameter '{self._source_names[s_index]}' changed to {tuple(src.shape)} {src.dtype} after "
                        f"the plan was built ({tuple(view.shape)} {view.dtype}); build a new WeightBroadcaster"
                    )
                view.copy_(src.detach())
                src.data = view
            if verify:
                t, offset = self._place[s_index]
                sums[t] = add_checksums(sums[t], checksum(view, offset))
        works = [_broadcast(self._arena[b * self._bucket_bytes:b * self._bucket_bytes + self._layout.bucket_used[b]],
                            self.group, async_op=True) for b in active]
        for work in works:
            work.wait()
        return sums

    def close(self) -> None:
        """Tell the receivers there will be no more syncs (their ``sync()`` returns ``None``)."""
        if self.group.is_src:
            header = torch.tensor([_CLOSED, self.fingerprint, 0, 0], dtype=torch.int64, device=self._device)
            _broadcast(header, self.group)

    def release_buffers(self) -> None:
        """Free the bucket buffers (they are allocated again by the next sync)."""
        self._buffers = []

    def _get_buffers(self) -> list[torch.Tensor]:
        if not self._buffers:
            size = max(self._layout.bucket_used)
            self._buffers = [torch.empty(size, dtype=torch.uint8, device=self._device)
                             for _ in range(min(self._num_buffers, self.num_buckets))]
        return self._buffers

    def _send_header(self, version: int, verify: bool) -> None:
        blob = b"" if self._plan_sent else self._plan_blob
        send_header(self.group, self._device, version, self.fingerprint, verify, blob, len(self.target_names))
        self._plan_sent = True

    def _check(self, sums: list[tuple[int, int]]) -> None:
        send_checksums(self.group, self._device, sums, self.target_names)


class WeightReceiver:
    """Rollout side: receives the buckets and writes them into the engine.

    Args:
        target: the engine's ``nn.Module`` (its parameters, named in the sender's layout, are
            written in place, casting to their dtype), or a ``RolloutEngine``
            (``update_weights(named_tensors, version)`` is called once per bucket with the tensors
            completed in it, in the wire dtype; they are valid only during the call).
        group: from :func:`new_sync_group`.
        engine: the engine whose ``weight_version`` is set after each sync when ``target`` is its model.
        strict: every parameter of a module target must be fed.
        device: where buckets land; default: the module's device, else CUDA when available.
        overlap: receive the next bucket while unpacking the previous one (two buffers).
        read_back: ``name -> tensor`` for the first-sync check of a ``RolloutEngine`` target;
            default: ``engine.model``'s parameters when it has them all, else the check covers
            the bytes received.
        in_place: (module targets) move the engine's parameters into the bucket layout on the
            first sync and receive buckets straight into them (each parameter's dtype must be its
            wire dtype).
        check_bucket: ``(version, bucket index, bucket bytes uint8 [used])`` called for every
            bucket after it arrives and before it is unpacked; raising stops the sync there (the
            weight client checks buckets against the trainer's signed digests).
    """

    def __init__(self, target: Any, group: SyncGroup, *, engine: Any = None, strict: bool = True,
                 device: torch.device | str | None = None, overlap: bool = True,
                 read_back: Callable[[str], torch.Tensor] | None = None, in_place: bool = False,
                 check_bucket: Callable[[int, int, torch.Tensor], None] | None = None) -> None:
        if not group.is_member or group.is_src:
            raise ValueError(f"rank {group.rank} is not a receiver of this sync group (ranks {group.ranks}, "
                             f"src {group.src})")
        self.group = group
        self._module = target if isinstance(target, nn.Module) else None
        if self._module is None and not callable(getattr(target, "update_weights", None)):
            raise TypeError(f"target must be an nn.Module or a RolloutEngine with update_weights(); "
                            f"got {type(target).__name__}")
        self._engine = engine if self._module is not None else target
        self._params: dict[str, torch.Tensor] = {}
        if self._module is not None:
            self._params = {clean_name(n): p for n, p in self._module.named_parameters()}
        if device is None:
            first = next(iter(self._params.values()), None)
            device = first.device if first is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        self._device = torch.device(device)
        self._strict = strict
        self._num_buffers = 2 if overlap else 1
        self._read_back_fn = read_back
        if in_place and self._module is None:
            raise ValueError("in_place needs an nn.Module target (a RolloutEngine takes tensors by update_weights)")
        if in_place and check_bucket is not None:
            raise ValueError("check_bucket needs buckets received apart from the engine's tensors (in_place=False)")
        self._in_place = in_place
        self._check_bucket = check_bucket
        self._arena: torch.Tensor | None = None
        self._plan: WirePlan | None = None
        self.fingerprint: int | None = None
        self.weight_version: int | None = None

    def sync(self) -> SyncResult | None:
        """Receive one sync; returns ``None`` when the trainer called ``close()``.

        The result's ``seconds`` include waiting for the trainer to start sending.

        Raises:
            WeightMismatchError: the first-sync check found a tensor that differs (names it).
            NameMapError: on the first sync, the engine does not fit the trainer's plan.
        """
        start = time.perf_counter()
        header = torch.empty(4, dtype=torch.int64, device=self._device)
        _broadcast(header, self.group)
        version, fingerprint, verify, plan_len = (int(x) for x in header.tolist())
        if version == _CLOSED:
            return None
        if plan_len:
            self._accept_plan(plan_len, fingerprint)
        if self._plan is None or fingerprint != self.fingerprint:
            raise RuntimeError(
                "the trainer sent weights for a plan this receiver does not have (it was created after the "
                "trainer's first sync, or the trainer's model changed); create both sides again"
            )
        plan = self._plan
        sums: list[tuple[int, int]] = [(0, 0)] * len(plan.targets)
        write_errors: list[int] = []
        with torch.no_grad():
            active = [b for b, used in enumerate(plan.bucket_used) if used > 0]
            if self._arena is not None:
                self._receive_in_place(active)
            else:
                self._receive_packed(active, version, sums if verify else None, write_errors)
            if self._device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if verify:
                self._check(sums, write_errors)
        if verify and self._module is None:
            self._check_coverage()
        self.weight_version = version
        if self._module is not None and self._engine is not None:
            self._engine.weight_version = version
        return SyncResult(version=version, seconds=seconds, bytes_moved=sum(plan.bucket_used),
                          num_copied=len(plan.targets), num_buckets=len(active), verified=bool(verify))

    # first sync: the plan ----------------------------------------------------------------------

    def _accept_plan(self, plan_len: int, fingerprint: int) -> None:
        blob = torch.empty(plan_len, dtype=torch.uint8, device=self._device)
        _broadcast(blob, self.group)
        raw = blob.cpu().numpy().tobytes()
        error = ""
        try:
            if fingerprint_of(raw) != fingerprint:
                raise RuntimeError("the weight plan arrived corrupted (fingerprint mismatch)")
            self._setup(msgspec.json.decode(raw, type=WirePlan))
        except (NameMapError, ValueError, RuntimeError, msgspec.DecodeError) as exc:
            error = str(exc)
        rejected = _any_rank(self.group.rank + 1 if error else 0, self.group, self._device)
        if error:
            raise NameMapError(f"rollout rank {self.group.rank} cannot take the trainer's weights: {error}")
        if rejected:
            raise RuntimeError(f"rollout rank {rejected - 1} rejected the trainer's weight plan; see its error")
        self.fingerprint = fingerprint

    def _setup(self, plan: WirePlan) -> None:
        self._names = [t[0] for t in plan.targets]
        self._shapes = [tuple(t[1]) for t in plan.targets]
        self._wire = [wire_dtype(t[2]) for t in plan.targets]
        self._esize = [torch.empty((), dtype=w).element_size() for w in self._wire]
        self._numel = [int(torch.Size(s).numel()) for s in self._shapes]
        pieces = [Piece(t, to, n, -1, -1, b, bo) for t, to, n, b, bo in plan.pieces]
        self._pieces: list[list[Piece]] = [[] for _ in plan.bucket_used]
        for p in pieces:
            self._pieces[p.bucket].append(p)
        self._single_bucket = [True] * len(self._names)
        self._start_byte = [0] * len(self._names)
        first_bucket: dict[int, int] = {}
        for p in pieces:
            if p.target not in first_bucket:
                first_bucket[p.target] = p.bucket
                self._start_byte[p.target] = p.byte_offset
            elif first_bucket[p.target] != p.bucket:
                self._single_bucket[p.target] = False
        self._flat: list[torch.Tensor | None] = [None] * len(self._names)
        self._exact = [False] * len(self._names)
        if self._module is not None:
            self._bind_module()
        else:
            self._staging: dict[int, torch.Tensor] = {}
            self._read_back = self._read_back_fn or self._engine_read_back()
            if self._read_back is not None:
                for t, name in enumerate(self._names):
                    self._exact[t] = self._read_back(name).dtype in _EXACT_WIDENING.get(self._wire[t], {self._wire[t]})
        if self._in_place:
            self._buffers = []
            self._lay_out_in_place(plan)
        else:
            size = max(plan.bucket_used)
            self._buffers = [torch.empty(size, dtype=torch.uint8, device=self._device)
                             for _ in range(min(self._num_buffers, len(plan.bucket_used)))]
        self._plan = plan

    def _bind_module(self) -> None:
        missing = [n for n in self._names if n not in self._params]
        if missing:
            raise NameMapError(
                f"{len(missing)} tensors the trainer sends are not parameters of the engine model, e.g. "
                f"{missing[:3]}; the engine has e.g. {list(self._params)[:3]}. Use the sender layout that "
                "matches the engine"
            )
        unfed = [n for n in self._params if n not in set(self._names)]
        if unfed and self._strict:
            raise NameMapError(f"{len(unfed)} engine parameters get no value from the trainer, e.g. {unfed[:3]}; "
                               "pass strict=False to leave them as they are")
        for t, name in enumerate(self._names):
            param = self._params[name]
            if tuple(param.shape) != self._shapes[t]:
                raise NameMapError(f"engine tensor '{name}' has shape {tuple(param.shape)}, the trainer sends "
                                   f"{self._shapes[t]}")
            if not param.is_contiguous():
                raise NameMapError(f"engine tensor '{name}' is not contiguous; it cannot be written in place")
            self._flat[t] = param.data.view(-1)
            self._exact[t] = param.dtype in _EXACT_WIDENING.get(self._wire[t], {self._wire[t]})

    def _lay_out_in_place(self, plan: WirePlan) -> None:
        for t, name in enumerate(self._names):
            if self._params[name].dtype != self._wire[t]:
                raise NameMapError(f"in_place receives tensors as sent, but engine tensor '{name}' is "
                                   f"{self._params[name].dtype} and arrives as {self._wire[t]}; match the dtypes "
                                   "(transfer_dtype on the trainer) or use in_place=False")
        layout = BucketLayout(tuple(p for bucket in self._pieces for p in bucket), tuple(plan.bucket_used))
        starts = arena_starts(layout, plan.bucket_bytes, len(self._names))
        arena = torch.empty(arena_size(layout, plan.bucket_bytes), dtype=torch.uint8, device=self._device)
        self._views: list[torch.Tensor] = []
        for t, name in enumerate(self._names):
            param = self._params[name]
            begin = max(starts[t], 0)
            view = arena[begin:begin + self._numel[t] * self._esize[t]].view(self._wire[t]).view(self._shapes[t])
            view.copy_(param.data)
            param.data = view
            self._flat[t] = view.view(-1)
            self._views.append(view)
        self._arena = arena

    def _receive_packed(self, active: list[int], version: int, sums: list[tuple[int, int]] | None,
                        write_errors: list[int]) -> None:
        """Receive bucket ``i + 1`` while unpacking bucket ``i`` (with two buffers)."""
        assert self._plan is not None
        used = self._plan.bucket_used
        works: dict[int, Any] = {}

        def post(i: int) -> None:
            buf = self._buffers[i % self._num_buffers]
            works[i] = _broadcast(buf[:used[active[i]]], self.group, async_op=True)

        for i in range(min(self._num_buffers, len(active))):
            post(i)
        for i, b in enumerate(active):
            works.pop(i).wait()
            if self._check_bucket is not None:  # before any byte of the bucket reaches the engine
                self._check_bucket(version, b, self._buffers[i % self._num_buffers][:used[b]])
            self._unpack(self._buffers[i % self._num_buffers], self._pieces[b], version, sums, write_errors)
            if i + self._num_buffers < len(active):
                post(i + self._num_buffers)

    def _receive_in_place(self, active: list[int]) -> None:
        assert self._arena is not None and self._plan is not None
        for t, name in enumerate(self._names):
            param = self._params[name]
            if param.data_ptr() != self._views[t].data_ptr():  # the engine replaced this tensor's storage
                param.data = self._views[t]
        size, used = self._plan.bucket_bytes, self._plan.bucket_used
        works = [_broadcast(self._arena[b * size:b * size + used[b]], self.group, async_op=True) for b in active]
        for work in works:
            work.wait()

    def _engine_read_back(self) -> Callable[[str], torch.Tensor] | None:
        model = getattr(self._engine, "model", None)
        if not isinstance(model, nn.Module):
            return None
        params = {clean_name(n): p for n, p in model.named_parameters()}
        if any(n not in params for n in self._names):
            return None
        return lambda name: params[name]

    # every sync: buckets -----------------------------------------------------------------------

    def _unpack(self, buf: torch.Tensor, pieces: list[Piece], version: int,
                sums: list[tuple[int, int]] | None, write_errors: list[int]) -> None:
        done: list[tuple[str, torch.Tensor]] = []
        for p in pieces:
            t = p.target
            wire = buf[p.byte_offset:p.byte_offset + p.numel * self._esize[t]].view(self._wire[t])
            if sums is not None:
                sums[t] = add_checksums(sums[t], checksum(wire, p.target_offset))
            flat = self._flat[t]
            if flat is not None:
                dst = flat[p.target_offset:p.target_offset + p.numel]
                dst.copy_(wire)
                if sums is not None and not self._exact[t] and not bitwise_equal(dst, wire.to(dst.dtype)):
                    write_errors.append(t)
                continue
            complete = p.target_offset + p.numel == self._numel[t]
            if self._single_bucket[t]:
                if complete:  # its pieces are contiguous in this bucket: view them in place
                    start = self._start_byte[t]
                    whole = buf[start:start + self._numel[t] * self._esize[t]].view(self._wire[t])
                    done.append((self._names[t], whole.view(self._shapes[t])))
                continue
            staging = self._staging.get(t)
            if staging is None:
                staging = self._staging[t] = torch.empty(self._numel[t], dtype=self._wire[t], device=self._device)
            staging[p.target_offset:p.target_offset + p.numel].copy_(wire)
            if complete:
                done.append((self._names[t], staging.view(self._shapes[t])))
        if done:
            self._engine.update_weights(iter(done), version)

    def _check(self, sums: list[tuple[int, int]], write_errors: list[int]) -> None:
        table = torch.empty(len(self._names), 2, dtype=torch.int64, device=self._device)
        _broadcast(table, self.group)
        expected = [tuple(int(x) for x in row) for row in table.tolist()]
        bad, how = -1, ""
        for t in range(len(self._names)):
            got = self._received(t, sums[t])
            if got != expected[t]:
                bad, how = t, "the values it holds differ from the trainer's"
                break
            if t in write_errors:
                bad, how = t, "writing the received values into it changed them"
                break
        worst = _any_rank(bad + 1, self.group, self._device)
        if bad >= 0:
            raise WeightMismatchError(
                f"weight sync check failed on rollout rank {self.group.rank}: engine tensor '{self._names[bad]}' "
                f"({self._shapes[bad]}, sent as {self._wire[bad]}): {how}. The engine's weight loader or the "
                "name map is wrong for this tensor"
            )
        if worst:
            raise WeightMismatchError(f"weight sync check failed on another rollout rank for "
                                      f"'{self._names[worst - 1]}'; see that rank's error")

    def _check_coverage(self) -> None:
        """A tensor-parallel engine (``checksum_layout`` None) holds shards that no sent tensor equals: the
        check is then that its loader wrote every one of them (its ``unloaded_weights()`` is empty)."""
        unloaded = getattr(self._engine, "unloaded_weights", None)
        if getattr(self._engine, "checksum_layout", "") is not None or not callable(unloaded):
            return
        missing = unloaded()
        if missing:
            raise WeightMismatchError(
                f"weight sync check failed on rollout rank {self.group.rank}: {len(missing)} of the engine's "
                f"tensors were not loaded by the sync, e.g. {missing[:3]} (no tensor the trainer sends maps to "
                "them in the engine's loader); fix the family's name map"
            )

    def _received(self, t: int, wire_sum: tuple[int, int]) -> tuple[int, int]:
        """Checksum of what the engine holds for target ``t`` (read back when that is exact)."""
        if not self._exact[t]:
            return wire_sum
        if self._module is not None:
            held = self._params[self._names[t]]
        elif self._read_back is not None:
            held = self._read_back(self._names[t])
        else:
            return wire_sum
        return checksum(held.detach().reshape(-1).to(self._wire[t]))
