"""``RewardSet``: weighted sums, user callables (sync / async), metrics, errors and the fallback score."""

from __future__ import annotations

import asyncio

import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import config_from_dict
from cosmos_primitives.rewards import RewardError, RewardSet

GOOD = "<think>r</think>\n\n<answer>A</answer>"
COMPLETIONS = [GOOD, "<answer>B</answer>", "A", GOOD]
REFERENCES = ["A", "B", "A", "C"]


def test_weighted_sum_per_sample_and_batch_means_by_hand() -> None:
    # format:        1, 0, 0, 1      single_choice: 1, 1, 1, 0
    # total = 0.5 * format + 2 * single_choice = 2.5, 2.0, 2.0, 0.5 -> mean 1.75
    batch = RewardSet({"format": 0.5, "single_choice": 2.0})(COMPLETIONS, REFERENCES)
    assert batch.totals == [2.5, 2.0, 2.0, 0.5]
    assert batch.values("format") == [1.0, 0.0, 0.0, 1.0]
    assert batch.samples[3].values == {"format": 1.0, "single_choice": 0.0}
    assert batch.metrics["reward/format"] == 0.5
    assert batch.metrics["reward/single_choice"] == 0.75
    assert batch.metrics["reward/total"] == 1.75
    # population std of (2.5, 2, 2, 0.5): deviations .75, .25, .25, -1.25 -> sqrt(2.25 / 4) = 0.75
    assert batch.metrics["reward/total_std"] == pytest.approx(0.75)
    assert batch.total_tensor().tolist() == [2.5, 2.0, 2.0, 0.5]


def test_from_config_uses_reward_function_table_and_fallback() -> None:
    cfg = config_from_dict({"train": {"train_policy": {"reward_function": ["single_choice"]}},
                            "grpo": {"reward_fallback_score": -1.0}}).grpo
    rewards = RewardSet.from_config(cfg)
    assert rewards.weights == {"single_choice": 1.0} and rewards.fallback_score == -1.0
    assert rewards(COMPLETIONS, REFERENCES).totals == [1.0, 1.0, 1.0, 0.0]
    default = RewardSet.from_config(cp.config.GRPOConfig())
    assert default.weights == {"single_choice": 1.0, "format": 1.0}


def test_user_callables_get_the_keywords_they_declare_and_may_return_metrics() -> None:
    seen = []

    def uses_row(row):
        return float(row["difficulty"])

    def everything(**kwargs):
        seen.append(sorted(kwargs))
        return 1.0, {"length": len(kwargs["completion"])}

    class Scorer:  # a callable object works too
        def __call__(self, completion: str, reference: str | None) -> bool:
            return completion.endswith(reference or "?")

    rows = [{"difficulty": d} for d in (1, 2, 3, 4)]
    batch = RewardSet({"uses_row": 0.1, "everything": 1.0, "scorer": 1.0},
                      functions={"uses_row": uses_row, "everything": everything, "scorer": Scorer()})(
        ["ab", "abcd", "A", "xyz"], ["b", "c", "A", "z"], rows)
    assert batch.values("uses_row") == [1.0, 2.0, 3.0, 4.0]
    assert batch.values("scorer") == [1.0, 0.0, 1.0, 1.0]
    assert batch.totals == pytest.approx([2.1, 1.2, 2.3, 2.4])
    assert seen[0] == ["completion", "reference", "row"]
    assert batch.samples[1].metrics == {"everything/length": 4.0}
    assert batch.metrics["reward/everything/length"] == pytest.approx((2 + 4 + 1 + 3) / 4)


def test_async_rewards_of_the_whole_batch_run_concurrently() -> None:
    n_calls = 2 * len(COMPLETIONS)
    state = {"started": 0, "max_in_flight": 0, "in_flight": 0}
    everyone_started = asyncio.Event()

    async def judge(completion: str, reference: str) -> float:
        state["started"] += 1
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        if state["started"] == n_calls:
            everyone_started.set()
        # every call waits until all have started: run one at a time, this would time out
        await asyncio.wait_for(everyone_started.wait(), timeout=10)
        state["in_flight"] -= 1
        return float(completion.strip().endswith(f"{reference}</answer>"))

    async def judge_twice(completion: str, reference: str) -> tuple[float, dict[str, float]]:
        return 2 * await judge(completion, reference), {"calls": 1.0}

    rewards = RewardSet({"judge": 1.0, "twice": 1.0, "format": 1.0}, functions={"judge": judge, "twice": judge_twice})
    batch = rewards(COMPLETIONS, REFERENCES)
    assert state["max_in_flight"] == n_calls
    assert batch.values("judge") == [1.0, 1.0, 0.0, 0.0]
    assert batch.totals == [4.0, 3.0, 0.0, 1.0]
    assert batch.metrics["reward/twice/calls"] == 1.0


