"""A generated colour-MCQ task for demos and learning tests: "Which colour fills the image?".

Each item is a solid-colour image (with pixel noise) and four colour choices; the answer is the
letter of the colour that fills the image. Rows follow the Cosmos-Reason1-RL layout (``image``,
``question``, ``choices``, ``answer``) so the regular MCQ prompt adapter and evaluator read them,
and :func:`colour_mcq_sft_rows` turns them into ``conversations`` rows for SFT.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmos_primitives.testing.media import COLOURS, color_image, write_image

QUESTION = "Which colour fills the image?"
COLOUR_NAMES = tuple(COLOURS)


def colour_mcq_rows(n: int, seed: int, split: str = "train", shuffle_choices: bool = False) -> list[dict[str, Any]]:
    """``n`` item descriptions (no files written): id, colour, choices, answer letter, image path."""
    rng = random.Random(f"{split}-{seed}")
    rows = []
    for i in range(n):
        colour = rng.choice(COLOUR_NAMES)
        choices = list(COLOUR_NAMES)
        if shuffle_choices:
            rng.shuffle(choices)
        rows.append({
            "id": f"{split}-{i}",
            "dataset": "colour_mcq",
            "image": f"images/{split}_{i}.png",
            "question": QUESTION,
            "choices": choices,
            "answer": "ABCD"[choices.index(colour)],
            "colour": colour,
            "noise_seed": rng.randrange(2**31),
        })
    return rows


def write_colour_mcq(root: str | Path, n: int, seed: int = 0, split: str = "train", *, noise: float = 20.0,
                     shuffle_choices: bool = False, size: tuple[int, int] = (56, 56)) -> Path:
    """Write ``n`` items (PNG images + ``<split>.jsonl``) under ``root``; returns the JSONL path.

    Image paths in the rows are relative to ``root`` (use ``root`` as the media dir).
    """
    root = Path(root)
    rows = colour_mcq_rows(n, seed, split, shuffle_choices)
    for row in rows:
        write_image(root / row["image"], color_image(row["colour"], size=size, noise=noise, seed=row["noise_seed"]))
    path = root / f"{split}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reasoning_answer(row: dict[str, Any], colour: str | None = None) -> str:
    """The target completion an SFT run teaches: a short reasoning naming the colour (``row``'s own
    unless ``colour`` is given), then the letter of that colour among the row's choices."""
    from cosmos_primitives.data.mcq import answer_letter

    colour = colour or row["colour"]
    return f"<think>The image is {colour}.</think>\n\n<answer>{answer_letter(colour, row['choices'])}</answer>"


def colour_mcq_sft_rows(rows: Sequence[dict[str, Any]], mistakes: Mapping[str, str] | None = None,
                        mistake_rate: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """Cosmos-Reason1-SFT style rows (``conversations``) whose user turn is the exact MCQ prompt.

    The assistant turns are the traces of a teacher that is right, except that for a row whose
    colour is a key of ``mistakes`` it names (and answers) ``mistakes[colour]`` instead, with
    probability ``mistake_rate`` (drawn per row from ``seed``). An SFT model imitates such a
    teacher, mistakes included; RL with the true answers as reward can correct them.
    """
    from cosmos_primitives.data.mcq import mcq_prompt_text

    mistakes = dict(mistakes or {})
    unknown = sorted((set(mistakes) | set(mistakes.values())) - set(COLOUR_NAMES))
    if unknown:
        raise ValueError(f"mistakes {mistakes}: {unknown} are not colours of the task {list(COLOUR_NAMES)}")
    if not 0.0 <= mistake_rate <= 1.0:
        raise ValueError(f"mistake_rate must be in [0, 1], got {mistake_rate}")
    rng = random.Random(f"teacher-{seed}")
    out = []
    for row in rows:
        wrong = row["colour"] in mistakes and rng.random() < mistake_rate
        user = [{"type": "image", "image": row["image"]},
                {"type": "text", "text": mcq_prompt_text(row["question"], row["choices"])}]
        answer = reasoning_answer(row, mistakes[row["colour"]] if wrong else None)
        out.append({"id": row["id"], "conversations": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]})
    return out


def write_colour_mcq_sft(root: str | Path, jsonl: str | Path, mistakes: Mapping[str, str] | None = None,
                         mistake_rate: float = 0.0, seed: int = 0) -> Path:
    """Write ``<jsonl stem>_sft.jsonl`` under ``root``: the SFT rows of the items of ``jsonl``
    (teacher mistakes as in :func:`colour_mcq_sft_rows`)."""
    jsonl = Path(jsonl)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    out = Path(root) / f"{jsonl.stem}_sft.jsonl"
    sft_rows = colour_mcq_sft_rows(rows, mistakes, mistake_rate, seed)
    out.write_text("".join(json.dumps(r) + "\n" for r in sft_rows))
    return out
