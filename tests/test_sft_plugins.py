"""SFT takes a dataset plug-in the way cosmos-rl users write them: Cosmos-Reason1's own
``cosmos_sft.py`` (vendored unchanged in ``tests/data/plugins/cosmos_reason1``, its ``cosmos_rl``
imports served by ``cp.data.cosmos_rl_shim``) gives the samples the built-in reader gives for the
same rows, and trains through ``examples/sft.py --dataset`` with Reason1's ``sft.toml``; a plug-in
key the recipe would not read is an error, not silence."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import msgspec
import pytest

import cosmos_primitives as cp
from cosmos_primitives.config import ConfigError
from cosmos_primitives.data import (
    CosmosRLConversationDataset,
    build_sft_datasets,
    call_setup,
    check_plugins_read,
    encode_conversation,
    load_plugin,
    make_plugin,
)
from cosmos_primitives.data.cosmos_rl_shim import capturing_launch, install, is_stand_in
from cosmos_primitives.testing.forked_script import run_script

REPO = Path(__file__).resolve().parents[1]
REASON1 = REPO / "tests" / "data" / "plugins" / "cosmos_reason1"
COSMOS_SFT = REASON1 / "examples" / "post_training" / "tools" / "dataset" / "cosmos_sft.py"
REASON1_UTILS = REASON1 / "cosmos_reason1_utils" / "src"  # the package cosmos_sft.py imports first
SFT_TOML = REPO / "tests" / "data" / "cosmos_rl_configs" / "cosmos-reason1" / "examples" / "post_training" / "configs" \
    / "sft.toml"
AVHA = REPO / "tests" / "data" / "plugins" / "cosmos_cookbook" / "scripts" / "examples" / "reason1" \
    / "av_video_caption_vqa"
AVHA_SFT = AVHA / "scripts" / "avha_sft.py"
ITEMS = 12


def _datasets(cfg: cp.Config, processor=None):
    """``build_sft_datasets`` of a loaded config's sections, as the recipe calls it."""
    return build_sft_datasets(cfg.train.train_policy, cfg.validation, seed=cfg.train.seed, processor=processor,
                              setup_config=cfg)


def write_reason1_sft(root: Path, n: int = ITEMS) -> tuple[Path, Path]:
    """A local copy of a Hub dataset shaped like nvidia/Cosmos-Reason1-SFT-Dataset (its ``robovqa``
    config's ``understanding`` split: a ``video`` path and a plain-text ``conversations`` column;
    ``datasets.load_dataset(folder, "robovqa")`` reads it as the Hub's), and the clips where
    cosmos-rl's download puts them (``$COSMOS_CACHE/datasets/<owner>/<name>/<subset>/video_clips``).
    Returns ``(dataset folder, COSMOS_CACHE)``."""
    source = cp.testing.write_video_qa(root / "generated", n=n)
    cache = root / "cosmos_cache"
    clips = cache / "datasets" / "nvidia" / "Cosmos-Reason1-SFT-Dataset" / "robovqa" / "video_clips"
    clips.mkdir(parents=True)
    rows = []
    for i, meta in enumerate(sorted((source / "metas").glob("*.label.json"))):
        clip = meta.name.replace(".label.json", ".mp4")
        shutil.copy(source / "videos" / clip, clips / clip)
        colour = json.loads(meta.read_text())["colour"]
        rows.append({"id": f"r{i}", "video": f"robovqa/videos/{clip}", "conversations": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What colour is the screen?"},
            {"role": "assistant", "content": f"<think>\nIt looks {colour}.\n</think>\n\n<answer>{colour}</answer>"}]})
    name = root / "hub" / "nvidia" / "Cosmos-Reason1-SFT-Dataset"
    (name / "robovqa").mkdir(parents=True)
    (name / "robovqa" / "understanding.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (name / "README.md").write_text("---\nconfigs:\n- config_name: robovqa\n  data_files:\n  - split: understanding\n"
                                    "    path: robovqa/understanding.jsonl\n---\n")
    return name, cache


@pytest.fixture(scope="module")
def reason1_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_reason1_sft(tmp_path_factory.mktemp("reason1_sft"))


