"""Prompts and real clips for world-model RL (REFERENCE.md section 5).

Folder layout (Cosmos-Predict2.5 post-training)::

    <root>/videos/<name>.mp4
    <root>/metas/<name>.txt                  # the caption
    <root>/text_embedding/<name>.npy         # optional [n_tokens, dim]; or .safetensors;
                                             # .pickle / .pkl only with allow_pickle=True
                                             # (folder name: [wfm.data] embedding_dir; cosmos-rl's
                                             # world-model datasets use t5_xxl/)

Each item is a random contiguous window of ``num_frames`` frames, resized (cover, then centre
crop) to ``height x width``, as float32 ``[3, T, H, W]`` in ``[-1, 1]``; the caption's embedding
zero-padded (or cut) to ``max_tokens`` rows, with a mask of the real rows.

Text encoder: real recipes precompute T5 / Cosmos-Reason embeddings into ``text_embedding/``. When
an embedding is missing, :class:`HashingTextEmbedder` (a tiny deterministic bag-of-words embedder:
each lower-cased word maps to a fixed random vector seeded by its hash) stands in: no weights to
download, the same caption always gives the same embedding, different captions differ. It is
meant for CPU recipes and tests, not for quality.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosmos_primitives.config.wfm import WFMDataConfig
from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.utils.extras import require

EMBEDDING_SUFFIXES = (".npy", ".safetensors")
PICKLE_SUFFIXES = (".pickle", ".pkl")
_WORD = re.compile(r"[a-z0-9']+")


class HashingTextEmbedder:
    """Caption -> ``[n_words, dim]`` float32, one fixed unit-norm random vector per lower-cased word.

    Deterministic across processes and runs (the vector of a word is seeded by its BLAKE2 hash and
    ``seed``); an empty caption gives ``[0, dim]``.
    """

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim = dim
        self.seed = seed
        self._cache: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        if word not in self._cache:
            digest = hashlib.blake2b(f"{self.seed}:{word}".encode(), digest_size=8).digest()
            vec = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(self.dim)
            self._cache[word] = (vec / np.linalg.norm(vec)).astype(np.float32)
        return self._cache[word]

    def __call__(self, caption: str) -> np.ndarray:
        words = _WORD.findall(caption.lower())
        if not words:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._word(w) for w in words])


def pad_text_embedding(embedding: np.ndarray | torch.Tensor, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad (or cut) ``[n, D]`` to ``[max_tokens, D]`` float32, with a ``[max_tokens]`` bool mask of real rows.

    Trailing all-zero rows of the input (files saved already padded, as the old pickles were) count as padding.
    """
    emb = torch.as_tensor(np.asarray(embedding), dtype=torch.float32)
    if emb.ndim != 2:
        raise ValueError(f"a text embedding must be [n_tokens, dim]; got shape {tuple(emb.shape)}")
    nonzero = emb.abs().sum(dim=1) > 0
    length = int(nonzero.nonzero().max().item()) + 1 if bool(nonzero.any()) else 0
    length = min(length, max_tokens)
    out = torch.zeros(max_tokens, emb.shape[1])
    out[:length] = emb[:length]
    mask = torch.zeros(max_tokens, dtype=torch.bool)
    mask[:length] = True
    return out, mask


def load_text_embedding(path: str | Path, *, allow_pickle: bool = False) -> np.ndarray:
    """Read a precomputed ``[n_tokens, dim]`` embedding from ``.npy``, ``.safetensors`` or (opt-in) pickle.

    A safetensors file must hold one tensor (or one named ``text_embedding``). Leading singleton
    dimensions (``[1, n, D]``) are dropped. A ``.npy`` file is never unpickled (object arrays are
    refused even with ``allow_pickle``, which is for ``.pickle`` / ``.pkl`` files only).

    Raises:
        BadSampleError: naming the file: a pickle file without ``allow_pickle=True``, a file that
            cannot be parsed (truncated, garbage, object dtype), an unexpected layout or
            non-finite values.
    """
    path = Path(path)
    with bad_sample_boundary(str(path), "could not load the text embedding"):
        array = _read_embedding_file(path, allow_pickle)
        array = np.asarray(array, dtype=np.float32)
        while array.ndim > 2 and array.shape[0] == 1:
            array = array[0]
    if array.ndim != 2:
        raise BadSampleError(str(path), f"expected a [n_tokens, dim] embedding; got shape {array.shape}")
    if not np.isfinite(array).all():
        raise BadSampleError(str(path), "the text embedding holds NaN or inf values")
    return array


