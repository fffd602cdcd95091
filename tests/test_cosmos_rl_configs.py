"""cosmos-rl configs as users have them: every vendored file loads, every key of cosmos-rl's config
class is mapped / ignored / refused in one table (code and docs agree), cosmos-rl meanings and
defaults, and the migration report."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import msgspec
import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError, check_runnable, load_config
from cosmos_primitives.config.compat.cosmos_rl import RULES, render_table, rule_for
from cosmos_primitives.config.loader import canonical_key
from cosmos_primitives.migrate import main as migrate_main

DATA = Path(__file__).parent / "data" / "cosmos_rl_configs"
# the LLM / VLM files; the world-model ones (configs/cosmos-predict2-5/) are tests/test_cosmos_rl_wfm.py's
CONFIGS = sorted(p for p in DATA.rglob("*.toml") if "cosmos-predict2-5" not in p.parts)
REASON1_RL = DATA / "cosmos-reason1" / "examples" / "post_training" / "configs" / "rl.toml"
REASON1_SFT = DATA / "cosmos-reason1" / "examples" / "post_training" / "configs" / "sft.toml"
DOC = Path(__file__).parents[1] / "docs" / "from_cosmos_rl.md"
# the one file with a real mistake: a misspelt key that cosmos-rl (pydantic, extra keys ignored) never read
MISTAKE = ("cosmos-rl/configs/qwen3/qwen3-32b-tp8-sft.toml", "policy.model_gradient_checkpointig")


def load_quietly(path: Path, overrides: list[str] | None = None) -> cp.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_config(path, overrides or [])


def test_every_vendored_config_loads(tmp_path: Path) -> None:
    # cosmos-rl's 33 (its three distillation files: [distillation]), Reason1's 4, Reason2's 3, the cookbook's 11,
    # its tests' 5
    assert len(CONFIGS) == 54
    for i, path in enumerate(CONFIGS):
        cfg = load_quietly(path)
        # the resolved config (cosmos-rl meanings translated) is written to the run folder and loads back
        # equal; an unset seed is not written (the recipes dump the seed they drew)
        again = load_config(cp.config.dump_config(cfg, tmp_path / f"{i}.toml"))
        assert again == msgspec.structs.replace(cfg, train=msgspec.structs.replace(cfg.train, seed=again.train.seed))
        assert cfg.train.seed is None or again.train.seed == cfg.train.seed, path


def test_a_key_cosmos_rl_ignored_is_ignored_with_the_closest_key_named() -> None:
    name, key = MISTAKE
    with pytest.warns(UserWarning) as caught:
        cfg = load_config(DATA / name)
    (message,) = [str(w.message) for w in caught if "read as a cosmos-rl config" in str(w.message)]
    assert (f"{key} (not a key of cosmos-rl's config (it ignores keys it does not have, so this one changed nothing "
            "there) nor of this library's; did you mean 'policy.model_gradient_checkpointing'?)") in message
    assert cfg.policy.model_gradient_checkpointing is True  # cosmos-rl's default, as it trained there


def _class_keys() -> list[str]:
    """Every dotted key of cosmos-rl's config class (the vendored copy), walked from ``Config``."""
    tree = ast.parse((DATA / "cosmos-rl" / "cosmos_rl" / "policy" / "config" / "__init__.py.txt").read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def fields(name: str) -> list[tuple[str, str]]:
        node = classes[name]
        own = [(b.target.id, ast.unparse(b.annotation)) for b in node.body
               if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
        bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) in classes]
        return own + [f for base in bases for f in fields(base)]

    keys: list[str] = []

    def walk(name: str, prefix: str) -> None:
        for field, annotation in fields(name):
            path = prefix + field
            nested = [c for c in re.findall(r"\w+", annotation) if c in classes and c != name]
            if field == "train_policy":
                nested = ["SFTDataConfig", "GrpoConfig"]
            if nested and path not in RULES:  # a sub-table: its keys (a whole-section rule covers all)
                for c in nested:
                    walk(c, path + ".")
            else:
                keys.append(path)

    walk("Config", "")
    return keys


def test_every_key_of_the_cosmos_rl_class_has_one_rule() -> None:
    keys = _class_keys()
    assert len(keys) > 200  # the walk really went through the class
    missing = [k for k in keys if rule_for(k) is None]
    assert not missing, f"add these cosmos-rl keys to config/compat/cosmos_rl.py: {missing}"
    assert {rule.how for rule in RULES.values()} == {"mapped", "ignored", "refused"}
    for rule in RULES.values():
        if rule.how == "mapped" and not rule.note.startswith("="):
            target = rule.note.split(" ")[0]
            assert canonical_key(rule.key) == target, rule.key  # the loader reads it as the table says


