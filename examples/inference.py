"""Run one model on one video or image with a prompt and print its answer.

    python examples/inference.py --model outputs/sft/<timestamp>/safetensors/final \\
        --video clip.mp4 --prompt "What is the robot about to do?"
    python examples/inference.py --model nvidia/Cosmos-Reason1-7B --image frame.png \\
        --prompt "Is it safe to cross?" --reasoning --temperature 0

``--reasoning`` appends the Cosmos-Reason instruction to answer as ``<think>...</think>
<answer>...</answer>``. ``--system`` sets the system message ("" sends an empty one; left out,
the model's chat template decides). Videos are sampled at ``--fps`` frames per second.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from cosmos_primitives.data.conversation import load_conversation
from cosmos_primitives.data.mcq import FORMAT_INSTRUCTION
from cosmos_primitives.data.media import MediaSettings
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.eval import load_eval_engine


def _number(kind: type, low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite ``kind`` in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    def parse(text: str) -> float:
        value = kind(text)
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            where = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: expects a finite {kind.__name__} {where}")
        return value
    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "--model_name", dest="model", required=True,
                        help="exported safetensors folder, HF model folder or hub id")
    media = parser.add_mutually_exclusive_group()
    media.add_argument("--video", help="a video file")
    media.add_argument("--image", help="an image file")
    parser.add_argument("--prompt", required=True, help="the question or instruction")
    parser.add_argument("--system", default=None, help='system message ("" sends an empty one)')
    parser.add_argument("--reasoning", action="store_true", help="ask for <think>...</think> <answer>...</answer>")
    parser.add_argument("--fps", type=_number(float, 0, low_open=True), default=4.0)
    parser.add_argument("--max-pixels", type=_number(int, 1), default=81920)
    parser.add_argument("--temperature", type=_number(float, 0), default=0.6, help="0 decodes greedily")
    parser.add_argument("--top-p", type=_number(float, 0, 1, low_open=True), default=0.95)
    parser.add_argument("--max-response-length", "--max-tokens", dest="max_response_length", type=_number(int, 1),
                        default=1024, help="new tokens per answer (--max-tokens: its older spelling)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    content: list[dict] = []
    for kind in ("video", "image"):
        path = getattr(args, kind)
        if path is not None:
            if not Path(path).is_file():
                raise SystemExit(f"--{kind} {path}: no such file")
            content.append({"type": kind, kind: str(Path(path).resolve())})
    content.append({"type": "text", "text": args.prompt + (FORMAT_INSTRUCTION if args.reasoning else "")})
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
    messages.append({"role": "user", "content": content})
    loaded = load_conversation(messages, None, MediaSettings(fps=args.fps, max_pixels=args.max_pixels),
                               sample_id="inference")
    prompt = Prompt(conversation=loaded.conversation, prompt_id="inference", images=loaded.images,
                    videos=loaded.videos, video_fps=loaded.video_fps)
    engine = load_eval_engine(args.model, backend=args.backend, dtype=args.dtype, seed=args.seed)
    params = SamplingParams(num_samples_per_prompt=1, temperature=args.temperature,
                            top_p=args.top_p if args.temperature > 0 else 1.0,
                            max_response_length=args.max_response_length, seed=args.seed)
    (group,) = engine.generate([prompt], params)
    answer = group.completions[0].text
    print(answer)
    return answer


if __name__ == "__main__":
    main()
