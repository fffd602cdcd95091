"""World-model clip data: the clip folder adapter on real mp4 files, embeddings (npy, safetensors,
opt-in pickle), frame windows, resizing, padding, and the mock mode."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from cosmos_primitives.config.wfm import WFMDataConfig
from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.data.wfm_clips import (
    ClipFolderDataset,
    HashingTextEmbedder,
    MockClipDataset,
    build_wfm_dataset,
    collate_clips,
    load_text_embedding,
    negative_prompt_embedding,
    pad_text_embedding,
    read_clip,
    resize_clip,
)
from cosmos_primitives.testing import decode_frame_index, write_mp4


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("clips")
    for name, frames in (("walk", 12), ("drive", 9), ("wave", 10)):
        write_mp4(root / "videos" / f"{name}.mp4", num_frames=frames, fps=8.0, size=(48, 64))
        (root / "metas").mkdir(exist_ok=True)
        (root / "metas" / f"{name}.txt").write_text(f"a person does {name}\n")
    (root / "text_embedding").mkdir()
    np.save(root / "text_embedding" / "walk.npy", np.arange(3 * 8, dtype=np.float32).reshape(3, 8) + 1)
    from safetensors.numpy import save_file

    save_file({"text_embedding": np.ones((1, 5, 8), dtype=np.float32)},
              str(root / "text_embedding" / "drive.safetensors"))
    padded = np.zeros((20, 8), dtype=np.float32)
    padded[:2] = 2.0  # the old format: zero-padded rows after the real tokens
    with open(root / "text_embedding" / "wave.pickle", "wb") as f:
        pickle.dump(padded, f)
    return root


def test_read_clip_takes_a_random_contiguous_window(clip_folder):
    starts = set()
    for seed in range(6):
        frames = read_clip(clip_folder / "videos" / "walk.mp4", 4, np.random.default_rng(seed))
        assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
        idx = [decode_frame_index(f) for f in frames]
        assert idx == list(range(idx[0], idx[0] + 4)) and 0 <= idx[0] <= 8
        starts.add(idx[0])
    assert len(starts) > 1
    with pytest.raises(BadSampleError, match=r"drive\.mp4.*9 frames"):
        read_clip(clip_folder / "videos" / "drive.mp4", 10)


def test_resize_clip_covers_then_crops_to_the_target():
    frames = np.zeros((2, 48, 64, 3), dtype=np.uint8)
    frames[:, :, :32] = 255  # left half white
    video = resize_clip(frames, 16, 16)
    assert video.shape == (3, 2, 16, 16) and video.dtype == torch.float32
    assert video.min() >= -1 and video.max() <= 1
    # cover: 48x64 -> 16x21, centre crop keeps columns 2..17 of 21: white on the left, black on the right
    assert video[:, :, :, 0].mean() > 0.9 and video[:, :, :, -1].mean() < -0.9


def test_pad_text_embedding_masks_real_rows():
    out, mask = pad_text_embedding(np.ones((3, 4), dtype=np.float32), 5)
    assert out.shape == (5, 4) and mask.tolist() == [True, True, True, False, False]
    assert out[3:].abs().sum() == 0
    cut, mask = pad_text_embedding(np.ones((7, 4), dtype=np.float32), 5)
    assert cut.shape == (5, 4) and bool(mask.all())
    zero_padded = np.zeros((6, 4), dtype=np.float32)
    zero_padded[:2] = 1.0
    assert pad_text_embedding(zero_padded, 8)[1].sum().item() == 2


def test_pickle_embeddings_need_the_opt_in(clip_folder):
    path = clip_folder / "text_embedding" / "wave.pickle"
    with pytest.raises(BadSampleError, match="allow_pickle"):
        load_text_embedding(path)
    with pytest.warns(UserWarning, match="unpickling"):
        assert load_text_embedding(path, allow_pickle=True).shape == (20, 8)


def test_clip_folder_items(clip_folder):
    ds = ClipFolderDataset(clip_folder, num_frames=5, height=16, width=16, max_tokens=6, seed=3)
    assert len(ds) == 3 and [v.stem for v in ds.videos] == ["drive", "walk", "wave"]
    item = ds[1]
    assert item["name"] == "walk" and item["caption"] == "a person does walk"
    assert item["video"].shape == (3, 5, 16, 16)
    assert item["text"].shape == (6, 8) and item["text_mask"].tolist() == [True] * 3 + [False] * 3
    torch.testing.assert_close(item["text"][:3], torch.arange(24, dtype=torch.float32).reshape(3, 8) + 1)
    assert ds[0]["text_mask"].sum() == 5  # safetensors [1, 5, 8]
    torch.testing.assert_close(ds[1]["video"], item["video"])  # same (seed, epoch, index): same window
    with pytest.raises(BadSampleError, match="allow_pickle"):
        ds[2]
    opted_in = ClipFolderDataset(clip_folder, num_frames=5, height=16, width=16, max_tokens=6, allow_pickle=True)
    with pytest.warns(UserWarning):
        assert opted_in[2]["text_mask"].sum() == 2
    batch = collate_clips([ds[0], ds[1]])
    assert batch["video"].shape == (2, 3, 5, 16, 16) and batch["text"].shape == (2, 6, 8)
    assert batch["caption"] == ["a person does drive", "a person does walk"]


def test_clip_folder_errors_and_hashing_fallback(clip_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="videos"):
        ClipFolderDataset(tmp_path, num_frames=2, height=8, width=8, max_tokens=4)
    write_mp4(tmp_path / "videos" / "lonely.mp4", num_frames=3, size=(16, 16))
    with pytest.raises(FileNotFoundError, match=r"lonely\.txt"):
        ClipFolderDataset(tmp_path, num_frames=2, height=8, width=8, max_tokens=4)
    (tmp_path / "metas").mkdir()
    (tmp_path / "metas" / "lonely.txt").write_text("a lonely robot")
    no_encoder = ClipFolderDataset(tmp_path, num_frames=2, height=8, width=8, max_tokens=4)
    with pytest.raises(BadSampleError, match="text_encoder"):
        no_encoder[0]
    hashed = ClipFolderDataset(tmp_path, num_frames=2, height=8, width=8, max_tokens=4,
                               embedder=HashingTextEmbedder(8))
    item = hashed[0]
    assert item["text_mask"].tolist() == [True, True, True, False]
    torch.testing.assert_close(item["text"][:3], torch.from_numpy(HashingTextEmbedder(8)("A lonely ROBOT")))


def test_hashing_embedder_is_deterministic_and_separates_words():
    emb = HashingTextEmbedder(16)
    a, b = emb("red car turns"), HashingTextEmbedder(16)("red car turns")
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 16) and np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert not np.allclose(emb("blue")[0], emb("red")[0])
    assert emb("").shape == (0, 16)


def test_mock_mode_and_builder(clip_folder):
    cfg = WFMDataConfig(kind="mock", mock_num_samples=3, num_frames=5, height=8, width=12, max_tokens=10, text_dim=16)
    ds = build_wfm_dataset(cfg)
    assert isinstance(ds, MockClipDataset) and len(ds) == 3
    item = ds[2]
    assert item["video"].shape == (3, 5, 8, 12) and item["text"].shape == (10, 16)
    assert item["video"].min() >= -1 and item["video"].max() <= 1 and item["video"].std() > 0
    assert item["text_mask"].sum() == len(item["caption"].split())
    torch.testing.assert_close(ds[2]["video"], item["video"])
    assert not torch.equal(ds[0]["video"], ds[1]["video"])
    folder = build_wfm_dataset(WFMDataConfig(kind="clip_folder", path=str(clip_folder), num_frames=4, text_dim=8))
    assert isinstance(folder, ClipFolderDataset) and folder.embedder is not None
    with pytest.raises(ValueError, match="path"):
        build_wfm_dataset(WFMDataConfig(kind="clip_folder"))


def test_negative_prompt_embedding_sources(tmp_path):
    hashed, mask = negative_prompt_embedding(WFMDataConfig(max_tokens=6, text_dim=8), "blurry static")
    assert hashed.shape == (1, 6, 8) and mask[0].tolist() == [True, True] + [False] * 4
    empty, mask = negative_prompt_embedding(WFMDataConfig(max_tokens=6, text_dim=8))
    assert empty.abs().sum() == 0 and not mask.any()
    np.save(tmp_path / "neg.npy", np.full((3, 8), 0.5, dtype=np.float32))
    cfg = WFMDataConfig(max_tokens=6, text_dim=8, text_encoder="none", negative_embedding=str(tmp_path / "neg.npy"))
    from_file, mask = negative_prompt_embedding(cfg)
    assert mask.sum() == 3 and from_file[0, 0, 0] == 0.5
    with pytest.raises(ValueError, match="negative_embedding"):
        negative_prompt_embedding(WFMDataConfig(text_encoder="none"))
