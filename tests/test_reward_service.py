"""Reward-service client and reference server over real HTTP on loopback (REFERENCE.md section 5)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import cosmos_primitives as cp
from cosmos_primitives.config.remote_reward import RemoteRewardConfig, RemoteRewardTerm
from cosmos_primitives.parallel.distributed import free_port
from cosmos_primitives.rewards import media_stats
from cosmos_primitives.rewards.remote import RemoteRewardClient
from cosmos_primitives.rewards.remote_errors import (
    RemoteRewardAuthError,
    RemoteRewardBadReply,
    RemoteRewardBusy,
    RemoteRewardTimeout,
    RemoteRewardUnreachable,
)
from cosmos_primitives.rewards.server import RewardServer
from cosmos_primitives.rewards.server.process import RewardServerProcess

TOKEN = "test-token-123"


def wait_until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def video_batch(levels: list[int], seed: int = 0, shape: tuple[int, int, int, int] = (3, 4, 8, 8)) -> np.ndarray:
    """uint8 [B, C, T, H, W] clips with pixel noise around each grey ``level``."""
    rng = np.random.default_rng(seed)
    clips = [np.clip(rng.normal(level, 20.0, shape), 0, 255) for level in levels]
    return np.stack(clips).astype(np.uint8)


def mean_level(media: np.ndarray) -> np.ndarray:
    """Mean pixel value in [0, 1] per item, computed here independently of the server."""
    return media.reshape(media.shape[0], -1).astype(np.float64).mean(axis=1) / 255.0


class Gate:
    """A reward that blocks until ``open()``: makes "not ready" and "queue full" deterministic."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.entered = threading.Event()

    def open(self) -> None:
        self._event.set()

    def __call__(self, media, **_):
        self.entered.set()
        if not self._event.wait(60):
            raise TimeoutError("gate never opened")
        return mean_level(media)


def two_keys(media, *, prompts, **_):
    """Score keys ``a`` (mean level) and ``b`` (prompt length / 10)."""
    return {"a": mean_level(media), "b": [len(p) / 10.0 for p in prompts]}


def picky(media, *, prompts, **_):
    """Fails on any batch containing the prompt ``"bad"``."""
    if "bad" in prompts:
        raise RuntimeError("cannot score the prompt 'bad'")
    return mean_level(media)


def nan_on_second(media, **_):
    scores = mean_level(media)
    scores[1] = np.nan
    return scores


@pytest.fixture
def gate():
    g = Gate()
    yield g
    g.open()


@pytest.fixture
def server(gate):
    with RewardServer(token=TOKEN, rewards={"gated": gate, "two_keys": two_keys, "picky": picky,
                                                  "nan_on_second": nan_on_second}) as srv:
        yield srv


def client_for(target, rewards=None, *, token: str | None = TOKEN, enqueue_url: str | None = None,
               fetch_url: str | None = None, **overrides) -> RemoteRewardClient:
    settings = dict(poll_interval_s=0.01, poll_max_interval_s=0.1, retry_backoff_s=0.02, retry_max_backoff_s=0.2,
                    max_retries=2, request_timeout_s=10.0, poll_timeout_s=30.0)
    settings.update(overrides)
    return RemoteRewardClient(
        RemoteRewardConfig(**settings),
        enqueue_url=enqueue_url or target.enqueue_url,
        fetch_url=fetch_url or target.fetch_url,
        token=token,
        rewards=rewards if rewards is not None else {"brightness": 1.0},
    )


# ---------------------------------------------------------------- scores


def test_brightness_of_video_image_and_latent(server):
    client = client_for(server, {"brightness": 1.0, "contrast": 1.0}, scale=2.0)
    video = video_batch([30, 128, 220])
    result = client.score_sync(["dark", "mid", "bright"], video, "video", video_fps=16.0)
    expected = mean_level(video)
    np.testing.assert_allclose(result.per_reward["brightness"], expected, rtol=1e-5)
    assert result.total.dtype == np.float32 and result.total.shape == (3,)
    np.testing.assert_allclose(result.total, 2.0 * (expected + result.per_reward["contrast"]), rtol=1e-5)
    reply = result.replies["brightness"]
    assert reply["type"] == "brightness"
    assert reply["input_info"]["shape"] == list(video.shape)
    assert reply["input_info"]["video_infos"][0] == {"video_fps": 16.0}

    images = np.moveaxis(video[:, :, 0], 1, -1).copy()  # [B, H, W, C]
    result = client.score_sync(["a", "b", "c"], images, "image")
    np.testing.assert_allclose(result.per_reward["brightness"], mean_level(images), rtol=1e-5)

    latent = np.random.default_rng(1).normal(0.0, 1.0, (2, 4, 3, 4, 4)).astype(np.float32)
    result = client.score_sync(["x", "y"], latent, "latent")
    as_pixels = (np.clip(latent, -1.0, 1.0) + 1.0) / 2.0
    np.testing.assert_allclose(result.per_reward["brightness"], as_pixels.reshape(2, -1).mean(1), rtol=1e-5)


