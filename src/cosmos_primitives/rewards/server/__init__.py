"""Run the reference reward server: ``python -m cosmos_primitives.rewards.server``.

::

    export REMOTE_REWARD_TOKEN=some-secret
    python -m cosmos_primitives.rewards.server --host 127.0.0.1 --port 8080 \\
        --reward my_rewards:sharpness --reward aesthetic=my_rewards:aesthetic_score

It prints one line ``reward server listening on http://HOST:PORT ...`` on stdout once the port is
bound (``--port 0`` picks a free one), logs to stderr, and stops on SIGINT / SIGTERM. It refuses to
start without a token (``REMOTE_REWARD_TOKEN`` or ``--token``) unless ``--insecure-no-token`` is
given. Point clients at it with ``REMOTE_REWARD_ENQUEUE_URL=http://HOST:PORT/api/reward/enqueue``
and ``REMOTE_REWARD_FETCH_URL=http://HOST:PORT/api/reward/pull``.

The server itself is :class:`RewardServer` (:mod:`.app`); this package holds the whole reference
server: request handling (:mod:`.requests`, :mod:`.http_parser`: aiohttp's pure-Python parser),
batches and their memory budget (:mod:`.jobs`, :mod:`.memory`), reward loading (:mod:`.rewards`) and
the CLI server as a child process (:mod:`.process`). The client and rule-based rewards are in
``cp.rewards``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from cosmos_primitives.rewards.remote_protocol import ENV_TOKEN

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.rewards.server.app import RewardServer

READY_LINE = "reward server listening on "


def __getattr__(name: str) -> Any:
    # RewardServer loads on first use, so that a refused start (no token) exits before the heavy imports
    if name == "RewardServer":
        from cosmos_primitives.rewards.server.app import RewardServer

        return RewardServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cosmos_primitives.rewards.server",
        description="Reference reward server for world-model RL (protocol of REFERENCE.md section 5).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind; 0 picks a free one (default 8080)")
    parser.add_argument("--token", default=None,
                        help=f"bearer token clients must send (default: env {ENV_TOKEN}; an argument is visible "
                             "in the process list, the environment variable is not)")
    parser.add_argument("--insecure-no-token", action="store_true",
                        help="accept requests without a token (local experiments only)")
    parser.add_argument("--reward", action="append", default=[], metavar="[NAME=]MODULE:FUNCTION",
                        help="host a reward function fn(media, *, media_type, prompts, video_infos); repeatable")
    parser.add_argument("--no-builtin", action="store_true",
                        help="do not host the built-in brightness / contrast / colorfulness / media_stats")
    parser.add_argument("--latent-decoder", default=None, metavar="MODULE:FUNCTION",
                        help="fn(latent [B,C,T,H,W]) -> video uint8 [B,C,T,H,W], applied before rewards")
    parser.add_argument("--max-pending", type=int, default=64, help="batches waiting or running; more get 503")
    parser.add_argument("--workers", type=int, default=2, help="threads computing rewards")
    parser.add_argument("--max-body-mb", type=float, default=1024.0, help="largest enqueue body in MiB (413 above)")
    parser.add_argument("--max-memory-mb", type=float, default=None,
                        help="bytes all request bodies being read and all pending batches may hold together, in MiB "
                             "(503 above; default max-pending x max-body-mb)")
    parser.add_argument("--body-timeout-s", type=float, default=60.0,
                        help="seconds a request body may take to arrive (408 after; default 60)")
    parser.add_argument("--result-ttl-s", type=float, default=600.0, help="seconds finished results stay fetchable")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = args.token or os.environ.get(ENV_TOKEN) or None
    if token is None and not args.insecure_no_token:
        print(f"error: no token: set the environment variable {ENV_TOKEN} (or pass --token); "
              "--insecure-no-token serves without one", file=sys.stderr)
        return 2
    from cosmos_primitives.rewards.server.app import RewardServer
    from cosmos_primitives.rewards.server.rewards import load_reward_spec

    try:
        rewards = dict(load_reward_spec(spec) for spec in args.reward)
        decoder = load_reward_spec(args.latent_decoder)[1] if args.latent_decoder else None
        server = RewardServer(
            host=args.host,
            port=args.port,
            token=token,
            rewards=rewards,
            builtin=not args.no_builtin,
            max_pending=args.max_pending,
            workers=args.workers,
            max_body_bytes=int(args.max_body_mb * (1 << 20)),
            max_memory_bytes=None if args.max_memory_mb is None else int(args.max_memory_mb * (1 << 20)),
            body_timeout_s=args.body_timeout_s,
            result_ttl_s=args.result_ttl_s,
            decode_latent=decoder,
            insecure_no_token=args.insecure_no_token,
        )
        if not server.rewards:
            raise ValueError("no rewards to host: add --reward MODULE:FUNCTION or drop --no-builtin")
        server.start()
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"{READY_LINE}{server.url} (enqueue {server.enqueue_url}, fetch {server.fetch_url}; "
          f"rewards: {', '.join(sorted(server.rewards))})", flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


__all__ = ["READY_LINE", "RewardServer", "build_parser", "main"]
