"""The reference reward server under hostile input, over real HTTP: every client mistake is a 4xx with a
reason (never a 500), memory stays within its bound, stalled bodies time out (408), a hang-up is one line.

``SERVER_CASES`` counts the hostile inputs tried here (for the reliability table of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import socket
import sys
import time
import tracemalloc
import urllib.parse

import numpy as np
import pytest

from cosmos_primitives.rewards.remote_protocol import encode_enqueue_body
from cosmos_primitives.rewards.server import RewardServer
from cosmos_primitives.rewards.server.process import RewardServerProcess

TOKEN = "hostile-token"
VIDEO = np.full((2, 3, 2, 4, 4), 100, dtype=np.uint8)
GOOD_META = {"prompts": ["a", "b"], "reward_fn": {"brightness": 1.0}, "media_type": "video",
             "video_infos": [{"video_fps": 16.0}]}


def npy_with_header(shape: str, dtype: str = "|u1", data: bytes = b"") -> bytes:
    """An .npy v1.0 file whose header declares ``shape`` (a literal written as is) followed by ``data``."""
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}".encode("latin1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def body(meta_text: str | bytes, array: bytes | None = None) -> bytes:
    text = meta_text.encode() if isinstance(meta_text, str) else meta_text
    return text + b"\n" + (npy(VIDEO) if array is None else array)


def with_meta(**fields) -> str:
    return json.dumps({**GOOD_META, **fields})


DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_SMALL = b"[" * 30_000 + b"]" * 30_000  # under the 64 KiB fetch limit

# name -> (route, body, headers, expected status, text expected in the error)
SERVER_CASES: dict[str, tuple[str, bytes, dict[str, bytes | str], int, str]] = {
    "npy dims overflowing int64": ("enqueue", body(with_meta(), npy_with_header("(4294967296, 4294967296, 1, 1, 1)")),
                                   {}, 413, "max_body_bytes"),
    "npy dims product over the limit": ("enqueue", body(with_meta(), npy_with_header("(65536, 65536, 3, 1, 1)")),
                                        {}, 413, "max_body_bytes"),
    "npy negative dims": ("enqueue", body(with_meta(), npy_with_header("(-2, -3, 1, 1, 1)", data=b"\0" * 6)),
                          {}, 400, "negative dimension"),
    "npy non-integer dims": ("enqueue", body(with_meta(), npy_with_header("(2.5, 3, 1, 1, 1)")), {}, 400,
                             "not an .npy array"),
    "npy header not a dict": ("enqueue", body(with_meta(), npy_with_header("(1,)")[:10] + b"[1, 2]" + b" " * 53
                                              + b"\n"), {}, 400, "not an .npy array"),
    "npy unknown version": ("enqueue", body(with_meta(), b"\x93NUMPY\x09\x00" + b"\0" * 64), {}, 400, "version"),
    "100k-deep JSON enqueue": ("enqueue", body(DEEP), {}, 400, "nested too deeply"),
    "30k-deep JSON fetch": ("fetch", DEEP_SMALL, {"Content-Type": "application/json"}, 400, "nested too deeply"),
    "65-deep JSON enqueue": ("enqueue", body(with_meta(extra=json.loads("[" * 65 + "]" * 65))), {}, 400,
                             "nested more than 64"),
    "non-ASCII bearer token": ("enqueue", body(with_meta()), {"Authorization": b"Bearer \xe9\xff\xc3(token"}, 401,
                               "wrong token"),
    "non-ASCII auth scheme": ("enqueue", body(with_meta()), {"Authorization": b"\xff\xfe x"}, 401, "wrong token"),
    "NaN fps": ("enqueue", body(with_meta().replace("16.0", "NaN")), {}, 400, "NaN is not a JSON number"),
    "Infinity fps": ("enqueue", body(with_meta().replace("16.0", "Infinity")), {}, 400, "Infinity"),
    "overflowing fps 1e999": ("enqueue", body(with_meta().replace("16.0", "1e999")), {}, 422, "video_fps"),
    "zero fps": ("enqueue", body(with_meta(video_infos=[{"video_fps": 0}])), {}, 422, "video_fps"),
    "NaN weight": ("enqueue", body(with_meta().replace('"brightness": 1.0', '"brightness": NaN')), {}, 400, "NaN"),
    "-Infinity weight": ("enqueue", body(with_meta().replace('"brightness": 1.0', '"brightness": -Infinity')), {},
                         400, "Infinity"),
    "overflowing weight 1e999": ("enqueue", body(with_meta().replace('"brightness": 1.0', '"brightness": 1e999')),
                                 {}, 422, "finite"),
    "JSON not UTF-8": ("enqueue", body(b'{"prompts": ["\xff\xfe"]}'), {}, 400, "could not be parsed"),
    "fetch not UTF-8": ("fetch", b"uuid=\xff\xfe&type=x", {"Content-Type": "application/x-www-form-urlencoded"}, 400,
                        "could not be read"),
    "fetch JSON with NaN": ("fetch", b'{"uuid": NaN, "type": "brightness"}', {"Content-Type": "application/json"},
                            400, "NaN"),
    "fetch body over 64 KiB": ("fetch", urllib.parse.urlencode({"uuid": "u" * 70_000, "type": "x"}).encode(),
                               {"Content-Type": "application/x-www-form-urlencoded"}, 413, "fetch body limit"),
    "fetch broken multipart": ("fetch", b"--zz\r\nno headers", {"Content-Type": "multipart/form-data; boundary=zz"},
                               422, "uuid"),
    "chunked body broken": ("enqueue", b"zz\r\nnot hex chunk sizes\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"},
                            400, ""),
}


def raw_request(port: int, path: str, payload: bytes, headers: dict[str, bytes | str]) -> tuple[int, dict]:
    """POST with http.client, which sends header bytes as given (non-ASCII included)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("POST", path)
    sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream", **headers}
    for key, value in sent.items():
        conn.putheader(key, value)
    if "Transfer-Encoding" not in sent:
        conn.putheader("Content-Length", str(len(payload)))
    conn.endheaders(payload)
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    try:
        return reply.status, json.loads(data)
    except json.JSONDecodeError:
        return reply.status, {"error": data.decode("utf-8", "replace")}


