"""World-model clips from WebDataset-style tar shards, local or on S3, streamed and resumable.

A shard is a tar whose members are grouped by key (the name up to its first dot)::

    clip000.mp4            # the video (required)
    clip000.txt            # the caption (or "caption" in clip000.json)
    clip000.json           # optional metadata
    clip000.safetensors    # optional precomputed text embedding ([n, D]; or .npy)

``urls`` name shards: local files, local folders (their ``*.tar``), local globs (``shards/*.tar``), or
``s3://bucket/prefix`` (every ``.tar`` under the prefix, or one object); WebDataset's brace notation
(``shard-{0000..0099}.tar``, ``{train,extra}``) expands first. S3 is read with boto3 from the standard ``AWS_*``
variables (``AWS_ENDPOINT_URL`` for S3-compatible stores; the seed guide's ``PROD_S3_CHECKPOINT_*``
variables are used when the ``AWS_*`` ones are unset), streamed member by member (a shard is never
held whole). Items are those of ``ClipFolderDataset`` (``name``, ``caption``, ``video`` ``[3, T, H, W]``
in ``[-1, 1]``, ``text`` ``[max_tokens, D]``, ``text_mask``) plus ``meta`` (the JSON, or ``{}``).

Order and resume: each epoch shuffles the shard list with ``(seed, epoch)``; rank ``r`` of ``w``
reads shards ``r, r + w, ...`` of it. :meth:`WebDatasetClips.state_dict` records the epoch, the
shard position and the samples consumed in it, so a restored reader yields exactly what an
uninterrupted one would. A sample whose video cannot be decoded (or lacks a caption) is skipped,
counted and logged by a ``BadSampleTracker``; past ``bad_sample_budget`` the run stops naming them.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_primitives.config.wfm import WFMDataConfig
from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker, bad_sample_boundary
from cosmos_primitives.data.wfm_clips import HashingTextEmbedder, pad_text_embedding, read_clip, resize_clip
from cosmos_primitives.utils.extras import require

# the seed guide names the region PROD_S3_CHECKPOINT_REGION_NAME; PROD_S3_CHECKPOINT_REGION is read too
_ENV_FALLBACKS = {"AWS_ACCESS_KEY_ID": ("PROD_S3_CHECKPOINT_ACCESS_KEY_ID",),
                  "AWS_SECRET_ACCESS_KEY": ("PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY",),
                  "AWS_ENDPOINT_URL": ("PROD_S3_CHECKPOINT_ENDPOINT_URL",),
                  "AWS_DEFAULT_REGION": ("PROD_S3_CHECKPOINT_REGION_NAME", "PROD_S3_CHECKPOINT_REGION")}


def s3_client() -> Any:
    """A boto3 S3 client from ``AWS_*`` (each falling back to its ``PROD_S3_CHECKPOINT_*`` variable)."""
    boto3 = require("boto3", "reading shards from S3")
    values = {k: next((os.environ[name] for name in (k, *fallbacks) if os.environ.get(name)), None)
              for k, fallbacks in _ENV_FALLBACKS.items()}
    return boto3.client("s3", endpoint_url=values["AWS_ENDPOINT_URL"] or None,
                        aws_access_key_id=values["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=values["AWS_SECRET_ACCESS_KEY"],
                        region_name=values["AWS_DEFAULT_REGION"])


_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_braces(url: str) -> list[str]:
    """WebDataset's shard notation: ``a-{00..02}.tar`` -> ``a-00.tar, a-01.tar, a-02.tar`` (the width of
    the first bound is kept), ``{x,y}`` -> each alternative; several groups expand left to right."""
    match = _BRACES.search(url)
    if match is None:
        return [url]
    body, head, tail = match.group(1), url[:match.start()], url[match.end():]
    bounds = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if bounds:
        lo, hi = bounds.groups()
        choices = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    return [expanded for choice in choices for expanded in expand_braces(head + choice + tail)]


def list_shards(urls: Sequence[str], client: Any = None) -> list[str]:
    """The shard URLs ``urls`` name (braces expanded), sorted within each entry.

    Raises:
        FileNotFoundError: an entry names no shard.
    """
    shards: list[str] = []
    for url in (expanded for entry in urls for expanded in expand_braces(entry)):
        found: list[str] = []
        if url.startswith("s3://"):
            bucket, _, prefix = url[5:].partition("/")
            client = client or s3_client()
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                found += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []) if o["Key"].endswith(".tar")]
        else:
            path = Path(url).expanduser()
            if path.is_dir():
                found = [str(p) for p in path.glob("*.tar")]
            elif path.is_file():
                found = [str(path)]
            else:
                found = [p for p in glob.glob(str(path)) if Path(p).is_file()]
        if not found:
            raise FileNotFoundError(f"[wfm.data] shards: {url} names no .tar shard")
        shards += sorted(found)
    return shards


def _open_stream(url: str, client: Any) -> Any:
    if url.startswith("s3://"):
        bucket, _, key = url[5:].partition("/")
        return client.get_object(Bucket=bucket, Key=key)["Body"]
    return open(url, "rb")


def iter_shard(url: str, client: Any = None) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` per sample of a shard, read as a stream (members of a key are adjacent)."""
    stream = _open_stream(url, client)
    try:
        key, parts = None, {}
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = member.name.rsplit("/", 1)[-1]
                stem, _, ext = name.partition(".")
                if key is not None and stem != key:
                    yield key, parts
                    parts = {}
                key = stem
                parts[ext.lower()] = tar.extractfile(member).read()
        if key is not None:
            yield key, parts
    finally:
        stream.close()


