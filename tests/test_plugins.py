"""Plug-ins by import path: a cosmos-rl-shaped dataset class and reward run unchanged (cp.data.plugins,
cp.rewards.plugins), and the recipes' --dataset / --reward flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError, check_runnable, load_config, with_plugins
from cosmos_primitives.data import CosmosRLPromptDataset, prompt_dataset
from cosmos_primitives.data.bad_samples import BadSampleError
from cosmos_primitives.rewards import RewardSet, from_cosmos_rl

PLUGINS = Path(__file__).parent / "data" / "plugins"
REASON1_RL = Path(__file__).parent / "data" / "cosmos_rl_configs" / "cosmos-reason1" / "examples" / "post_training" \
    / "configs" / "rl.toml"


def write_qa_pairs(root: Path, n: int = 6) -> Path:
    """Colour-MCQ items as Cosmos-Reason1-RL ``qa_pairs`` rows (JSONL beside their images)."""
    mcq = cp.testing.write_colour_mcq(root, n, seed=0, split="train")
    rows = [json.loads(line) for line in mcq.read_text().splitlines()]
    path = root / "qa_pairs.jsonl"
    path.write_text("".join(json.dumps({"image": r["image"], "qa_pairs": {
        "question": r["question"], "index2ans": dict(zip("ABCD", r["choices"], strict=True)),
        "answer": r["answer"]}}) + "\n" for r in rows))
    return path


@pytest.fixture
def reason1_style(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import reason1_style

    return reason1_style


def test_cosmos_rl_dataset_class_runs_unchanged(reason1_style, tmp_path: Path, qwen_tokenizer) -> None:
    data = write_qa_pairs(tmp_path)
    cfg = with_plugins(load_config(REASON1_RL, [f"train.train_policy.dataset.name={data}"]),
                       dataset="reason1_style:CosmosGRPODataset")
    assert cfg.train.train_policy.prompt_column_name == "qa_pairs"  # cosmos-rl's key, read by the plug-in
    check_runnable(cfg, str(REASON1_RL))  # nothing refused once a plug-in reads the column
    dataset = prompt_dataset(cfg.train.train_policy.dataset, prompt_column=cfg.train.train_policy.prompt_column_name,
                             processor=qwen_tokenizer, setup_config=cfg)
    assert isinstance(dataset, CosmosRLPromptDataset) and len(dataset) == 6
    prompt = dataset[0]
    assert prompt.conversation[0] == {"role": "system", "content": ""}  # cosmos-rl's empty system message kept
    assert prompt.conversation[1]["content"][0]["type"] == "image" and len(prompt.images) == 1
    assert prompt.reference == json.loads(data.read_text().splitlines()[0])["qa_pairs"]["answer"]
    # the empty system message renders as one: the template adds no default system prompt
    text = qwen_tokenizer.apply_chat_template([prompt.conversation[0], {"role": "user", "content": "hi"}],
                                              tokenize=False)
    assert "You are a helpful assistant" not in text and text.startswith("<|im_start|>system\n<|im_end|>")


def test_cosmos_rl_reward_runs_unchanged_by_import_path(reason1_style) -> None:
    rewards = RewardSet({"reason1_style:custom_reward_fn": 1.0})
    batch = rewards(["<think>red</think> <answer>B</answer>", "<answer>A</answer>"], ["B", "B"])
    assert batch.totals == [2.0, 0.0]
    assert from_cosmos_rl(reason1_style.custom_reward_fn)(completion="<think/><answer>C</answer>", reference="C") == 1


def test_bad_plugin_paths_and_items_are_named(reason1_style, tmp_path: Path) -> None:
    with pytest.raises(ImportError, match=r"\[grpo\] reward_function: module 'reason1_style' has no attribute 'nope'"):
        RewardSet({"reason1_style:nope": 1.0})
    cfg = with_plugins(load_config(None), dataset="no_such_pkg.data:Dataset")
    with pytest.raises(ImportError, match=r"cannot import module 'no_such_pkg.data'"):
        prompt_dataset(cfg.train.train_policy.dataset, setup_config=cfg)

    class Broken:
        def __len__(self):
            return 2

        def __getitem__(self, idx):
            raise KeyError("qa_pairs")

    with pytest.raises(BadSampleError, match=r"broken\[1\].*KeyError"):
        CosmosRLPromptDataset(Broken(), name="broken")[1]


def test_prompt_and_response_columns_without_a_plugin(tmp_path: Path) -> None:
    """cosmos-rl's prompt / reference-answer column datasets (gsm8k-like, text only, or with an image)."""
    image = cp.testing.write_image(tmp_path / "a.png", cp.testing.color_image("red", size=(56, 56)))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "2 + 3 = ?", "answer": "5"}) + "\n"
                    + json.dumps({"question": "Which colour?", "answer": "red", "image": image.name}) + "\n"
                    + json.dumps({"question": {"nested": 1}, "answer": "x"}) + "\n")
    cfg = load_config(None, [f"train.train_policy.dataset.name={rows}", "train.train_policy.type=grpo",
                             "train.train_policy.prompt_column_name=question",
                             "train.train_policy.response_column_name=answer"])
    check_runnable(cfg, "<overrides>")
    dataset = prompt_dataset(cfg.train.train_policy.dataset, prompt_column=cfg.train.train_policy.prompt_column_name,
                             response_column=cfg.train.train_policy.response_column_name)
    text, pictured = dataset[0], dataset[1]
    assert text.conversation == "2 + 3 = ?"  # plain text, used as it is (no chat template)
    assert text.reference == "5" and not text.images
    assert pictured.conversation[0]["content"][0]["type"] == "image" and len(pictured.images) == 1
    assert pictured.reference == "red"
    with pytest.raises(BadSampleError, match="prompt column 'question' holds a dict"):
        dataset[2]
    only_response = load_config(None, ["train.train_policy.response_column_name=answer"])
    with pytest.raises(ConfigError, match="response_column_name' is set without prompt_column_name"):
        check_runnable(only_response, "<overrides>")


