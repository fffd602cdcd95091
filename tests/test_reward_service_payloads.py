"""The reference reward server answers bad requests with 4xx and a message, never unpickles, and keeps serving."""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
import pytest

from cosmos_primitives.rewards.remote_protocol import encode_enqueue_body
from cosmos_primitives.rewards.server import RewardServer

TOKEN = "payload-token"
MAX_BODY = 64 * 1024


def post(url: str, body: bytes | dict[str, str], token: str | None = TOKEN,
         content_type: str = "application/octet-stream") -> tuple[int, Any]:
    """POST over real HTTP; returns (status, decoded JSON reply)."""
    if isinstance(body, dict):
        body = urllib.parse.urlencode(body).encode()
        content_type = "application/x-www-form-urlencoded"
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def meta(**overrides: Any) -> bytes:
    fields = {"prompts": ["a", "b"], "reward_fn": {"brightness": 1.0}, "media_type": "video",
              "video_infos": [{"video_fps": 16.0}]}
    fields.update(overrides)
    return json.dumps(fields).encode()


VIDEO = np.full((2, 3, 2, 4, 4), 100, dtype=np.uint8)


class TouchOnUnpickle:
    """Unpickling this object creates a file: proof that something unpickled it."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


@pytest.fixture(scope="module")
def server():
    with RewardServer(token=TOKEN, max_body_bytes=MAX_BODY) as srv:
        yield srv


def bad_bodies(marker: pathlib.Path) -> dict[str, tuple[bytes, int, str]]:
    """name -> (body, expected status, text expected in the error message)."""
    buf = io.BytesIO()
    np.savez(buf, x=VIDEO)
    object_array = np.array([TouchOnUnpickle(marker), 1], dtype=object)
    return {
        "no newline": (meta(), 400, "no newline"),
        "bad json": (b"{not json\n" + npy(VIDEO), 400, "could not be parsed"),
        "json not an object": (b"[1, 2]\n" + npy(VIDEO), 400, "must be an object"),
        "pickled array": (meta() + b"\n" + pickle.dumps(VIDEO), 400, "not an .npy array"),
        "pickle payload": (meta() + b"\n" + pickle.dumps(TouchOnUnpickle(marker)), 400, "not an .npy array"),
        "object dtype": (meta() + b"\n" + npy(object_array, allow_pickle=True), 422, "dtype object"),
        "npz archive": (meta() + b"\n" + buf.getvalue(), 400, "not an .npy array"),
        "truncated array": (meta() + b"\n" + npy(VIDEO)[:-10], 400, "bytes follow its header"),
        "string dtype": (meta() + b"\n" + npy(np.array(["a", "b"])), 422, "not allowed"),
        "video with 4 dims": (meta() + b"\n" + npy(VIDEO[:, :, 0]), 422, "[B, C, T, H, W]"),
        "float video": (meta() + b"\n" + npy(VIDEO.astype(np.float32)), 422, "uint8"),
        "two channels": (meta() + b"\n" + npy(VIDEO[:, :2]), 422, "channels"),
        "image as video layout": (meta(media_type="image") + b"\n" + npy(VIDEO), 422, "[B, H, W, C]"),
        "unknown media_type": (meta(media_type="audio") + b"\n" + npy(VIDEO), 422, "unknown media_type"),
        "unknown reward": (meta(reward_fn={"hpsv9": 1.0}) + b"\n" + npy(VIDEO), 422, "this server hosts"),
        "no reward": (meta(reward_fn={}) + b"\n" + npy(VIDEO), 422, "reward_fn"),
        "weight not a number": (meta(reward_fn={"brightness": "x"}) + b"\n" + npy(VIDEO), 422, "must be a number"),
        "prompt count": (meta(prompts=["a"]) + b"\n" + npy(VIDEO), 422, "1 prompts for a batch of 2"),
        "prompts not strings": (meta(prompts=[1, 2]) + b"\n" + npy(VIDEO), 422, "list of strings"),
        "bad fps": (meta(video_infos=[{"video_fps": -3}]) + b"\n" + npy(VIDEO), 422, "video_fps"),
        "too many video_infos": (meta(video_infos=[{}] * 3) + b"\n" + npy(VIDEO), 422, "video_infos"),
        "NaN latent": (meta(media_type="latent") + b"\n" + npy(np.full((2, 4, 1, 2, 2), np.nan, np.float32)), 422,
                       "NaN"),
        "too large": (meta() + b"\n" + npy(np.zeros((2, 3, 8, 64, 64), np.uint8)), 413, "max_body_bytes"),
    }


def test_malformed_enqueues_get_4xx_and_the_server_keeps_serving(server, tmp_path):
    marker = tmp_path / "unpickled"
    cases = bad_bodies(marker)
    for name, (body, status, message) in cases.items():
        got, reply = post(server.enqueue_url, body)
        assert got == status, f"{name}: expected HTTP {status}, got {got}: {reply}"
        assert message in reply["error"], f"{name}: {reply['error']!r} does not mention {message!r}"
        assert not marker.exists(), f"{name}: the server unpickled the payload"
    assert server.stats["rejected_bad"] == len(cases)
    assert server.stats["enqueued"] == 0

    status, reply = post(server.enqueue_url, encode_enqueue_body(json.loads(meta()), VIDEO))
    assert status == 200, reply
    job = reply["uuid"]
    for _ in range(2000):
        status, reply = post(server.fetch_url, {"uuid": job, "type": "brightness"})
        if status != 400:
            break
    assert status == 200, reply
    assert reply["scores"]["brightness"] == pytest.approx([100 / 255] * 2)


def test_malformed_fetches_get_4xx_other_than_400(server):
    status, reply = post(server.enqueue_url, encode_enqueue_body(json.loads(meta()), VIDEO))
    assert status == 200
    job = reply["uuid"]
    assert post(server.fetch_url, {"uuid": job})[0] == 422
    assert post(server.fetch_url, b"[1]", content_type="application/json")[0] == 422
    status, reply = post(server.fetch_url, {"uuid": "no-such-job", "type": "brightness"})
    assert status == 404 and "unknown uuid" in reply["error"]
    status, reply = post(server.fetch_url, {"uuid": job, "type": "contrast"})
    assert status == 404 and "did not request reward 'contrast'" in reply["error"]
    # the existing service's docs show a JSON fetch body: accepted as well
    body = json.dumps({"uuid": job, "type": "brightness"}).encode()
    for _ in range(2000):
        status, reply = post(server.fetch_url, body, content_type="application/json")
        if status != 400:
            break
    assert status == 200 and reply["type"] == "brightness"


def test_every_route_needs_the_token(server):
    body = encode_enqueue_body(json.loads(meta()), VIDEO)
    for url in (server.enqueue_url, server.fetch_url, server.url + "/api/reward/ping"):
        status, reply = post(url, body, token=None)
        assert status == 401 and "missing" in reply["error"]
        status, reply = post(url, body, token="wrong")
        assert status == 401 and "wrong token" in reply["error"]
    status, reply = post(server.url + "/api/reward/ping", b"")
    assert status == 200 and "brightness" in reply["rewards"]
