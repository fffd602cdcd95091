"""Quickstart: a tiny vision-language model learns colour MCQ on a CPU, with SFT then GRPO.

    python examples/quickstart.py            # or: make demo
    python examples/quickstart.py --family qwen3_vl   # the same with a tiny Qwen3-VL (Cosmos-Reason2's family)

1. Generate data: solid-colour images, "Which colour fills the image?" with four choices
   (train and held-out test splits), and SFT conversations whose answers follow the
   "<think> ... </think> <answer> X </answer>" format. As SFT data often does, they come from an
   imperfect teacher: it mistakes blue for green and yellow for red two times in three.
2. SFT a randomly initialised tiny Qwen2.5-VL (or Qwen3-VL) (examples/sft.py) and evaluate it on the held-out set:
   it learns the format and imitates the teacher, mistakes included.
3. GRPO from the SFT export (examples/grpo_vlm.py, rewards: format + single_choice against the true
   answers) and evaluate again: the reward corrects the teacher's mistakes.
4. Print held-out accuracy and format rate after SFT and after GRPO; write the reward curve PNG
   and summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.config import EvalConfig
from cosmos_primitives.rewards import get_reward

EXAMPLES = Path(__file__).resolve().parent
HIDDEN_SIZE = 128
# the tiny model of each family: Qwen2.5-VL (Cosmos-Reason1) or Qwen3-VL (Cosmos-Reason2)
FAMILIES = {"qwen2_5_vl": ("Qwen2.5-VL", cpt.save_tiny_qwen2_5_vl), "qwen3_vl": ("Qwen3-VL", cpt.save_tiny_qwen3_vl)}
# The SFT traces come from an imperfect teacher: it mistakes blue for green and yellow for red two
# times in three. SFT imitates it, mistakes included; GRPO, rewarded with the true answers, has
# something to correct.
TEACHER_MISTAKES = {"blue": "green", "yellow": "red"}
TEACHER_MISTAKE_RATE = 2 / 3


def run_recipe(script: str, config: str, overrides: list[str]) -> None:
    cmd = [sys.executable, str(EXAMPLES / script), "--config", str(EXAMPLES / "configs" / config), *overrides]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)


def final_export(output_dir: Path) -> Path:
    """``<output_dir>/<newest timestamp>/safetensors/final``."""
    run = cp.utils.latest_run_dir(output_dir)
    if run is None or not (cp.checkpoint.final_export_dir(run) / "config.json").is_file():
        raise SystemExit(f"no exported model under {output_dir}: did the recipe fail?")
    return cp.checkpoint.final_export_dir(run)


def evaluate(model: Path, benchmark: Path, results: Path) -> dict[str, float]:
    """Greedy held-out accuracy and format rate of an exported model."""
    # greedy, and worded as the recipes trained it: the tiny model has seen no other prompt (the guide's
    # "your single letter answer" and system message leave it answering nothing)
    cfg = EvalConfig(temperature=0.0, max_response_length=32, batch_size=64, skip_saved=False, max_retries=0,
                     prompt="training")
    report = cp.eval.evaluate(str(model), str(benchmark), results_dir=results, cfg=cfg, print_table=False)
    outputs = [r["full_response"] for r in report.records]
    format_reward = get_reward("format")
    fmt = sum(float(format_reward(completion=o)) for o in outputs) / max(len(outputs), 1)
    overall = report.table["overall"]
    return {"accuracy": overall["correct"] / max(overall["total"], 1), "format": fmt, "items": overall["total"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="./outputs/quickstart")
    parser.add_argument("--train-items", type=int, default=256)
    parser.add_argument("--test-items", type=int, default=64)
    parser.add_argument("--sft-steps", type=int, default=None, help="override quickstart_sft.toml max_steps")
    parser.add_argument("--grpo-steps", type=int, default=None, help="override grpo_tiny.toml max_steps")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model init, the generated data and both runs")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2_5_vl",
                        help="the tiny model's family: qwen2_5_vl (Cosmos-Reason1's) or qwen3_vl (Cosmos-Reason2's)")
    args = parser.parse_args()
    start = time.perf_counter()
    out = Path(args.output_dir).resolve()
    data, models = out / "data", out / "models"

    family_name, save_tiny_model = FAMILIES[args.family]
    print(f"== 1. data and a random tiny {family_name}", flush=True)
    train = cpt.write_colour_mcq(data, args.train_items, seed=args.seed, split="train")
    test = cpt.write_colour_mcq(data, args.test_items, seed=args.seed, split="test")
    sft_rows = cpt.write_colour_mcq_sft(data, train, mistakes=TEACHER_MISTAKES, mistake_rate=TEACHER_MISTAKE_RATE,
                                        seed=args.seed)
    # Weights drawn with std 1/sqrt(width): with transformers' default 0.02 (right for a 3,584-wide
    # model) a model this narrow learns to read the image only after long, seed-dependent plateaus.
    base = save_tiny_model(models / "base", seed=args.seed, hidden_size=HIDDEN_SIZE,
                           initializer_range=HIDDEN_SIZE**-0.5)

    print("== 2. SFT", flush=True)
    sft_overrides = [f"policy.model_name_or_path={base}", f"train.output_dir={out / 'sft'}",
                     f"train.train_policy.dataset.name={sft_rows}", f"train.train_policy.dataset.media_dir={data}",
                     f"train.seed={args.seed}"]
    if args.sft_steps is not None:
        sft_overrides.append(f"train.max_steps={args.sft_steps}")
    run_recipe("sft.py", "quickstart_sft.toml", sft_overrides)
    sft_model = final_export(out / "sft")
    after_sft = evaluate(sft_model, test, out / "eval" / "sft")
    print(f"held-out after SFT: accuracy {after_sft['accuracy']:.1%}, format {after_sft['format']:.1%}", flush=True)

    print("== 3. GRPO from the SFT model", flush=True)
    grpo_overrides = [f"policy.model_name_or_path={sft_model}", f"train.output_dir={out / 'grpo'}",
                      f"train.train_policy.dataset.name={train}", "custom={}", f"train.seed={args.seed}"]
    if args.grpo_steps is not None:
        grpo_overrides.append(f"train.max_steps={args.grpo_steps}")
    run_recipe("grpo_vlm.py", "grpo_tiny.toml", grpo_overrides)
    grpo_model = final_export(out / "grpo")
    after_grpo = evaluate(grpo_model, test, out / "eval" / "grpo")
    grpo_run = grpo_model.parent.parent

    summary = {
        "after_sft": after_sft,
        "after_grpo": after_grpo,
        "accuracy_gain_points": 100 * (after_grpo["accuracy"] - after_sft["accuracy"]),
        "reward_curve": str(grpo_run / "curves.png"),
        "sft_model": str(sft_model),
        "grpo_model": str(grpo_model),
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n== Quickstart result (held-out colour MCQ, greedy decoding)")
    print(f"{'':12} {'accuracy':>9} {'format':>8}")
    for name, row in (("after SFT", after_sft), ("after GRPO", after_grpo)):
        print(f"{name:12} {row['accuracy']:>9.1%} {row['format']:>8.1%}")
    print(f"\nreward curve: {summary['reward_curve']}\nsummary:      {out / 'summary.json'}"
          f"\ntime:         {summary['seconds']:.0f} s")


if __name__ == "__main__":
    main()
