"""Two-member process groups between processes of different ``torch.distributed`` worlds.

A trainer job and a rollout job are separate ``torchrun`` jobs: neither can join the other's
default group. As vLLM's stateless process groups and verl's checkpoint engine do, the sender
hosts a store of its own (:class:`~cosmos_primitives.sync.pair_store.PairStoreServer`: bound to
the configured address, open only to holders of the run secret), and each pair (sender = rank 0,
one member = rank 1) builds a backend process group directly on a ``PrefixStore`` of it, never
registered in either world, so forming or dropping one touches no other group. The result is a stateless
:class:`~cosmos_primitives.sync.broadcast.SyncGroup`, whose collectives are called on the group
object itself.

Backends: gloo for CPU tensors (tested); NCCL for CUDA tensors (``ProcessGroupNCCL`` on the same
store; not exercised by the test suite, which runs without GPUs).
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cosmos_primitives.sync.broadcast import SyncGroup
from cosmos_primitives.sync.pair_store import PairStoreClient, PairStoreServer
from cosmos_primitives.sync.run_auth import RunSecret

HOST_ENV = "COSMOS_TRANSFER_HOST"


def transfer_host(host: str | None = None) -> str:
    """The address members reach the sender at: ``host``, else ``$COSMOS_TRANSFER_HOST``, else
    this machine's address: its hostname resolved, unless that is a loopback address (as
    ``/etc/hosts`` often makes it), then the address of the interface of its default route; the
    loopback address only when neither exists (one machine)."""
    if host:
        return host
    if os.environ.get(HOST_ENV):
        return os.environ[HOST_ENV]
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    if address and not address.startswith("127."):
        return address
    return local_address_toward("10.255.255.255") or address or name


def local_address_toward(remote: str) -> str:
    """This machine's address on the interface that reaches ``remote`` (empty when no route does).

    Connecting a UDP socket only picks the route; nothing is sent.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((remote, 9))
            return probe.getsockname()[0]
    except OSError:
        return ""


def serve_store(host: str, port: int, secret: RunSecret, *, max_connections: int = 256) -> PairStoreServer:
    """The sender's store: listening on ``host`` only (``port=0``: a free port, read back from
    ``.port``), open to holders of the run secret, at most ``max_connections`` of them at once."""
    return PairStoreServer(host, port, secret, max_connections=max_connections)


def connect_store(host: str, port: int, timeout_s: float, secret: RunSecret) -> PairStoreClient:
    """An authenticated connection to the sender's store.

    Raises:
        ConnectionError: nothing listens there (a trainer gone while its Redis record lives on):
            refused at once, where a client would retry for ``timeout_s``; or the store kept
            closing the connection before it authenticated.
        AuthError: the store there does not hold the run secret.
    """
    problem = store_problem(host, port, timeout_s)
    if problem:
        raise ConnectionError(f"no weight server listens at {host}:{port} ({problem})")
    return PairStoreClient(host, port, secret, timeout_s)


def store_problem(host: str, port: int, timeout_s: float) -> str:
    """Why a TCP connection to ``host:port`` fails (empty when something listens there)."""
    try:
        socket.create_connection((host, port), timeout=min(timeout_s, 10.0)).close()
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return ""


def pair_group(store: dist.Store, key: str, rank: int, *, device_type: str, timeout_s: float,
               peer_host: str = "") -> SyncGroup:
    """Form the two-member group named ``key`` (both sides call this; it returns once both have).

    Args:
        store: the sender's store (its own on the sender, a client on the member).
        key: unique per pair formation (member id and a fresh nonce), so that a re-formed pair
            never meets the keys of an earlier one.
        rank: 0 on the sender, 1 on the member.
        device_type: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL).
        timeout_s: bounds the formation and every later collective of the group.
        peer_host: the sender's address; gloo then listens on the interface that reaches it
            (torch's default, the hostname's address, is a loopback one on many hosts), unless
            ``$GLOO_SOCKET_IFNAME`` names the interfaces.

    Raises:
        RuntimeError / DistStoreError: the other side did not arrive within ``timeout_s``.
    """
    group = _backend_group(dist.PrefixStore(f"pair/{key}/", store), rank, 2, device_type, timeout_s, peer_host)
    return SyncGroup(group, 0, (0, 1), rank, stateless=True)


