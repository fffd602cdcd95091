"""Cosmos-Predict2.5's text conditioning computed ahead of a run with a Cosmos-Reason1-style text
encoder, into safetensors files the clip loader reads (``[wfm.data] kind = "clip_folder"``,
``text_encoder = "none"``); the command line is
``python -m cosmos_primitives.data.precompute_text_embeddings`` (:mod:`.precompute_text_embeddings`).

For every caption ``<folder>/metas/<name>.txt`` :func:`precompute_clip_folder` writes
``<folder>/text_embedding/<name>.safetensors`` (one tensor ``text_embedding``, ``[max_tokens, layers x hidden]``,
float16 by default), and with ``negative_prompt`` also ``<folder>/negative_prompt.safetensors`` for
``[wfm.data] negative_embedding``. Existing files are kept unless ``overwrite``. Never pickle.
The embedding is the one Cosmos-Predict2.5 is conditioned on (diffusers' ``Cosmos2_5_PredictBasePipeline``):
the caption as the user turn of a chat with a fixed system prompt, tokenized with the encoder's chat
template and padded / cut to ``max_tokens``; every decoder layer's hidden state (not the input
embeddings), each normalised over its features (``(h - mean) / (std + 1e-8)``), concatenated along
the features: 28 layers x 3584 = 100352 wide for the Qwen2.5-VL-7B of Cosmos-Reason1. All
``max_tokens`` rows are kept (the model was trained on the padded sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."
"""The system turn of Cosmos-Predict2.5's prompt encoding."""
NEGATIVE_FILE = "negative_prompt.safetensors"
_DTYPES = {"float16": torch.float16, "float32": torch.float32}  # numpy-readable (the loader reads numpy)


def prompt_token_ids(tokenizer: Any, captions: Sequence[str], max_tokens: int) -> torch.Tensor:
    """``[B, max_tokens]`` int64: each caption as the user turn after :data:`SYSTEM_PROMPT`, through the
    tokenizer's chat template, padded / cut to ``max_tokens``."""
    rows = []
    for caption in captions:
        chat = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "user", "content": [{"type": "text", "text": caption}]}]
        ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=False, add_vision_id=False,
                                            max_length=max_tokens, truncation=True, padding="max_length")
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        rows.append(torch.as_tensor(ids, dtype=torch.long).reshape(-1))
    return torch.stack(rows)


@torch.no_grad()
def reason_text_embeddings(model: Any, tokenizer: Any, captions: Sequence[str], max_tokens: int = 512) -> torch.Tensor:
    """``[B, max_tokens, num_layers * hidden]`` float32: every layer's normalised hidden states, concatenated.

    ``model``: the text encoder (a Qwen2.5-VL ``...ForConditionalGeneration`` or its decoder); only
    its decoder runs (no LM head).
    """
    decoder = getattr(model, "model", model)  # the LM head's logits are not needed
    device = next(decoder.parameters()).device
    ids = prompt_token_ids(tokenizer, captions, max_tokens).to(device)
    hidden = decoder(input_ids=ids, output_hidden_states=True).hidden_states  # embeddings, then each layer
    layers = []
    for h in hidden[1:]:
        h = h.float()
        layers.append((h - h.mean(dim=-1, keepdim=True)) / (h.std(dim=-1, keepdim=True) + 1e-8))
    return torch.cat(layers, dim=-1)


def precompute_clip_folder(folder: str | Path, model: Any, tokenizer: Any, *, max_tokens: int = 512,
                           dtype: str = "float16", batch_size: int = 4, overwrite: bool = False,
                           negative_prompt: str | None = None) -> list[Path]:
    """Write ``text_embedding/<name>.safetensors`` for each ``metas/<name>.txt`` of ``folder`` (and
    ``negative_prompt.safetensors`` when ``negative_prompt`` is given); returns the files written.

    Raises:
        FileNotFoundError: ``folder`` has no ``metas/*.txt``.
        ValueError: an unknown ``dtype``.
    """
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(_DTYPES)} (the clip loader reads them), got {dtype!r}")
    folder = Path(folder)
    metas = sorted((folder / "metas").glob("*.txt"))
    if not metas:
        raise FileNotFoundError(f"{folder / 'metas'} holds no captions (*.txt); a clip folder has videos/<name>.mp4 "
                                "and metas/<name>.txt")
    out_dir = folder / "text_embedding"
    out_dir.mkdir(exist_ok=True)
    jobs = [(m.read_text().strip(), out_dir / f"{m.stem}.safetensors") for m in metas]
    if negative_prompt is not None:
        jobs.append((negative_prompt, folder / NEGATIVE_FILE))
    jobs = [(caption, path) for caption, path in jobs if overwrite or not path.exists()]
    written = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        embeddings = reason_text_embeddings(model, tokenizer, [c for c, _ in chunk], max_tokens)
        for (_, path), emb in zip(chunk, embeddings):
            tmp = path.with_name(path.name + ".tmp")
            save_file({"text_embedding": emb.to(_DTYPES[dtype]).cpu().contiguous()}, str(tmp))
            tmp.replace(path)  # a killed run leaves no half-written embedding behind
            written.append(path)
    return written