@pytest.fixture
def reason1_env(reason1_data, monkeypatch: pytest.MonkeyPatch) -> Path:
    """COSMOS_CACHE at the clips and cosmos_reason1_utils importable, as in a Reason1 checkout; the
    dataset folder."""
    import datasets

    name, cache = reason1_data
    monkeypatch.setenv("COSMOS_CACHE", str(cache))
    monkeypatch.syspath_prepend(str(REASON1_UTILS))
    # datasets caches a local folder under its name and config alone: a cache of the test's own
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache.parent / "hf_datasets"))
    return name


@pytest.mark.parametrize("plugin", [f"{COSMOS_SFT}:CosmosSFTDataset", str(COSMOS_SFT)], ids=["class", "script"])
def test_reason1_cosmos_sft_gives_the_built_in_readers_samples(reason1_env: Path, tiny_vl_processor,
                                                               plugin: str) -> None:
    """The class made here from the loaded dataset (``:CosmosSFTDataset``), or the script run as
    cosmos-rl's launcher runs it (its ``__main__`` block checks the clips and hands its factory over)."""
    whole = "validation.enable=false"  # the file holds 100 items out for validation; compare all of them
    cfg = cp.load_config(SFT_TOML, [f"train.train_policy.dataset.name={reason1_env}",
                                    f"train.train_policy.dataset.plugin={plugin}", whole])
    train, _ = _datasets(cfg, tiny_vl_processor)  # the config key is read, not ignored
    assert isinstance(train, CosmosRLConversationDataset) and len(train) == ITEMS
    assert type(train.dataset).__name__ == "CosmosSFTDataset"  # Reason1's class, from its own file
    assert is_stand_in(sys.modules["cosmos_rl.policy.config"])  # no cosmos-rl in this environment
    # what the built-in reader makes of the same rows with the script's clip folder, fps and max_pixels
    clips = Path(os.environ["COSMOS_CACHE"]) / "datasets" / "nvidia" / "Cosmos-Reason1-SFT-Dataset" / "robovqa" \
        / "video_clips"
    built_in = cp.load_config(SFT_TOML, [f"train.train_policy.dataset.name={reason1_env}", whole,
                                         f"train.train_policy.dataset.media_dir={clips}",
                                         "train.train_policy.dataset.fps=1",
                                         "train.train_policy.dataset.max_pixels=81920"])
    reference, _ = _datasets(built_in)
    assert not isinstance(reference, CosmosRLConversationDataset)
    mrope = cp.data.MRopeSpec.from_config(cp.testing.tiny_qwen2_5_vl_config())
    for i in (0, ITEMS - 1):
        mine, theirs = train[i], reference[i]
        video = mine.conversation[1]["content"][0]  # the script's part: its clip folder, FPS and MAX_PIXELS
        assert video["type"] == "video" and video["video"] == theirs.media_paths[0] and video["max_pixels"] == 81920
        assert mine.media_paths == theirs.media_paths and mine.video_fps == theirs.video_fps
        assert mine.conversation[0] == {"role": "system", "content": "You are a helpful assistant."}
        a, b = (encode_conversation(tiny_vl_processor, s, mrope=mrope) for s in (mine, theirs))
        assert a.input_ids.tolist() == b.input_ids.tolist() and a.labels.tolist() == b.labels.tolist()
        assert a.num_target_tokens > 0  # the assistant answer is trained on


