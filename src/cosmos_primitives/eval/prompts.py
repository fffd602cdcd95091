"""The chat prompt of a benchmark item, worded as the Cosmos-Reason1 guide's evaluation tool words it.

The tool (cosmos-reason1 ``examples/benchmark/tools/eval/utils/input.py``, ``get_prompt`` and
``prepare_single_model_input``) sends, for an MCQ item::

    system: "Answer the questions."
    user:   [{"type": "video", "video": <clip>, "fps": <fps>},
             {"type": "text", "text": question + "\\n" + "(A) ..." lines
                                     + "\\nAnswer with the option's letter from the given choices directly."
                                     + "\\nPlease answer the question in the following format: <think> your
                                        reasoning </think> <answer> your single letter answer </answer>."}]

(the last line only for ``answer_type = "reasoning"``; the choices in the order the item lists
them). :func:`item_conversation` builds exactly that; the video part carries only the sampling
rate, so ``cp.data`` encodes the clip as qwen-vl-utils does a part without pixel bounds (the
``[eval]`` media keys hold qwen-vl-utils' defaults).

``style = "training"`` words the prompt as the Cosmos-Reason1 RL recipe trains on it
(``cp.data.mcq.mcq_prompt_text``: "<answer> your answer </answer>", no system message unless one
is given), for a model that has only seen that prompt (the quickstart's tiny model).

Beyond the tool: image items (an ``image`` part in the video's place), several media, and
open-ended items (no choices: the question, plus the training format line for ``"reasoning"``;
the tool can only ask for a letter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.mcq import ANSWER_INSTRUCTION, FORMAT_INSTRUCTION
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.records import Prompt
from cosmos_primitives.eval.benchmark import BenchmarkItem

AnswerType = Literal["reasoning", "letter"]
ANSWER_TYPES = ("reasoning", "letter")
PromptStyle = Literal["guide", "training"]
PROMPT_STYLES = ("guide", "training")
GUIDE_SYSTEM_PROMPT = "Answer the questions."
LETTER_FORMAT_INSTRUCTION = ("\nPlease answer the question in the following format: "
                             "<think> your reasoning </think> <answer> your single letter answer </answer>.")


def check_answer_type(answer_type: str) -> None:
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"[eval] answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")


def check_prompt_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"[eval] prompt must be one of {PROMPT_STYLES}, got {style!r}")


def system_prompt_for(style: PromptStyle, system_prompt: str | None) -> str:
    """``system_prompt`` when given (``""``: none), else the style's: the guide's
    "Answer the questions.", none for ``"training"``."""
    check_prompt_style(style)
    if system_prompt is not None:
        return system_prompt
    return GUIDE_SYSTEM_PROMPT if style == "guide" else ""


def prompt_text(item: BenchmarkItem, answer_type: AnswerType = "reasoning", style: PromptStyle = "guide") -> str:
    """The user text of ``item``'s prompt (see the module docstring)."""
    check_answer_type(answer_type)
    check_prompt_style(style)
    if item.choices is None:
        return item.question + (FORMAT_INSTRUCTION if answer_type == "reasoning" else "")
    lines = "\n".join(f"({letter}) {text}" for letter, text in item.choices)
    text = item.question + "\n" + lines + ANSWER_INSTRUCTION
    if answer_type == "letter":
        return text
    return text + (LETTER_FORMAT_INSTRUCTION if style == "guide" else FORMAT_INSTRUCTION)


def item_conversation(item: BenchmarkItem, answer_type: AnswerType = "reasoning",
                      system_prompt: str = GUIDE_SYSTEM_PROMPT, fps: float | None = None,
                      style: PromptStyle = "guide") -> list[dict[str, Any]]:
    """``[system?], user: [media parts..., text]`` with media paths as written in the item; video
    parts carry ``fps`` when it is given (the tool's part), nothing else."""
    content: list[dict[str, Any]] = []
    for kind, path in item.media:
        part: dict[str, Any] = {"type": kind, kind: path}
        if kind == "video" and fps is not None:
            part["fps"] = fps
        content.append(part)
    content.append({"type": "text", "text": prompt_text(item, answer_type, style)})
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": content})
    return messages


def load_item_prompt(item: BenchmarkItem, answer_type: AnswerType, data_dir: str | Path | None,
                     settings: MediaSettings, system_prompt: str = GUIDE_SYSTEM_PROMPT,
                     processor_fps: float = 0.0, style: PromptStyle = "guide") -> Prompt:
    """A rollout :class:`Prompt` for ``item`` with its media read by ``cp.data`` (videos sampled at
    ``settings.fps``).

    ``processor_fps`` > 0: the frame rate the model's processor is told for every video (its time
    positions), instead of the rate the frames were sampled at (see ``[eval] processor_fps``).

    Raises:
        cosmos_primitives.data.BadSampleError: a media file is missing or undecodable (``.path``
            names it).
    """
    conversation = item_conversation(item, answer_type, system_prompt, fps=settings.fps, style=style)
    loaded = load_conversation(conversation, data_dir, settings, sample_id=item.id)
    video_fps = [processor_fps] * len(loaded.videos) if processor_fps > 0 else loaded.video_fps
    return Prompt(conversation=loaded.conversation, prompt_id=item.id, images=loaded.images,
                  videos=loaded.videos, video_fps=video_fps, reference=item.answer, row=item.row)