def _read_embedding_file(path: Path, allow_pickle: bool) -> Any:
    """The array a ``.npy`` / ``.safetensors`` / (opt-in) pickle embedding file holds."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)  # never: a .npy can carry pickled objects
    if suffix == ".safetensors":
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
        if "text_embedding" in tensors:
            return tensors["text_embedding"]
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        raise BadSampleError(str(path), f"holds tensors {sorted(tensors)}; keep one, or name it 'text_embedding'")
    if suffix in PICKLE_SUFFIXES:
        if not allow_pickle:
            raise BadSampleError(
                str(path), "pickle embeddings are not loaded by default (unpickling runs code from the file). "
                "Convert them to .npy / .safetensors, or set [wfm.data] allow_pickle = true if you trust the files")
        warnings.warn(f"unpickling {path} ([wfm.data] allow_pickle = true): only do this for files you trust",
                      stacklevel=3)
        with open(path, "rb") as f:
            obj = pickle.load(f)  # opt-in only, see above
        if isinstance(obj, (list, tuple)) and len(obj) == 1:
            obj = obj[0]
        return obj.numpy() if isinstance(obj, torch.Tensor) else np.asarray(obj)
    raise BadSampleError(str(path), "unknown embedding format; use .npy or .safetensors")


def read_clip(path: str | Path, num_frames: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """A random contiguous window of ``num_frames`` frames of a video: ``[T, H, W, 3]`` uint8.

    Raises:
        BadSampleError: naming the file: it cannot be decoded (empty, truncated, not a video) or
            has fewer than ``num_frames`` frames.
    """
    av = require("av", "reading mp4 clips")
    rng = rng or np.random.default_rng()
    with bad_sample_boundary(str(path), "cannot decode video"), av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if len(frames) < num_frames:
        raise BadSampleError(str(path), f"has {len(frames)} frames, fewer than num_frames = {num_frames} "
                                        "([wfm.data] num_frames)")
    start = int(rng.integers(0, len(frames) - num_frames + 1))
    return np.stack(frames[start : start + num_frames])


def resize_clip(frames: np.ndarray | torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``[T, H, W, 3]`` uint8 -> ``[3, T, height, width]`` float32 in ``[-1, 1]``.

    Scales so the clip covers the target (aspect kept), then crops the centre.
    """
    video = torch.as_tensor(np.asarray(frames)).permute(0, 3, 1, 2).float()  # [T, 3, H, W]
    h, w = video.shape[-2:]
    scale = max(height / h, width / w)
    new_h, new_w = max(height, round(h * scale)), max(width, round(w * scale))
    if (new_h, new_w) != (h, w):
        video = F.interpolate(video, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)
    top, left = (new_h - height) // 2, (new_w - width) // 2
    video = video[:, :, top : top + height, left : left + width]
    return (video / 127.5 - 1.0).clamp(-1.0, 1.0).permute(1, 0, 2, 3).contiguous()