def test_the_guides_custom_dataset_script_runs_as_cosmos_rl_ran_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    tiny_vl_processor) -> None:
    """The cookbook's ``avha_sft.py`` (the guide's ``avha_sft_single_caption.py``) with its own
    ``avha_sft.toml``: its ``__main__`` block reads the prompts beside it and hands the launcher a
    factory that needs the config's dataset path; its class takes a folder and two prompts."""
    source = cp.testing.write_video_qa(tmp_path / "generated", n=3)
    data = tmp_path / "av" / "train"
    (data / "videos").mkdir(parents=True)
    (data / "metas").mkdir()
    for meta in sorted((source / "metas").glob("*.label.json")):
        clip = meta.name.removesuffix(".label.json")
        shutil.copy(source / "videos" / f"{clip}.mp4", data / "videos" / f"{clip}.camera_front_wide_120fov.mp4")
        shutil.copy(meta, data / "metas" / meta.name)
    monkeypatch.syspath_prepend(str(REASON1_UTILS))
    cfg = cp.load_config(AVHA / "configs" / "avha_sft.toml", [f"train.train_policy.dataset.name={data}",
                                                             f"train.train_policy.dataset.plugin={AVHA_SFT}",
                                                             "validation.enable=false"])
    train, _ = _datasets(cfg, tiny_vl_processor)
    assert type(train.dataset).__name__ == "CosmosSFTDataset" and len(train) == 3
    sample = train[0]
    system, user, assistant = sample.conversation
    assert system == {"role": "system", "content": (AVHA / "prompts" / "system_prompt.txt").read_text()}
    assert user["content"][0]["max_pixels"] == 16 * 9 * 28 * 28 + 1 and len(sample.videos) == 1  # the script's
    assert user["content"][1]["text"] == (AVHA / "prompts" / "user_prompt.txt").read_text()
    assert assistant["content"].startswith("```json\n{") and '"colour"' in assistant["content"]
    mrope = cp.data.MRopeSpec.from_config(cp.testing.tiny_qwen2_5_vl_config())
    assert encode_conversation(tiny_vl_processor, sample, mrope=mrope).num_target_tokens > 0
    # the class alone takes a folder and two prompts: named directly, the recipe cannot make it
    with pytest.raises(TypeError, match=r"requires \['dataset_path', 'system_prompt', 'user_prompt'\]"):
        _datasets(msgspec.structs.replace(cfg, train=msgspec.structs.replace(cfg.train, train_policy=(
            msgspec.structs.replace(cfg.train.train_policy, dataset=msgspec.structs.replace(
                cfg.train.train_policy.dataset, plugin=f"{AVHA_SFT}:CosmosSFTDataset"))))))


def test_a_plugin_of_this_librarys_shape_and_a_bad_item(tmp_path: Path) -> None:
    script = tmp_path / "mine.py"
    script.write_text(
        "from cosmos_primitives.data import ConversationSample\n\n"
        "def make(config):\n"
        "    return Texts(config.custom['words'])\n\n"
        "class Texts:\n"
        "    def __init__(self, words):\n"
        "        self.words = words\n"
        "    def __len__(self):\n"
        "        return len(self.words)\n"
        "    def __getitem__(self, i):\n"
        "        if self.words[i] == 'bad':\n"
        "            return {'not': 'a conversation'}\n"
        "        return ConversationSample(conversation=[{'role': 'user', 'content': 'say it'},\n"
        "                                                {'role': 'assistant', 'content': self.words[i]}])\n")
    cfg = cp.load_config(None, [f"train.train_policy.dataset.plugin={script}:make", 'custom={words = ["hi", "bad"]}'])
    train, validation = _datasets(cfg)
    assert validation is None and len(train) == 2
    assert train[0].conversation[1] == {"role": "assistant", "content": "hi"}  # passed on as it is
    with pytest.raises(cp.data.BadSampleError, match=r"mine.py:make\[1\]: conversation must be a non-empty list"):
        train[1]


def test_make_plugin_supplies_config_and_dataset_by_name(reason1_env: Path) -> None:
    cfg = cp.load_config(SFT_TOML, [f"train.train_policy.dataset.name={reason1_env}"])
    data_cfg = cfg.train.train_policy.dataset

    class Takes:
        def __init__(self, dataset, config):
            self.dataset, self.config = dataset, config

    made = make_plugin(Takes, data_cfg, cfg)
    assert list(made.dataset) == ["understanding"] and made.config is cfg  # every split, as load_dataset gives
    assert make_plugin(lambda cosmos_config: ("factory", cosmos_config), data_cfg, cfg) == ("factory", cfg)
    instance = object()
    assert make_plugin(instance, data_cfg, cfg) is instance

    class NeedsPrompts:
        def __init__(self, dataset_path, system_prompt, user_prompt):  # the guide's avha_sft script's class
            pass

    with pytest.raises(TypeError, match=r"requires \['dataset_path', 'system_prompt', 'user_prompt'\].*factory"):
        make_plugin(NeedsPrompts, data_cfg, cfg)


def test_setup_gets_cosmos_rls_split_list_and_either_signature() -> None:
    cfg = cp.load_config(None, ["train.train_policy.dataset.split=[\"a\", \"b\"]"])
    assert cfg.train.train_policy.dataset.split == "a+b"  # the loader's spelling
    seen = {}

    class New:
        def setup(self, config):
            seen["new"] = config.train.train_policy.dataset.split

    class Old:
        def setup(self, config, tokenizer, *args, **kwargs):
            seen["old"] = (config.validation.dataset.split, tokenizer)

    call_setup(New(), cfg)
    call_setup(Old(), cfg, "tok")
    assert seen == {"new": ["a", "b"], "old": (["train"], "tok")}  # cosmos-rl keeps a list

    class Odd:
        def setup(self):
            pass

    with pytest.raises(TypeError, match=r"Odd.setup\(\) must take \(config\) or \(config, tokenizer\)"):
        call_setup(Odd(), cfg)