@pytest.fixture(scope="module")
def server():
    with RewardServer(token=TOKEN, max_body_bytes=256 * 1024) as srv:
        yield srv


def test_client_mistakes_are_4xx_with_a_reason_never_500(server, caplog):
    caplog.set_level(logging.INFO)
    paths = {"enqueue": "/api/reward/enqueue", "fetch": "/api/reward/pull"}
    wrong = {}
    for name, (route, payload, headers, status, reason) in SERVER_CASES.items():
        try:
            got, reply = raw_request(server.port, paths[route], payload, headers)
        except OSError as exc:
            got, reply = -1, {"error": f"no answer: {exc!r}"}
        if got != status or reason not in reply.get("error", ""):
            wrong[name] = (got, reply)
    assert not wrong, f"{len(wrong)} of {len(SERVER_CASES)} hostile requests mis-answered: {wrong}"
    assert not [r for r in caplog.records if r.exc_info], "a client's mistake logged a traceback"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert server.stats["enqueued"] == 0 and server.stats["memory_bytes"] == 0

    # and it still serves
    got, reply = raw_request(server.port, paths["enqueue"], encode_enqueue_body(GOOD_META, VIDEO), {})
    assert got == 200, reply


def _open_stalled(port: int, path: str, declared: int, sent: bytes) -> socket.socket:
    """A POST declaring ``declared`` body bytes of which only ``sent`` are sent (fetches as a form)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    kind = "application/x-www-form-urlencoded" if path.endswith("/pull") else "application/octet-stream"
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"Content-Type: {kind}\r\nContent-Length: {declared}\r\n\r\n").encode() + sent)
    return sock


def _status_line(sock: socket.socket, timeout_s: float) -> str:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(4096).split(b"\r\n", 1)[0].decode()
    except TimeoutError:
        return "<no answer>"


def test_a_chunked_body_broken_after_its_headers_arrived_is_400_at_once(caplog):
    """Headers first, the broken chunk sizes in a later read: aiohttp's C parser dropped that error and
    the handler waited ``body_timeout_s`` (then 408); the server's connections parse in Python, which
    hands it to the body being read. Each of 5 tries answers 400 within 5 s, with no traceback logged."""
    caplog.set_level(logging.INFO)
    with RewardServer(token=TOKEN, body_timeout_s=30.0) as srv:
        lines = []
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                sock.sendall(f"POST /api/reward/enqueue HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                             "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
                time.sleep(0.2)  # the server has parsed the headers and its handler is reading the body
                sock.sendall(b"zz\r\nnot hex chunk sizes\r\n0\r\n\r\n")
                lines.append(_status_line(sock, 5.0))
        assert lines == ["HTTP/1.1 400 Bad Request"] * 5, lines
        assert srv.stats["timed_out"] == 0 and srv.stats["memory_bytes"] == 0
    assert not [r for r in caplog.records if r.exc_info], "a client's mistake logged a traceback"


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _open_chunked(port: int, path: str = "/api/reward/enqueue") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    kind = "application/x-www-form-urlencoded" if path.endswith("/pull") else "application/octet-stream"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Content-Type: {kind}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    return sock


def _reply(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one response on ``sock``."""
    sock.settimeout(10.0)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        got = sock.recv(65536)
        assert got, f"the server closed the connection after {data!r}"
        data += got
    head, payload = data.split(b"\r\n\r\n", 1)
    return int(head.split(b" ", 2)[1]), json.loads(payload)