def test_reward_flag_replaces_the_reward_table() -> None:
    cfg = with_plugins(load_config(None), rewards=["a.b:c", "d:e"])
    assert cfg.grpo.reward_function == {"a.b:c": 1.0, "d:e": 1.0}


MY_REWARDS = """
def short(completion: str) -> float:
    return float(len(completion) <= 3)


def says_yes(completion: str, reference: str) -> tuple[float, dict[str, float]]:
    return float(completion == "yes"), {"chars": float(len(completion))}
"""


@pytest.fixture
def my_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's reward module, importable because its folder is on sys.path (as PYTHONPATH puts it)."""
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_reward_flag_takes_a_weight_per_reward(my_rewards: str, tmp_path: Path) -> None:
    """``--reward my_mod:fn=0.5`` (repeatable) on the recipes' command line, with no copy of the script."""
    config = tmp_path / "run.toml"
    config.write_text("")
    cfg, _ = cp.config.load_recipe_config(None, plugins=True, argv=[
        "--config", str(config), "--reward", "my_rewards:short=0.5", "--reward", "my_rewards:says_yes",
        "--reward", "format=0.25"])
    assert cfg.grpo.reward_function == {"my_rewards:short": 0.5, "my_rewards:says_yes": 1.0, "format": 0.25}
    batch = RewardSet.from_config(cfg.grpo)(["yes", "no thanks"], ["yes", "yes"])
    assert batch.totals == [0.5 * 1 + 1.0 * 1 + 0.25 * 0, 0.0]
    # logged under the function's name, not the import path
    assert {"reward/short", "reward/says_yes", "reward/says_yes/chars", "reward/format"} <= set(batch.metrics)
    assert not any(":" in key for key in batch.metrics)
    for bad in ("my_rewards:short=half", "=0.5", "my_rewards:short=inf"):
        with pytest.raises(ConfigError, match=r"--reward .*MODULE:FUNCTION=WEIGHT"):
            with_plugins(load_config(None), rewards=[bad])
    with pytest.raises(ConfigError, match="given twice"):
        with_plugins(load_config(None), rewards=["a:b=1", "a:b=2"])


