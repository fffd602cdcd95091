"""The SFT input pipeline of one rank: sampler -> load + encode (bad samples skipped and counted)
-> packed or padded batches, with its position saved and restored exactly."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from cosmos_primitives.config.dataset import DatasetConfig, TrainPolicyConfig, data_order
from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker, bad_sample_boundary
from cosmos_primitives.data.hf_conversations import HFConversationDataset
from cosmos_primitives.data.mrope import MRopeSpec
from cosmos_primitives.data.packing import collate_packed, collate_padded, plan_rows
from cosmos_primitives.data.qwen_vl_encoding import EncodedSample, encode_conversation
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.video_folder import VideoFolderDataset

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.config.root import Config


class SFTBatchLoader:
    """Batches for one rank, one epoch per iteration, resumable between batches.

    Args:
        dataset: ``dataset[i]`` -> a conversation sample. Any error it (or ``encode``) raises for
            one sample makes that sample a bad sample (skipped, counted against ``bad_samples``).
        encode: sample -> :class:`~cosmos_primitives.data.qwen_vl_encoding.EncodedSample`
            (e.g. ``functools.partial(encode_conversation, processor, mrope=spec)``).
        sampler: this rank's :class:`ResumableDistributedSampler` over ``dataset``.
        token_budget: tokens per row; longer samples are bad samples (skipped, counted).
        pad_token_id: filler token.
        packing: ``True``: each batch is ``rows_per_batch`` packed rows (see
            :mod:`cosmos_primitives.data.packing` for keys and the no-cross-attention contract);
            ``False``: ``samples_per_batch`` samples, padded, with an ``attention_mask``.
        buffer_size: samples held to pick packed rows from (more = fuller rows, more memory); more
            are drawn while the held ones total fewer than ``token_budget`` tokens.
        pad_to_budget: pad every row to ``token_budget`` (static shapes) instead of the longest row.
        bad_samples: the tracker that counts skipped samples and enforces the budget.

    Iterating yields the rest of the current epoch, then moves the sampler to the next epoch.
    :meth:`state_dict` between two batches captures the sampler position, the indices drawn but not
    yet batched, and the bad-sample counts; :meth:`load_state_dict` on a loader built the same way
    makes it yield exactly the batches the saved one would have yielded next. An epoch in which every
    drawn sample was bad raises :class:`~cosmos_primitives.data.bad_samples.NoGoodSamplesError` when it
    runs out (a run that would train on nothing fails rather than finishing at step 0).

    With several data-parallel ranks, ranks can run out of batches at different steps (packing
    makes the batch count data-dependent): stop the epoch when any rank is out, e.g. with
    :func:`all_ranks_have_batch`, so collective ops stay matched.
    """

    def __init__(self, dataset: Any, encode: Callable[[Any], EncodedSample], sampler: ResumableDistributedSampler,
                 *, token_budget: int, pad_token_id: int, packing: bool = True, rows_per_batch: int = 1,
                 samples_per_batch: int = 1, buffer_size: int = 32, pad_to_budget: bool = False,
                 bad_samples: BadSampleTracker | None = None) -> None:
        if sampler.num_samples != len(dataset):
            raise ValueError(f"sampler covers {sampler.num_samples} samples but the dataset has {len(dataset)}")
        self.dataset = dataset
        self.encode = encode
        self.sampler = sampler
        self.token_budget = token_budget
        self.pad_token_id = pad_token_id
        self.packing = packing
        self.rows_per_batch = rows_per_batch
        self.samples_per_batch = samples_per_batch
        self.buffer_size = max(buffer_size, samples_per_batch if not packing else 1)
        self.pad_to_budget = pad_to_budget
        self.bad_samples = bad_samples or BadSampleTracker(100)
        self._pending: list[tuple[int, EncodedSample]] = []
        self._restored: list[int] = []
        self._indices: Iterator[int] | None = None
        self._drawn = self._good = 0  # samples drawn / encoded this epoch (by this process)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while (batch := self.next_batch()) is not None:
            yield batch
        self.start_next_epoch()

    def start_next_epoch(self) -> None:
        """Move to the next epoch (samples held back for the current one are dropped with it)."""
        self.sampler.set_epoch(self.sampler.epoch + 1)
        self._drawn = self._good = 0
        self._pending = []
        self._restored = []
        self._indices = None

    def next_batch(self) -> dict[str, torch.Tensor] | None:
        """The next batch of the current epoch, or ``None`` when the epoch is used up."""
        if self.packing:
            rows = []
            for _ in range(self.rows_per_batch):
                self._fill(self.buffer_size, min_tokens=self.token_budget)
                if not self._pending:
                    break
                chosen = plan_rows([len(s) for _, s in self._pending], self.token_budget)[0]
                rows.append([self._pending[i][1] for i in chosen])
                taken = set(chosen)
                self._pending = [p for i, p in enumerate(self._pending) if i not in taken]
            if not rows:
                return self._epoch_end()
            return collate_packed(rows, self.pad_token_id, pad_to=self.token_budget if self.pad_to_budget else None)
        self._fill(self.samples_per_batch)
        if not self._pending:
            return self._epoch_end()
        taken, self._pending = self._pending[: self.samples_per_batch], self._pending[self.samples_per_batch:]
        return collate_padded([s for _, s in taken], self.pad_token_id,
                              pad_to=self.token_budget if self.pad_to_budget else None)

    def next_step(self, num_samples: int) -> list[dict[str, torch.Tensor]] | None:
        """The micro-batches of one optimizer step: the next ``num_samples`` samples of the epoch
        (bad ones skipped and counted), packed into rows of at most ``token_budget`` tokens and
        split into batches of ``rows_per_batch`` rows (or ``samples_per_batch`` padded samples).

        Each step consumes exactly its samples, so the sampler position alone resumes the loader,
        and every rank takes the same number of steps per epoch. ``None`` when the epoch is used up.
        """
        if self._indices is None:
            self._indices = iter(self.sampler)
        drawn = 0
        samples: list[EncodedSample] = []
        while drawn < num_samples:
            index = next(self._indices, None)
            if index is None:
                break
            drawn += 1
            before = len(self._pending)
            self._admit(index)
            if len(self._pending) > before:
                samples.append(self._pending.pop()[1])
        if drawn == 0:
            return self._epoch_end()
        if not samples:
            return []
        if not self.packing:
            size = self.samples_per_batch
            return [collate_padded(samples[i:i + size], self.pad_token_id,
                                   pad_to=self.token_budget if self.pad_to_budget else None)
                    for i in range(0, len(samples), size)]
        rows = [[samples[i] for i in row] for row in plan_rows([len(s) for s in samples], self.token_budget)]
        pad_to = self.token_budget if self.pad_to_budget else None
        return [collate_packed(rows[i:i + self.rows_per_batch], self.pad_token_id, pad_to=pad_to)
                for i in range(0, len(rows), self.rows_per_batch)]

    def _fill(self, target: int, min_tokens: int = 0) -> None:
        """Draw samples until ``target`` are pending and they hold at least ``min_tokens`` tokens
        (so a row of many short samples can be filled), or the epoch runs out."""
        while self._restored:
            self._admit(self._restored.pop(0))
        if self._indices is None:
            self._indices = iter(self.sampler)
        while len(self._pending) < target or sum(len(s) for _, s in self._pending) < min_tokens:
            index = next(self._indices, None)
            if index is None:
                return
            self._admit(index)

    def _epoch_end(self) -> None:
        if self._drawn > 0 and self._good == 0:
            raise self.bad_samples.no_good_samples(self._drawn, self.epoch)

    def _admit(self, index: int) -> None:
        self._drawn += 1
        try:
            # the per-sample boundary: whatever one sample raises makes it a counted bad sample
            with bad_sample_boundary(f"sample {index}"):
                item = self.dataset[index]
            with bad_sample_boundary(sample_files(item) or f"sample {index}", "could not encode"):
                sample = self.encode(item)
            if len(sample) > self.token_budget:
                raise BadSampleError(sample.source or f"sample {index}",
                                     f"{len(sample)} tokens exceed the packing budget of {self.token_budget}; "
                                     f"lower fps / max_pixels / max_frames or raise packing_budget")
        except BadSampleError as error:
            self.bad_samples.record(error, sample=index)
            return
        self._good += 1
        self._pending.append((index, sample))

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(),
                "pending": [i for i, _ in self._pending] + list(self._restored),
                "bad_samples": self.bad_samples.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.bad_samples.load_state_dict(state["bad_samples"])
        self._pending = []
        self._restored = [int(i) for i in state["pending"]]
        self._indices = None


def sample_files(item: Any) -> str:
    """The media files (or else the id) of a loaded sample, to name it in a bad-sample message; ``""`` if none."""
    paths = getattr(item, "media_paths", None) or []
    return ", ".join(paths) or str(getattr(item, "sample_id", "") or "")


def all_ranks_have_batch(has_batch: bool, device: torch.device | str | None = None, group: Any = None) -> bool:
    """``True`` iff every rank of ``group`` has a batch (a MIN all-reduce; ``has_batch`` without a
    process group). ``device``: where the flag lives (``"cuda"`` under nccl)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return has_batch
    flag = torch.tensor([1 if has_batch else 0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=group)
    return bool(flag.item())


def build_sft_dataset(cfg: DatasetConfig, conversation_column: str = "conversations", *,
                      setup_config: Config | None = None, processor: Any = None) -> Any:
    """The dataset a :class:`~cosmos_primitives.config.DatasetConfig` names: its ``plugin`` when set
    (:func:`~cosmos_primitives.data.plugins.sft_plugin_dataset`; ``setup_config`` (the run's config,
    what cosmos-rl hands a dataset's ``setup``) and ``processor``'s tokenizer go to the plug-in's
    ``setup``), else the reader its ``kind`` picks. Media are sized for ``processor`` (the model's;
    its patch size sets the pixel factor: 28 for Qwen2.5-VL, 32 for Qwen3-VL; 28 without one)."""
    from pathlib import Path

    if cfg.plugin:
        from cosmos_primitives.data.plugins import sft_plugin_dataset

        return sft_plugin_dataset(cfg, setup_config, processor)
    root = Path(cfg.name).expanduser() if cfg.name else None
    kind = cfg.kind
    if kind == "auto":
        is_folder = root is not None and (root / "videos").is_dir() and (root / "metas").is_dir()
        kind = "video_folder" if is_folder else "hf"
    if not cfg.name:
        raise ValueError("train.train_policy.dataset.name is empty: give a hub name or a local path")
    if kind == "video_folder":
        return VideoFolderDataset.from_config(cfg, processor)
    return HFConversationDataset.from_config(cfg, conversation_column=conversation_column, processor=processor)


def build_sft_loader(train_policy: TrainPolicyConfig, processor: Any, model_config: Any = None, *,
                     model_max_length: int, seed: int | None = None, rank: int = 0, world_size: int = 1,
                     dataset: Any = None, setup_config: Config | None = None) -> SFTBatchLoader:
    """The loader of one rank that ``[train.train_policy]`` (``train_policy``) describes.

    Reads its ``dataset``, ``sequence_packing``, ``packing_budget`` (unset: ``model_max_length``,
    ``[policy] model_max_length``), ``packing_buffer``, ``mini_batch`` = rows (packed) or samples
    (padded) per batch, and the data order (``dataloader_shuffle``, ``dataloader_seed``, unset:
    ``seed``, the run's ``[train] seed``: ``cp.config.sampler_settings``). ``model_config``: the
    model's config (mRoPE constants and family of a Qwen-VL model; ``None`` or a text config for
    text models). ``dataset`` overrides the configured one; ``setup_config`` is what a dataset
    plug-in's ``setup`` receives when the configured one is built here (:func:`build_sft_dataset`).
    """
    data_cfg = train_policy.dataset
    if dataset is None:
        dataset = build_sft_dataset(data_cfg, train_policy.conversation_column_name, setup_config=setup_config,
                                    processor=processor)
    mrope = MRopeSpec.from_config(model_config) if getattr(model_config, "vision_config", None) is not None else None
    tokenizer = getattr(processor, "tokenizer", processor)
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = getattr(model_config, "pad_token_id", None) or tokenizer.eos_token_id
    sampler = ResumableDistributedSampler(len(dataset), rank=rank, world_size=world_size,
                                          **data_order(train_policy, seed))
    return SFTBatchLoader(
        dataset,
        functools.partial(encode_conversation, processor, mrope=mrope),
        sampler,
        token_budget=train_policy.packing_budget or model_max_length,
        pad_token_id=int(pad_token_id),
        packing=train_policy.sequence_packing,
        rows_per_batch=train_policy.mini_batch,
        samples_per_batch=train_policy.mini_batch,
        buffer_size=train_policy.packing_buffer,
        bad_samples=BadSampleTracker(data_cfg.bad_sample_budget),
    )
