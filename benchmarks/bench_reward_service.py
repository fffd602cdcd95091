"""Reward-service benchmark: one batch scored through the HTTP service vs the same reward called in-process.

Run: ``.venv/bin/python benchmarks/bench_reward_service.py [--batch 8 --frames 16 --size 128 --repeats 10]``.

A batch of uint8 clips ``[B, 3, T, S, S]`` is scored for ``brightness``:

1. in-process: ``media_stats.brightness(media, media_type="video")`` (the baseline);
2. service, fast polling: ``RemoteRewardClient.score`` against ``RewardServer`` on loopback with
   ``poll_interval_s = 0.005`` (protocol overhead: np.save encoding, HTTP upload, server-side
   parsing, the worker hop, polling, JSON reply);
3. service, default polling (``poll_interval_s = 0.05`` growing 1.5x per poll), what a training loop gets
   out of the box;
4. throughput: ``batch`` concurrent clients (threads) each scoring one batch, against the
   in-process time of the same number of batches.

Each ratio compares two things measured in this run (median of ``repeats``).
"""

from __future__ import annotations

import argparse
import concurrent.futures

import numpy as np

from cosmos_primitives.config.remote_reward import RemoteRewardConfig
from cosmos_primitives.rewards.media_stats import brightness
from cosmos_primitives.rewards.remote import RemoteRewardClient
from cosmos_primitives.rewards.server import RewardServer
from timing import median_seconds

TOKEN = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    media = rng.integers(0, 256, (args.batch, 3, args.frames, args.size, args.size), dtype=np.uint8)
    prompts = [f"clip {i}" for i in range(args.batch)]
    mb = media.nbytes / 2**20
    print(f"batch: video uint8 {list(media.shape)} ({mb:.1f} MiB), reward 'brightness', median of {args.repeats}")

    local = median_seconds(lambda: brightness(media, media_type="video"), args.repeats)
    with RewardServer(token=TOKEN, workers=2, max_pending=4 * args.batch) as srv:
        def client(poll_interval_s: float) -> RemoteRewardClient:
            return RemoteRewardClient(RemoteRewardConfig(poll_interval_s=poll_interval_s), enqueue_url=srv.enqueue_url,
                                      token=TOKEN, rewards={"brightness": 1.0})

        fast, default = client(0.005), client(RemoteRewardConfig().poll_interval_s)
        check = fast.score_sync(prompts, media, "video").total
        np.testing.assert_allclose(check, brightness(media, media_type="video")["brightness"], rtol=1e-5)
        service_fast = median_seconds(lambda: fast.score_sync(prompts, media, "video"), args.repeats)
        service_default = median_seconds(lambda: default.score_sync(prompts, media, "video"), args.repeats)

        def concurrent_batches() -> None:
            with concurrent.futures.ThreadPoolExecutor(args.batch) as pool:
                list(pool.map(lambda _: fast.score_sync(prompts, media, "video"), range(args.batch)))

        many = median_seconds(concurrent_batches, max(3, args.repeats // 3))

    print(f"in-process brightness:              {1e3 * local:8.1f} ms / batch")
    print(f"service, poll 5 ms:                 {1e3 * service_fast:8.1f} ms / batch  "
          f"({service_fast / local:.1f}x in-process; {mb / service_fast:.0f} MiB/s)")
    print(f"service, default polling (0.05 s):  {1e3 * service_default:8.1f} ms / batch  "
          f"({service_default / local:.1f}x in-process)")
    print(f"{args.batch} concurrent clients:              {1e3 * many:8.1f} ms for {args.batch} batches  "
          f"({many / (args.batch * local):.2f}x in-process for the same batches)")


if __name__ == "__main__":
    main()
