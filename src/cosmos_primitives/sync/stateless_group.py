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
    prefixed = dist.PrefixStore(f"pair/{key}/", store)
    timeout = timedelta(seconds=timeout_s)
    if device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, 2, options)
    else:
        local = ""
        if peer_host and not os.environ.get("GLOO_SOCKET_IFNAME"):
            local = local_address_toward(peer_host)
        if local:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local)]
            options._timeout = timeout
            group = dist.ProcessGroupGloo(prefixed, rank, 2, options)
        else:
            group = dist.ProcessGroupGloo(prefixed, rank, 2, timeout)
    return SyncGroup(group, 0, (0, 1), rank, stateless=True)


def drop_group(group: SyncGroup | None) -> None:
    """Abort a pair's process group (pending operations fail instead of waiting for a dead peer)."""
    if group is None:
        return
    abort = getattr(group.group, "abort", None)
    if callable(abort):
        with contextlib.suppress(RuntimeError):  # already broken: nothing left to abort
            abort()
