"""Rollout-queue benchmark: msgspec record encoding vs raw bytes, and queue throughput vs raw Redis.

Run: ``.venv/bin/python benchmarks/bench_queue.py [--records 1000 --completions 8 --tokens 512]``.

1. Codec: one realistic record (``completions`` x ``tokens`` generated tokens with log-probs, a
   1024-token prompt, decoded texts, media references) through ``encode_record`` / ``decode_record``,
   against the minimal raw form of the same numbers: int32 token ids, float32 log-probs, rewards and
   advantages, UTF-8 texts, concatenated from numpy arrays with ``tobytes`` and read back with
   ``np.frombuffer`` (zero-copy; the floor any transport of these bytes pays).
2. Queue: ``records`` records put (producer thread, ``put_many`` of 8) and got + acknowledged
   (consumer, batches of 8) through ``RedisRolloutQueue`` on a local redis-server, against the same
   traffic done with bare redis-py commands on pre-encoded payloads of the same size (pipelined
   XADD, XREADGROUP, XACK + XDEL; no bound, no de-duplication, no validation), once with raw bytes
   and once with the same msgspec encode / decode, which separates the cost of the codec from the
   cost of the queue's protocol (bounded put script, done-set check, atomic ack script). The
   in-memory queue is timed too.
Each ratio compares two things measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import redis

from cosmos_primitives.config import RedisConfig
from cosmos_primitives.queue import (
    InMemoryRolloutQueue,
    RedisRolloutQueue,
    RedisServer,
    RolloutRecord,
    decode_record,
    encode_record,
)

PROMPT_TOKENS = 1024
BATCH = 8


def make_record(i: int, completions: int, tokens: int, rng: np.random.Generator) -> RolloutRecord:
    ids = rng.integers(0, 151_643, size=(completions, tokens))
    lps = -rng.exponential(1.0, size=(completions, tokens)).astype(np.float32)
    return RolloutRecord(
        record_id=f"bench-{i:07d}", prompt_id=f"p{i}", group_id=f"p{i}:g", weight_version=3,
        prompt_token_ids=rng.integers(0, 151_643, size=PROMPT_TOKENS).tolist(),
        completions=["<think>the cube is red</think><answer>B</answer> " * (tokens // 12)] * completions,
        completion_token_ids=ids.tolist(), logprobs=lps.tolist(), finish_reasons=["stop"] * completions,
        rewards=rng.random(completions).tolist(), advantages=rng.standard_normal(completions).tolist(),
        media=["s3://bucket/videos/clip_000123.mp4"],
        conversation=[{"role": "user", "content": [{"type": "video", "video": "s3://bucket/videos/clip_000123.mp4"},
                                                   {"type": "text", "text": "Which colour is the cube?"}]}],
    )


def raw_arrays(record: RolloutRecord) -> list[np.ndarray | str]:
    """The record's numbers as fixed-width arrays (the form a raw-bytes transport would start from)."""
    return [
        np.asarray(record.prompt_token_ids, np.int32),
        np.asarray(record.completion_token_ids, np.int32),
        np.asarray(record.logprobs, np.float32),
        np.asarray(record.rewards, np.float32),
        np.asarray(record.advantages, np.float32),
        "\0".join(record.completions),
    ]


def raw_payload(arrays: list[np.ndarray | str]) -> bytes:
    """The same numbers and texts in their smallest form: int32 / float32 bytes + UTF-8 text."""
    return b"".join(a.encode() if isinstance(a, str) else a.tobytes() for a in arrays)


def raw_decode(data: bytes, completions: int, tokens: int) -> tuple:
    n_ids = PROMPT_TOKENS + completions * tokens
    ids = np.frombuffer(data, np.int32, n_ids)
    off = 4 * n_ids
    lps = np.frombuffer(data, np.float32, completions * tokens, off).reshape(completions, tokens)
    off += 4 * completions * tokens
    scalars = np.frombuffer(data, np.float32, 2 * completions, off)
    texts = data[off + 8 * completions:].decode().split("\0")
    return ids, lps, scalars, texts


