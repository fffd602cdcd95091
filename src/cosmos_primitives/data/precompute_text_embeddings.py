"""Precompute the text embeddings of a clip folder with a Cosmos-Reason1-style text encoder, into
safetensors files the clip loader reads (``[wfm.data] kind = "clip_folder"``, ``text_encoder = "none"``)::

    python -m cosmos_primitives.data.precompute_text_embeddings datasets/my_clips \\
        --encoder /path/to/Cosmos-Reason1-7B --max-tokens 512 --negative-prompt "" --device cuda

For every caption ``<folder>/metas/<name>.txt`` it writes ``<folder>/text_embedding/<name>.safetensors``
(one tensor ``text_embedding``, ``[max_tokens, layers x hidden]``, float16 by default), and with
``--negative-prompt`` also ``<folder>/negative_prompt.safetensors`` for ``[wfm.data] negative_embedding``.
Existing files are kept unless ``--overwrite``. Never pickle.

The embedding is the one Cosmos-Predict2.5 is conditioned on (diffusers' ``Cosmos2_5_PredictBasePipeline``):
the caption as the user turn of a chat with a fixed system prompt, tokenized with the encoder's chat
template and padded / cut to ``max_tokens``; every decoder layer's hidden state (not the input
embeddings), each normalised over its features (``(h - mean) / (std + 1e-8)``), concatenated along
the features: 28 layers x 3584 = 100352 wide for the Qwen2.5-VL-7B of Cosmos-Reason1. All
``max_tokens`` rows are kept (the model was trained on the padded sequence).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from cosmos_primitives.data.text_embeddings import _DTYPES, precompute_clip_folder


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="clip folder: videos/<name>.mp4, metas/<name>.txt")
    parser.add_argument("--encoder", required=True, help="text encoder folder or Hub id (Cosmos-Reason1-7B)")
    parser.add_argument("--max-tokens", type=int, default=512, help="[wfm.data] max_tokens (512 for Predict2.5)")
    parser.add_argument("--dtype", default="float16", choices=sorted(_DTYPES), help="stored dtype")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--negative-prompt", default=None, help="also embed this into negative_prompt.safetensors")
    parser.add_argument("--overwrite", action="store_true", help="recompute existing files")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from cosmos_primitives.logging.console import get_logger
    from cosmos_primitives.policy.hf_loading import load_hf_model

    model = load_hf_model(args.encoder, dtype="bfloat16" if args.device != "cpu" else "float32")
    model.to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.encoder)
    written = precompute_clip_folder(args.folder, model, tokenizer, max_tokens=args.max_tokens, dtype=args.dtype,
                                     batch_size=args.batch_size, overwrite=args.overwrite,
                                     negative_prompt=args.negative_prompt)
    get_logger().info("Wrote %d text embeddings under %s", len(written), args.folder)
    return written


if __name__ == "__main__":
    main()