class ClipFolderDataset(torch.utils.data.Dataset):
    """Items of a clip folder (layout in the module docstring).

    Each item is a dict: ``name`` (str), ``caption`` (str), ``video`` ``[3, T, H, W]`` float32 in
    ``[-1, 1]``, ``text`` ``[max_tokens, D]`` float32, ``text_mask`` ``[max_tokens]`` bool. The frame
    window is drawn from a generator seeded by ``(seed, epoch, index)``: reproducible, different per
    epoch (:meth:`set_epoch`).

    Raises (at construction): ``FileNotFoundError`` for a missing ``videos/`` folder or caption file.
    Items whose files are bad (an empty or undecodable clip, a caption that is not UTF-8, an
    embedding file that cannot be read) raise :class:`BadSampleError` naming the file.
    """

    def __init__(self, root: str | Path, *, num_frames: int, height: int, width: int, max_tokens: int,
                 embedder: HashingTextEmbedder | None = None, allow_pickle: bool = False, seed: int = 0,
                 embedding_dir: str = "text_embedding") -> None:
        self.root = Path(root)
        self.embedding_dir = self.root / embedding_dir
        videos_dir = self.root / "videos"
        if not videos_dir.is_dir():
            raise FileNotFoundError(f"{videos_dir} does not exist; a clip folder holds videos/*.mp4 and metas/*.txt")
        self.videos = sorted(videos_dir.glob("*.mp4"))
        if not self.videos:
            raise FileNotFoundError(f"no .mp4 file in {videos_dir}")
        missing = [str(self.root / "metas" / f"{v.stem}.txt") for v in self.videos
                   if not (self.root / "metas" / f"{v.stem}.txt").is_file()]
        if missing:
            raise FileNotFoundError(f"{len(missing)} video(s) have no caption file, e.g. {missing[:3]}")
        self.num_frames, self.height, self.width, self.max_tokens = num_frames, height, width, max_tokens
        self.embedder = embedder
        self.allow_pickle = allow_pickle
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.videos)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _embedding_path(self, name: str) -> Path | None:
        for suffix in EMBEDDING_SUFFIXES + PICKLE_SUFFIXES:
            path = self.embedding_dir / f"{name}{suffix}"
            if path.is_file():
                return path
        return None

    def caption(self, index: int) -> str:
        """The caption of item ``index`` (a file that is not UTF-8 text is a :class:`BadSampleError`)."""
        path = self.root / "metas" / f"{self.videos[index].stem}.txt"
        with bad_sample_boundary(str(path), "could not read the caption"):
            return path.read_text(encoding="utf-8").strip()

    def text_embedding(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(text [max_tokens, D], text_mask [max_tokens])`` of item ``index``."""
        name = self.videos[index].stem
        path = self._embedding_path(name)
        if path is not None:
            return pad_text_embedding(load_text_embedding(path, allow_pickle=self.allow_pickle), self.max_tokens)
        if self.embedder is None:
            raise BadSampleError(
                str(self.embedding_dir / name),
                "no text embedding (.npy / .safetensors) and no text encoder configured; precompute it or set "
                "[wfm.data] text_encoder = \"hash\"")
        return pad_text_embedding(self.embedder(self.caption(index)), self.max_tokens)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Item ``index``; any failure of its files is a :class:`BadSampleError` naming the file
        (skip and count it with a :class:`~cosmos_primitives.data.bad_samples.BadSampleTracker`, e.g.
        through :func:`~cosmos_primitives.data.prompt_streaming.prompt_stream`)."""
        video = self.videos[index]
        rng = np.random.default_rng((self.seed, self.epoch, index))
        caption = self.caption(index)
        frames = read_clip(video, self.num_frames, rng)
        text, mask = self.text_embedding(index)
        with bad_sample_boundary(str(video), "could not resize the clip"):
            clip = resize_clip(frames, self.height, self.width)
        return {"name": video.stem, "caption": caption, "video": clip, "text": text, "text_mask": mask}


_MOCK_SUBJECTS = ("a red car", "a robot arm", "a white dog", "a delivery drone", "a forklift", "a pedestrian")
_MOCK_ACTIONS = ("moves left", "turns right", "picks up a box", "stops at a crossing", "drives forward", "waits")
_MOCK_PLACES = ("in a warehouse", "on a city street", "in a kitchen", "at night", "in the rain", "on a farm")


class MockClipDataset(torch.utils.data.Dataset):
    """``num_samples`` random items shaped like :class:`ClipFolderDataset`'s, for quick runs and tests.

    Captions are drawn from a small template grammar, embedded by ``embedder``; clips are smooth
    random colour fields drifting over time (low-frequency, so a VAE can encode them), float32
    ``[3, T, H, W]`` in ``[-1, 1]``. Item ``i`` is the same on every call.
    """

    def __init__(self, num_samples: int, *, num_frames: int, height: int, width: int, max_tokens: int,
                 embedder: HashingTextEmbedder, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.num_frames, self.height, self.width, self.max_tokens = num_frames, height, width, max_tokens
        self.embedder = embedder
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def caption(self, index: int) -> str:
        rng = np.random.default_rng((self.seed, index, 0))
        parts = (_MOCK_SUBJECTS, _MOCK_ACTIONS, _MOCK_PLACES)
        return " ".join(words[rng.integers(len(words))] for words in parts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"mock dataset has {self.num_samples} items; asked for {index}")
        gen = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + index)
        coarse = torch.rand(1, 3, 2, 3, 3, generator=gen) * 2.0 - 1.0  # [1, 3, T0, H0, W0]
        video = F.interpolate(coarse, size=(self.num_frames, self.height, self.width), mode="trilinear",
                              align_corners=True)[0]
        caption = self.caption(index)
        text, mask = pad_text_embedding(self.embedder(caption), self.max_tokens)
        return {"name": f"mock_{index:05d}", "caption": caption, "video": video.clamp(-1.0, 1.0),
                "text": text, "text_mask": mask}


def collate_clips(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack items: ``video [B, 3, T, H, W]``, ``text [B, L, D]``, ``text_mask [B, L]``; ``name``, ``caption`` lists."""
    return {
        "name": [it["name"] for it in items],
        "caption": [it["caption"] for it in items],
        "video": torch.stack([it["video"] for it in items]),
        "text": torch.stack([it["text"] for it in items]),
        "text_mask": torch.stack([it["text_mask"] for it in items]),
    }


def build_wfm_dataset(cfg: WFMDataConfig, seed: int = 0) -> torch.utils.data.Dataset:
    """The dataset ``[wfm.data]`` describes (``kind = "mock"`` or ``"clip_folder"``; a ``"webdataset"`` is a
    stream: ``cp.data.build_wfm_webdataset``)."""
    if cfg.kind == "webdataset":
        raise ValueError('[wfm.data] kind = "webdataset" is a stream without indices: build it with '
                         "cp.data.build_wfm_webdataset")
    embedder = HashingTextEmbedder(cfg.text_dim) if cfg.text_encoder == "hash" else None
    common = dict(num_frames=cfg.num_frames, height=cfg.height, width=cfg.width, max_tokens=cfg.max_tokens)
    if cfg.kind == "mock":
        if embedder is None:
            raise ValueError("[wfm.data] kind = \"mock\" needs text_encoder = \"hash\" (mock captions have no files)")
        return MockClipDataset(cfg.mock_num_samples, embedder=embedder, seed=seed, **common)
    if not cfg.path:
        raise ValueError("[wfm.data] kind = \"clip_folder\" needs path = the folder holding videos/ and metas/")
    return ClipFolderDataset(cfg.path, embedder=embedder, allow_pickle=cfg.allow_pickle, seed=seed,
                             embedding_dir=cfg.embedding_dir, **common)


def negative_prompt_embedding(cfg: WFMDataConfig, prompt: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The guidance's negative prompt as ``(text [1, max_tokens, D], mask [1, max_tokens])``.

    From ``cfg.negative_embedding`` when set, else ``prompt`` through the hashing embedder.

    Raises:
        ValueError: ``text_encoder = "none"`` and no ``negative_embedding`` file.
    """
    if cfg.negative_embedding:
        text, mask = pad_text_embedding(load_text_embedding(cfg.negative_embedding, allow_pickle=cfg.allow_pickle),
                                        cfg.max_tokens)
    elif cfg.text_encoder == "hash":
        text, mask = pad_text_embedding(HashingTextEmbedder(cfg.text_dim)(prompt), cfg.max_tokens)
    else:
        raise ValueError("classifier-free guidance needs the negative prompt's embedding: precompute it with the "
                         "model's text encoder and set [wfm.data] negative_embedding = \"path.npy\"")
    return text[None], mask[None]
