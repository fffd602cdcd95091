"""Adapter for a local folder of clips with label files: ``videos/<id><suffix>.mp4`` beside
``metas/<id>.label.json``; the label (the whole JSON, or one of its fields) is the assistant answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosmos_primitives.config.dataset import DatasetConfig
from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.conversation import ConversationSample, load_conversation
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.logging.console import get_logger

LABEL_SUFFIX = ".label.json"


class VideoFolderDataset:
    """One sample per ``metas/<id>.label.json``, sorted by id.

    Args:
        root: folder holding ``videos/`` and ``metas/``.
        video_suffix: text between the id and ``.mp4`` (e.g. ``".camera_front_wide_120fov"`` for
            ``videos/clip7.camera_front_wide_120fov.mp4``); ``""`` for ``videos/<id>.mp4``.
        label_field: field of the label JSON used as the answer (dotted for nested fields, e.g.
            ``"caption.short"``; non-string values are written as JSON); ``""`` uses the whole file's
            text.
        prompt: the user's text after the video.
        system_prompt: the system message; None: none (the chat template may add its default), "": an
            empty one (what cosmos-rl sends).

    ``dataset[i]`` is a :class:`ConversationSample` ``[system?], user: [video, prompt], assistant:
    label``, or raises :class:`BadSampleError` (missing / undecodable video, unreadable label).
    """

    def __init__(self, root: str | Path, video_suffix: str = "", label_field: str = "",
                 prompt: str = "Describe what happens in this video.", system_prompt: str | None = None,
                 settings: MediaSettings | None = None) -> None:
        self.root = Path(root).expanduser()
        self.video_dir, self.meta_dir = self.root / "videos", self.root / "metas"
        for folder in (self.video_dir, self.meta_dir):
            if not folder.is_dir():
                raise FileNotFoundError(f"{folder} does not exist; a video folder dataset needs "
                                        f"{self.root}/videos/<id>{video_suffix}.mp4 and "
                                        f"{self.root}/metas/<id>{LABEL_SUFFIX}")
        self.video_suffix = video_suffix
        self.label_field = label_field
        self.prompt = prompt
        self.system_prompt = system_prompt
        self.settings = settings or MediaSettings()
        self.ids = sorted(p.name[: -len(LABEL_SUFFIX)] for p in self.meta_dir.glob(f"*{LABEL_SUFFIX}"))
        if not self.ids:
            raise FileNotFoundError(f"no *{LABEL_SUFFIX} files in {self.meta_dir}")
        labelled = set(self.ids)
        unlabelled = [p.name for p in self.video_dir.glob(f"*{video_suffix}.mp4")
                      if p.name[: -len(f"{video_suffix}.mp4")] not in labelled]
        if unlabelled:
            get_logger().warning(f"{len(unlabelled)} videos in {self.video_dir} have no label file and are not used "
                                 f"(e.g. {sorted(unlabelled)[:3]})")

    @classmethod
    def from_config(cls, cfg: DatasetConfig, processor: Any = None) -> VideoFolderDataset:
        """From a :class:`~cosmos_primitives.config.DatasetConfig` (``name`` is the folder); videos
        are sized for ``processor`` (its patch size)."""
        return cls(cfg.name, video_suffix=cfg.video_suffix, label_field=cfg.label_field, prompt=cfg.prompt,
                   system_prompt=cfg.system_prompt, settings=MediaSettings.from_config(cfg, processor))

    def __len__(self) -> int:
        return len(self.ids)

    def video_path(self, index: int) -> Path:
        return self.video_dir / f"{self.ids[index]}{self.video_suffix}.mp4"

    def label_text(self, index: int) -> str:
        """The assistant answer of sample ``index``."""
        path = self.meta_dir / f"{self.ids[index]}{LABEL_SUFFIX}"
        try:
            text = path.read_text(encoding="utf-8")
            if not self.label_field:
                json.loads(text)  # a broken label file is a bad sample, not a training target
                return text.strip()
            value: Any = json.loads(text)
            for key in self.label_field.split("."):
                if not isinstance(value, dict) or key not in value:
                    fields = sorted(value) if isinstance(value, dict) else type(value).__name__
                    raise BadSampleError(str(path), f"no field {self.label_field!r} (at {key!r}; has {fields})")
                value = value[key]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadSampleError(str(path), f"unreadable label file: {exc}") from exc
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def conversation(self, index: int) -> list[dict[str, Any]]:
        messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        messages.append({"role": "user", "content": [{"type": "video", "video": str(self.video_path(index))},
                                                     {"type": "text", "text": self.prompt}]})
        messages.append({"role": "assistant", "content": self.label_text(index)})
        return messages

    def __getitem__(self, index: int) -> ConversationSample:
        with bad_sample_boundary(str(self.video_path(index))):
            return load_conversation(self.conversation(index), None, self.settings, sample_id=self.ids[index])
