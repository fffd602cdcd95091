"""World-model clips from tar shards on S3 (moto's server mode: a real HTTP server on loopback) and
on disk: streamed, resumed mid-shard exactly, bad samples skipped within the budget."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_primitives.data.bad_samples import BadSampleBudgetExceeded
from cosmos_primitives.data.wfm_clips import HashingTextEmbedder
from cosmos_primitives.data.wfm_webdataset import WebDatasetClips, list_shards
from cosmos_primitives.testing import write_corrupt_mp4, write_mp4

SIZE = dict(num_frames=2, height=16, width=16, max_tokens=4)


def write_shard(path: Path, keys: list[str], tmp: Path, corrupt: set[str] = frozenset()) -> Path:
    """A tar of ``<key>.mp4`` (a brightness per key), ``.txt``, ``.json`` and a ``.safetensors`` embedding."""
    from safetensors.torch import save

    with tarfile.open(path, "w") as tar:
        for key in keys:
            clip = tmp / f"{key}.mp4"
            if key in corrupt:
                write_corrupt_mp4(clip)
            else:
                level = 10 * (int(key[-2:]) + 1)
                write_mp4(clip, frames=np.full((3, 16, 16, 3), level, dtype=np.uint8), fps=4.0)
            files = {"mp4": clip.read_bytes(), "txt": f"clip {key}".encode(),
                     "json": json.dumps({"id": key}).encode(),
                     "safetensors": save({"text_embedding": torch.full((2, 8), float(int(key[-2:])))})}
            for ext, data in files.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def s3_endpoint() -> str:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_shards(s3_endpoint, tmp_path, monkeypatch):
    """Three shards of three clips under s3://clips/train/ (clip04 undecodable), with the seed's variable names."""
    import boto3

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("PROD_S3_CHECKPOINT_ENDPOINT_URL", s3_endpoint)  # the AWS_* names take precedence
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="clips")
    for s in range(3):
        keys = [f"clip{3 * s + i:02d}" for i in range(3)]
        shard = write_shard(tmp_path / f"shard{s}.tar", keys, tmp_path, corrupt={"clip04"})
        client.upload_file(str(shard), "clips", f"train/shard-{s:04d}.tar")
    return "s3://clips/train/"


def names(items) -> list[str]:
    return [it["name"] for it in items]


def test_s3_shards_stream_and_resume_mid_shard_exactly(s3_shards):
    reader = WebDatasetClips([s3_shards], seed=3, bad_sample_budget=5, **SIZE)
    assert len(reader.shards) == 3
    stream = iter(reader)
    uninterrupted = [next(stream) for _ in range(10)]  # 8 good clips per epoch: into the second epoch
    assert len(set(names(uninterrupted[:8]))) == 8 and "clip04" not in names(uninterrupted)
    assert reader.bad.count >= 1 and {p for p, _, _ in reader.bad.worst()} == {"s3://clips/train/shard-0001.tar#clip04"}
    item = uninterrupted[0]
    assert item["video"].shape == (3, 2, 16, 16) and item["text"].shape == (4, 8)
    assert item["meta"] == {"id": item["name"]}
    assert torch.equal(item["text"][:2], torch.full((2, 8), float(int(item["name"][-2:]))))

    first = WebDatasetClips([s3_shards], seed=3, bad_sample_budget=5, **SIZE)
    stream = iter(first)
    head = [next(stream) for _ in range(4)]  # stops inside a shard
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    resumed = WebDatasetClips([s3_shards], seed=3, bad_sample_budget=5, **SIZE)
    resumed.load_state_dict(state)
    stream = iter(resumed)
    tail = [next(stream) for _ in range(6)]
    assert names(head + tail) == names(uninterrupted)
    for a, b in zip(head + tail, uninterrupted):
        assert torch.equal(a["video"], b["video"])  # the same frames (per-sample frame windows)


def test_ranks_read_disjoint_shards_and_the_budget_stops_the_run(s3_shards):
    ranks = [WebDatasetClips([s3_shards], seed=0, rank=r, world_size=2, bad_sample_budget=-1, **SIZE)
             for r in range(2)]
    assert not set(ranks[0].rank_shards(0)) & set(ranks[1].rank_shards(0))
    strict = WebDatasetClips([s3_shards], seed=0, bad_sample_budget=0, **SIZE)
    stream = iter(strict)
    with pytest.raises(BadSampleBudgetExceeded, match="clip04"):
        for _ in range(9):
            next(stream)


