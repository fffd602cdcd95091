"""One real cosmos-rl GRPO config runs as a user runs it: cosmos-rl's
``configs/qwen2-5/qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo.toml`` (Qwen2.5 text, one replica of one
rank, ``boxed_math`` reward) under ``torchrun --nproc_per_node 1 examples/grpo_vlm.py`` with only
``policy.model_name_or_path`` and ``train.train_policy.dataset.name`` overridden: every size of the
file is kept (192 rollouts per step = 12 prompts x ``n_generation`` 16, 2048-token responses,
``rollout.batch_size`` 4 prompts per generate call, ``mini_batch`` 2, gradient checkpointing, bf16).

The model is a tiny Qwen2 (the Qwen2.5 architecture) taught, in a few seconds of plain supervised
steps here, to answer a sum as ``\\boxed{N}`` and end its turn, as an instruct model does: a random
model never emits its end token, so every response would run to the file's 2048 tokens (192 of them
per step take far longer than a test may on a CPU). The data are ``prompt`` / ``result`` rows like
the file's Hub dataset, the results in LaTeX (``$7$``) as ``boxed_math`` reads them. The run is
stopped (SIGKILL to the launcher and its ranks, ``kill_when(tree=True)``) once the first optimizer
step's metrics row is written; a SIGTERM would have it finish its second step and save a checkpoint
first (20 s of the distillation file's test), which other tests check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cosmos_primitives.testing.models import tiny_qwen2
from cosmos_primitives.testing.recipe_runs import kill_when, launch_recipe
from cosmos_primitives.testing.tokenizer import qwen_tokenizer

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tests/data/cosmos_rl_configs/cosmos-rl/configs/qwen2-5/qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo.toml"
ITEMS = 48  # four steps of 12 prompts: the run would go on after the row the test waits for
IM_END = 151645


def _sums(n: int) -> list[dict[str, str]]:
    """``n`` sums with answers 3 to 6 only: the tiny model learns the format, not arithmetic, so its
    sampled answers are right about one time in four, and a step's 128 rollouts (the files' seed is
    unset: they differ run to run) hold right and wrong ones (with answers 3 to 17 about one in 15
    was right, and a step's rollouts were all wrong in one suite run)."""
    rows = []
    for i in range(n):
        a, b = i % 3 + 1, (3 * i) % 2 + 2
        rows.append({"prompt": f"What is {a} + {b}? Put the final answer in \\boxed{{}}.", "result": f"${a + b}$"})
    return rows


def _teach_boxed_answers(model: torch.nn.Module, tokenizer, rows: list[dict[str, str]], steps: int) -> None:
    """Full-batch next-token steps on ``prompt -> \\boxed{answer}<|im_end|>`` (loss on the answer only)."""
    pairs = [(tokenizer(r["prompt"])["input_ids"],
              tokenizer("\\boxed{" + r["result"].strip("$") + "}")["input_ids"] + [IM_END]) for r in rows]
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), IM_END)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(pairs):
        ids[i, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        mask[i, :len(prompt) + len(answer)] = 1
        labels[i, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)
    targets = labels[:, 1:] != -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][targets]
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), labels[:, 1:][targets])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 1.0, f"the tiny model did not learn the answer format (loss {loss.item():.2f})"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Qwen2 folder that answers in ``\\boxed{}`` and stops, and a JSONL of prompt / result rows."""
    root = tmp_path_factory.mktemp("cosmos_rl_run")
    rows = _sums(ITEMS)
    data = root / "math_examples.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = qwen_tokenizer()
    model = tiny_qwen2(seed=0)
    _teach_boxed_answers(model, tokenizer, rows, steps=32)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model", data


def _first_step_row(metrics: Path) -> dict | None:
    if not metrics.is_file():
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return next((r for r in rows if r.get("step") == 1 and "reward/mean" in r), None)


@pytest.mark.slow
def test_cosmos_rl_qwen2_5_grpo_config_runs_with_only_paths_overridden(inputs: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    model, data = inputs
    log = tmp_path / "run.log"
    # cwd = tmp_path: the file's output_dir "./outputs/..." lands there
    proc = launch_recipe(REPO / "examples" / "grpo_vlm.py", CONFIG,
                         [f"policy.model_name_or_path={model}", f"train.train_policy.dataset.name={data}"],
                         log, cwd=tmp_path, nproc=1, torchrun=True, new_session=True)
    metrics = tmp_path / "outputs" / "qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo"

    def first_row() -> dict | None:
        found = list(metrics.glob("*/metrics.jsonl")) if metrics.is_dir() else []
        return _first_step_row(found[0]) if found else None

    kill_when(proc, lambda: first_row() is not None, log, "the first optimizer step's metrics row",
              timeout_s=400, tree=True)
    text = log.read_text(errors="replace")
    row = first_row()
    assert row is not None

    # the file's sizes as cosmos-rl means them: 192 rollouts per step and replica = 12 prompts x 16
    assert ("GRPO: 192 rollouts per step and rank: each generation takes grpo.rollout_batch_size = 12 prompts x 16 "
            "samples") in text
    assert "rollout.batch_size = 4 prompts is 64 sequences here" in text
    assert f"{ITEMS // 12} steps x 12 prompts x 16 samples per rank" in text
    assert "policy Qwen2ForCausalLM" in text and "world_size=1" in text
    # the first optimizer step: boxed_math scored every rollout, a finite loss and gradient
    assert 0.0 <= row["reward/boxed_math"] <= 1.0 and row["reward/mean"] == pytest.approx(row["reward/boxed_math"])
    assert 0.0 < row["reward/mean"] < 1.0, row  # some sums right, some wrong: groups with a spread
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0, row
    assert 3 <= row["response_length"] < 2048, row  # answers ended with <|im_end|>, none ran to the cap
    # optm_lr 1e-6, 20 warmup steps clamped to the run's 4 (as cosmos-rl), from 0: step 2's lr is a third of the peak
    assert row["lr"] == pytest.approx(1e-6 / 3)


MULTI_TURN = CONFIG.parent / "qwen2-5-multiturn-3b-p-fsdp1-tp1-r-tp1-pp1-grpo.toml"
DISTILL = CONFIG.parents[1] / "qwen3" / "qwen3-8b-distill.toml"


def _run_to_first_row(config: Path, overrides: list[str], output: str, tmp_path: Path, nproc: int) -> tuple[dict, str]:
    """Run ``config`` under torchrun with ``overrides`` until its first optimizer step's metrics row."""
    log = tmp_path / "run.log"
    proc = launch_recipe(REPO / "examples" / "grpo_vlm.py", config, overrides, log, cwd=tmp_path, nproc=nproc,
                         torchrun=True, new_session=True)
    metrics = tmp_path / "outputs" / output

    def first_row() -> dict | None:
        found = list(metrics.glob("*/metrics.jsonl")) if metrics.is_dir() else []
        return _first_step_row(found[0]) if found else None

    kill_when(proc, lambda: first_row() is not None, log, "the first optimizer step's metrics row",
              timeout_s=560, tree=True)
    row = first_row()
    assert row is not None
    return row, log.read_text(errors="replace")