def test_doc_table_is_the_code_table() -> None:
    doc = DOC.read_text()
    start = doc.index("<!-- cosmos-rl key table: generated, do not edit -->\n") + len(
        "<!-- cosmos-rl key table: generated, do not edit -->\n")
    end = doc.index("<!-- end of cosmos-rl key table -->")
    assert doc[start:end] == render_table(), "regenerate with: python -m cosmos_primitives.migrate --table"


def test_reason1_rl_reads_as_cosmos_rl_means_it() -> None:
    with pytest.warns(UserWarning) as caught:
        cfg = load_config(REASON1_RL)
    (message,) = [str(w.message) for w in caught if "read as a cosmos-rl config" in str(w.message)]
    assert "train.async_tp_enabled (speed-only" in message and "redis (launcher-only" in message
    # the speed keys it sets are read (compile = false, optm_impl = "fused", reshard "default")
    assert "train.compile" not in message
    assert (cfg.train.compile, cfg.train.optm_impl, cfg.train.fsdp_reshard_after_forward) == (False, "fused", "default")
    assert cfg.train.optm_eps == 1e-6  # train.epsilon
    assert cfg.train.optm_lr == 2e-6 and cfg.train.optm_warmup_steps == 20
    assert cfg.grpo.temperature == 0.9  # trainer-side temperature
    assert cfg.grpo.num_samples_per_prompt == 8
    assert cfg.rollout.batch_size == 4 * 8  # 4 prompts per generate call there
    assert cfg.train.train_batch_per_replica == 64  # 128 per replica of dp_shard 2
    assert cfg.grpo.rollout_batch_size == 8  # 64 rollouts per rank and step = 8 prompts x 8
    assert cfg.grpo.old_logprobs == "recompute"  # cosmos-rl's default (use_rollout_logprobs_for_loss = false)
    assert cfg.train.train_policy.sequence_packing is False  # cosmos-rl's default
    assert cfg.rollout.backend == "auto"  # unset in the file: decided where the engine is built
    assert cfg.grpo.min_filter_prefix_tokens == 1
    assert cfg.train.train_policy.prompt_column_name == "qa_pairs"  # the dataset script's column
    assert cfg.unsupported == {}
    check_runnable(cfg, str(REASON1_RL))  # nothing refused, a Hub dataset: the recipes start on it


def test_own_style_files_keep_our_defaults(tmp_path: Path) -> None:
    path = tmp_path / "ours.toml"
    for text in ("[train]\nepoch = 2\noptm_eps = 1e-8\n[rollout]\nbatch_size = 4\n",  # optm_eps: ours only
                 "config_style = 'cosmos_primitives'\n[train]\nepoch = 2\n[rollout]\nbatch_size = 4\n"):
        path.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no cosmos-rl warning for our own file
            cfg = load_config(path)
        assert (cfg.train.optm_lr, cfg.rollout.batch_size, cfg.grpo.num_samples_per_prompt) == (1e-5, 4, 8), text
        assert cfg.unsupported == {} and cfg.train.seed == 42