def _hang_up(sock: socket.socket) -> None:
    """Close our side and wait for the server's, so that no connection handler outlives the server."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(10.0)
    while sock.recv(65536):
        pass
    sock.close()


def _content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 62


def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.01)


def test_a_chunked_body_is_charged_to_the_size_limit_and_the_memory_budget_as_it_streams():
    """No Content-Length: the body takes budget bytes as they arrive, exactly those, so a client
    that has sent part of one holds that part and no more; past the size limit it is 413."""
    limit, budget = 64 * 1024, 90 * 1024
    big = encode_enqueue_body(GOOD_META, np.full((2, 3, 2, 64, 64), 7, dtype=np.uint8))
    over = encode_enqueue_body(GOOD_META, np.full((2, 3, 3, 64, 64), 7, dtype=np.uint8))
    assert 49_152 < len(big) < 50_000 and budget > len(over) > limit
    with RewardServer(token=TOKEN, max_body_bytes=limit, max_memory_bytes=budget, body_timeout_s=10.0) as srv:
        slow = _open_chunked(srv.port)
        slow.sendall(b"".join(_chunked(big[k:k + 12_000]) for k in range(0, 48_000, 12_000)))
        _until(lambda: srv.stats["memory_bytes"] == 48_000)

        # a small batch fits beside it; a second large one would pass the budget while it streams
        assert raw_request(srv.port, "/api/reward/enqueue", encode_enqueue_body(GOOD_META, VIDEO), {})[0] == 200
        second = _open_chunked(srv.port)
        second.sendall(_chunked(big) + b"0\r\n\r\n")
        status, reply = _reply(second)
        _hang_up(second)
        assert status == 503 and "memory budget full" in reply["error"], reply
        # finished batches' replies hold their bytes too (results_bytes), until fetched-and-expired or evicted
        _until(lambda: srv.stats["pending"] == 0 and srv.stats["memory_bytes"] - srv.stats["results_bytes"] == 48_000)

        slow.sendall(_chunked(big[48_000:]) + b"0\r\n\r\n")
        status, reply = _reply(slow)
        _hang_up(slow)
        assert status == 200, reply
        _until(lambda: srv.stats["pending"] == 0 and srv.stats["memory_bytes"] == srv.stats["results_bytes"])

        too_big = _open_chunked(srv.port)
        too_big.sendall(b"".join(_chunked(over[k:k + 16_384]) for k in range(0, len(over), 16_384)) + b"0\r\n\r\n")
        status, reply = _reply(too_big)
        _hang_up(too_big)
        assert status == 413 and f"max_body_bytes={limit}" in reply["error"], reply
        # a fetch body has its own, smaller limit (64 KiB) and no parser of its own to catch a longer one
        long_form = _open_chunked(srv.port, "/api/reward/pull")
        form = b"type=brightness&uuid=" + b"a" * 70_000
        long_form.sendall(b"".join(_chunked(form[k:k + 8192]) for k in range(0, len(form), 8192)) + b"0\r\n\r\n")
        status, reply = _reply(long_form)
        _hang_up(long_form)
        assert status == 413 and "the fetch body limit" in reply["error"], reply
        assert srv.stats["memory_peak_bytes"] <= budget
        _until(lambda: srv.stats["memory_bytes"] == srv.stats["results_bytes"])
        assert (srv.stats["enqueued"], srv.stats["rejected_full"]) == (2, 1)


def test_stalled_bodies_get_408_and_free_their_slots():
    with RewardServer(token=TOKEN, max_pending=2, body_timeout_s=0.5) as srv:
        path = "/api/reward/enqueue"
        stalled = [_open_stalled(srv.port, path, 100_000, b"x" * 1000) for _ in range(2)]
        started = time.monotonic()
        lines = [_status_line(sock, 10.0) for sock in stalled]
        assert lines == ["HTTP/1.1 408 Request Timeout"] * 2, lines
        assert time.monotonic() - started < 5.0
        for sock in stalled:
            sock.close()
        assert srv.stats["timed_out"] == 2 and srv.stats["memory_bytes"] == 0 and srv.stats["pending"] == 0
        got, reply = raw_request(srv.port, path, encode_enqueue_body(GOOD_META, VIDEO), {})
        assert got == 200, reply


def test_a_client_hanging_up_mid_body_is_one_log_line(caplog):
    caplog.set_level(logging.INFO, logger="cosmos_primitives.rewards")

    def server_records():
        return [r for r in caplog.records if "/api/reward/" in r.getMessage() or r.exc_info]

    with RewardServer(token=TOKEN) as srv:
        for path in ("/api/reward/enqueue", "/api/reward/pull"):
            sock = _open_stalled(srv.port, path, 50_000, b"x" * 100)
            time.sleep(0.1)
            sock.close()
        deadline = time.monotonic() + 10
        while len(server_records()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # anything more it would log
        records = server_records()
        assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], [r.getMessage() for r in records]
        hung_up = [r.getMessage() for r in records if "hung up" in r.getMessage()]
        assert len(hung_up) == 2 and all("\n" not in m for m in hung_up), hung_up
        assert srv.stats["disconnected"] == 2 and srv.stats["memory_bytes"] == 0


def test_finished_batches_keep_only_their_replies():
    """Batches with 4 MiB of prompts and video_infos each: once scored, the server holds none of it
    (measured with tracemalloc: every Python and numpy allocation of this process)."""
    big = "p" * (2 << 20)
    meta = {**GOOD_META, "prompts": [big, big], "video_infos": [{"video_fps": 16.0, "note": big}] * 2}
    payload = encode_enqueue_body(meta, VIDEO)
    with RewardServer(token=TOKEN) as srv:
        raw_request(srv.port, "/api/reward/enqueue", encode_enqueue_body(GOOD_META, VIDEO), {})  # warm-up
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            uuids = [raw_request(srv.port, "/api/reward/enqueue", payload, {})[1]["uuid"] for _ in range(6)]
            for uuid in uuids:
                form = urllib.parse.urlencode({"uuid": uuid, "type": "brightness"}).encode()
                for _ in range(500):
                    status, reply = raw_request(srv.port, "/api/reward/pull", form,
                                                {"Content-Type": "application/x-www-form-urlencoded"})
                    if status != 400:
                        break
                    time.sleep(0.01)
                assert status == 200, reply
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # 6 batches sent 36 MiB of prompts and video_infos; what stays is their replies (a few KiB)
        assert held < 4 << 20, f"the server still holds {held / 2**20:.1f} MiB after every batch finished"
        assert reply["input_info"]["video_infos"][0] == {"video_fps": 16.0}  # the reply keeps the fps only
        assert srv.stats["pending"] == 0 and srv.stats["memory_bytes"] == srv.stats["results_bytes"] < 64 << 10


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _push(sock: socket.socket, data: bytes) -> int:
    """Send what the kernel takes now without blocking; returns the bytes sent."""
    sock.setblocking(False)
    try:
        return sock.send(data)
    except (BlockingIOError, ConnectionError):
        return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's RSS from /proc")
def test_held_uploads_stay_within_the_memory_bound():
    """40 uploads of 4 MiB bodies (20 enqueues, 20 fetches) hold their connections open: the server's
    RSS grows by at most its memory bound (2 batches x 4 MiB) plus slack, never by the 160 MiB sent."""
    body_mb = 4
    args = ["--max-pending", "2", "--max-body-mb", str(body_mb)]
    # under glibc's default allocator, as a deployed server runs: the settings `make test` runs under
    # keep freed memory in the heap, which the RSS would count
    with RewardServerProcess(TOKEN, args=args, env={"GLIBC_TUNABLES": ""}) as proc:
        raw_request(proc.port, "/api/reward/enqueue", encode_enqueue_body(GOOD_META, VIDEO), {})  # warm-up
        baseline = _rss_bytes(proc.pid)
        declared = body_mb << 20
        chunk = b"x" * (declared - 1)
        socks = [_open_stalled(proc.port, path, declared, b"")
                 for path in ["/api/reward/enqueue", "/api/reward/pull"] * 20]
        sent = [0] * len(socks)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:  # keep feeding whatever the server reads, one byte short of the end
            for i, sock in enumerate(socks):
                if sent[i] < len(chunk):
                    sent[i] += _push(sock, chunk[sent[i]: sent[i] + (1 << 20)])
            time.sleep(0.05)
        grown = _rss_bytes(proc.pid) - baseline
        for sock in socks:
            sock.close()
    bound = 2 * declared
    assert grown < bound + (16 << 20), (
        f"server RSS grew {grown / 2**20:.0f} MiB holding 40 uploads (bound {bound / 2**20:.0f} MiB; "
        f"{sum(sent) / 2**20:.0f} MiB were sent)"
    )


def test_a_memory_budget_smaller_than_one_body_is_refused_at_construction():
    with pytest.raises(ValueError, match="max_memory_bytes=1000 is below max_body_bytes=2000"):
        RewardServer(token=TOKEN, max_body_bytes=2000, max_memory_bytes=1000)


def test_fetch_as_a_multipart_form_is_still_served(server):
    """The fetch boundary parses form fields itself: multipart (what some HTTP clients send) still works."""
    status, reply = raw_request(server.port, "/api/reward/enqueue", encode_enqueue_body(GOOD_META, VIDEO), {})
    assert status == 200, reply
    form = (f'--b0undary\r\nContent-Disposition: form-data; name="uuid"\r\n\r\n{reply["uuid"]}\r\n'
            '--b0undary\r\nContent-Disposition: form-data; name="type"\r\n\r\nbrightness\r\n--b0undary--\r\n').encode()
    for _ in range(500):
        status, reply = raw_request(server.port, "/api/reward/pull", form,
                                    {"Content-Type": "multipart/form-data; boundary=b0undary"})
        if status != 400:
            break
        time.sleep(0.01)
    assert status == 200 and reply["scores"]["brightness"] == pytest.approx([100 / 255] * 2), reply


def _pull(port: int, uuid: str) -> tuple[int, dict]:
    form = urllib.parse.urlencode({"uuid": uuid, "type": "brightness"}).encode()
    for _ in range(500):
        status, reply = raw_request(port, "/api/reward/pull", form,
                                    {"Content-Type": "application/x-www-form-urlencoded"})
        if status != 400:
            return status, reply
        time.sleep(0.01)
    return status, reply


def test_unfetched_results_are_charged_to_the_memory_budget_and_evicted_oldest_first():
    """Batches nobody fetches: their replies hold bytes of the budget (counted exactly: encoded reply
    plus a fixed overhead), never more than the budget; a new batch evicts the oldest results, and a
    fetch of those says why they are gone."""
    from cosmos_primitives.rewards.server.jobs import RESULT_OVERHEAD_BYTES

    note = "n" * 20_000  # a long prompt per item: each reply's input_info stays small, so make many
    meta = {**GOOD_META, "prompts": [note, note]}
    payload = encode_enqueue_body(meta, VIDEO)
    budget = 64 * 1024
    with RewardServer(token=TOKEN, max_body_bytes=budget, max_memory_bytes=budget, max_pending=2) as srv:
        uuids = []
        for _ in range(120):
            status, reply = raw_request(srv.port, "/api/reward/enqueue", payload, {})
            assert status == 200, reply
            uuids.append(reply["uuid"])
            _until(lambda: srv.stats["pending"] == 0)
            assert srv.stats["memory_bytes"] <= budget
        stats = srv.stats
        assert stats["results_bytes"] == stats["memory_bytes"] > 0  # nothing else is held now
        assert stats["results_evicted"] > 0 and stats["memory_peak_bytes"] <= budget
        answers = [_pull(srv.port, uuid) for uuid in uuids]
        held = [reply for status, reply in answers if status == 200]
        gone = [reply for status, reply in answers if status != 200]
        assert answers[-1][0] == 200 and answers[0][0] == 404, answers[0]
        # every batch is either held, with exactly its bytes counted, or evicted (the oldest ones)
        assert len(gone) == stats["results_evicted"]
        assert [s for s, _ in answers] == [404] * len(gone) + [200] * len(held)
        assert stats["results_bytes"] == sum(RESULT_OVERHEAD_BYTES + len(json.dumps(r).encode()) for r in held)
        assert all("evicted" in r["error"] and "max_memory_bytes" in r["error"] for r in gone), gone[0]