def test_weights_clips_and_summed_score_keys(server):
    terms = [
        RemoteRewardTerm(name="two_keys", weight=2.0, score_key="a+b", clip=(0.2, 0.9)),
        RemoteRewardTerm(name="brightness", weight=-0.5),
    ]
    client = client_for(server, terms, scale=3.0)
    video = video_batch([10, 100, 250], seed=3)
    prompts = ["", "abc", "a much longer prompt"]
    result = client.score_sync(prompts, video, "video")
    level = mean_level(video)
    summed = level + np.array([len(p) / 10.0 for p in prompts])
    np.testing.assert_allclose(result.per_reward["two_keys"], summed, rtol=1e-5)
    expected = 3.0 * (2.0 * np.clip(summed, 0.2, 0.9) - 0.5 * level)
    np.testing.assert_allclose(result.total, expected, rtol=1e-5)
    assert (summed < 0.2).any() and (summed > 0.9).any(), "the batch must exercise both clip bounds"

    ambiguous = client_for(server, {"two_keys": 1.0})
    with pytest.raises(RemoteRewardBadReply, match=r"several score keys \['a', 'b'\].*score_key"):
        ambiguous.score_sync(prompts, video, "video")
    missing = client_for(server, [RemoteRewardTerm(name="two_keys", score_key="a+c")])
    with pytest.raises(RemoteRewardBadReply, match="no score key 'c'"):
        missing.score_sync(prompts, video, "video")


def test_failed_items_score_minus_one(server):
    client = client_for(server, {"picky": 1.0})
    video = video_batch([50, 90, 200])
    result = client.score_sync(["ok", "bad", "fine"], video, "video")
    level = mean_level(video)
    np.testing.assert_allclose(result.per_reward["picky"], [level[0], -1.0, level[2]], rtol=1e-5)
    assert any("item 1" in e and "cannot score" in e for e in result.replies["picky"]["errors"])

    result = client_for(server, {"nan_on_second": 1.0}).score_sync(["a", "b", "c"], video, "video")
    np.testing.assert_allclose(result.total, [level[0], -1.0, level[2]], rtol=1e-5)
    assert any("non-finite" in e for e in result.replies["nan_on_second"]["errors"])

    # colorfulness needs pixels: every latent item fails, the batch still gets an answer
    latent = np.zeros((2, 4, 2, 4, 4), dtype=np.float32)
    result = client_for(server, {"colorfulness": 1.0}).score_sync(["x", "y"], latent, "latent")
    np.testing.assert_array_equal(result.per_reward["colorfulness"], [-1.0, -1.0])


def test_latent_decoder_turns_latents_into_video():
    def decode(latent):
        return np.clip((latent[:, :3] + 1.0) * 127.5, 0, 255).astype(np.uint8)

    latent = np.random.default_rng(2).uniform(-1, 1, (2, 4, 2, 4, 4)).astype(np.float32)
    with RewardServer(token=TOKEN, decode_latent=decode) as srv:
        result = client_for(srv, {"brightness": 1.0, "colorfulness": 0.0}).score_sync(["x", "y"], latent, "latent")
    np.testing.assert_allclose(result.per_reward["brightness"], mean_level(decode(latent)), rtol=1e-5)
    assert (result.per_reward["colorfulness"] >= 0).all()
    assert "decoded_duration" in result.replies["brightness"]


# ---------------------------------------------------------------- auth