def test_script_paths_pick_the_one_dataset_class_or_name_it(tmp_path: Path) -> None:
    script = tmp_path / "two_datasets.py"
    script.write_text("class A:\n    def __len__(self): return 0\n    def __getitem__(self, i): return i\n\n"
                      "class B(A):\n    pass\n")
    with pytest.raises(ImportError, match=r"defines 2 dataset classes \(A, B\): name one"):
        load_plugin(str(script))
    assert load_plugin(f"{script}:B").__name__ == "B"
    with pytest.raises(ImportError, match="has no attribute 'C'"):
        load_plugin(f"{script}:C")
    with pytest.raises(ImportError, match="no such file"):
        load_plugin(str(tmp_path / "missing.py"))


def test_a_script_is_run_as_cosmos_rls_launcher_ran_it(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = tmp_path / "launching.py"
    script.write_text(
        "import argparse, os, toml\n"
        "from cosmos_rl.launcher.worker_entry import main as launch_worker\n"
        "from cosmos_rl.policy.config import Config\n\n"
        "class Rows:\n"
        "    def __init__(self, n): self.n = n\n"
        "    def __len__(self): return self.n\n"
        "    def __getitem__(self, i):\n"
        "        return [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a'}]\n\n"
        "if __name__ == '__main__':\n"
        "    args = argparse.ArgumentParser()\n"
        "    args.add_argument('--config', required=True)\n"
        "    config = Config.from_dict(toml.load(args.parse_known_args()[0].config))\n"
        "    assert os.environ['COSMOS_ROLE'] == 'Policy'\n"
        "    launch_worker(dataset=lambda cfg: Rows(cfg.custom['rows']), reward_fns=[len])\n")
    cfg = cp.load_config(None, [f"train.train_policy.dataset.plugin={script}", "custom={rows = 3}"])
    train, _ = _datasets(cfg)
    assert len(train) == 3 and train[2].conversation[1] == {"role": "assistant", "content": "a"}
    assert "handed cosmos-rl's launcher ['reward_fns'], which the recipe does not take" in capfd.readouterr().err
    assert "COSMOS_ROLE" not in os.environ  # put back as it was


def test_cosmos_rl_stand_ins_cover_the_scripts_imports_and_say_what_they_do_not() -> None:
    install()
    from cosmos_rl.dispatcher.data.packer import Qwen2_5_VLM_DataPacker
    from cosmos_rl.launcher.worker_entry import main as launch_worker
    from cosmos_rl.policy.config import Config
    from cosmos_rl.utils.util import basename_from_modelpath

    assert issubclass(Config, cp.config.Config)  # this library's, with cosmos-rl's from_dict
    assert Config.from_dict({"train": {"optm_lr": 3e-6}}).train.optm_lr == 3e-6
    # cosmos-rl's rule (cosmos_rl/utils/util.py): the last two parts of a longer path
    assert basename_from_modelpath("nvidia/Cosmos-Reason1-SFT-Dataset") == "nvidia/Cosmos-Reason1-SFT-Dataset"
    assert basename_from_modelpath("/data/hub/nvidia/Cosmos-Reason1-SFT-Dataset/") \
        == "nvidia/Cosmos-Reason1-SFT-Dataset"
    with pytest.raises(RuntimeError, match="no cosmos-rl launcher: run your dataset class through a recipe"):
        launch_worker(dataset=list)
    with capturing_launch() as handed:
        launch_worker(dataset=list, reward_fns=[len])
    assert handed == {"dataset": list, "reward_fns": [len]}

    class DemoDataPacker(Qwen2_5_VLM_DataPacker):  # what cosmos_grpo.py defines and hands its launcher
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.underlying_data_packer = Qwen2_5_VLM_DataPacker()

    DemoDataPacker().setup(None, None)  # made and set up, never used
    with pytest.raises(ModuleNotFoundError, match=r"'cosmos_rl.dispatcher.algo': cosmos-rl is not installed.*--reward"):
        import cosmos_rl.dispatcher.algo.reward  # noqa: F401


def test_an_installed_cosmos_rl_wins_over_the_stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cosmos_rl").mkdir()
    (tmp_path / "cosmos_rl" / "__init__.py").write_text("REAL = True\n")
    for name in [n for n in sys.modules if n == "cosmos_rl" or n.startswith("cosmos_rl.")]:
        monkeypatch.delitem(sys.modules, name)  # stand-ins an earlier test imported come back afterwards
    monkeypatch.syspath_prepend(str(tmp_path))
    install()
    import cosmos_rl

    assert cosmos_rl.REAL and not is_stand_in(cosmos_rl)
    with pytest.raises(ModuleNotFoundError) as error:  # its own submodules only: none served from here
        import cosmos_rl.policy.config
    assert "stand-ins" not in str(error.value)
    for name in [n for n in sys.modules if n == "cosmos_rl" or n.startswith("cosmos_rl.")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_plugin_key_the_recipe_does_not_read_is_an_error() -> None:
    cfg = cp.load_config(None, ["validation.dataset.plugin=my_pkg.data:Val", "train.train_policy.dataset.plugin=a:B"])
    with pytest.raises(ConfigError, match=r"cfg.toml: key 'validation.dataset.plugin' = 'my_pkg.data:Val' is not "
                                          r"read by this recipe \(validation is off"):
        check_plugins_read(cfg, "cfg.toml")
    check_plugins_read(cp.load_config(None, ["validation.enable=true", "validation.dataset.plugin=a:B"]), "cfg.toml")
    with pytest.raises(ConfigError) as error:  # a recipe reading no plug-in (e.g. the world-model one)
        check_plugins_read(cfg, "cfg.toml", reads=())
    assert len(error.value.problems) == 2 and "reads its own data section" in error.value.problems[0]


def test_the_sft_recipe_stops_on_an_unread_plugin_key(tmp_path: Path) -> None:
    paths = [f"policy.model_name_or_path={tmp_path}", f"train.train_policy.dataset.name={tmp_path}"]  # exist
    proc = run_script(["examples/sft.py", "--config", "examples/configs/sft_tiny.toml", *paths,
                       f"train.output_dir={tmp_path / 'out'}", "validation.dataset.plugin=my_pkg.data:Val"],
                      tmp_path / "run.log", cwd=REPO, timeout_s=120)
    assert proc.returncode != 0
    assert "key 'validation.dataset.plugin' = 'my_pkg.data:Val' is not read by this recipe" in proc.stdout
    assert not (tmp_path / "out").exists()  # stopped before anything was written or trained


@pytest.mark.slow
def test_reason1_sft_toml_trains_through_the_plugin_path(reason1_data, tmp_path: Path) -> None:
    """``cosmos-rl --config sft.toml ./tools/dataset/cosmos_sft.py`` as ``examples/sft.py --config
    sft.toml --dataset ./tools/dataset/cosmos_sft.py``: only the model and data paths and the run's
    size (one process, two steps of 4 samples, 4 clips held out for validation) are overridden, and
    validation is asked for (the file's train.enable_validation is ignored, as by cosmos-rl 0.4.7)."""
    from cosmos_primitives.testing.recipe_runs import finish, launch_recipe, only_run_dir

    name, cache = reason1_data
    model = cp.testing.save_tiny_qwen2_5_vl(tmp_path / "model", seed=0)
    overrides = ["--dataset", str(COSMOS_SFT), f"policy.model_name_or_path={model}",
                 f"train.train_policy.dataset.name={name}", f"train.output_dir={tmp_path / 'out'}",
                 "policy.parallelism.dp_shard_size=1", "train.max_steps=2", "train.train_batch_per_replica=4",
                 "train.train_policy.dataset.test_size=4", "validation.enable=true", "logging.logger=[]"]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REASON1_UTILS)]), "COSMOS_CACHE": str(cache),
           "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets"), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "run.log"
    text = finish(launch_recipe("examples/sft.py", SFT_TOML, overrides, log, cwd=REPO, env=env), log, timeout_s=400)
    records = cp.logging.read_metrics(only_run_dir(tmp_path / "out"))
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["tokens"] > 0 and r["bad_samples"] == 0 for r in steps)
    assert any("val/avg_loss" in r for r in records)  # the held-out clips went through the plug-in too
    assert "Exported safetensors to" in text
