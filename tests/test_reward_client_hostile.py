"""The reward-service client does not trust the server: a real aiohttp server on loopback answers the
client's enqueue and fetch with hostile replies; each ends in a ``RemoteRewardError`` naming the server
(and the reward, for scores), never in a reward value, a ``RecursionError`` or a reply read whole.

``CLIENT_CASES`` counts the hostile replies tried here (for the reliability table of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cosmos_primitives.config.remote_reward import RemoteRewardConfig
from cosmos_primitives.rewards.remote import RemoteRewardClient
from cosmos_primitives.rewards.remote_errors import RemoteRewardBadReply, RemoteRewardError, RemoteRewardRejected

web = pytest.importorskip("aiohttp.web", reason="the reward client needs aiohttp (extra wfm)")

VIDEO = np.zeros((2, 3, 1, 2, 2), dtype=np.uint8)


def scores_reply(values: str) -> bytes:
    tail = '}, "input_info": {}, "duration": 0.1, "type": "aesthetic"}'
    return ('{"scores": {"aesthetic": ' + values + tail).encode()


DEEP = b"[" * 100_000 + b"]" * 100_000


class HostileServer:
    """A real HTTP server whose fetch route answers ``fetch_reply(request)``; enqueue accepts everything.
    Counts the reply bytes it managed to write."""

    def __init__(self, fetch_reply: Callable[[Any], Any]) -> None:
        self.fetch_reply = fetch_reply
        self.bytes_written = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(30)
        self.enqueue_url = f"http://127.0.0.1:{self.port}/api/reward/enqueue"
        self.fetch_url = f"http://127.0.0.1:{self.port}/api/reward/pull"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def enqueue(request):
            await request.read()
            return web.json_response({"uuid": "job-1"})

        async def fetch(request):
            await request.read()
            return await self.fetch_reply(self, request)

        app = web.Application()
        app.router.add_post("/api/reward/enqueue", enqueue)
        app.router.add_post("/api/reward/pull", fetch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def fixed(body: bytes, status: int = 200) -> Callable[..., Any]:
    async def reply(server, request):
        return web.Response(body=body, status=status, content_type="application/json")
    return reply


def endless(declare_length: bool) -> Callable[..., Any]:
    """A 400 MB reply streamed in 1 MiB chunks (as many as the client reads)."""
    async def reply(server, request):
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if declare_length:
            resp.content_length = 400 << 20
        await resp.prepare(request)
        chunk = b" " * (1 << 20)
        try:
            for _ in range(400):
                await resp.write(chunk)
                server.bytes_written += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp
    return reply


# name -> (fetch reply, error class, text expected in the message)
CLIENT_CASES: dict[str, tuple[Callable[..., Any], type[RemoteRewardError], str]] = {
    "NaN score": (fixed(scores_reply("[0.5, NaN]")), RemoteRewardBadReply, "non-finite scores at items [1]"),
    "Infinity score": (fixed(scores_reply("[Infinity, 0.5]")), RemoteRewardBadReply, "non-finite scores at items [0]"),
    "-Infinity score": (fixed(scores_reply("[-Infinity, -Infinity]")), RemoteRewardBadReply, "items [0, 1]"),
    "overflowing score 1e999": (fixed(scores_reply("[1e999, 0.0]")), RemoteRewardBadReply, "non-finite"),
    "100k-deep JSON reply": (fixed(DEEP), RemoteRewardBadReply, "nested too deeply"),
    "65-deep JSON reply": (fixed(scores_reply("[0.5, " + "[" * 65 + "]" * 65 + "]")), RemoteRewardBadReply,
                           "nested more than 64"),
    "100k-deep JSON error reply": (fixed(DEEP, status=404), RemoteRewardRejected, "HTTP 404"),
    "reply not UTF-8": (fixed(b'{"scores": "\xff\xfe"}'), RemoteRewardBadReply, "could not be parsed"),
    "400 MB reply, Content-Length": (endless(True), RemoteRewardBadReply, "max_reply_bytes"),
    "400 MB reply, streamed": (endless(False), RemoteRewardBadReply, "max_reply_bytes"),
}


@pytest.mark.parametrize("case", list(CLIENT_CASES))
def test_hostile_reply_is_an_error_naming_the_server(case):
    reply, error, text = CLIENT_CASES[case]
    server = HostileServer(reply)
    try:
        client = RemoteRewardClient(
            RemoteRewardConfig(max_retries=0, request_timeout_s=20.0, poll_timeout_s=10.0, max_reply_bytes=4 << 20),
            enqueue_url=server.enqueue_url, fetch_url=server.fetch_url, token="t", rewards={"aesthetic": 1.0},
        )
        with pytest.raises(error) as info:
            client.score_sync(["a", "b"], VIDEO, "video")
    finally:
        server.close()
    message = str(info.value)
    assert text in message and server.fetch_url in message, message
    if error is RemoteRewardBadReply and "score" in case:
        assert "reward 'aesthetic'" in message, message
    # a reply over the bound is dropped after at most the bound plus what was in flight, never read whole
    assert server.bytes_written < 64 << 20, f"{server.bytes_written / 2**20:.0f} MiB of the reply were sent"


def test_video_fps_must_be_finite_before_anything_is_sent():
    client = RemoteRewardClient(RemoteRewardConfig(), enqueue_url="http://127.0.0.1:9/api/reward/enqueue",
                                token="t", rewards={"aesthetic": 1.0})
    for fps in (float("nan"), float("inf"), 0.0, -16.0):
        with pytest.raises(ValueError, match="video_fps must be a positive finite number"):
            client.score_sync(["a", "b"], VIDEO, "video", video_fps=fps)