def test_missing_and_wrong_token_are_rejected(server, monkeypatch):
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    video = video_batch([100])
    with pytest.raises(RemoteRewardAuthError, match="REMOTE_REWARD_TOKEN is not set") as info:
        client_for(server, token=None).score_sync(["p"], video, "video")
    assert info.value.status == 401 and server.enqueue_url in str(info.value)
    with pytest.raises(RemoteRewardAuthError, match=r"token sent was refused.*REMOTE_REWARD_TOKEN"):
        client_for(server, token="not-the-token").score_sync(["p"], video, "video")
    assert server.stats["unauthorized"] == 2 and server.stats["enqueued"] == 0

    monkeypatch.setenv("REMOTE_REWARD_TOKEN", TOKEN)
    result = client_for(server, token=None).score_sync(["p"], video, "video")
    np.testing.assert_allclose(result.total, mean_level(video), rtol=1e-5)


def test_server_refuses_to_run_without_token(monkeypatch):
    with pytest.raises(ValueError, match="needs a token"):
        RewardServer(token=None)
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "REMOTE_REWARD_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "cosmos_primitives.rewards.server", "--port", "0"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "REMOTE_REWARD_TOKEN" in proc.stderr and "--insecure-no-token" in proc.stderr


# ---------------------------------------------------------------- polling, queue, failures


def test_not_ready_is_polled_until_the_result_arrives(server, gate):
    client = client_for(server, {"gated": 1.0})
    video = video_batch([40, 160])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.score_sync, ["a", "b"], video, "video")
        wait_until(lambda: server.stats["not_ready"] >= 3, "the client to see three 'not ready' replies")
        assert not future.done()
        gate.open()
        result = future.result(timeout=30)
    np.testing.assert_allclose(result.total, mean_level(video), rtol=1e-5)
    assert server.stats["served"] == 1


def test_result_that_never_arrives_times_out(server, gate):
    client = client_for(server, {"gated": 1.0}, poll_timeout_s=0.3)
    with pytest.raises(RemoteRewardTimeout, match=r"reward 'gated'.*not ready after 0.3s .*polls") as info:
        client.score_sync(["a"], video_batch([1]), "video")
    assert server.fetch_url in str(info.value)


def test_queue_full_is_503_then_served_after_retries(gate):
    video = video_batch([60])
    with RewardServer(token=TOKEN, rewards={"gated": gate}, max_pending=1) as srv, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(client_for(srv, {"gated": 1.0}).score_sync, ["a"], video, "video")
        wait_until(lambda: srv.stats["pending"] == 1, "the first batch to be pending")

        impatient = client_for(srv, {"gated": 1.0}, retry_on_queue_full=False)
        with pytest.raises(RemoteRewardBusy, match=r"HTTP 503.*max_pending=1") as info:
            impatient.score_sync(["b"], video, "video")
        assert info.value.status == 503 and srv.enqueue_url in str(info.value)

        giving_up = client_for(srv, {"gated": 1.0}, max_retries=1)
        with pytest.raises(RemoteRewardBusy, match="stayed full after 2 attempt"):
            giving_up.score_sync(["c"], video, "video")

        patient = client_for(srv, {"brightness": 1.0}, max_retries=200, retry_backoff_s=0.01,
                             retry_max_backoff_s=0.05)
        second = pool.submit(patient.score_sync, ["d"], video, "video")
        rejected = srv.stats["rejected_full"]
        wait_until(lambda: srv.stats["rejected_full"] >= rejected + 2, "the patient client to be refused twice")
        gate.open()
        np.testing.assert_allclose(first.result(timeout=30).total, mean_level(video), rtol=1e-5)
        np.testing.assert_allclose(second.result(timeout=30).total, mean_level(video), rtol=1e-5)
        assert srv.stats["enqueued"] == 2


def test_a_body_still_arriving_holds_a_pending_slot():
    # bounds memory: with max_pending = 1, one slow upload is all the server holds
    video = video_batch([60])
    with RewardServer(token=TOKEN, max_pending=1) as srv:
        host, port = srv.url.split("//")[1].split(":")[0], srv.port
        slow = socket.create_connection((host, port), timeout=10)
        path = "/" + srv.enqueue_url.split("/", 3)[3]
        slow.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n").encode()
                     + b"x" * 1000)
        impatient = client_for(srv, {"brightness": 1.0}, retry_on_queue_full=False)
        wait_until(lambda: _refused(impatient, video), "an enqueue beside the slow upload to be refused with 503")
        slow.close()  # the upload is abandoned: its slot frees
        patient = client_for(srv, {"brightness": 1.0}, max_retries=200, retry_backoff_s=0.01, retry_max_backoff_s=0.05)
        np.testing.assert_allclose(patient.score_sync(["a"], video, "video").total, mean_level(video), rtol=1e-5)


