"""SFT validation: the held-out split (cosmos-rl's ``dataset.test_size``), the validation loss against
a direct computation on a tiny model, and the cosmos-rl SFT configs that ask for validation."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.data import (
    HFConversationDataset,
    build_sft_datasets,
    build_sft_validation_loader,
    encode_conversation,
    split_validation,
)
from cosmos_primitives.data.sft_validation import held_out_count
from cosmos_primitives.policy import sft_validation_loss
from cosmos_primitives.policy.lm_policy import backbone_of

DATA = Path(__file__).parent / "data" / "cosmos_rl_configs"
REASON1_SFT = DATA / "cosmos-reason1" / "examples" / "post_training" / "configs" / "sft.toml"
GEMMA_SFT = DATA / "cosmos-rl" / "configs" / "gemma" / "gemma3-12b-vlm-fsdp4-sft.toml"


def _datasets(cfg: cp.Config, processor=None):
    """``build_sft_datasets`` of a loaded config's sections, as the recipe calls it."""
    return build_sft_datasets(cfg.train.train_policy, cfg.validation, seed=cfg.train.seed, processor=processor,
                              setup_config=cfg)


def rows(n: int) -> list[dict]:
    """``n`` text conversations of different lengths (row ``i`` answers ``Answer i.``)."""
    return [{"conversations": [{"role": "user", "content": f"Question {i}: {' '.join(['word'] * (1 + i * 5 % 17))}?"},
                               {"role": "assistant", "content": f"Answer {i}."}]} for i in range(n)]


def test_split_is_disjoint_deterministic_and_sized_as_cosmos_rl_means() -> None:
    train, val = split_validation(50, 0.1, seed=3)
    assert len(val) == 5 and sorted(train + val) == list(range(50)) and not set(train) & set(val)
    assert split_validation(50, 0.1, seed=3) == (train, val)  # same seed, same split
    assert split_validation(50, 0.1, seed=4)[1] != val
    assert val != list(range(5)) and val != list(range(45, 50))  # drawn, not the first / last rows
    assert held_out_count(10, 7) == 7 and held_out_count(10, 0.25) == 3  # a fraction rounds up
    assert held_out_count(50, None) == 5  # unset: 10 %, as cosmos-rl
    for bad in (10, 12, 0.999):
        with pytest.raises(ValueError, match=r"train\.train_policy\.dataset\.test_size"):
            held_out_count(10, bad)


def config_for(tmp_path: Path, n: int, *overrides: str) -> cp.Config:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    return cp.load_config(overrides=[f"train.train_policy.dataset.name={path}", "train.seed=5",
                                     "policy.model_max_length=256", "train.train_policy.mini_batch=2", *overrides])


def answers(dataset) -> list[str]:
    return [dataset[i].conversation[-1]["content"] for i in range(len(dataset))]


def test_validation_items_are_held_out_of_training(tmp_path: Path) -> None:
    train, val = _datasets(config_for(tmp_path, 20))
    assert val is None and len(train) == 20  # validation off: test_size holds nothing out
    train, val = _datasets(config_for(tmp_path, 20, "validation.enable=true",
                                               "train.train_policy.dataset.test_size=4"))
    assert (len(train), len(val)) == (16, 4)
    assert sorted(answers(train) + answers(val)) == sorted(f"Answer {i}." for i in range(20))
    again = _datasets(config_for(tmp_path, 20, "validation.enable=true",
                                          "train.train_policy.dataset.test_size=4"))[1]
    assert answers(again) == answers(val)
    other = tmp_path / "val.jsonl"
    other.write_text(json.dumps(rows(1)[0]) + "\n")
    train, val = _datasets(config_for(tmp_path, 20, "validation.enable=true",
                                               f"validation.dataset.name={other}"))
    assert (len(train), len(val)) == (20, 1)  # a separate validation dataset: nothing held out


def direct_mean_nll(model: torch.nn.Module, tokenizer, dataset) -> tuple[float, int]:
    """The mean NLL over every assistant token, one sample at a time, from full-vocabulary logits."""
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(dataset)):
            sample = encode_conversation(tokenizer, dataset[i])
            logits = model(input_ids=sample.input_ids[None]).logits[0, :-1].double()
            targets, labels = sample.input_ids[1:], sample.labels[1:]
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
            mask = labels != -100
            nll -= float(logprobs[mask].sum())
            tokens += int(mask.sum())
    return nll / tokens, tokens