@pytest.mark.slow
def test_cosmos_rl_multiturn_config_runs_with_only_paths_overridden(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """cosmos-rl's multi-turn file ([rollout.multi_turn_config] enable, tools, 5 assistant turns): with no
    tool agent, as cosmos-rl's default data packer, each episode ends after the model's first turn."""
    model, data = inputs
    row, text = _run_to_first_row(MULTI_TURN, [f"policy.model_name_or_path={model}",
                                               f"train.train_policy.dataset.name={data}"],
                                  "qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo", tmp_path, nproc=1)
    assert "128 rollouts per step and rank" in text
    assert row["episode/turns"] == 1.0 and row["episode/turns_max"] == 1.0, row
    assert row["episode/env_reward"] == 0.0
    assert 0.0 < row["reward/mean"] < 1.0 and row["reward/mean"] == pytest.approx(row["reward/boxed_math"]), row
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0, row


def _tiny_qwen2_for_tp4(seed: int) -> torch.nn.Module:
    """A tiny Qwen2 whose 4 attention and 4 KV heads split over the file's policy ``tp_size = 4``."""
    from transformers import Qwen2ForCausalLM

    model = tiny_qwen2(seed=seed)
    config = model.config
    config.num_key_value_heads = 4
    torch.manual_seed(seed)
    fresh = Qwen2ForCausalLM(config)
    fresh.generation_config = model.generation_config
    return fresh


@pytest.mark.slow
def test_cosmos_rl_distill_config_runs_with_only_paths_overridden(tmp_path: Path) -> None:
    """cosmos-rl's ``configs/qwen3/qwen3-8b-distill.toml`` ([distillation] enable, policy tp_size 4: four
    ranks) with only the policy, teacher and data paths overridden: the file's rollout tp_size = 2 is
    vLLM's, and backend "auto" picks the HF engine on a CPU, which warns and runs one whole model per
    rank. The student is taught the answer format
    as the fixture's model is (its heads split four ways); the teacher is a random tiny Qwen2 of the same
    tokenizer. The step trains on the teacher's per-token reverse KL, the rewards bypassed (as cosmos-rl)."""
    tokenizer = qwen_tokenizer()
    rows = _sums(ITEMS)
    student = _tiny_qwen2_for_tp4(seed=0)
    _teach_boxed_answers(student, tokenizer, rows, steps=32)
    for name, model in (("student", student), ("teacher", _tiny_qwen2_for_tp4(seed=1))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    gsm8k = tmp_path / "gsm8k.jsonl"  # the file's columns: question / answer ("... #### N")
    gsm8k.write_text("".join(json.dumps({"question": r["prompt"], "answer": "so #### " + r["result"].strip("$")})
                             + "\n" for r in rows))
    row, text = _run_to_first_row(DISTILL, [f"policy.model_name_or_path={tmp_path / 'student'}",
                                            f"distillation.model_name_or_path={tmp_path / 'teacher'}",
                                            f"train.train_policy.dataset.name={gsm8k}",
                                            f"validation.dataset.name={gsm8k}"],
                                  "qwen3-8b-distillation", tmp_path, nproc=4)
    assert "world_size=4" in text
    assert "tp_size = 2 is vLLM's engine split" in text
    _assert_a_teacher_kl_step(row)


def _assert_a_teacher_kl_step(row: dict) -> None:
    """A distillation step's metrics row: a random teacher disagrees with the taught student (a clearly
    positive sampled reverse KL), whose negative is the advantage (kl_penalty_coef 1); a finite loss and
    a non-zero gradient."""
    assert row["teacher_kl"] > 0.5 and math.isfinite(row["teacher_kl"]), row
    assert row["teacher_kl_advantages"] == pytest.approx(-row["teacher_kl"], rel=1e-4)
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0, row


COUNTDOWN = CONFIG.parent / "qwen2-5-1.5b-distill-countdown.toml"
DEEPMATH = CONFIG.parents[1] / "qwen3" / "qwen3-8b-distill-deepmath.toml"


def _question_rows(n: int) -> str:
    """JSONL of ``n`` sums in the distillation files' prompt column, ``question``."""
    return "".join(json.dumps({"question": r["prompt"], "answer": r["result"].strip("$")}) + "\n" for r in _sums(n))


def _run_question_distill_file(config: Path, output: str, student: Path, tmp_path: Path, *, train_items: int,
                               val_items: int, nproc: int) -> tuple[dict, str, list[dict]]:
    """``config`` (a distillation file over ``question`` rows) run to its first step with only the student,
    a random tiny teacher and the two data files overridden; its first step's row, its log and its
    validation rows."""
    teacher = tiny_qwen2(seed=1)
    teacher.save_pretrained(tmp_path / "teacher")
    qwen_tokenizer().save_pretrained(tmp_path / "teacher")
    (tmp_path / "train.jsonl").write_text(_question_rows(train_items))
    (tmp_path / "val.jsonl").write_text(_question_rows(val_items))
    row, text = _run_to_first_row(config, [f"policy.model_name_or_path={student}",
                                           f"distillation.model_name_or_path={tmp_path / 'teacher'}",
                                           f"train.train_policy.dataset.name={tmp_path / 'train.jsonl'}",
                                           f"validation.dataset.name={tmp_path / 'val.jsonl'}"],
                                  output, tmp_path, nproc=nproc)
    validations = [json.loads(line) for path in (tmp_path / "outputs").glob("*/*/metrics.jsonl")
                   for line in path.read_text().splitlines() if "validation/items" in line]
    return row, text, validations


@pytest.mark.slow
def test_cosmos_rl_countdown_distill_config_runs_with_only_paths_overridden(inputs: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    """cosmos-rl's ``configs/qwen2-5/qwen2-5-1.5b-distill-countdown.toml`` with only the student, teacher
    and data paths overridden: four FSDP ranks (dp_shard_size 4), ``optm_name = "Adam"``, both clip
    bounds off (``epsilon_low`` / ``epsilon_high = -1``, dual clip at 100), ``optm_decay_ratio = 0.0``,
    and validation before training and after every step on the first ``int(0.01 x N)`` validation
    prompts (``validation.dataset.test_size``, as its launch script reads it)."""
    student, _ = inputs
    # int(250 x 0.01) = 2 validation prompts scored
    row, text, validations = _run_question_distill_file(COUNTDOWN, "qwen3-8b-distillation-countdown", student,
                                                        tmp_path, train_items=ITEMS, val_items=250, nproc=4)
    assert "world_size=4" in text
    assert "32 rollouts per step and rank" in text  # 128 per replica over dp_shard_size 4
    assert "optm_decay_type = 'constant'" in text
    _assert_a_teacher_kl_step(row)
    assert row["lr"] == pytest.approx(1e-4)  # no warmup, no decay
    assert validations and all(v["validation/items"] == 2.0 for v in validations), validations


@pytest.mark.slow
def test_cosmos_rl_deepmath_distill_config_runs_with_only_paths_overridden(inputs: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    """cosmos-rl's ``configs/qwen3/qwen3-8b-distill-deepmath.toml`` with only the student, teacher and data
    paths overridden, at the file's sizes: two FSDP ranks (``dp_shard_size = 2``), 1,024 rollouts per
    step and replica (512 per rank: 128 prompts x ``n_generation`` 4), ``loss_type = "token-sum"``,
    ``mini_batch = 4``, and validation before training of up to 32,768 tokens per answer (the taught
    student ends its answers long before; the file's ``validation.top_p = 0.95`` is read as cosmos-rl
    reads it, checked at start-up by
    ``test_every_distillation_file_starts_with_only_model_and_data_paths_overridden``). The validation
    file here holds two prompts (aime24's 30 in the file's launch)."""
    student, _ = inputs
    # 256 training prompts: one step of 128 on each of the 2 ranks
    row, text, validations = _run_question_distill_file(DEEPMATH, "qwen3-8b-distillation-deepmath", student,
                                                        tmp_path, train_items=256, val_items=2, nproc=2)
    assert "dp_shard=2, cp=1, tp=1, world_size=2" in text
    assert "GRPO: 512 rollouts per step and rank: each generation takes grpo.rollout_batch_size = 128 prompts" in text
    assert "optm_decay_type = 'constant'" in text
    _assert_a_teacher_kl_step(row)
    assert row["lr"] == pytest.approx(1e-4)
    assert 1 <= row["response_length"] < 2048, row  # the taught student ends its answers
    assert validations and validations[0]["step"] == 0 and validations[0]["validation/items"] == 2.0, validations