@pytest.mark.parametrize(("text", "why"), [
    # the same keys as Reason2's hf_sft.toml: only keys both configs have
    ('[train]\ntrain_batch_per_replica = 32\n[policy]\nmodel_name_or_path = "m"\n[train.train_policy]\ntype = "sft"\n',
     "every key it holds is one cosmos-rl's config has too"),
    ("[train]\nepsilon = 1e-6\n[grpo]\nkl_beta = 0.0\n", "it holds 'train.epsilon', a key of cosmos-rl's config"),
    ("config_style = 'cosmos-rl'\n[grpo]\nkl_beta = 0.0\n", "config_style = 'cosmos-rl'"),
])
def test_a_file_is_read_one_way_whatever_keys_it_holds(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.warns(UserWarning, match="read as a cosmos-rl config") as caught:
        cfg = load_config(path)
    assert any(why in str(w.message) for w in caught)
    # cosmos-rl's defaults, every one of them, whichever keys the file spells
    assert (cfg.train.optm_lr, cfg.train.optm_eps, cfg.train.optm_warmup_steps) == (1e-6, 1e-6, 20)
    assert cfg.policy.model_gradient_checkpointing is True and cfg.train.train_policy.sequence_packing is False
    assert cfg.train.seed is None and cfg.train.compile is True


def test_the_style_marker_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("config_style = 'cosmos_rl'\n[train]\nepoch = 1\n")
    with pytest.raises(ConfigError, match="key 'config_style' = 'cosmos_rl': write \"cosmos-rl\""):
        load_config(path)


def test_compile_is_on_for_a_cosmos_rl_file_that_leaves_it_unset(tmp_path: Path) -> None:
    for text, expected in (('redis = "1"\n[train]\nepoch = 2\n', True),  # cosmos-rl's default
                           ('redis = "1"\n[train]\ncompile = false\n', False),
                           ("[train]\nepoch = 2\n[policy]\ndtype = 'bfloat16'\n", False),  # ours
                           ("[train]\ncompile = true\noptm_impl = 'for-loop'\nfsdp_reshard_after_forward = 'never'\n",
                            True)):
        path = tmp_path / "c.toml"
        path.write_text(text)
        assert load_quietly(path).train.compile is expected, text
    cfg = load_quietly(path)
    assert (cfg.train.optm_impl, cfg.train.fsdp_reshard_after_forward) == ("for-loop", "never")
    path.write_text("[train]\noptm_impl = ['fused', 'foreach']\n")  # cosmos-rl's list per model part
    with pytest.raises(ConfigError, match="optm_impl"):
        load_quietly(path)


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ('redis = "12800"\n[train]\nepoch = 2\n', lambda c: c.redis.url == "" and c.train.epoch == 2),
        ("[train]\nepsilon = 1e-7\n", lambda c: c.train.optm_eps == 1e-7),
        ("[train]\nmax_num_steps = 7\n", lambda c: c.train.max_steps == 7),
        ("[train]\nsequence_packing = true\n", lambda c: c.train.train_policy.sequence_packing is True),
        ("[train]\noptm_warmup_steps = 0.03\n", lambda c: c.train.optm_warmup_steps == 0.03),
        ("[train.train_policy.dataset]\nsplit = ['train', 'validation']\n",
         lambda c: c.train.train_policy.dataset.split == "train+validation"),
        ("[policy]\nfreeze_pattern = 'visual'\n", lambda c: c.policy.freeze_patterns == ["visual"]),
    ],
)
def test_loader_reads_cosmos_rl_spellings(tmp_path: Path, text: str, check) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert check(load_quietly(path))


def test_fractional_warmup_is_a_fraction_of_the_steps() -> None:
    import torch

    cfg = cp.config.config_from_dict({"train": {"optm_warmup_steps": 0.03, "optm_decay_type": "linear"}})
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = cp.policy.build_lr_scheduler(optimizer, cfg.train, total_steps=200)
    assert scheduler.warmup_steps == 6  # int(0.03 * 200), as cosmos-rl


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[train]\nepsilonn = 1e-6\n", "did you mean 'train.epsilon' (= 'train.optm_eps')?"),
        ("[train]\nmaster_dtyp = 'float32'\n", "did you mean 'train.master_dtype'?"),
        ("[train.train_policy]\ndataloader_shufle = false\n", "did you mean 'train.train_policy.dataloader_shuffle'?"),
        ("[train.train_policy]\nkl_betta = 0.1\n", "did you mean 'train.train_policy.kl_beta' (= 'grpo.kl_beta')?"),
    ],
)
def test_suggestions_know_aliases_and_cosmos_rl_keys(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_quietly(path)
    assert expected in str(info.value)
    assert "max_steps" not in str(info.value) and "'train.epoch'" not in str(info.value)


def test_every_problem_of_a_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[train]\ncompile = false\nepoc = 1\ntrain_batch_per_replica = 0\n"
                    "[policy]\nmodel_gradient_checkpointig = true\n")
    with pytest.raises(ConfigError) as info:
        load_quietly(path)
    assert len(info.value.problems) == 3
    assert all(p.startswith(str(path)) for p in info.value.problems)
    # written for cosmos-rl (its redis port): the misspelt keys changed nothing there and are ignored, named
    path.write_text('redis = "1"\n' + path.read_text())
    with pytest.raises(ConfigError) as info, pytest.warns(UserWarning, match="did you mean 'train.epoch'"):
        load_config(path)
    assert len(info.value.problems) == 1 and "train_batch_per_replica" in info.value.problems[0]


def test_migrate_reports_maps_ignored_refused_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate_main([str(REASON1_RL)]) == 0  # the recipes start on it
    out = capsys.readouterr().out
    assert "train.epsilon = 1e-06 -> train.optm_eps" in out
    assert "train.async_tp_enabled: speed-only" in out
    assert "train.compile = False  (torch.compile of every decoder layer" in out
    assert "a cosmos-rl config (its top-level redis is cosmos-rl's controller port)" in out
    assert "train.train_policy.prompt_column_name = 'qa_pairs'  (the prompt column" in out
    assert "grpo.old_logprobs = 'recompute'" in out  # a default that differs
    assert "rollout.batch_size = 4 prompts is 32 sequences here" in out
    assert "  samples_per_step_per_rank = 64\n  data_parallel_size = 2\n  samples_per_step = 128\n" in out
    assert out.rstrip().endswith("loads with cp.load_config; the recipes start on it")
    assert migrate_main([str(REASON1_SFT)]) == 0
    out = capsys.readouterr().out
    assert "train.train_policy.dataset.test_size = 100  (with validation.enable and no validation.dataset.name" in out
    # gone from cosmos-rl's class: it ignores the key, so Reason1's SFT ran without validation there
    assert "train.enable_validation: an older cosmos-rl spelling, gone from its config class" in out
    assert migrate_main(["--table"]) == 0 and capsys.readouterr().out.count("\n| `") == len(RULES)