def test_validation_loss_equals_a_direct_computation_without_gradient(tmp_path: Path, qwen_tokenizer,
                                                                      tiny_qwen2_model) -> None:
    cfg = config_for(tmp_path, 7)
    dataset = HFConversationDataset(rows(7), name="val")
    model = tiny_qwen2_model.train()
    grad_modes: list[bool] = []
    backbone_of(model).register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    expected, expected_tokens = direct_mean_nll(model, qwen_tokenizer, dataset)
    grad_modes.clear()

    loader = build_sft_validation_loader(cfg.train.train_policy, qwen_tokenizer, model.config, dataset,
                                         model_max_length=cfg.policy.model_max_length, seed=cfg.train.seed)
    got = sft_validation_loss(model, loader, samples_per_pass=4, device="cpu")
    assert got.tokens == expected_tokens and got.loss == pytest.approx(expected, rel=1e-5)
    assert grad_modes and not any(grad_modes)  # every forward ran without autograd
    assert model.training and all(p.grad is None for p in model.parameters())
    again = sft_validation_loss(model, loader, samples_per_pass=3, device="cpu")  # the loader scores the split anew
    assert again.loss == pytest.approx(expected, rel=1e-5)

    # two data-parallel ranks' shares: every item scored once, none twice
    shares = [sft_validation_loss(model, build_sft_validation_loader(
        cfg.train.train_policy, qwen_tokenizer, model.config, dataset, model_max_length=cfg.policy.model_max_length,
        seed=cfg.train.seed, rank=r, world_size=2),
                                  samples_per_pass=4, device="cpu") for r in range(2)]
    assert sum(s.tokens for s in shares) == expected_tokens
    assert sum(s.loss * s.tokens for s in shares) / expected_tokens == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="fewer than the 8 data-parallel ranks"):
        build_sft_validation_loader(cfg.train.train_policy, qwen_tokenizer, model.config, dataset,
                                    model_max_length=cfg.policy.model_max_length, rank=0, world_size=8)


def rank_validation_loss(cfg: cp.Config) -> tuple[float, int, int]:
    """One rank of two: its share of 7 items scored one sample per pass (4 passes on rank 0, 3 on
    rank 1, which then scores a label-less copy); returns (loss, tokens, forward passes)."""
    rank = torch.distributed.get_rank()
    tokenizer = cp.testing.qwen_tokenizer()
    model = cp.testing.tiny_qwen2(seed=0)
    passes: list[int] = []
    backbone_of(model).register_forward_hook(lambda *_: passes.append(1))
    loader = build_sft_validation_loader(cfg.train.train_policy, tokenizer, model.config,
                                         HFConversationDataset(rows(7), name="val"),
                                         model_max_length=cfg.policy.model_max_length, seed=cfg.train.seed,
                                         rank=rank, world_size=2)
    result = sft_validation_loss(model, loader, samples_per_pass=1, device="cpu")
    return result.loss, result.tokens, len(passes)


@pytest.mark.slow  # two spawned processes
def test_ranks_that_run_out_first_keep_the_collectives_matched(tmp_path: Path, qwen_tokenizer) -> None:
    expected, tokens = direct_mean_nll(cp.testing.tiny_qwen2(seed=0), qwen_tokenizer,
                                       HFConversationDataset(rows(7), name="val"))
    results = cp.testing.run_distributed(rank_validation_loss, 2, args=(config_for(tmp_path, 7),))
    assert [passes for *_, passes in results] == [4, 4]  # rank 1 ran one forward on a copy with no label
    for loss, total_tokens, _ in results:  # both ranks get the mean over all 7 items, each counted once
        assert total_tokens == tokens and loss == pytest.approx(expected, rel=1e-5)


# Reason1's sft.toml spells the older [train] enable_validation / validation_step, gone from cosmos-rl's
# config class (0.4.7 ignores them: no validation there); validating it takes validation.enable=true
@pytest.mark.parametrize(("path", "overrides", "freq"), [(REASON1_SFT, ["validation.enable=true"], 20),
                                                          (GEMMA_SFT, [], 30)], ids=["reason1", "gemma3"])
def test_cosmos_rl_sft_configs_with_validation_load_and_run(path: Path, overrides: list[str], freq: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cfg = cp.load_config(path, overrides)
    assert cfg.validation.enable and cfg.train.train_policy.dataset.test_size == 100
    assert cfg.validation.freq == freq and not cfg.validation.val_before_train
    assert cfg.unsupported == {}
    cp.config.check_runnable(cfg, str(path))  # the SFT recipe starts on it
