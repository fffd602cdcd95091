"""The reference reward server (aiohttp) speaking the protocol of REFERENCE.md section 5.

``RewardServer`` runs the HTTP server and its workers on an event loop in a background thread::

    with RewardServer(host="127.0.0.1", port=0, token="t", rewards={"mine": my_fn}) as srv:
        client = RemoteRewardClient(enqueue_url=srv.enqueue_url, fetch_url=srv.fetch_url, token="t", ...)

Behaviour:

- every request needs ``Authorization: Bearer <token>`` (401 otherwise) unless the server was made
  with ``insecure_no_token=True``;
- every request is read and checked at one boundary (:mod:`cosmos_primitives.rewards.server.requests`):
  a client's mistake is answered 4xx with the reason, never 500: 400 (unparsable: bad JSON, JSON
  nested too deeply or holding NaN, a bad ``.npy`` header), 408 (a body that does not arrive within
  ``body_timeout_s``), 413 (over ``max_body_bytes``; fetch bodies over 64 KiB) or 422 (wrong media /
  prompts / rewards / non-finite weights or fps), and the server keeps serving; a client that hangs
  up mid-body is logged in one line;
- enqueue bodies are parsed as they arrive, without unpickling: the array bytes go straight into
  the array's buffer;
- memory: every request body takes its bytes from one budget (``max_memory_bytes``) while it is
  read, and a batch keeps them until its rewards are computed; at most ``max_pending`` batches
  wait, run or arrive at once; beyond either bound a request is answered 503 (nothing is dropped
  silently). A finished batch keeps only its replies, encoded, and they hold their bytes of the same
  budget until ``result_ttl_s`` passes; a new body that needs their room evicts the oldest unfetched
  results first (a later fetch of those is a 404 that says so);
- ``workers`` threads compute rewards; a batch's rewards run one after the other, and each reward's
  reply can be fetched as soon as it is ready (HTTP 400 before that);
- a fetch of an unknown uuid, or of a reward the batch did not request, is answered 404; a fetch
  without ``uuid`` / ``type`` 422 (never 400, which means "not ready").

Without ``media_type`` in the JSON the body is taken as ``latent`` (what the existing service's video
clients send). With ``decode_latent`` (``fn(latent [B, C, T, H, W]) -> video uint8 [B, C, T, H, W]``)
latents are decoded once per batch and every reward receives ``media_type="video"``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid as uuid_lib
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from cosmos_primitives.rewards.media_stats import BUILTIN_REWARDS
from cosmos_primitives.rewards.remote_protocol import (
    ENQUEUE_PATH,
    FAILED_SCORE,
    FETCH_PATH,
    PING_PATH,
    EnqueueBodyParser,
    ProtocolError,
    check_media,
)
from cosmos_primitives.rewards.server.http_parser import python_parser_protocol
from cosmos_primitives.rewards.server.jobs import Job, JobTable
from cosmos_primitives.rewards.server.memory import ByteBudget
from cosmos_primitives.rewards.server.requests import (
    MAX_FETCH_BODY_BYTES,
    ClientGone,
    ClientMistakesLog,
    check_enqueue,
    check_token,
    parse_fetch,
    read_body,
)
from cosmos_primitives.rewards.server.rewards import RewardFn, run_reward
from cosmos_primitives.utils.extras import require

log = logging.getLogger(__name__)

_COUNTERS = ("enqueued", "rejected_full", "rejected_bad", "unauthorized", "not_ready", "served", "timed_out",
             "disconnected")
# the counter of each refusal status
_COUNTER_OF = {401: "unauthorized", 408: "timed_out", 503: "rejected_full"}


class RewardServer:
    """The reference reward server, run in a background thread.

    Args:
        host, port: where to listen; ``port=0`` picks a free port (read it back from ``port`` / ``url``).
        token: the bearer token clients must send. Required unless ``insecure_no_token``.
        rewards: {name: reward function} added to the built-in ones (see
            :mod:`cosmos_primitives.rewards.server.rewards` for the signature).
        builtin: host the built-in statistics ``brightness``, ``contrast``, ``colorfulness``,
            ``media_stats`` (:mod:`cosmos_primitives.rewards.media_stats`).
        max_pending: batches allowed to wait or run at once; more are answered 503.
        workers: threads computing rewards (batches scored in parallel).
        max_body_bytes: largest enqueue body accepted (413 above).
        max_memory_bytes: the budget of bytes all request bodies being read, all pending batches
            and all finished results not yet expired hold together (the oldest results are evicted
            for a new body; 503 when that is not enough); default ``max_pending * max_body_bytes``.
        body_timeout_s: seconds a request body may take to arrive (408 after).
        result_ttl_s: seconds a finished batch's replies stay fetchable.
        decode_latent: optional ``fn(latent) -> video uint8 [B, C, T, H, W]`` applied to latent batches.
        insecure_no_token: accept requests without any token (local experiments only).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        rewards: dict[str, RewardFn] | None = None,
        *,
        builtin: bool = True,
        max_pending: int = 64,
        workers: int = 2,
        max_body_bytes: int = 1 << 30,
        max_memory_bytes: int | None = None,
        body_timeout_s: float = 60.0,
        result_ttl_s: float = 600.0,
        decode_latent: Callable[[np.ndarray], np.ndarray] | None = None,
        insecure_no_token: bool = False,
    ) -> None:
        self._web = require("aiohttp.web", "the reference reward server")
        if not token and not insecure_no_token:
            raise ValueError(
                "RewardServer needs a token (clients send it as 'Authorization: Bearer <token>'); pass token=..., "
                "or insecure_no_token=True for a local experiment"
            )
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be > 0, got {body_timeout_s}")
        self.host = host
        self.port = port
        self.token = token or None
        self.workers = workers
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.decode_latent = decode_latent
        self.replica_id = uuid_lib.uuid4().hex[:12]
        budget = max_memory_bytes if max_memory_bytes is not None else max_pending * max_body_bytes
        if budget < max_body_bytes:
            raise ValueError(f"max_memory_bytes={budget} is below max_body_bytes={max_body_bytes}: a batch of the "
                             "largest size could never be accepted; raise max_memory_bytes or lower max_body_bytes")
        self.memory = ByteBudget(budget)
        self.jobs = JobTable(max_pending, result_ttl_s, self.memory)
        self.rewards: dict[str, RewardFn] = dict(BUILTIN_REWARDS) if builtin else {}
        for name, fn in (rewards or {}).items():
            self.register(name, fn)
        # every key exists from the start: `stats` copies this from another thread, which must not see it grow
        self._counts: Counter[str] = Counter(dict.fromkeys(_COUNTERS, 0))
        self._arriving = 0  # enqueue bodies being read or parsed (event-loop thread only)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    # ------------------------------------------------------------------ public

    def register(self, name: str, fn: RewardFn) -> None:
        """Host ``fn`` under ``name`` (replacing a reward of that name). Safe while running."""
        if not isinstance(name, str) or not name or "+" in name:
            raise ValueError(f"reward name {name!r} must be a non-empty string without '+'")
        if not callable(fn):
            raise TypeError(f"reward {name!r}: {fn!r} is not callable")
        self.rewards[name] = fn

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def enqueue_url(self) -> str:
        return self.url + ENQUEUE_PATH

    @property
    def fetch_url(self) -> str:
        return self.url + FETCH_PATH

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``enqueued``, ``rejected_full`` (503), ``rejected_bad`` (400/413/422),
        ``unauthorized`` (401), ``timed_out`` (408), ``disconnected`` (client hung up mid-body),
        ``not_ready`` (400 on fetch), ``served`` (200 on fetch); plus ``pending`` (batches) and
        ``memory_bytes`` / ``memory_peak_bytes`` (bytes of the budget held now / at most), of which
        ``results_bytes`` by finished results (encoded replies, plus ``RESULT_OVERHEAD_BYTES`` a batch),
        and ``results_evicted`` (finished batches forgotten unfetched to make room)."""
        counts = {k: self._counts[k] for k in _COUNTERS}
        counts["pending"] = self.jobs.pending
        counts["memory_bytes"] = self.memory.used
        counts["memory_peak_bytes"] = self.memory.peak
        counts["results_bytes"] = self.jobs.results_bytes
        counts["results_evicted"] = self.jobs.results_evicted
        return counts

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> RewardServer:
        """Start listening (returns once the port is bound)."""
        if self.running:
            return self
        self._ready.clear()
        self._startup_error = None
        self._thread = threading.Thread(target=self._thread_main, name=f"reward-server-{self.replica_id}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"reward server on {self.host}:{self.port} did not start within {timeout_s}s")
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(
                f"reward server could not listen on {self.host}:{self.port}: {self._startup_error}"
            ) from self._startup_error
        log.info("reward server listening on %s (rewards: %s)", self.url, sorted(self.rewards))
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening and cancel queued work. A reward function already running finishes in its thread."""
        if self._thread is None or self._loop is None:
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ event loop

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._open())
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close())
            loop.close()

    async def _open(self) -> None:
        web = self._web

        @web.middleware
        async def guard(request: Any, handler: Callable[..., Any]) -> Any:
            return await self._guard(request, handler)

        # handlers read bodies themselves (requests.read_body); aiohttp's own limit is never reached
        app = web.Application(client_max_size=self.max_body_bytes + 1, middlewares=[guard])
        app.router.add_post(ENQUEUE_PATH, self._enqueue)
        app.router.add_post(FETCH_PATH, self._fetch)
        app.router.add_route("*", PING_PATH, self._ping)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     logger=ClientMistakesLog(logging.getLogger("aiohttp.server"), {}))
        await self._runner.setup()
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="reward-worker")
        # bodies are parsed beside the workers, so a slow reward never delays the answer to an enqueue
        self._parse_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="reward-parse")
        try:
            # not web.TCPSite: each connection gets aiohttp's Python request parser (http_parser says why)
            self._listener = await asyncio.get_running_loop().create_server(
                python_parser_protocol(self._runner.server), self.host, self.port)
        except BaseException:
            await self._runner.cleanup()
            self._pool.shutdown(wait=False)
            self._parse_pool.shutdown(wait=False)
            raise
        self.port = self._listener.sockets[0].getsockname()[1]
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._worker_tasks = [asyncio.ensure_future(self._worker()) for _ in range(self.workers)]

    async def _close(self) -> None:
        for task in self._worker_tasks:
            task.cancel()
        await asyncio.gather(*self._worker_tasks, return_exceptions=True)
        self._listener.close()  # stop accepting; the runner's cleanup closes the open connections
        await self._runner.cleanup()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._parse_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ HTTP

    def _error(self, status: int, message: str, counter: str | None = None, **headers: str) -> Any:
        if counter:
            self._counts[counter] += 1
        return self._web.json_response({"error": message}, status=status, headers=headers or None)

    async def _guard(self, request: Any, handler: Callable[..., Any]) -> Any:
        """Token check for every route; client mistakes (ProtocolError) -> 4xx with the reason; a JSON 500
        instead of a dropped connection on the server's own bugs."""
        web = self._web
        try:
            if self.token is not None:
                check_token(request.headers.get("Authorization", ""), self.token)
            return await handler(request)
        except web.HTTPException:
            raise
        except ProtocolError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
            if exc.status == 503:
                headers["Retry-After"] = "1"
            reply = self._error(exc.status, exc.message, _COUNTER_OF.get(exc.status, "rejected_bad"), **headers)
            if not request.content.is_eof():
                reply.force_close()  # a body left unread (stalled, too large): do not wait for it
            return reply
        except ClientGone as exc:
            self._counts["disconnected"] += 1
            log.info("reward server: client %s hung up during %s %s (%s)", request.remote, request.method,
                     request.path, exc)
            return self._error(400, "client disconnected")
        except Exception as exc:
            log.exception("reward server: %s %s failed", request.method, request.path)
            return self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    def _busy(self) -> Any:
        return self._error(
            503, f"queue full: {self.jobs.pending} batches pending (max_pending={self.jobs.max_pending}); retry later",
            "rejected_full", **{"Retry-After": "1"},
        )

    async def _enqueue(self, request: Any) -> Any:
        # bodies being read or parsed hold a pending slot too: at most max_pending batches (queued,
        # running or arriving) at once, however many clients upload together
        if self.jobs.pending + self._arriving >= self.jobs.max_pending:
            return self._busy()
        self._arriving += 1
        try:
            parser = EnqueueBodyParser(self.max_body_bytes)
            held = await read_body(request, parser.feed, limit=self.max_body_bytes,
                                   limit_name="max_body_bytes", budget=self.memory,
                                   timeout_s=self.body_timeout_s, what="enqueue body")
            try:
                meta, media = parser.finish()
                del parser
                loop = asyncio.get_running_loop()
                parsed = await loop.run_in_executor(self._parse_pool, check_enqueue, meta, media, dict(self.rewards))
            except BaseException:
                self.memory.release(held)
                raise
        finally:
            self._arriving -= 1
        job = self.jobs.add(**parsed, held_bytes=held)
        self._queue.put_nowait(job)
        self._counts["enqueued"] += 1
        return self._web.json_response({"uuid": job.uuid, "replica_id": self.replica_id})

    async def _fetch(self, request: Any) -> Any:
        web = self._web
        body = bytearray()
        held = await read_body(request, body.extend, limit=MAX_FETCH_BODY_BYTES,
                               limit_name="the fetch body limit", budget=self.memory,
                               timeout_s=self.body_timeout_s, what="fetch body")
        try:
            uuid, name = parse_fetch(bytes(body), request.content_type,
                                     request.headers.get("Content-Type", ""))
        finally:
            self.memory.release(held)
        job = self.jobs.get(uuid)
        if job is None and self.jobs.evicted(uuid):
            return self._error(
                404, f"the results of batch {uuid} were evicted before they were fetched: the server's memory "
                f"budget (max_memory_bytes={self.memory.capacity}) was needed for newer batches. Fetch results "
                f"sooner, or give the server a larger max_memory_bytes", "rejected_bad",
            )
        if job is None:
            return self._error(
                404, f"unknown uuid {uuid!r}: never enqueued on this server, or its results expired after "
                f"result_ttl_s={self.jobs.result_ttl_s}s", "rejected_bad",
            )
        if name not in job.rewards:
            return self._error(404, f"batch {uuid} did not request reward {name!r}; it requested {list(job.rewards)}",
                               "rejected_bad")
        reply = job.replies.get(name)
        if reply is None:
            self._counts["not_ready"] += 1
            return web.json_response(
                {"status": "pending", "error": f"not ready: reward {name!r} of batch {uuid} is being computed"},
                status=400,
            )
        self._counts["served"] += 1
        if isinstance(reply, bytes):
            return web.Response(body=reply, content_type="application/json")
        return web.json_response(reply)

    async def _ping(self, request: Any) -> Any:
        return self._web.json_response({
            "status": "ok",
            "rewards": sorted(self.rewards),
            "pending": self.jobs.pending,
            "max_pending": self.jobs.max_pending,
            "replica_id": self.replica_id,
        })

    # ------------------------------------------------------------------ workers

    def _decode(self, latent: np.ndarray) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        video = np.asarray(self.decode_latent(latent))  # type: ignore[misc]
        try:
            check_media(video, "video")
        except ProtocolError as exc:
            raise ValueError(f"the latent decoder's output is not a video: {exc.message}") from None
        if video.shape[0] != latent.shape[0]:
            raise ValueError(f"the latent decoder returned {video.shape[0]} videos for {latent.shape[0]} latents")
        return video, time.perf_counter() - start

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self._queue.get()
            try:
                await self._score(loop, job)
            except Exception as exc:
                log.exception("reward server: batch %s failed", job.uuid)
                self._fail_rest(job, f"{type(exc).__name__}: {exc}")
            finally:
                self.jobs.finish(job)

    async def _score(self, loop: asyncio.AbstractEventLoop, job: Job) -> None:
        media, media_type = job.media, job.media_type
        decoded_s: float | None = None
        if media_type == "latent" and self.decode_latent is not None:
            try:
                media, decoded_s = await loop.run_in_executor(self._pool, self._decode, media)
            except Exception as exc:
                log.warning("reward server: latent decoder failed on batch %s: %s", job.uuid, exc)
                self._fail_rest(job, f"latent decoder failed: {type(exc).__name__}: {exc}")
                return
            media_type = "video"
        for name in job.rewards:
            scores, errors, seconds = await loop.run_in_executor(
                self._pool, run_reward, self.rewards[name], name, media, media_type, job.prompts, job.video_infos
            )
            reply: dict[str, Any] = {"scores": scores, "input_info": job.input_info, "duration": seconds, "type": name}
            if decoded_s is not None:
                reply["decoded_duration"] = decoded_s
            if errors:
                reply["errors"] = errors
            job.replies[name] = reply

    @staticmethod
    def _fail_rest(job: Job, error: str) -> None:
        """Every reward of ``job`` without a reply gets -1.0 for all items and the error."""
        batch = job.input_info["shape"][0]
        for name in job.rewards:
            job.replies.setdefault(name, {
                "scores": {name: [FAILED_SCORE] * batch},
                "input_info": job.input_info,
                "duration": 0.0,
                "type": name,
                "errors": [error],
            })
