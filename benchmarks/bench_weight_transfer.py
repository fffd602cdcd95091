"""Weight transfer between jobs (``WeightServer`` -> ``WeightClient``) vs the in-job broadcast.

Run: ``.venv/bin/python benchmarks/bench_weight_transfer.py [--mb 200 --repeats 5 --bucket-mb 64]``.

Two processes on this machine (gloo over loopback, ``--threads`` intra-op threads each), a ~``--mb``
MB bf16 state dict with Qwen2-style shapes, sent from process 0 to process 1 three ways in the
same run, interleaved, each repeated and reported as the median:

- in-job broadcast (baseline): ``WeightBroadcaster.sync`` -> ``WeightReceiver.sync`` over a group of
  the shared world, packed (the path FSDP2 shards take), with overlap; the trainer is busy for
  the whole sync (the slower rank's time);
- ``WeightServer.publish``: the trainer's share of the cross-job transfer (gather, cast, pack a
  snapshot), after which it trains on;
- ``WeightClient.fetch``: the member's side (request through a real redis-server, the snapshot
  over the pair group formed outside any world, unpacking into its parameters), timed on the
  member while the trainer is idle.

Ratios are against the in-job broadcast of the same run. The world the two processes share here
only times and orders the steps: the transfer itself uses the pair group.

``--members 1 2 4``: the trainer's cost per version as rollout jobs are added. For each count ``k``,
one trainer process and ``k`` member processes (gloo over loopback); per version the trainer publishes,
then every member fetches at once (one round: the members form a relay chain with the trainer).
Reported per ``k`` (median over ``--repeats`` versions): the trainer's ``publish`` time, the
trainer's send time for the version (``sync/serve_s``), the time until the last member holds it
(the chain: each member passes the buckets on), the bytes that left the trainer for the version
(``sync/bytes_served``, measured), the trainer's own CPU seconds for the version (its serving
threads' ``time.thread_time()``, ``sync/serve_cpu_s``; and the whole trainer process's
``time.process_time()`` from publish until every member holds it, publish and serving included),
and each against ``k = 1``. The CPU seconds are what the trainer itself spends: unlike the wall
times, member processes sharing its cores do not inflate them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time

import torch
import torch.distributed as dist

from bench_weight_sync import module_with, print_medians, shapes_of_size
from cosmos_primitives.queue import RedisServer
from cosmos_primitives.sync import WeightBroadcaster, WeightClient, WeightReceiver, WeightServer, new_sync_group
from cosmos_primitives.testing import run_distributed


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _bench(url: str, total_mb: float, repeats: int, bucket_mb: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=rank == 0)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    group = new_sync_group(src=0, receivers=[1])
    bucket = bucket_mb << 20
    if rank == 0:
        sender = WeightBroadcaster(model, group, bucket_bytes=bucket)
        sender.sync(version=0)  # plan + first-sync check, not timed
        server = WeightServer(model, url, "bench:transfer", bucket_bytes=bucket, timeout_s=600)
        server.publish(0)
    else:
        receiver = WeightReceiver(model, group)
        receiver.sync()
    dist.barrier()
    if rank == 1:
        client = WeightClient(model, url, "bench:transfer", member_id="bench", timeout_s=600)
        client.fetch()  # pair formation + plan + check, not timed
    times: dict[str, list[float]] = {"in-job broadcast": [], "publish": [], "fetch": []}
    for version in range(1, repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        sender.sync(version) if rank == 0 else receiver.sync()
        times["in-job broadcast"].append(_slowest(time.perf_counter() - start))
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            server.publish(version)
        times["publish"].append(_slowest(time.perf_counter() - start if rank == 0 else 0.0))
        start = time.perf_counter()
        if rank == 1:
            client.fetch()
        times["fetch"].append(_slowest(time.perf_counter() - start if rank == 1 else 0.0))
    ok = True
    if rank == 1:
        torch.manual_seed(0)
        expected = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=True)
        ok = all(torch.equal(a, b) for a, b in zip(model.parameters(), expected.parameters(), strict=True))
        client.close()
    dist.barrier()
    if rank == 0:
        server.close()
        sender.close()
    else:
        receiver.sync()  # the broadcaster's close
    return {"bytes": nbytes, "times": times, "ok": ok}


def _bench_members(url: str, total_mb: float, repeats: int, bucket_mb: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    rank, members = dist.get_rank(), dist.get_world_size() - 1
    torch.manual_seed(0)
    model = module_with(shapes_of_size(total_mb), torch.bfloat16, "cpu", fill=rank == 0)
    prefix = f"bench:members{members}"
    if rank == 0:
        # a round starts once every member asks (max_members), or when all known members do
        server = WeightServer(model, url, prefix, bucket_bytes=bucket_mb << 20, timeout_s=600, max_members=members,
                              gather_s=60.0)
        server.publish(0)
    dist.barrier()
    client = None
    if rank > 0:
        client = WeightClient(model, url, prefix, member_id=f"member{rank}", timeout_s=600)
        client.fetch()  # plan + check, not timed
    times: dict[str, list[float]] = {"publish": [], "trainer sends": [], "all members hold it": []}
    sent: list[float] = []
    serve_cpu: list[float] = []  # the trainer's serving threads' CPU seconds for the version
    process_cpu: list[float] = []  # the trainer process's CPU seconds from publish until all members hold it
    for version in range(1, repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        cpu_start = time.process_time()
        if rank == 0:
            server.publish(version)
            before = server.metrics()
        times["publish"].append(_slowest(time.perf_counter() - start if rank == 0 else 0.0))
        dist.barrier()
        start = time.perf_counter()
        if client is not None:
            assert client.fetch().version == version
        times["all members hold it"].append(_slowest(time.perf_counter() - start))
        serve_s = 0.0
        if rank == 0:  # measured on the trainer: its send time, CPU time and the bytes that left it for this version
            process_cpu.append(time.process_time() - cpu_start)
            deadline = time.monotonic() + 60  # a member can hold the version before the trainer counted it
            while (after := server.metrics())["sync/rounds"] == before["sync/rounds"] and time.monotonic() < deadline:
                time.sleep(0.005)
            serve_s = after["sync/serve_s"] - before["sync/serve_s"]
            serve_cpu.append(after["sync/serve_cpu_s"] - before["sync/serve_cpu_s"])
            sent.append(after["sync/bytes_served"] - before["sync/bytes_served"])
        times["trainer sends"].append(_slowest(serve_s))
    dist.barrier()
    if client is not None:
        client.close()
    dist.barrier()
    if rank == 0:
        server.close()
    return {"times": times, "sent": sent, "serve_cpu": serve_cpu, "process_cpu": process_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="size of the bf16 state dict (MB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    parser.add_argument("--members", type=int, nargs="*", default=None,
                        help="measure the trainer's cost per version with these numbers of members instead")
    args = parser.parse_args()
    # the transfer is signed with the run secret; a fresh one for this run unless one is set
    os.environ.setdefault("COSMOS_RUN_SECRET", secrets.token_hex(32))
    if args.members:
        members_scaling(args)
        return
    with RedisServer() as redis_server:
        trainer, member = run_distributed(_bench, 2, args=(redis_server.url, args.mb, args.repeats, args.bucket_mb,
                                                           args.threads), timeout_s=3600)
    nbytes, times = trainer["bytes"], trainer["times"]
    print(f"{nbytes / 1e6:.0f} MB bf16, {args.bucket_mb} MB buckets, median of {args.repeats}, {args.threads} "
          f"intra-op thread(s) per process; member got the trainer's weights: {member['ok']}")
    print_medians(times, nbytes, "in-job broadcast", "vs in-job", speed=False, width=18)


def members_scaling(args: argparse.Namespace) -> None:
    import platform
    import statistics

    rows = {}
    with RedisServer() as redis_server:
        for k in args.members:
            rows[k] = run_distributed(_bench_members, k + 1, args=(redis_server.url, args.mb, args.repeats,
                                                                   args.bucket_mb, args.threads), timeout_s=3600)[0]
    cpu = platform.processor() or platform.machine()
    print(f"{args.mb:.0f} MB bf16, {args.bucket_mb} MB buckets, median of {args.repeats} versions, {args.threads} "
          f"intra-op thread(s) per process, gloo over loopback, {os.cpu_count()} CPUs ({cpu}), load average "
          f"{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    base = {key: statistics.median(v) for key, v in rows[args.members[0]]["times"].items()}
    base_sent, base_serve_cpu, base_process_cpu = (statistics.median(rows[args.members[0]][key])
                                                   for key in ("sent", "serve_cpu", "process_cpu"))
    print(f"{'members':>7}  {'publish s':>9} {'x':>5}  {'trainer sends s':>15} {'x':>5}  {'all hold it s':>13} "
          f"{'x':>5}  {'trainer sent MB':>15} {'x':>5}  {'serving CPU s':>13} {'x':>5}  {'trainer CPU s':>13} {'x':>5}")
    for k, row in rows.items():
        publish, sends, held = (statistics.median(row["times"][key])
                                for key in ("publish", "trainer sends", "all members hold it"))
        sent, serve_cpu, process_cpu = (statistics.median(row[key]) for key in ("sent", "serve_cpu", "process_cpu"))
        print(f"{k:>7}  {publish:9.3f} {publish / base['publish']:5.2f}  {sends:15.3f} "
              f"{sends / base['trainer sends']:5.2f}  {held:13.3f} {held / base['all members hold it']:5.2f}  "
              f"{sent / 1e6:15.1f} {sent / base_sent:5.2f}  {serve_cpu:13.3f} {serve_cpu / base_serve_cpu:5.2f}  "
              f"{process_cpu:13.3f} {process_cpu / base_process_cpu:5.2f}")


if __name__ == "__main__":
    main()