def test_reward_by_import_path_in_the_config(my_rewards: str) -> None:
    """``"my_mod:fn" = weight`` in ``[grpo] reward_function`` imports the function; two rewards whose
    function names collide keep their paths as metric names."""
    cfg = load_config(None, ['grpo.reward_function={"my_rewards:says_yes" = 2.0, single_choice = 1.0}'])
    batch = RewardSet.from_config(cfg.grpo)(["yes", "<answer>B</answer>"], ["B", "B"])
    assert batch.totals == [2.0, 1.0]
    assert batch.metrics["reward/says_yes"] == 0.5 and batch.metrics["reward/single_choice"] == 0.5
    assert cp.rewards.reward_metric_names(["a.b:score", "c:score", "d:Judge.score", "format"]) == {
        "a.b:score": "a.b:score", "c:score": "c:score", "d:Judge.score": "d:Judge.score", "format": "format"}
    assert cp.rewards.reward_metric_names(["a.b:score", "d:Judge.rate"]) == {"a.b:score": "score",
                                                                            "d:Judge.rate": "rate"}


def test_unknown_reward_names_both_no_copy_routes() -> None:
    with pytest.raises(cp.rewards.UnknownRewardError) as error:
        RewardSet({"my_scorer": 1.0})
    message = str(error.value)
    assert "unknown reward 'my_scorer'" in message
    assert "--reward my_mod:fn" in message                      # the recipes' flag
    assert '"my_mod:fn" = WEIGHT in [grpo] reward_function' in message    # the config's import path
    assert "PYTHONPATH" in message


@pytest.mark.slow
def test_reason1_rl_config_runs_on_the_tiny_model_through_the_plugin_path(tmp_path: Path) -> None:
    """Cosmos-Reason1's rl.toml as it is, with its dataset script and reward handed over by import
    path: only the model and data paths and the run's size (one process, one step, short answers,
    rollout TP 1, for a CPU) are overridden."""
    import os

    from cosmos_primitives.testing.recipe_runs import finish, launch_recipe

    model = cp.testing.save_tiny_qwen2_5_vl(tmp_path / "model", seed=0)
    data = write_qa_pairs(tmp_path / "data", n=8)
    repo = Path(__file__).resolve().parents[1]
    overrides = ["--dataset", "reason1_style:CosmosGRPODataset", "--reward", "reason1_style:custom_reward_fn",
                 f"policy.model_name_or_path={model}", f"train.train_policy.dataset.name={data}",
                 f"train.output_dir={tmp_path / 'out'}",
                 # the run's size: one process (the file shards over 2), one step of 2 prompts x 8, short answers
                 "policy.parallelism.dp_shard_size=1", "train.max_steps=1", "grpo.rollout_batch_size=2",
                 "rollout.max_response_length=16",
                 # the file's vLLM TP 2: the HF engine here (no GPU) runs whole models and refuses tp_size > 1
                 "rollout.parallelism.tp_size=1"]
    env = {"PYTHONPATH": os.pathsep.join([str(repo / "src"), str(PLUGINS)]), "WANDB_MODE": "offline"}
    log = tmp_path / "run.log"
    text = finish(launch_recipe("examples/grpo_vlm.py", REASON1_RL, overrides, log, cwd=repo, env=env), log,
                  timeout_s=540)
    assert "is read as a cosmos-rl config" in text  # the one start-up warning
    assert "[GRPO] Step: 1/1" in text
    assert "Exported safetensors to" in text
    assert list((tmp_path / "out").glob("*/safetensors/final/model.safetensors*"))