def _refused(client, video) -> bool:
    try:
        client.score_sync(["b"], video, "video")
    except RemoteRewardBusy:
        return True
    return False


def test_server_down_gives_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}/api/reward/enqueue"
    client = RemoteRewardClient(RemoteRewardConfig(max_retries=2, retry_backoff_s=0.01), enqueue_url=url,
                                token=TOKEN, rewards={"brightness": 1.0})
    with pytest.raises(RemoteRewardUnreachable, match=r"unreachable after 3 attempt") as info:
        client.score_sync(["a"], video_batch([1]), "video")
    assert url in str(info.value)


class SilentServer:
    """Accepts TCP connections and reads requests but never answers (a hung server)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self._conns.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._conns:
            conn.close()
        self.sock.close()


def test_slow_server_times_out_after_retries():
    silent = SilentServer()
    try:
        url = f"http://127.0.0.1:{silent.port}/api/reward/enqueue"
        client = RemoteRewardClient(
            RemoteRewardConfig(request_timeout_s=0.3, max_retries=2, retry_backoff_s=0.01),
            enqueue_url=url, token=TOKEN, rewards={"brightness": 1.0},
        )
        with pytest.raises(RemoteRewardTimeout, match=r"did not answer in 3 attempt.*request_timeout_s") as info:
            client.score_sync(["a"], video_batch([1]), "video")
        assert url in str(info.value)
        assert silent.accepted == 3
    finally:
        silent.close()


# ---------------------------------------------------------------- concurrency


def test_concurrent_clients_get_their_own_scores(server):
    levels = [[10, 60], [120, 30], [200, 250], [90, 90], [5, 180], [140, 70]]
    videos = [video_batch(lv, seed=i) for i, lv in enumerate(levels)]

    def one(i: int) -> np.ndarray:
        return client_for(server, {"brightness": 1.0}).score_sync([f"p{i}a", f"p{i}b"], videos[i], "video").total

    with concurrent.futures.ThreadPoolExecutor(len(videos)) as pool:
        totals = list(pool.map(one, range(len(videos))))
    for video, total in zip(videos, totals):
        np.testing.assert_allclose(total, mean_level(video), rtol=1e-5)

    shared = client_for(server, [RemoteRewardTerm(name="brightness"),
                                 RemoteRewardTerm(name="two_keys", weight=0.0, score_key="b")])

    async def gather():
        return await asyncio.gather(*(shared.score(["x" * i, "y"], v, "video") for i, v in enumerate(videos)))

    for i, (video, result) in enumerate(zip(videos, asyncio.run(gather()))):
        np.testing.assert_allclose(result.total, mean_level(video), rtol=1e-5)
        np.testing.assert_allclose(result.per_reward["two_keys"], [i / 10.0, 0.1], rtol=1e-6)


def test_score_sync_works_inside_a_running_event_loop(server):
    client = client_for(server)
    video = video_batch([77])

    async def notebook_cell():
        return client.score_sync(["a"], video, "video")

    np.testing.assert_allclose(asyncio.run(notebook_cell()).total, mean_level(video), rtol=1e-5)


# ---------------------------------------------------------------- process, CLI, config


def test_server_as_a_process_with_a_user_reward_then_stopped(tmp_path: Path):
    (tmp_path / "my_rewards.py").write_text(
        "def prompt_length(media, *, prompts, **_):\n    return [float(len(p)) for p in prompts]\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    with RewardServerProcess(TOKEN, rewards=["plen=my_rewards:prompt_length"], env=env) as proc:
        client = client_for(proc, {"plen": 0.5, "brightness": 1.0})
        video = video_batch([20, 220])
        result = client.score_sync(["abcd", "ab"], video, "video")
        np.testing.assert_allclose(result.per_reward["plen"], [4.0, 2.0])
        np.testing.assert_allclose(result.total, 0.5 * np.array([4.0, 2.0]) + mean_level(video), rtol=1e-5)
        assert proc.stop() == 0, proc.log_text()  # SIGTERM: a clean exit
        with pytest.raises(RemoteRewardUnreachable, match="unreachable") as info:
            client.score_sync(["a", "b"], video, "video")
        assert proc.enqueue_url in str(info.value)


def test_client_from_config_file_and_env(tmp_path: Path, monkeypatch, server):
    toml = tmp_path / "rl.toml"
    toml.write_text(
        "[remote_reward]\nscale = 2.0\ntoken_env = \"MY_REWARD_TOKEN\"\npoll_interval_s = 0.01\n"
        "[[remote_reward.rewards]]\nname = \"two_keys\"\nscore_key = \"a\"\nclip = [0.0, 0.5]\n"
    )
    cfg = cp.load_config(toml)
    monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", server.enqueue_url)
    monkeypatch.delenv("REMOTE_REWARD_FETCH_URL", raising=False)
    monkeypatch.setenv("MY_REWARD_TOKEN", TOKEN)
    client = RemoteRewardClient(cfg.remote_reward)
    assert client.fetch_url == server.fetch_url
    video = video_batch([30, 200])
    result = client.score_sync(["a", "b"], video, "video")
    np.testing.assert_allclose(result.total, 2.0 * np.clip(mean_level(video), 0.0, 0.5), rtol=1e-5)

    with pytest.raises(ValueError, match=r"\[\[remote_reward.rewards\]\]"):
        RemoteRewardClient(RemoteRewardConfig())
    monkeypatch.delenv("REMOTE_REWARD_ENQUEUE_URL")
    with pytest.raises(ValueError, match="REMOTE_REWARD_ENQUEUE_URL"):
        RemoteRewardClient(cfg.remote_reward)
    with pytest.raises(ValueError, match="3 prompts for a batch of 2"):
        client_for(server).score_sync(["a", "b", "c"], video, "video")
    with pytest.raises(ValueError, match="uint8"):
        client_for(server).score_sync(["a", "b"], video.astype(np.float32), "video")


# ---------------------------------------------------------------- built-in statistics


def test_media_stats_functions():
    black_white = np.zeros((1, 2, 2, 3), dtype=np.uint8)
    black_white[0, 0] = 255  # top row white, bottom row black: [B, H, W, C]
    grey = np.full((1, 1, 2, 2, 2), 128, dtype=np.uint8)  # [B, C, T, H, W] single channel
    red = np.zeros((1, 3, 1, 2, 2), dtype=np.uint8)
    red[:, 0] = 255
    out = media_stats.media_stats(black_white, media_type="image")
    assert out["brightness"] == [pytest.approx(0.5)]
    assert out["contrast"] == [pytest.approx(np.std([1.0, 1.0, 0.0, 0.0]), abs=1e-6)]
    assert out["colorfulness"] == [pytest.approx(0.0, abs=1e-6)]
    assert media_stats.colorfulness(grey, media_type="video")["colorfulness"] == [0.0]
    assert media_stats.brightness(grey, media_type="video")["brightness"] == [pytest.approx(128 / 255)]
    # pure red: rg = 1 and yb = 0.5 everywhere, so no spread and colorfulness = 0.3 * |(1, 0.5)|
    assert media_stats.colorfulness(red, media_type="video")["colorfulness"] == [
        pytest.approx(0.3 * np.hypot(1.0, 0.5), rel=1e-6)
    ]
    rgba = np.concatenate([np.moveaxis(red[:, :, 0], 1, -1), np.zeros((1, 2, 2, 1), np.uint8)], axis=-1)
    assert media_stats.brightness(rgba, media_type="image")["brightness"] == [pytest.approx(1 / 3)]


def test_the_seed_guides_environment_variables_reach_the_service(server, monkeypatch):
    """The world-model RL guide sets WFM_REWARD_TOKEN / _ENQUEUE_URL / _FETCH_URL: they work as they are."""
    for name in ("REMOTE_REWARD_TOKEN", "REMOTE_REWARD_ENQUEUE_URL", "REMOTE_REWARD_FETCH_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WFM_REWARD_TOKEN", TOKEN)
    monkeypatch.setenv("WFM_REWARD_ENQUEUE_URL", server.enqueue_url)
    monkeypatch.setenv("WFM_REWARD_FETCH_URL", server.fetch_url)
    client = RemoteRewardClient(RemoteRewardConfig(poll_interval_s=0.01, request_timeout_s=10.0),
                                rewards={"brightness": 1.0})
    assert (client.enqueue_url, client.fetch_url, client.token) == (server.enqueue_url, server.fetch_url, TOKEN)
    video = video_batch([100])
    np.testing.assert_allclose(client.score_sync(["p"], video, "video").total, mean_level(video), rtol=1e-5)