def test_unset_backend_is_vllm_only_with_vllm_and_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    import importlib.util

    from cosmos_primitives.utils import engine_choice as backend_choice
    from cosmos_primitives.utils.engine_choice import resolve_backend

    path = tmp_path / "c.toml"
    path.write_text("[train]\nepoch = 1\n")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(backend_choice, "_gpu_present", lambda: True)
    with caplog.at_level("INFO", logger="cosmos"):
        assert resolve_backend(load_config(path).rollout.backend) == "vllm"
    assert "rollout.backend = 'auto': using 'vllm' (vLLM is installed and a GPU is present)" in caplog.text
    monkeypatch.setattr(backend_choice, "_gpu_present", lambda: False)
    assert resolve_backend(load_config(path).rollout.backend) == "hf"
    assert resolve_backend(load_config(path, ["rollout.backend=vllm"]).rollout.backend) == "vllm"  # said: as it is
    path.write_text("[rollout]\nbackend = 'hf'\n")
    monkeypatch.setattr(backend_choice, "_gpu_present", lambda: True)
    assert resolve_backend(load_config(path).rollout.backend) == "hf"


DISTILLATION = sorted(p for p in CONFIGS if "distill" in p.name)


@pytest.mark.parametrize("path", DISTILLATION, ids=lambda p: p.name)
def test_every_distillation_file_starts_with_only_model_and_data_paths_overridden(path: Path, tmp_path: Path) -> None:
    """cosmos-rl's three distillation files pass the recipes' start-up checks with only the student, teacher
    and data paths overridden, each key read as cosmos-rl (and the file's launcher script) reads it."""
    for name in ("student", "teacher"):
        (tmp_path / name).mkdir()
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    cfg = load_quietly(path, [f"policy.model_name_or_path={tmp_path / 'student'}",
                              f"distillation.model_name_or_path={tmp_path / 'teacher'}",
                              f"train.train_policy.dataset.name={data}", f"validation.dataset.name={data}"])
    cfg = check_runnable(cfg, str(path))  # raises ConfigError listing every key that stops a recipe
    assert cfg.distillation.enable and cfg.unsupported == {}
    text = path.read_text()
    if 'optm_name = "Adam"' in text:
        assert cfg.train.optm_name == "Adam"
    if "epsilon_low = -1.0" in text:
        assert (cfg.grpo.epsilon_low, cfg.grpo.epsilon_high, cfg.grpo.dual_clip_c) == (-1.0, -1.0, 100.0)
    if "optm_decay_ratio = 0.0" in text:
        # cosmos-rl: 0 decay steps, the learning rate stays at its peak after the warmup whatever the decay type
        assert cfg.train.optm_decay_type == "constant"
    if "top_p = 0.95" in text:
        assert cfg.validation.top_p == 0.95
    if "test_size = 0.01" in text:
        assert cfg.validation.dataset.test_size == 0.01


def test_top_k_distillation_stops_at_start_up_naming_the_key_and_what_runs(tmp_path: Path) -> None:
    """cosmos-rl's top-k form trains through the student's top-k log-probs inside its advantage (their
    gradient kept), which a per-token advantage cannot carry: the file loads, and the recipes stop on it,
    naming the key, why, and the forms that do run."""
    path = tmp_path / "topk.toml"
    text = (DATA / "cosmos-rl/configs/qwen3/qwen3-8b-distill-deepmath.toml").read_text()
    path.write_text(text.replace("top_k = 0\n", "top_k = 16\n").replace("jsd_beta = 1\n", "jsd_beta = 0.5\n"))
    cfg = load_quietly(path)
    with pytest.raises(ConfigError) as info:
        check_runnable(cfg, str(path))
    (problem,) = [p for p in info.value.problems if "distillation.top_k" in p]
    assert f"{path}: key 'distillation.top_k' = 16:" in problem
    assert "gradient" in problem and "set top_k = 0 (the sampled reverse KL" in problem
    assert "topk_jsd_per_token" in problem and "jsd_beta" in problem
