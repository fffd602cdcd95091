"""Hostile files in a WFM clip folder: each bad clip, caption or embedding is a bad sample naming
its file, skipped and counted under SFT's budget ([train.train_policy.dataset] bad_sample_budget);
examples/wfm_rl.py trains through a zero-byte clip and reports it."""

from __future__ import annotations

import numpy as np
import pytest

# through the package: importing the submodule first would shadow the function with the module
from cosmos_primitives.data import prompt_stream
from cosmos_primitives.data.bad_samples import BadSampleBudgetExceeded, BadSampleError, BadSampleTracker
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.wfm_clips import ClipFolderDataset, HashingTextEmbedder, load_text_embedding
from cosmos_primitives.logging import metric_series, read_metrics
from cosmos_primitives.testing import write_mp4
from test_wfm_recipes import CONFIGS, run_recipe

HOSTILE = ("empty", "latin1", "object", "truncated", "garbage", "nan")


def _clip(root, name: str, caption: bytes = b"a robot moves") -> None:
    write_mp4(root / "videos" / f"{name}.mp4", num_frames=4, fps=8.0, size=(16, 16))
    (root / "metas" / f"{name}.txt").write_bytes(caption)


@pytest.fixture
def hostile_folder(tmp_path):
    """``good`` plus one clip per hostile file (named after it); embeddings where a clip has one."""
    root = tmp_path / "clips"
    for folder in ("videos", "metas", "text_embedding"):
        (root / folder).mkdir(parents=True)
    for name in ("good", *HOSTILE):
        _clip(root, name)
    emb = root / "text_embedding"
    (root / "videos" / "empty.mp4").write_bytes(b"")
    (root / "metas" / "latin1.txt").write_bytes("un café à emporter".encode("latin-1"))
    np.save(emb / "good.npy", np.ones((3, 8), dtype=np.float32))
    np.save(emb / "object.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(emb / "truncated.npy", np.ones((64, 8), dtype=np.float32))
    (emb / "truncated.npy").write_bytes((emb / "truncated.npy").read_bytes()[:300])
    (emb / "garbage.safetensors").write_bytes(np.random.default_rng(0).bytes(512))
    np.save(emb / "nan.npy", np.full((2, 8), np.nan, dtype=np.float32))
    return root


def _offending_file(root, name: str) -> str:
    emb = root / "text_embedding"
    return str({"empty": root / "videos" / "empty.mp4", "latin1": root / "metas" / "latin1.txt",
                "object": emb / "object.npy", "truncated": emb / "truncated.npy",
                "garbage": emb / "garbage.safetensors", "nan": emb / "nan.npy"}[name])


def test_each_bad_file_is_a_bad_sample_naming_it(hostile_folder):
    ds = ClipFolderDataset(hostile_folder, num_frames=2, height=8, width=8, max_tokens=4, allow_pickle=True,
                           embedder=HashingTextEmbedder(8))
    names = [v.stem for v in ds.videos]
    assert ds[names.index("good")]["text_mask"].sum() == 3
    reasons = {}
    for name in HOSTILE:
        with pytest.raises(BadSampleError) as bad:
            ds[names.index(name)]
        assert bad.value.path == _offending_file(hostile_folder, name)
        reasons[name] = bad.value.reason
    assert "cannot decode video" in reasons["empty"]
    assert "UnicodeDecodeError" in reasons["latin1"]
    assert "allow_pickle=False" in reasons["object"]  # never unpickled, even with [wfm.data] allow_pickle
    assert "NaN or inf" in reasons["nan"]


def test_npy_embeddings_are_never_unpickled(hostile_folder):
    with pytest.raises(BadSampleError, match="Object arrays cannot be loaded"):
        load_text_embedding(hostile_folder / "text_embedding" / "object.npy", allow_pickle=True)


def test_stream_skips_and_counts_bad_clips_within_the_budget(hostile_folder):
    ds = ClipFolderDataset(hostile_folder, num_frames=2, height=8, width=8, max_tokens=4,
                           embedder=HashingTextEmbedder(8))
    bad = BadSampleTracker(budget=len(HOSTILE) - 1)
    stream = prompt_stream(ds, ResumableDistributedSampler(len(ds), shuffle=False), bad)
    assert next(stream)["name"] == "good"  # sorted: empty, garbage, good, latin1, nan, object, truncated
    assert {path for path, _, _ in bad.worst()} == {_offending_file(hostile_folder, n) for n in ("empty", "garbage")}
    with pytest.raises(BadSampleBudgetExceeded, match=r"truncated\.npy") as exceeded:
        next(stream)  # latin1, nan, object: 5 bad; truncated: the 6th, over the budget of 5
    assert all(_offending_file(hostile_folder, n) in str(exceeded.value) for n in HOSTILE)


def _run_over_one_empty_clip_of_four(tmp_path, *overrides):
    root = tmp_path / "clips"
    for folder in ("videos", "metas"):
        (root / folder).mkdir(parents=True)
    for name in ("a", "b", "c", "d"):
        _clip(root, name, f"clip {name} moves".encode())
    (root / "videos" / "b.mp4").write_bytes(b"")  # zero bytes
    return root / "videos" / "b.mp4", [
        "--config", str(CONFIGS / "wfm_flowgrpo_tiny.toml"), f"train.output_dir={tmp_path / 'out'}",
        "logging.logger=[]", "train.max_steps=3", "train.ckpt.enable_checkpoint=false",
        "wfm.data.kind=clip_folder", f"wfm.data.path={root}", "wfm.data.num_frames=2", "wfm.data.height=8",
        "wfm.data.width=8", "wfm.num_samples_per_prompt=2", "wfm.num_inference_steps=2",
        "wfm.eval_num_inference_steps=2", "wfm.sampler.sde_window_size=0", *overrides]


def test_wfm_rl_trains_through_a_zero_byte_clip_and_reports_it(tmp_path, capfd):
    empty, args = _run_over_one_empty_clip_of_four(tmp_path)
    run_dir = run_recipe(args)
    logged = capfd.readouterr().err.splitlines()
    records = read_metrics(run_dir)
    steps, bad_counts = metric_series(records, "bad_samples")
    assert steps == [1, 2, 3]
    # 3 steps x 2 prompts = 6 draws over 4 clips: the empty one once per epoch, plus the evaluation's pick
    assert bad_counts[-1] >= 2
    skipped = [line for line in logged if "skipping bad sample" in line]
    assert skipped and all(f"{empty}: cannot decode video" in m for m in skipped)

    _, args = _run_over_one_empty_clip_of_four(tmp_path / "strict", "train.train_policy.dataset.bad_sample_budget=0")
    with pytest.raises(BadSampleBudgetExceeded, match=r"b\.mp4") as exceeded:
        run_recipe(args)
    assert "train.train_policy.dataset.bad_sample_budget" in str(exceeded.value)


def test_the_recipes_prompt_position_resumes_with_its_bad_sample_count(hostile_folder):
    """What wfm_rl.py checkpoints for a clip folder (cp.data.WFMPromptSource): the shuffled order's
    position and the bad samples met so far; a source restored from it yields what the saved one would,
    with the same count."""
    from cosmos_primitives.config import WFMDataConfig
    from cosmos_primitives.data import WFMPromptSource

    data = WFMDataConfig(kind="clip_folder", path=str(hostile_folder), num_frames=2, height=8, width=8,
                         max_tokens=4, text_dim=8)
    source_cls = WFMPromptSource

    def source():
        return source_cls(data, seed=1, rank=0, world_size=1, per_step=1, bad_sample_budget=-1)

    first = source()
    stream = first.stream()
    next(stream)  # the one good clip, after whatever bad ones the shuffled order puts first
    state = first.state_dict()
    assert first.bad.count >= 1 and state["bad_samples"]["count"] == first.bad.count
    expected = [next(stream)["name"] for _ in range(2)]  # the next epoch's good clip, twice
    resumed = source()
    resumed.load_state_dict(state)
    assert resumed.bad.count == state["bad_samples"]["count"] and resumed.epoch == state["sampler"]["epoch"]
    stream = resumed.stream()
    assert [next(stream)["name"] for _ in range(2)] == expected
    assert resumed.bad.count == first.bad.count  # the same bad samples met again, counted on top
