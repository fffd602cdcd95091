"""cosmos-rl's world-model configs (its ``configs/cosmos-predict2-5/``, the files the world-model guide
runs) as users have them: all five load, every key of cosmos-rl's Cosmos-trainer config class has a
rule, every mapped key's value equals what cosmos-rl's own classes make of the file
(``tests/data/cosmos_rl_wfm_effective.json``, written by ``scripts/fixtures_cosmos_rl_wfm.py``), the
migration report calls them world-model files, and each runs ``examples/wfm_rl.py`` for a step."""

from __future__ import annotations

import ast
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives.config.compat.cosmos_rl_wfm import (
    COSMOS_RULES,
    DIFFUSERS_RULES,
    WorldModelReading,
    effective_values,
    read_world_model_file,
    render_tables,
    targets,
    world_model_kind,
)
from cosmos_primitives.config.loader import read_cosmos_rl_file
from cosmos_primitives.config.toml_io import read_toml
from cosmos_primitives.migrate import main as migrate_main

DATA = Path(__file__).parent / "data"
WFM = DATA / "cosmos_rl_configs" / "cosmos-rl" / "configs" / "cosmos-predict2-5"
FILES = sorted(WFM.glob("*.toml"))
NFT = WFM / "cosmos-predict2-5-2b-720-nft.toml"
MOCK = WFM / "cosmos-predict2-5-2b-480-grpo-mock-data.toml"
FIXTURE = json.loads((DATA / "cosmos_rl_wfm_effective.json").read_text())
CLASS_FILE = DATA / "cosmos_rl_configs" / "cosmos-rl" / "cosmos_rl" / "policy" / "config" / "wfm" / "__init__.py.txt"
DOC = Path(__file__).parents[1] / "docs" / "from_cosmos_rl.md"


def load(path: Path, overrides: list[str] | None = None) -> cp.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return cp.load_config(path, overrides or [])


def reading_of(path: Path) -> Any:
    return read_world_model_file(read_toml(path))


def test_the_five_files_load_and_only_the_model_or_data_path_is_refused() -> None:
    assert len(FILES) == 5
    refused = {}
    for path in FILES:
        cfg = load(path)
        refused[path.name] = sorted(cfg.unsupported)
        given = load(path, ["policy.model_name_or_path=tiny", "wfm.data.path=/some/clips"])
        assert given.unsupported == {}, path.name  # with a model and data the recipe starts (paths aside)
    assert refused == {
        "cosmos-predict2-5-14b-720-reason-embedding-ddrl.toml": ["checkpoint.model_id"],  # an imaginaire .pt
        "cosmos-predict2-5-2b-480-grpo-mock-data.toml": ["checkpoint.load_path"],  # random weights there
        "cosmos-predict2-5-2b-480-grpo.toml": ["checkpoint.model_id"],
        "cosmos-predict2-5-2b-720-nft.toml": ["train.train_policy.dataset.name"],  # "pickscore", a prompt list
        "cosmos-predict2-5-2b-720-reason-embedding-ddrl.toml": ["checkpoint.model_id"],
    }


def test_kinds_and_own_style_files() -> None:
    assert [world_model_kind(read_toml(p)) for p in FILES] == ["cosmos", "cosmos", "cosmos", "diffusers", "cosmos"]
    # this library's own file carrying the guide's parallelism snippet stays ours ([model] sizes are aliases)
    guide = {"wfm": {}, "model": {"fsdp_shard_size": 8}, "model_parallel": {"context_parallel_size": 2}}
    assert world_model_kind(guide) is None
    assert world_model_kind({"model": {"fsdp_shard_size": 8, "rl": {}}}) == "cosmos"


def _class_keys() -> list[str]:
    """Every dotted key of cosmos-rl's ``CosmosVisionGenConfig`` (the vendored class file)."""
    tree = ast.parse(CLASS_FILE.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def fields(name: str) -> list[tuple[str, str]]:
        node = classes[name]
        own = [(b.target.id, ast.unparse(b.annotation)) for b in node.body
               if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name) and not b.target.id.startswith("_")]
        return own + [f for base in node.bases if ast.unparse(base) in classes for f in fields(ast.unparse(base))]

    keys: list[str] = []

    def walk(name: str, prefix: str) -> None:
        for field, annotation in fields(name):
            path = prefix + field
            nested = [c for c in re.findall(r"\w+", annotation) if c in classes and c != name]
            if nested and path not in COSMOS_RULES:
                for c in nested:
                    walk(c, path + ".")
            else:
                keys.append(path)

    walk("CosmosVisionGenConfig", "")
    return keys