def _metadata(data: bytes, where: str) -> dict[str, Any]:
    """A sample's ``.json`` part: a JSON object in UTF-8."""
    try:
        meta = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadSampleError(where, f"the .json metadata is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BadSampleError(where, f"the .json metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise BadSampleError(where, f"the .json metadata must be a JSON object, got {type(meta).__name__}")
    return meta


class WebDatasetClips:
    """An iterable of clip items from tar shards (module docstring). Iterate it for this rank's items
    (forever, epoch after epoch); ``state_dict`` / ``load_state_dict`` resume mid-shard.

    Args:
        urls: shard files / folders / ``s3://`` prefixes.
        embedder: for captions without an embedding (``[wfm.data] text_encoder = "hash"``); None makes
            a missing embedding a bad sample.
        bad_sample_budget: bad samples tolerated per rank (``-1``: any number).
        client: a boto3 S3 client (default :func:`s3_client` when a URL is on S3).
    """

    def __init__(self, urls: Sequence[str], *, num_frames: int, height: int, width: int, max_tokens: int,
                 embedder: HashingTextEmbedder | None = None, seed: int = 0, rank: int = 0, world_size: int = 1,
                 bad_sample_budget: int = 0, client: Any = None) -> None:
        self.client = client if client is not None or not any(u.startswith("s3://") for u in urls) else s3_client()
        self.shards = list_shards(urls, self.client)
        if len(self.shards) < world_size:
            raise ValueError(f"{len(self.shards)} shard(s) for {world_size} ranks: every rank needs at least one")
        self.num_frames, self.height, self.width, self.max_tokens = num_frames, height, width, max_tokens
        self.embedder, self.seed, self.rank, self.world_size = embedder, seed, rank, world_size
        self.bad = BadSampleTracker(bad_sample_budget, config_key="train.train_policy.dataset.bad_sample_budget")
        self.epoch, self.shard_pos, self.sample_pos = 0, 0, 0

    def rank_shards(self, epoch: int) -> list[str]:
        """This rank's shards in epoch ``epoch``'s order."""
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.shards))
        return [self.shards[i] for i in order[self.rank::self.world_size]]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            shards = self.rank_shards(self.epoch)
            while self.shard_pos < len(shards):
                url = shards[self.shard_pos]
                failure = yield from self._read_shard(url)
                # the position moves past the shard before a failure is counted: a checkpoint taken
                # from here on never comes back to it
                self.shard_pos, self.sample_pos = self.shard_pos + 1, 0
                if failure is not None:
                    self.bad.record(failure)
            self.epoch, self.shard_pos = self.epoch + 1, 0

    def _read_shard(self, url: str) -> Generator[dict[str, Any], None, BadSampleError | None]:
        """Yield the good items of shard ``url`` from ``sample_pos`` on, recording bad samples; return
        the error that ended it early (not a tar, or cut off), else None."""
        samples = iter_shard(url, self.client)
        index = -1
        while True:
            try:
                key, parts = next(samples)
            except StopIteration:
                return None
            except (tarfile.TarError, EOFError) as exc:
                read = f" after {index + 1} sample(s)" if index >= 0 else ""
                return BadSampleError(url, f"not a tar archive, or cut off{read} ({type(exc).__name__}: {exc}); "
                                           f"the rest of this shard is skipped")
            index += 1
            if index < self.sample_pos:
                continue  # consumed before the checkpoint this reader resumed from
            self.sample_pos = index + 1
            try:
                with bad_sample_boundary(f"{url}#{key}"):
                    item = self._decode(url, key, parts, index)
            except BadSampleError as error:
                self.bad.record(error, sample=f"{url}#{key}")
                continue
            yield item

    def _decode(self, url: str, key: str, parts: dict[str, bytes], index: int) -> dict[str, Any]:
        where = f"{url}#{key}"
        meta = _metadata(parts["json"], where) if "json" in parts else {}
        try:
            caption = parts["txt"].decode("utf-8").strip() if "txt" in parts else str(meta.get("caption", ""))
        except UnicodeDecodeError as exc:
            raise BadSampleError(where, f"the .txt caption is not UTF-8 text (byte {exc.start})") from None
        if "mp4" not in parts or not caption:
            raise BadSampleError(where, "needs an .mp4 and a caption (.txt, or 'caption' in the .json)")
        with tempfile.NamedTemporaryFile(suffix=".mp4") as f:  # the decoder wants a seekable file
            f.write(parts["mp4"])
            f.flush()
            rng = np.random.default_rng((self.seed, self.epoch, self.rank, self.shard_pos, index))
            try:
                frames = read_clip(f.name, self.num_frames, rng)
            except BadSampleError as exc:  # it names the temporary file: name the shard member instead
                raise BadSampleError(where, exc.reason.replace(f.name, "video")) from exc
        if "safetensors" in parts:
            from safetensors.numpy import load as load_safetensors

            with bad_sample_boundary(where, "unreadable .safetensors embedding"):
                tensors = load_safetensors(parts["safetensors"])
            if not tensors:
                raise BadSampleError(where, "the .safetensors embedding holds no tensor")
            embedding = tensors.get("text_embedding", next(iter(tensors.values())))
        elif "npy" in parts:
            try:
                embedding = np.load(io.BytesIO(parts["npy"]), allow_pickle=False)  # never unpickle shard data
            except ValueError as exc:
                raise BadSampleError(where, f"the .npy embedding is not a plain array (pickled objects are never "
                                            f"loaded): {exc}") from None
            except (OSError, EOFError) as exc:
                raise BadSampleError(where, f"unreadable .npy embedding: {exc}") from None
        elif self.embedder is not None:
            embedding = self.embedder(caption)
        else:
            raise BadSampleError(where, "no text embedding (.safetensors / .npy) and no text encoder configured")
        if not isinstance(embedding, np.ndarray) or embedding.ndim == 0 or embedding.size == 0 or \
                embedding.dtype.kind not in "fiub":
            shape = getattr(embedding, "shape", None)
            raise BadSampleError(where, f"the text embedding must be a non-empty numeric array [n, D] "
                                        f"(got shape {shape}{', a 0-d scalar' if shape == () else ''})")
        text, mask = pad_text_embedding(np.asarray(embedding, dtype=np.float32).reshape(-1, embedding.shape[-1]),
                                        self.max_tokens)
        return {"name": key, "caption": caption, "video": resize_clip(frames, self.height, self.width),
                "text": text, "text_mask": mask, "meta": meta}

    def state_dict(self) -> dict[str, Any]:
        """Where this rank's reader is (epoch, shard position, samples consumed in it) and its bad-sample count."""
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "sample_pos": self.sample_pos,
                "bad_samples": self.bad.state_dict(), "shards": len(self.shards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["shards"]) != len(self.shards):
            raise ValueError(f"the checkpoint's reader had {state['shards']} shards, this one {len(self.shards)}: "
                             "resume with the same [wfm.data] shards")
        self.epoch, self.shard_pos, self.sample_pos = int(state["epoch"]), int(state["shard_pos"]), int(
            state["sample_pos"])
        self.bad.load_state_dict(state["bad_samples"])



def build_wfm_webdataset(cfg: WFMDataConfig, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                         bad_sample_budget: int = 0, client: Any = None) -> WebDatasetClips:
    """The reader ``[wfm.data] kind = "webdataset"`` describes, for rank ``rank`` of ``world_size``.

    Raises:
        ValueError: no ``shards``, or fewer shards than ranks.
        FileNotFoundError: a ``shards`` entry names no ``.tar``.
    """
    if not cfg.shards:
        raise ValueError('[wfm.data] kind = "webdataset" needs shards = ["s3://bucket/prefix/", "/data/shards/", '
                         '"shard-{0000..0099}.tar", ...]')
    embedder = HashingTextEmbedder(cfg.text_dim) if cfg.text_encoder == "hash" else None
    return WebDatasetClips(cfg.shards, num_frames=cfg.num_frames, height=cfg.height, width=cfg.width,
                           max_tokens=cfg.max_tokens, embedder=embedder, seed=seed, rank=rank, world_size=world_size,
                           bad_sample_budget=bad_sample_budget, client=client)