def _backend_group(store: dist.Store, rank: int, size: int, device_type: str, timeout_s: float,
                   peer_host: str) -> Any:
    """A gloo / NCCL process group of ``size`` ranks on ``store``, registered in no world."""
    timeout = timedelta(seconds=timeout_s)
    if device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    local = ""
    if peer_host and not os.environ.get("GLOO_SOCKET_IFNAME"):
        local = local_address_toward(peer_host)
    if local:
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=local)]
        options._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class _Relayed:
    """A member's receive of one relayed tensor; ``wait()`` also passes it on to the next member."""

    def __init__(self, relay: RelayGroup, t: torch.Tensor, tag: int, work: Any) -> None:
        self._relay, self._t, self._tag, self._work = relay, t, tag, work

    def wait(self) -> bool:
        self._work.wait()
        relay = self._relay
        if relay.rank + 1 < relay.size:
            relay._forwards.append((self._t, relay.group.send([self._t], relay.rank + 1, self._tag)))
        return True


class RelayGroup:
    """A chain over ``size`` ranks: the sender (rank 0) sends each tensor to rank 1 only, and rank
    ``i`` passes what it received on to rank ``i + 1``. Stands in for a
    :class:`~cosmos_primitives.sync.broadcast.SyncGroup` (``broadcast``, ``max_of``), so the
    weight wire protocol runs over it unchanged while the bytes leaving the sender do not grow
    with the members.

    Each ``broadcast`` call is matched by position (every rank makes the same calls in the same
    order: the protocol does), using its ordinal as the point-to-point tag. A forward is sent
    asynchronously; a tensor is never received into storage that a pending forward still reads,
    and :meth:`flush` waits for every forward (call it before dropping the group).
    """

    stateless = True
    src = 0

    def __init__(self, group: Any, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, rank, size
        self.ranks = tuple(range(size))
        self._tag = 0
        self._forwards: list[tuple[torch.Tensor, Any]] = []

    @property
    def is_member(self) -> bool:
        return True

    @property
    def is_src(self) -> bool:
        return self.rank == 0

    def broadcast(self, t: torch.Tensor, async_op: bool = False) -> Any:
        """Send ``t`` down the chain (rank 0) or receive it in place and pass it on (the others)."""
        tag, self._tag = self._tag, self._tag + 1
        if self.rank == 0:
            work: Any = self.group.send([t], 1, tag) if self.size > 1 else None
        else:
            storage = t.untyped_storage().data_ptr()
            keep = []
            for tensor, forward in self._forwards:
                if tensor.untyped_storage().data_ptr() == storage:
                    forward.wait()
                else:
                    keep.append((tensor, forward))
            self._forwards = keep
            work = _Relayed(self, t, tag, self.group.recv([t], self.rank - 1, tag))
        if async_op:
            return work
        if work is not None:
            work.wait()
        return None

    def max_of(self, flag: int, device: torch.device) -> int:
        """Max of ``flag`` over every rank of the chain."""
        self.flush()
        t = torch.tensor([flag], dtype=torch.int64, device=device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self.group.allreduce([t], opts).wait()
        return int(t.item())

    def flush(self) -> None:
        """Wait until every tensor received here has been passed on."""
        while self._forwards:
            self._forwards.pop(0)[1].wait()


def relay_group(store: dist.Store, key: str, rank: int, size: int, *, device_type: str, timeout_s: float,
                peer_host: str = "") -> RelayGroup:
    """Form the relay chain named ``key`` of ``size`` ranks (every rank calls this; it returns once
    all have). Arguments as for :func:`pair_group`; ``rank`` 0 is the sender, the members take
    ranks ``1 .. size - 1`` in chain order.

    Raises:
        RuntimeError / DistStoreError: a rank did not arrive within ``timeout_s``.
    """
    group = _backend_group(dist.PrefixStore(f"round/{key}/", store), rank, size, device_type, timeout_s, peer_host)
    return RelayGroup(group, rank, size)


def drop_group(group: SyncGroup | RelayGroup | None) -> None:
    """Abort a pair's process group (pending operations fail instead of waiting for a dead peer)."""
    if group is None:
        return
    abort = getattr(group.group, "abort", None)
    if callable(abort):
        with contextlib.suppress(RuntimeError):  # already broken: nothing left to abort
            abort()