def test_every_key_of_cosmos_rls_world_model_class_has_one_rule() -> None:
    from cosmos_primitives.config.compat.cosmos_rl_wfm import rule_for

    keys = _class_keys()
    assert len(keys) > 100  # the walk went through the class (a rule on a table covers its keys)
    assert not [k for k in keys if rule_for(k) is None]
    # each rule's default is cosmos-rl's own: the effective value of every file that leaves the key out
    checked = set()
    for path in FILES:
        if path == NFT:
            continue
        tree, values = read_toml(path), FIXTURE[path.name]["values"]
        for rule in COSMOS_RULES.values():
            if rule.default is not None and rule.key in values and not _spelled(tree, rule.key):
                assert values[rule.key] == rule.default, (path.name, rule.key)
                checked.add(rule.key)
    assert len(checked) > 60


def _spelled(tree: dict[str, Any], key: str) -> bool:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _our(cfg: cp.Config, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


# cosmos-rl key -> (our key, value of theirs -> ours); every mapped rule of COSMOS_RULES is covered
COSMOS_CHECKS: dict[str, list[tuple[str, Any]]] = {
    "model.fsdp_shard_size": [("policy.parallelism.dp_shard_size", None)],
    "model.precision": [("policy.dtype", None)],
    "model.loss_scale": [("wfm.loss_scale", None)],
    "model.net.sac_config.mode": [("policy.model_gradient_checkpointing", lambda v: v != "none")],
    "model.rl.num_rollout": [("wfm.num_samples_per_prompt", None), ("wfm.group_ranks", None)],
    "model.rl.sample_steps": [("wfm.num_inference_steps", None)],
    "model.rl.train_on": [("wfm.train_steps", None)],
    "model.rl.guidance": [("wfm.guidance_scale", None)],
    "model.rl.clip_ratio": [("wfm.clip_range", None)],
    "model.rl.kl_beta": [("wfm.kl_beta", None)],
    "model.rl.data_beta": [("wfm.data_beta", None), ("wfm.algorithm", lambda v: "ddrl" if v > 0 else "flow_grpo")],
    "model.rl.use_rl_sigma_and_noise": [("wfm.ddrl_rollout_noise", None), ("wfm.ddrl_rollout_sigma", None)],
    "model.rl.use_same_seed": [("wfm.shared_initial_noise", None)],
    "model.rl.exp_reward": [("wfm.advantage_transform", lambda v: "neg_exp" if v else "none")],
    "model.rl.reward_config.adv_clip_max": [("wfm.adv_clip_max", None)],
    "model.rl.max_num_conditional_frames": [("wfm.num_conditional_frames", None)],
    "model.rl.reward_config.remote_reward.scale": [("remote_reward.scale", None)],
    "model.rl.reward_config.remote_reward.reward_fn": [("remote_reward.rewards.0.name", None)],
    "model.rl.reward_config.remote_reward.score_key": [("remote_reward.rewards.0.score_key", None)],
    "model.rl.reward_config.remote_reward.reward_clip_min": [("remote_reward.rewards.0.clip.0", None)],
    "model.rl.reward_config.remote_reward.reward_clip_max": [("remote_reward.rewards.0.clip.1", None)],
    "model.rl.reward_config.remote_reward.enqueue_url": [("remote_reward.enqueue_url", None)],
    "model.rl.reward_config.remote_reward.fetch_url": [("remote_reward.fetch_url", None)],
    "optimizer.weight_decay": [("train.optm_weight_decay", None)],
    "optimizer.betas": [("train.optm_betas", list)],
    "optimizer.eps": [("train.optm_eps", None)],
    "optimizer.master_weights": [("train.master_dtype", lambda v: "float32" if v else "bfloat16")],
    "optimizer.optim_type": [("train.optm_name", lambda v: "AdamW")],
    "scheduler.warm_up_steps": [("train.optm_warmup_steps", lambda v: v[0])],
    "trainer.seed": [("train.seed", None)],
    "trainer.max_iter": [("train.max_steps", None)],
    "trainer.logging_iter": [("logging.log_freq", None)],
    "model_parallel.context_parallel_size": [("policy.parallelism.cp_size", None)],
    "checkpoint.save_iter": [("train.ckpt.save_freq", None)],
    "checkpoint.dcp_async_mode_enabled": [("train.ckpt.save_mode", lambda v: "async" if v else "sync")],
    "job.project": [("logging.project_name", None)],
    "job.name": [("logging.experiment_name", None)],
}
# mapped keys whose value is checked by the effective figures or by a dedicated test below
COSMOS_ELSEWHERE = {"model.text_encoder_class", "model.text_encoder_config.compute_online",
                    "model.text_encoder_config.embedding_concat_strategy", "model.rl.update_ref_every_iter",
                    "model.rl.min_num_conditional_frames", "model.rl.reward_config.remote_reward.enabled",
                    "optimizer.lr", "scheduler.f_max", "scheduler.f_min", "scheduler.cycle_lengths",
                    "trainer.callbacks", "checkpoint.load_path", "job.group", "job.wandb_mode", "job.timestamp"}


def test_every_mapped_key_equals_cosmos_rls_own_reading() -> None:
    mapped = {r.key for r in COSMOS_RULES.values() if r.how == "mapped"}
    data_keys = {k for k in mapped if k.startswith("dataloader_train")}
    assert mapped - data_keys - COSMOS_ELSEWHERE == set(COSMOS_CHECKS)
    compared = 0
    for path in FILES:
        if path == NFT:
            continue
        theirs, cfg = FIXTURE[path.name]["values"], load(path)
        for key, checks in COSMOS_CHECKS.items():
            for ours, fn in checks:
                value = _lookup(cfg, ours)
                assert value == (fn or (lambda v: v))(theirs[key]), (path.name, key, ours)
                compared += 1
        # derived ones
        assert cfg.train.optm_lr == theirs["optimizer.lr"] * theirs["scheduler.f_max"][0]
        assert cfg.train.optm_decay_type == "constant" and theirs["scheduler.f_min"] == theirs["scheduler.f_max"]
        clip = [c["args"].get("clip_norm") for c in theirs["trainer.callbacks"] if c["name"] == "grad_clip"]
        assert cfg.train.optm_grad_norm_clip == clip[0]
        assert cfg.policy.model_name_or_path == theirs["checkpoint.load_path"]
        lo, hi = theirs["model.rl.min_num_conditional_frames"], theirs["model.rl.max_num_conditional_frames"]
        assert (cfg.wfm.conditioning, cfg.wfm.min_num_conditional_frames) == (
            ("image", None) if lo == hi == 1 else ("video", lo))
        kl = theirs["model.rl.kl_beta"]
        assert cfg.wfm.reference_update_interval == (theirs["model.rl.update_ref_every_iter"] if kl > 0 else 0)
        assert cfg.policy.parallelism.dp_replicate_size == -1  # cosmos-rl infers it from the world size
    assert compared == 4 * sum(len(c) for c in COSMOS_CHECKS.values())


def _lookup(cfg: cp.Config, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return list(node) if isinstance(node, tuple) else node


def test_data_keys_equal_cosmos_rls_own_reading() -> None:
    for path in FILES:
        if path == NFT:
            continue
        theirs, wfm = FIXTURE[path.name]["values"], load(path).wfm
        data = wfm.data
        if theirs["dataloader_train.type"] == "local":
            video = "dataloader_train.video_dataloader."
            assert (data.kind, data.path, data.num_frames) == ("clip_folder", theirs[video + "dataset_dir"],
                                                               theirs[video + "num_frames"])
            assert [data.height, data.width] == theirs[video + "video_size"]  # (height, width), cosmos-rl's resize
            assert wfm.rollout_batch_size == theirs[video + "batch_size"]
            online = theirs.get("model.text_encoder_config.compute_online", False)  # no text_encoder_config: T5
            assert data.text_encoder == "none"
            assert data.embedding_dir == ("text_embedding" if online else "t5_xxl")
            assert data.text_dim == (100352 if theirs["model.text_encoder_class"] == "reason1_7B" else 1024)
        else:  # cosmos-rl's mock data: random clips of the resolution's size, T5-shaped embeddings
            dataset = "dataloader_train.video_dataloader.dataloader."
            assert (data.kind, data.num_frames, data.height, data.width) == (
                "mock", theirs[dataset + "dataset.num_video_frames"], 432, 768)
            assert data.max_tokens == theirs[dataset + "dataset.len_t5"]
            assert data.text_dim == theirs[dataset + "dataset.t5_dim"]
            assert wfm.rollout_batch_size == theirs[dataset + "batch_size"]


DIFFUSERS_CHECKS: dict[str, list[tuple[str, Any]]] = {
    "policy.model_name_or_path": [("policy.model_name_or_path", None)],
    "policy.model_revision": [("policy.model_revision", None)],
    "policy.model_gradient_checkpointing": [("policy.model_gradient_checkpointing", None)],
    "policy.lora.r": [("policy.lora.r", None)],
    "policy.lora.lora_alpha": [("policy.lora.lora_alpha", None)],
    "policy.lora.lora_dropout": [("policy.lora.lora_dropout", None)],
    "policy.lora.target_modules": [("policy.lora.target_modules", None)],
    "policy.lora.init_lora_weights": [("policy.lora.init_lora_weights", None)],
    "policy.parallelism.dp_shard_size": [("policy.parallelism.dp_shard_size", None)],
    "policy.parallelism.tp_size": [("policy.parallelism.tp_size", None)],
    "policy.diffusers.max_prompt_length": [("wfm.data.max_tokens", None)],
    "policy.diffusers.inference_size": [("wfm.data.height", lambda v: v[0]), ("wfm.data.width", lambda v: v[1])],
    "policy.diffusers.train_frames": [("wfm.data.num_frames", None)],
    "policy.diffusers.nft_beta": [("wfm.nft_beta", None)],
    "policy.diffusers.sample.num_steps": [("wfm.num_inference_steps", None)],
    "rollout.n_generation": [("wfm.num_samples_per_prompt", None)],
    "train.train_policy.trainer_type": [("wfm.algorithm", None)],
    "train.train_policy.kl_beta": [("wfm.kl_beta", None)],
    "train.train_policy.mini_batch": [("train.train_policy.mini_batch", None)],
    "train.train_policy.advantage_high": [("wfm.adv_clip_max", None)],
    "train.train_policy.remote_reward.scale": [("remote_reward.scale", None)],
    "train.optm_lr": [("train.optm_lr", None)],
    "train.epsilon": [("train.optm_eps", None)],
    "train.optm_warmup_steps": [("train.optm_warmup_steps", None)],
    "train.optm_weight_decay": [("train.optm_weight_decay", None)],
    "train.optm_betas": [("train.optm_betas", None)],
    "train.optm_grad_norm_clip": [("train.optm_grad_norm_clip", None)],
    "train.optm_impl": [("train.optm_impl", None)],
    "train.param_dtype": [("policy.dtype", None)],
    "train.epoch": [("train.epoch", None)],
    "train.resume": [("train.resume", None)],
    "train.ckpt.enable_checkpoint": [("train.ckpt.enable_checkpoint", None)],
    "train.ckpt.save_freq": [("train.ckpt.save_freq", None)],
    "train.ckpt.save_mode": [("train.ckpt.save_mode", None)],
    "train.ckpt.max_keep": [("train.ckpt.max_keep", None)],
    "train.ckpt.export_safetensors": [("train.ckpt.export_safetensors", None)],
    "logging.logger": [("logging.logger", None)],
    "logging.project_name": [("logging.project_name", None)],
    "logging.experiment_name": [("logging.experiment_name", None)],
    "validation.freq": [("wfm.eval_freq", None)],
}


def test_the_diffusers_file_equals_cosmos_rls_own_reading() -> None:
    theirs, cfg = FIXTURE[NFT.name]["values"], load(NFT)
    for key, checks in DIFFUSERS_CHECKS.items():
        for ours, fn in checks:
            assert _lookup(cfg, ours) == (fn or (lambda v: v))(theirs[key]), key
    # every mapped key the file spells is compared (here or below)
    below = {"policy.diffusers.sample.eval_num_steps", "policy.diffusers.sample.guidance_scale", "validation.enable",
             "train.train_batch_per_replica", "train.train_policy.dataset.name", "train.train_policy.use_remote_reward",
             "train.train_policy.remote_reward.reward_fns", "train.output_dir", "train.optm_name",
             "train.fsdp_offload", "train.fsdp_reshard_after_forward"}
    assert {key for key, _, _ in reading_of(NFT).mapped} - set(DIFFUSERS_CHECKS) <= below
    assert theirs["validation.enable"] is False and cfg.wfm.eval_num_inference_steps == 0
    assert cfg.wfm.guidance_scale == theirs["policy.diffusers.sample.guidance_scale"] == 1.0
    # timestep_fraction (sic) is not cosmos-rl's key: it trains with timesteps_fraction = 1.0, every sampler step
    assert theirs["policy.diffusers.timesteps_fraction"] == 1.0
    assert cfg.wfm.nft_num_timesteps == theirs["policy.diffusers.sample.num_steps"]
    assert cfg.wfm.nft_timesteps == "sampler"  # the sampler's timesteps, shuffled per sample, as there
    (fn,) = theirs["train.train_policy.remote_reward.reward_fns"]
    (term,) = cfg.remote_reward.rewards
    assert (term.name, term.weight, term.score_key, list(term.clip)) == (
        fn["name"], fn["weight"], fn["score_key"], [fn["clip_min"], fn["clip_max"]])
    assert cfg.wfm.rollout_batch_size * cfg.wfm.num_samples_per_prompt * cfg.policy.parallelism.dp_shard_size == \
        theirs["train.train_batch_per_replica"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_effective_figures_equal_cosmos_rls(path: Path) -> None:
    reading = reading_of(path)
    ours = effective_values(load(path), reading.data_ranks)
    assert ours == FIXTURE[path.name]["effective"]


def test_migrate_calls_them_world_model_files(capsys: pytest.CaptureFixture[str]) -> None:
    for path in FILES:
        assert migrate_main([str(path)]) == 1  # the model / data path is still to give
        out = capsys.readouterr().out
        assert "a cosmos-rl world-model config" in out and "this library's own config" not in out
        assert "use examples/wfm_rl.py" not in out and "does not load" not in out and "does NOT load" not in out
        assert out.rstrip().splitlines()[-2].endswith("examples/wfm_rl.py stops at start-up on:") or \
            "examples/wfm_rl.py stops at start-up on:" in out
    assert migrate_main([str(NFT)]) == 1
    out = capsys.readouterr().out
    assert "train.train_policy.trainer_type = 'diffusion_nft' -> wfm.algorithm" in out
    assert "a custom trainer class" not in out


@pytest.mark.parametrize("path", [MOCK, NFT], ids=lambda p: p.stem)
def test_the_style_marker_and_a_world_model_file(path: Path, tmp_path: Path) -> None:
    text = path.read_text()
    marked = tmp_path / "marked.toml"
    marked.write_text('config_style = "cosmos-rl"\n' + text)  # cosmos-rl's own meaning: changes nothing
    assert load(marked) == load(path)
    mapped, reading, why = read_cosmos_rl_file(path)
    assert isinstance(reading, WorldModelReading) and mapped == reading.mapped
    assert why.startswith("a cosmos-rl world-model file (configs/cosmos-predict2-5/ layout")
    # marked as this library's: nothing is translated, so cosmos-rl's world-model keys are unknown here
    ours = tmp_path / "ours.toml"
    ours.write_text('config_style = "cosmos_primitives"\n' + text)
    with pytest.raises(cp.ConfigError, match="unknown key" if path == MOCK else "is_diffusers"):
        load(ours)
    # a dumped world-model config is marked as this library's and loads back as it is
    cfg = load(path, ["policy.model_name_or_path=tiny", "wfm.data.path=/some/clips"])
    assert load(cp.config.dump_config(cfg, tmp_path / "dumped.toml")) == cfg


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_migrate_json_has_the_effective_figures(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    migrate_main(["--json", str(path)])
    out = json.loads(capsys.readouterr().out)
    assert out["kind"].startswith("cosmos-rl world-model") and out["loads"] is True
    assert out["read_as"] == "cosmos-rl" and out["why"].startswith("a cosmos-rl world-model file")
    effective = out["effective"]
    for key in ("samples_per_step_per_rank", "samples_per_step", "lr", "warmup_steps", "algorithm"):
        assert effective[key] == FIXTURE[path.name]["effective"][key], key


def test_doc_tables_are_the_code_tables() -> None:
    doc = DOC.read_text()
    start = doc.index("<!-- cosmos-rl world-model key tables: generated, do not edit -->\n")
    end = doc.index("<!-- end of cosmos-rl world-model key tables -->")
    assert doc[start:end].split("\n", 1)[1] == render_tables(), "regenerate with render_tables()"
    assert len(DIFFUSERS_RULES) > 40 and all(targets(r)[0] for r in COSMOS_RULES.values() if r.how == "mapped")


# --- the pieces the translation needs from the recipe -------------------------------------------------


def test_listed_train_steps_and_random_extras() -> None:
    sde = torch.arange(10)
    assert cp.algo.listed_train_steps([0, 2, 4], sde).tolist() == [0, 2, 4]
    g = torch.Generator().manual_seed(0)
    picked = cp.algo.listed_train_steps([1, -1, -1], sde, generator=g).tolist()
    assert picked[0] == 1 and len(set(picked)) == 3 and all(0 <= p < 10 for p in picked)
    with pytest.raises(ValueError, match="train_steps"):
        cp.algo.listed_train_steps([12], sde)
    window = torch.tensor([3, 4, 5])  # positions are indices into the stochastic steps
    assert cp.algo.listed_train_steps([4, 5], window).tolist() == [1, 2]


def test_nft_points_are_the_sampler_grid_shuffled_per_sample() -> None:
    from cosmos_primitives.policy.flow_update import nft_grid_points

    sigmas = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0])
    points = nft_grid_points(sigmas, 3, 4, torch.Generator().manual_seed(0))
    assert points.shape == (3, 4)
    assert all(sorted(row.tolist()) == sorted(sigmas[:-1].tolist()) for row in points)  # every grid point once
    assert len({tuple(row.tolist()) for row in points}) > 1  # each sample its own order
    with pytest.raises(ValueError, match="nft_num_timesteps = 5"):
        nft_grid_points(sigmas, 3, 5, torch.Generator())


def test_sample_std_advantages_as_torch_computes_them() -> None:
    rewards = torch.tensor([1.0, 2.0, 4.0, 0.5, 0.5, 3.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = cp.algo.flow_grpo_advantages(rewards, ids, unbiased=True)
    for g in (0, 1):
        r = rewards[ids == g]
        torch.testing.assert_close(adv[ids == g], (r - r.mean()) / (r.std() + 1e-4))  # cosmos-rl's
    assert not torch.allclose(adv, cp.algo.flow_grpo_advantages(rewards, ids))


def test_a_group_can_share_its_initial_noise() -> None:
    def velocity(x, t, text, **_):
        return torch.zeros_like(x)

    sigmas, timesteps = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1000.0, 500.0])
    text = torch.zeros(4, 2, 3)
    kwargs = dict(latent_shape=(2, 1, 2, 2), sigmas=sigmas, timesteps=timesteps, seeds=[1, 2, 3, 4],
                  sde=cp.algo.SDEParams())
    shared = cp.rollout.sample_flow(velocity, text, noise_seeds=[7, 7, 8, 8], **kwargs)
    assert torch.equal(shared.initial_noise[0], shared.initial_noise[1])
    assert not torch.equal(shared.initial_noise[1], shared.initial_noise[2])
    assert not torch.equal(shared.samples[0], shared.samples[1])  # the SDE steps draw their own noise
    own = cp.rollout.sample_flow(velocity, text, **kwargs)
    assert not torch.equal(own.initial_noise[0], own.initial_noise[1])


def test_conditioning_frame_range() -> None:
    cfg = cp.config.config_from_dict({"wfm": {"conditioning": "video", "num_conditional_frames": 1,
                                              "min_num_conditional_frames": 0}})
    assert cfg.wfm.condition_frame_range(6) == (0, 1)
    cfg = cp.config.config_from_dict({"wfm": {"conditioning": "image", "min_num_conditional_frames": 0}})
    with pytest.raises(ValueError, match="min_num_conditional_frames"):
        cfg.wfm.condition_frame_range(6)


def test_dp_replicate_is_inferred_from_the_world_size() -> None:
    from cosmos_primitives.parallel.mesh import MeshError, resolve_sizes

    par = load(FILES[0]).policy.parallelism  # fsdp 32, cp 8: 1024 ranks give 4 replicas, as in cosmos-rl
    assert resolve_sizes(par, 1024)["dp_replicate"] == 4
    with pytest.raises(MeshError, match="cannot infer dp_replicate_size"):
        resolve_sizes(par, 100)
    with pytest.raises(MeshError, match="only one of"):
        resolve_sizes(cp.config.ParallelismConfig(dp_replicate_size=-1, dp_shard_size=-1), 4)


def _gather(rewards: list[float]) -> list[list[float]]:
    rank = torch.distributed.get_rank()
    mine = torch.tensor(rewards) + rank
    return cp.parallel.gather_group_rewards(mine, data_rank=rank, group_ranks=2).tolist()


def test_group_rewards_are_gathered_from_the_groups_ranks() -> None:
    alone = cp.parallel.gather_group_rewards(torch.tensor([1.0, 2.0]), data_rank=0, group_ranks=1)
    assert alone.tolist() == [[1.0, 2.0]]
    from cosmos_primitives.testing.distributed import run_distributed

    results = run_distributed(_gather, 2, args=([1.0, 2.0],))
    assert results[0] == results[1] == [[1.0, 2.0], [2.0, 3.0]]


def test_reference_refresh_copies_the_weights() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.enable_gradient_checkpointing = lambda: None
    policy = cp.policy.DiffusionPolicy(model, keep_reference=True)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    policy.refresh_reference()
    assert torch.equal(policy._frozen_reference[0].weight, model[0].weight)
    adapters = cp.config.config_from_dict({"policy": {"lora": {"target_modules": ["0"]}}}).policy.lora
    lora = cp.policy.DiffusionPolicy(torch.nn.Sequential(torch.nn.Linear(2, 2)), lora=adapters)
    with pytest.raises(RuntimeError, match="full fine-tuning"):
        lora.refresh_reference()


# --- each file runs a step of examples/wfm_rl.py ---------------------------------------------------------


def _dance_grpo(media: np.ndarray, **_: Any) -> dict[str, np.ndarray]:
    """A stand-in for the service's dance_grpo: the videos' mean brightness as ``overall_reward``."""
    video = np.asarray(media, dtype=np.float64)
    return {"overall_reward": video.reshape(video.shape[0], -1).mean(1) / 255.0}


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A diffusers folder laid out like Cosmos-Predict2.5's (T5-wide text, 1024) and a clip folder whose
    embeddings sit where each file looks for them (text_embedding/, and t5_xxl/ for offline T5)."""
    from cosmos_primitives.testing import tiny_cosmos_transformer, tiny_unipc_flow_scheduler, tiny_wan_vae, write_mp4

    root = tmp_path_factory.mktemp("cosmos_rl_wfm")
    model = root / "model"
    tiny_cosmos_transformer(seed=0, text_dim=1024).save_pretrained(model / "transformer")
    tiny_wan_vae(seed=0).save_pretrained(model / "vae")
    tiny_unipc_flow_scheduler().save_pretrained(model / "scheduler")
    clips = root / "clips"
    rng = np.random.default_rng(0)
    for name in ("walk", "drive", "wave"):
        write_mp4(clips / "videos" / f"{name}.mp4", num_frames=9, fps=8.0, size=(32, 32))
        (clips / "metas").mkdir(exist_ok=True)
        (clips / "metas" / f"{name}.txt").write_text(f"a person does {name}")
        for folder in ("text_embedding", "t5_xxl"):
            (clips / folder).mkdir(exist_ok=True)
            np.save(clips / folder / f"{name}.npy", rng.standard_normal((4, 1024)).astype(np.float32))
    return model, clips


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_file_runs_a_step(path: Path, tiny_inputs: tuple[Path, Path], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The file as it is, with the model and data paths given, one step, and clips small enough for a CPU
    (93 frames of 720p through even a tiny VAE take minutes per rollout here)."""
    from cosmos_primitives.logging import read_metrics
    from cosmos_primitives.rewards.server.app import RewardServer
    from test_wfm_recipes import run_recipe

    model, clips = tiny_inputs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("COSMOS_OUTPUT_DIR", str(tmp_path / "outputs"))
    overrides = [f"policy.model_name_or_path={'tiny' if path == MOCK else model}", "train.max_steps=1",
                 "wfm.data.num_frames=5", "wfm.data.height=16", "wfm.data.width=16"]
    if path != MOCK:  # cosmos-rl's mock data has no path
        overrides.append(f"wfm.data.path={clips}")
    with RewardServer(token="t", rewards={"dance_grpo": _dance_grpo}) as server:
        monkeypatch.setenv("WFM_REWARD_TOKEN", "t")
        monkeypatch.setenv("WFM_REWARD_ENQUEUE_URL", server.enqueue_url)
        monkeypatch.setenv("WFM_REWARD_FETCH_URL", server.fetch_url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            run_dir = run_recipe(["--config", str(path), *overrides])
    assert Path(run_dir).resolve().is_relative_to(tmp_path.resolve())  # the file's output_dir, under the cwd
    (step,) = [r for r in read_metrics(run_dir) if "reward_mean" in r]
    assert step["step"] == 1 and np.isfinite(step["grad_norm"]) and 0.0 < step["reward_mean"] < 1.0
    resolved = cp.load_config(run_dir / "config.toml")
    reading = reading_of(path)
    assert effective_values(resolved, reading.data_ranks)["algorithm"] == FIXTURE[path.name]["effective"]["algorithm"]
    if path != NFT:  # the checkpoint cosmos-rl makes at the end of training
        assert (run_dir / "checkpoints" / "step_1").is_dir()


@pytest.mark.slow
def test_a_group_spread_over_two_ranks_trains_as_one_rank(tmp_path: Path) -> None:
    """``[wfm] group_ranks = 2`` on 2 gloo ranks (cosmos-rl's layout: the ranks share the prompt, each
    rolls out half the group, the rewards are gathered for the advantages) against the same config on
    one process (gcd: the whole group on one rank): the same rollouts (seeded per group and sample), so
    the same group rewards and gradient norms over two FlowGRPO steps."""
    from test_wfm_context_parallel import _recipe_metrics

    config = Path(__file__).parents[1] / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"
    spread = ["wfm.group_ranks=2", "wfm.advantage_std=sample", "wfm.rollout_batch_size=1"]
    one = _recipe_metrics(config, spread, 1, tmp_path / "out1")
    two = _recipe_metrics(config, spread, 2, tmp_path / "out2")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    for a, b in zip(one, two):
        for key in ("reward_mean", "reward_std", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)


def test_no_llm_or_vlm_file_is_taken_for_a_world_model_file() -> None:
    others = [p for p in (DATA / "cosmos_rl_configs").rglob("*.toml") if "cosmos-predict2-5" not in p.parts]
    # 54 LLM / VLM files: tests/data/cosmos_rl_configs/README.md lists them (the distillation files the newest)
    assert len(others) == 54 and not [p for p in others if world_model_kind(read_toml(p))]


@pytest.mark.parametrize(("extra", "refused"), [
    ({"model_parallel": {"tensor_model_parallel_size": 2}}, "model_parallel.tensor_model_parallel_size"),
    ({"scheduler": {"f_min": [0.1]}}, "scheduler.f_min"),  # a decay that would not end at max_iter
    ({"model": {"rl": {"on_policy": False}}}, "model.rl.on_policy"),
    ({"model": {"rl": {"reward_config": {"aesthetic": {"enabled": True}}}}},
     "model.rl.reward_config.aesthetic.enabled"),
    ({"model": {"rl": {"reward_config": {"remote_reward": {"token": "abc"}}}}},
     "model.rl.reward_config.remote_reward.token"),
    ({"dataloader_train": {"type": "web", "video_dataloader": {"ratio": 1}}}, "dataloader_train.type"),
    ({"trainer": {"grad_accum_iter": 2}}, "trainer.grad_accum_iter"),
])
def test_what_cannot_run_here_is_refused_with_what_to_do(extra: dict[str, Any], refused: str) -> None:
    tree = read_toml(WFM / "cosmos-predict2-5-2b-480-grpo.toml")

    def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(tree, extra)
    reading = read_world_model_file(tree)
    assert refused in reading.refused and reading.refused[refused].startswith("= ")
    assert reading.refused[refused].split(": ", 1)[1]  # says what to do


def test_a_decay_to_f_min_that_ends_at_max_iter_is_linear() -> None:
    tree = read_toml(WFM / "cosmos-predict2-5-2b-480-grpo.toml")
    tree["scheduler"].update(f_min=[0.1], cycle_lengths=[2001])
    reading = read_world_model_file(tree)
    assert not reading.refused.get("scheduler.f_min")
    assert (tree["train"]["optm_decay_type"], tree["train"]["optm_min_lr_factor"]) == ("linear", 0.1)