def test_local_shards_hash_captions_without_embeddings(tmp_path):
    shard = tmp_path / "shards"
    shard.mkdir()
    with tarfile.open(shard / "a.tar", "w") as tar:
        write_mp4(tmp_path / "x.mp4", frames=np.zeros((2, 16, 16, 3), dtype=np.uint8))
        for name, data in (("k1.mp4", (tmp_path / "x.mp4").read_bytes()), ("k1.json", b'{"caption": "a red car"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert list_shards([str(shard)]) == [str(shard / "a.tar")]
    item = next(iter(WebDatasetClips([str(shard)], embedder=HashingTextEmbedder(8), **SIZE)))
    assert item["caption"] == "a red car" and item["text"].shape == (4, 8) and int(item["text_mask"].sum()) == 3
    with pytest.raises(FileNotFoundError, match=r"names no \.tar shard"):
        list_shards([str(tmp_path / "missing")])


def test_brace_ranges_and_globs_name_local_shards(tmp_path):
    from cosmos_primitives.data.wfm_webdataset import expand_braces

    assert expand_braces("s3://b/s-{08..10}.tar") == ["s3://b/s-08.tar", "s3://b/s-09.tar", "s3://b/s-10.tar"]
    assert expand_braces("{a,b}/x-{1..2}.tar") == ["a/x-1.tar", "a/x-2.tar", "b/x-1.tar", "b/x-2.tar"]
    for name in ("s-0.tar", "s-1.tar", "s-2.tar", "other.tar"):
        (tmp_path / name).write_bytes(b"")
    assert list_shards([str(tmp_path / "s-{0..1}.tar")]) == [str(tmp_path / "s-0.tar"), str(tmp_path / "s-1.tar")]
    assert list_shards([str(tmp_path / "s-*.tar")]) == [str(tmp_path / f"s-{i}.tar") for i in range(3)]
    with pytest.raises(FileNotFoundError, match=r"s-4\.tar names no \.tar shard"):
        list_shards([str(tmp_path / "s-{4..5}.tar")])


def _npy(array: np.ndarray, **kwargs) -> bytes:
    out = io.BytesIO()
    np.save(out, array, **kwargs)
    return out.getvalue()


def _write_members(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _hostile_shards(tmp_path: Path) -> Path:
    """``a.tar``: clip00 and clip07 good, six samples each with one bad part; ``b.tar``: not a tar;
    ``c.tar``: a tar cut off in the middle of its second sample; ``d.tar``: clip08 good."""
    from safetensors.torch import save

    folder = tmp_path / "shards"
    folder.mkdir()
    write_mp4(tmp_path / "x.mp4", frames=np.full((3, 16, 16, 3), 40, dtype=np.uint8), fps=4.0)
    video = (tmp_path / "x.mp4").read_bytes()
    embedding = save({"text_embedding": torch.ones(2, 8)})
    bad_parts = {
        "clip01": {"txt": b"\xff\xfe caption", "safetensors": embedding},  # not UTF-8
        "clip02": {"json": b"{not json", "safetensors": embedding},
        "clip03": {"txt": b"ok", "safetensors": b"garbage bytes, not safetensors"},
        "clip04": {"txt": b"ok", "safetensors": b""},
        "clip05": {"txt": b"ok", "npy": _npy(np.array([{"x": 1}], dtype=object), allow_pickle=True)},  # pickled
        "clip06": {"txt": b"ok", "npy": _npy(np.float32(3.0))},  # 0-d
        "clip09": {"json": b"[1, 2]", "safetensors": embedding},  # JSON, but not an object
    }
    members = []
    for key in ("clip00", *bad_parts, "clip07"):
        parts = bad_parts.get(key, {"txt": f"clip {key}".encode(), "safetensors": embedding})
        members += [(f"{key}.mp4", video)] + [(f"{key}.{ext}", data) for ext, data in parts.items()]
    _write_members(folder / "a.tar", members)
    (folder / "b.tar").write_bytes(b"this is not a tar archive at all\n" * 40)
    whole = _write_members(tmp_path / "c_full.tar", [("clip10.mp4", video), ("clip10.txt", b"ten"),
                                                     ("clip10.safetensors", embedding), ("clip11.mp4", video)])
    (folder / "c.tar").write_bytes(whole.read_bytes()[: 512 * 3 + len(video) + 2000])
    _write_members(folder / "d.tar", [("clip08.mp4", video), ("clip08.txt", b"eight"),
                                      ("clip08.safetensors", embedding)])
    return folder


def test_bad_samples_and_shards_are_skipped_within_the_budget_and_resume_moves_past_them(tmp_path):
    folder = _hostile_shards(tmp_path)
    reader = WebDatasetClips([str(folder)], seed=0, bad_sample_budget=20, **SIZE)
    stream = iter(reader)
    states, seen = [], []
    while len(seen) < 4:  # one epoch: clip00, clip07, clip08, clip10
        seen.append(next(stream)["name"])
        states.append(json.loads(json.dumps(reader.state_dict())))
    assert sorted(seen) == ["clip00", "clip07", "clip08", "clip10"]
    bad = {path.rsplit("/", 1)[-1]: reason for path, _, reason in reader.bad.worst()}
    assert set(bad) == {f"a.tar#clip0{i}" for i in (1, 2, 3, 4, 5, 6)} | {"a.tar#clip09", "b.tar", "c.tar"}, bad
    assert "UTF-8" in bad["a.tar#clip01"] and "JSON" in bad["a.tar#clip02"] and "object" in bad["a.tar#clip09"]
    assert "pickle" in bad["a.tar#clip05"] and "0-d" in bad["a.tar#clip06"]
    assert "not a tar" in bad["b.tar"] and "not a tar" in bad["c.tar"]
    assert reader.bad.count == 9

    # resuming from any point goes on past the bad ones, never back to them
    for i, state in enumerate(states[:-1]):
        resumed = WebDatasetClips([str(folder)], seed=0, bad_sample_budget=20, **SIZE)
        resumed.load_state_dict(state)
        again = iter(resumed)
        assert [next(again)["name"] for _ in range(len(seen) - i - 1)] == seen[i + 1:]
        assert resumed.bad.count == reader.bad.count

    strict = iter(WebDatasetClips([str(folder)], seed=0, bad_sample_budget=0, **SIZE))
    with pytest.raises(BadSampleBudgetExceeded, match="bad-sample budget of 0"):
        for _ in range(4):
            next(strict)
