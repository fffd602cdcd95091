"""MCQ prompts for GRPO / evaluation from Cosmos-Reason1-RL style rows (a video or image, a question,
choices and the answer letter), with the Cosmos-Reason prompt text."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos_primitives.config.dataset import DatasetConfig
from cosmos_primitives.data.bad_samples import BadSampleError, bad_sample_boundary
from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.media import MediaSettings, default_media_dir
from cosmos_primitives.data.records import Prompt

ANSWER_INSTRUCTION = "\nAnswer with the option's letter from the given choices directly."
FORMAT_INSTRUCTION = ("\nPlease answer the question in the following format: "
                      "<think> your reasoning </think> <answer> your answer </answer>.")


def mcq_choices(choices: Any, where: str = "row") -> list[tuple[str, str]]:
    """``[(letter, text), ...]`` from a list (lettered A, B, C, ...), a ``{letter: text}`` dict
    (kept in its order) or the JSON text of either."""
    if isinstance(choices, str):
        try:
            choices = json.loads(choices)
        except json.JSONDecodeError as exc:
            raise BadSampleError(where, f"choices must be a list, a dict or their JSON, got {choices[:100]!r}") from exc
    if isinstance(choices, dict):
        pairs = [(str(k).strip(), str(v)) for k, v in choices.items() if v is not None]
    elif isinstance(choices, (list, tuple)):
        if len(choices) > 26:
            raise BadSampleError(where, f"{len(choices)} choices is more than the 26 letters A-Z")
        pairs = [(string.ascii_uppercase[i], str(c)) for i, c in enumerate(choices)]
    else:
        raise BadSampleError(where, f"choices must be a list or a dict, got {type(choices).__name__}")
    if not pairs:
        raise BadSampleError(where, "no choices")
    return pairs


def mcq_prompt_text(question: str, choices: Any) -> str:
    """The Cosmos-Reason MCQ prompt: the question, one ``(letter) choice`` line per choice, then the
    answer-letter and ``<think>`` / ``<answer>`` format instructions."""
    lines = "\n".join(f"({letter}) {text}" for letter, text in mcq_choices(choices))
    return question + "\n" + lines + ANSWER_INSTRUCTION + FORMAT_INSTRUCTION


def answer_letter(answer: Any, choices: Any, where: str = "row") -> str:
    """The letter of the right choice: ``answer`` may be the letter (``"B"``, ``"(B)"``, ``"B."``,
    ``"<answer>B</answer>"``), a 0-based index, or the text of a choice."""
    pairs = mcq_choices(choices, where)
    letters = [letter for letter, _ in pairs]
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < len(pairs):
            return letters[answer]
        raise BadSampleError(where, f"answer index {answer} is outside the {len(pairs)} choices")
    text = str(answer).strip()
    inner = re.fullmatch(r"<answer>(.*)</answer>", text, flags=re.S)
    if inner:
        text = inner.group(1).strip()
    bare = re.fullmatch(r"\(?\s*([A-Za-z])\s*[).:]?", text)
    if bare and bare.group(1).upper() in {x.upper() for x in letters}:
        return next(x for x in letters if x.upper() == bare.group(1).upper())
    for letter, choice in pairs:
        if choice.strip().lower() == text.lower():
            return letter
    raise BadSampleError(where, f"answer {answer!r} is not one of the choice letters {letters} nor a choice's text")


def _field(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


class MCQPromptDataset:
    """Rollout prompts from MCQ rows.

    Args:
        rows: a ``datasets.Dataset`` or a sequence of dict rows.
        media_dir: folder relative media paths are taken under.
        question_column, choices_column, answer_column, video_column, image_column: field names
            (dotted for nested fields, e.g. ``"qa_pairs.index2ans"``). A row uses its video when it
            has one, else its image, else it is text only.
        system_prompt: the system message; None: none (the chat template may add its default), "": an
            empty one (what cosmos-rl sends).

    ``dataset[i]`` is a :class:`~cosmos_primitives.data.records.Prompt` whose conversation is
    ``[system?], user: [media part, prompt text]`` with media loaded, ``reference`` the answer letter
    and ``row`` the dataset row; or raises :class:`BadSampleError` (missing media, bad answer).
    """

    def __init__(self, rows: Sequence[dict[str, Any]] | Any, media_dir: str | Path | None = None,
                 settings: MediaSettings | None = None, question_column: str = "question",
                 choices_column: str = "choices", answer_column: str = "answer", video_column: str = "video",
                 image_column: str = "image", system_prompt: str | None = None, name: str = "dataset") -> None:
        self.rows = rows
        self.media_dir = media_dir
        self.settings = settings or MediaSettings()
        self.question_column, self.choices_column, self.answer_column = question_column, choices_column, answer_column
        self.video_column, self.image_column = video_column, image_column
        self.system_prompt = system_prompt
        self.name = name

    @classmethod
    def from_config(cls, cfg: DatasetConfig, rows: Sequence[dict[str, Any]] | Any | None = None,
                    processor: Any = None) -> MCQPromptDataset:
        """From a :class:`~cosmos_primitives.config.DatasetConfig` (rows loaded from ``cfg.name``
        unless given); media are sized for ``processor`` (its patch size)."""
        if rows is None:
            from cosmos_primitives.data.hf_conversations import load_hf_dataset

            rows = load_hf_dataset(cfg.name, split=cfg.split, subset=cfg.subset, revision=cfg.revision)
        return cls(rows, media_dir=default_media_dir(cfg), settings=MediaSettings.from_config(cfg, processor),
                   question_column=cfg.question_column, choices_column=cfg.choices_column,
                   answer_column=cfg.answer_column, video_column=cfg.video_column, image_column=cfg.image_column,
                   system_prompt=cfg.system_prompt, name=cfg.name or "dataset")

    def __len__(self) -> int:
        return len(self.rows)

    def conversation(self, index: int) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
        """``(conversation with stored media paths, answer letter, row)`` of row ``index``."""
        row = dict(self.rows[index])
        where = f"{self.name}[{index}]"
        question = _field(row, self.question_column)
        choices = _field(row, self.choices_column)
        answer = _field(row, self.answer_column)
        missing = [c for c, v in ((self.question_column, question), (self.choices_column, choices),
                                  (self.answer_column, answer)) if v is None]
        if missing:
            raise BadSampleError(where, f"missing field(s) {missing}; row has {sorted(row)}")
        content: list[dict[str, Any]] = []
        video, image = _field(row, self.video_column), _field(row, self.image_column)
        if video:
            content.append({"type": "video", "video": str(video)})
        elif image:
            content.append({"type": "image", "image": str(image)})
        mcq_choices(choices, where)  # raises naming this row when the choices are malformed
        content.append({"type": "text", "text": mcq_prompt_text(str(question), choices)})
        messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        messages.append({"role": "user", "content": content})
        return messages, answer_letter(answer, choices, where), row

    def __getitem__(self, index: int) -> Prompt:
        with bad_sample_boundary(f"{self.name}[{index}]"):  # a malformed row is a bad sample
            messages, letter, row = self.conversation(index)
            prompt_id = str(row.get("id", f"{self.name}[{index}]"))
            loaded = load_conversation(messages, self.media_dir, self.settings, sample_id=prompt_id)
        return Prompt(conversation=loaded.conversation, prompt_id=prompt_id, images=loaded.images,
                      videos=loaded.videos, video_fps=loaded.video_fps,
                      video_metadata=loaded.video_metadata, reference=letter, row=row)