def best_of(fn, repeats: int = 5, inner: int = 50) -> float:
    """Seconds per call, the best of ``repeats`` runs of ``inner`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def bench_codec(record: RolloutRecord, completions: int, tokens: int) -> dict[str, float]:
    encoded = encode_record(record)
    arrays = raw_arrays(record)
    raw = raw_payload(arrays)
    out = {
        "msgpack_bytes": len(encoded),
        "raw_bytes": len(raw),
        "encode_s": best_of(lambda: encode_record(record)),
        "decode_s": best_of(lambda: decode_record(encoded)),
        "raw_encode_s": best_of(lambda: raw_payload(arrays)),
        "raw_decode_s": best_of(lambda: raw_decode(raw, completions, tokens)),
        "raw_copy_s": best_of(lambda: bytes(bytearray(raw))),
    }
    return out


def run_queue(put_many, get, ack, records: list, total: int) -> float:
    """Records per second through put (thread) + get + ack."""
    def produce() -> None:
        for start in range(0, total, BATCH):
            put_many(records[start:start + BATCH])

    feeder = threading.Thread(target=produce)
    t0 = time.perf_counter()
    feeder.start()
    done = 0
    while done < total:
        batch = get(min(BATCH, total - done))
        ack(batch)
        done += len(batch)
    elapsed = time.perf_counter() - t0
    feeder.join()
    return total / elapsed


def bench_redis_queue(url: str, records: list[RolloutRecord], max_pending: int) -> float:
    client = redis.Redis.from_url(url)
    client.flushall()
    cfg = RedisConfig(url=url, stream="bench:rollouts", max_pending=max_pending, block_s=1.0)
    producer, consumer = RedisRolloutQueue(cfg, consumer="p"), RedisRolloutQueue(cfg, consumer="c")
    rate = run_queue(producer.put_many, lambda n: consumer.get(n, timeout=30), consumer.ack, records, len(records))
    assert consumer.metrics()["queue/acked"] == len(records) and producer.pending() == 0
    producer.close()
    consumer.close()
    client.close()
    return rate


def bench_raw_redis(url: str, items: list, codec: bool) -> float:
    """Bare redis-py on the same traffic; ``codec``: items are records, encoded on put and decoded on get."""
    client = redis.Redis.from_url(url)
    client.flushall()
    stream, group = "bench:raw", "g"
    client.xgroup_create(stream, group, id="0", mkstream=True)

    def put_many(chunk: list) -> None:
        pipe = client.pipeline(transaction=False)
        for item in chunk:
            pipe.xadd(stream, {"record": encode_record(item) if codec else item})
        pipe.execute()

    def get(n: int) -> list[tuple[bytes, object]]:
        reply = client.xreadgroup(group, "c", {stream: ">"}, count=n, block=30_000)
        if not reply:
            return []
        return [(eid, decode_record(f[b"record"]) if codec else f[b"record"]) for eid, f in reply[0][1]]

    def ack(batch: list[tuple[bytes, bytes]]) -> None:
        eids = [eid for eid, _ in batch]
        pipe = client.pipeline(transaction=True)
        pipe.xack(stream, group, *eids)
        pipe.xdel(stream, *eids)
        pipe.execute()

    rate = run_queue(put_many, get, ack, items, len(items))
    client.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--max-pending", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    template = make_record(0, args.completions, args.tokens, rng)
    codec = bench_codec(template, args.completions, args.tokens)
    print(f"record: {args.completions} completions x {args.tokens} tokens + {PROMPT_TOKENS}-token prompt")
    print(f"  size        msgpack {codec['msgpack_bytes'] / 1e3:8.1f} KB   raw {codec['raw_bytes'] / 1e3:8.1f} KB   "
          f"ratio {codec['msgpack_bytes'] / codec['raw_bytes']:.2f}")
    print(f"  encode      msgspec {codec['encode_s'] * 1e6:8.1f} us   raw {codec['raw_encode_s'] * 1e6:8.1f} us   "
          f"ratio {codec['encode_s'] / codec['raw_encode_s']:.2f}")
    print(f"  decode      msgspec {codec['decode_s'] * 1e6:8.1f} us   raw {codec['raw_decode_s'] * 1e6:8.1f} us   "
          f"ratio {codec['decode_s'] / codec['raw_decode_s']:.2f}   (decode incl. validation)")
    both = codec["encode_s"] + codec["decode_s"]
    raw_both = codec["raw_encode_s"] + codec["raw_decode_s"]
    print(f"  enc+dec     msgspec {both * 1e6:8.1f} us   raw {raw_both * 1e6:8.1f} us   ratio {both / raw_both:.2f}; "
          f"msgspec encode speed {codec['msgpack_bytes'] / codec['encode_s'] / 1e9:.2f} GB/s, "
          f"memcpy of the raw bytes {codec['raw_bytes'] / codec['raw_copy_s'] / 1e9:.2f} GB/s")

    records = [template.__copy__() for _ in range(args.records)]
    for i, r in enumerate(records):
        r.record_id = f"bench-{i:07d}"
    payloads = [encode_record(r) for r in records]
    kb = len(payloads[0]) / 1e3

    memory, queue, raw, raw_codec = [], [], [], []
    with RedisServer() as server:
        for _ in range(args.repeats):
            mem_q = InMemoryRolloutQueue(max_pending=args.max_pending)
            memory.append(run_queue(mem_q.put_many, lambda n, q=mem_q: q.get(n, timeout=30), mem_q.ack,
                                    records, len(records)))
            queue.append(bench_redis_queue(server.url, records, args.max_pending))
            raw.append(bench_raw_redis(server.url, payloads, codec=False))
            raw_codec.append(bench_raw_redis(server.url, records, codec=True))
    med = statistics.median
    print(f"queue: {args.records} records of {kb:.1f} KB, put_many({BATCH}) in a thread + get({BATCH}) + ack, "
          f"median of {args.repeats}")
    print(f"  RedisRolloutQueue            {med(queue):8.0f} records/s ({med(queue) * kb / 1e3:6.1f} MB/s)")
    print(f"  raw redis-py, raw bytes      {med(raw):8.0f} records/s ({med(raw) * kb / 1e3:6.1f} MB/s)   "
          f"queue / raw = {med(queue) / med(raw):.2f}")
    print(f"  raw redis-py + msgspec codec {med(raw_codec):8.0f} records/s "
          f"({med(raw_codec) * kb / 1e3:6.1f} MB/s)   queue / (raw + codec) = {med(queue) / med(raw_codec):.2f}")
    print(f"  InMemoryRolloutQueue         {med(memory):8.0f} records/s (objects, no encoding)")


if __name__ == "__main__":
    main()