def test_sync_call_inside_a_running_event_loop_and_await_acompute() -> None:
    rewards = RewardSet({"single_choice": 1.0})

    async def main() -> tuple[list[float], list[float]]:
        return rewards(COMPLETIONS, REFERENCES).totals, (await rewards.acompute(COMPLETIONS, REFERENCES)).totals

    from_sync, from_async = asyncio.run(main())
    assert from_sync == from_async == [1.0, 1.0, 1.0, 0.0]


def boom(completion: str) -> float:
    if completion == "A":
        raise ZeroDivisionError("division by zero in my parser")
    return 1.0


async def async_boom(completion: str) -> float:
    await asyncio.sleep(0)
    return boom(completion)


@pytest.mark.parametrize("fn", [boom, async_boom])
def test_exception_names_reward_sample_and_prompt_id(fn) -> None:
    rows = [{"id": f"q{i}"} for i in range(4)]
    rewards = RewardSet({"format": 1.0, "mine": 1.0}, functions={"mine": fn})
    with pytest.raises(RewardError, match=r"reward 'mine' failed on sample 2 \(prompt id 'q2'\): ZeroDivisionError: "
                                          r"division by zero in my parser") as info:
        rewards(COMPLETIONS, REFERENCES, rows)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(RewardError, match=r"sample 2 \(prompt id 77\)"):
        rewards(COMPLETIONS, REFERENCES, prompt_ids=[11, 22, 77, 88])


def test_fallback_score_replaces_failures_and_counts_them() -> None:
    rewards = RewardSet({"mine": 1.0, "format": 1.0}, functions={"mine": boom}, fallback_score=-0.5)
    batch = rewards(["A", "x", "A", GOOD], REFERENCES)
    assert batch.values("mine") == [-0.5, 1.0, -0.5, 1.0]
    assert batch.totals == [-0.5, 1.0, -0.5, 2.0]
    assert batch.samples[0].failed == ["mine"] and batch.samples[1].failed == []
    assert batch.metrics["reward/mine/failures"] == 2.0
    assert "reward/format/failures" not in batch.metrics


@pytest.mark.parametrize(
    ("value", "message"),
    [("yes", "returned str 'yes'; expected a float"), (float("nan"), "non-finite"),
     ((1.0, 2.0), "expected \\(float, dict of metrics\\)"), (None, "returned NoneType")],
)
def test_unusable_return_values_are_errors_naming_the_reward(value, message) -> None:
    rewards = RewardSet({"bad": 1.0}, functions={"bad": lambda completion: value})
    with pytest.raises(RewardError, match=f"reward 'bad' failed on sample 0: .*{message}"):
        rewards(["x"])


def test_construction_errors() -> None:
    def needs_tokenizer(completion, tokenizer):
        return 0.0

    with pytest.raises(TypeError, match=r"reward 'tok' .* requires argument 'tokenizer'"):
        RewardSet({"tok": 1.0}, functions={"tok": needs_tokenizer})
    with pytest.raises(KeyError, match="unknown reward 'fromat'"):
        RewardSet({"fromat": 1.0})
    with pytest.raises(ValueError, match="at least one reward"):
        RewardSet({})
    with pytest.raises(ValueError, match="3 references for 4 completions"):
        RewardSet({"format": 1.0})(COMPLETIONS, REFERENCES[:3])


def test_registered_user_reward_is_found_by_name() -> None:
    @cp.rewards.register_reward("test_length_penalty", override=True)
    def length_penalty(completion: str) -> float:
        return -len(completion) / 10

    assert RewardSet({"test_length_penalty": 2.0})(["abcde"]).totals == [-1.0]
