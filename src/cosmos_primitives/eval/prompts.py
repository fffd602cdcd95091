"""Prompt text and rollout prompts (media loaded) for benchmark items.

MCQ items with ``answer_type = "reasoning"`` get the Cosmos-Reason RL prompt of REFERENCE.md
section 1, built by :func:`cosmos_primitives.data.mcq.mcq_prompt_text` (the same text GRPO trains on):
question, ``(letter) choice`` lines, the answer-letter instruction and the ``<think>`` / ``<answer>``
format instruction. ``"letter"`` keeps the answer-letter instruction and drops the format one.
Open-ended items get the question (plus the format instruction for ``"reasoning"``).

The reference evaluation tool's reasoning prompt says "your single letter answer" where the
training prompt says "your answer"; the training prompt is used here so that evaluation measures
the task the model was trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.mcq import ANSWER_INSTRUCTION, FORMAT_INSTRUCTION, mcq_prompt_text
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.records import Prompt
from cosmos_primitives.eval.benchmark import BenchmarkItem

AnswerType = Literal["reasoning", "letter"]
ANSWER_TYPES = ("reasoning", "letter")


def check_answer_type(answer_type: str) -> None:
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"[eval] answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")


def prompt_text(item: BenchmarkItem, answer_type: AnswerType = "reasoning") -> str:
    """The user text of ``item``'s prompt (see the module docstring)."""
    check_answer_type(answer_type)
    if item.choices is None:
        return item.question + (FORMAT_INSTRUCTION if answer_type == "reasoning" else "")
    if answer_type == "reasoning":
        return mcq_prompt_text(item.question, dict(item.choices))
    lines = "\n".join(f"({letter}) {text}" for letter, text in item.choices)
    return item.question + "\n" + lines + ANSWER_INSTRUCTION


def item_conversation(item: BenchmarkItem, answer_type: AnswerType = "reasoning",
                      system_prompt: str = "") -> list[dict[str, Any]]:
    """``[system?], user: [media parts..., text]`` with media paths as written in the item."""
    content: list[dict[str, Any]] = [{"type": kind, kind: path} for kind, path in item.media]
    content.append({"type": "text", "text": prompt_text(item, answer_type)})
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": content})
    return messages


def load_item_prompt(item: BenchmarkItem, answer_type: AnswerType, data_dir: str | Path | None,
                     settings: MediaSettings, system_prompt: str = "") -> Prompt:
    """A rollout :class:`Prompt` for ``item`` with its media read (videos sampled at ``settings.fps``).

    Raises:
        cosmos_primitives.data.BadSampleError: a media file is missing or undecodable (``.path``
            names it).
    """
    loaded = load_conversation(item_conversation(item, answer_type, system_prompt), data_dir, settings,
                               sample_id=item.id)
    return Prompt(conversation=loaded.conversation, prompt_id=item.id, images=loaded.images,
                  videos=loaded.videos, video_fps=loaded.video_fps, reference=item.answer, row=item.row)
