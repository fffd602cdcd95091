"""The package imports with core dependencies only; missing extras are named in errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from cosmos_primitives.utils.extras import MissingExtraError, require

# Blocks every optional dependency in a child interpreter, as if only the core were installed.
BLOCK_OPTIONAL = textwrap.dedent(
    """
    import sys
    BLOCKED = {"decord", "av", "diffusers", "peft", "aiohttp", "vllm", "boto3", "botocore",
               "huggingface_hub", "datasets", "wandb", "matplotlib", "torchvision"}
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by test)")
            return None
    sys.meta_path.insert(0, Blocker())
    """
)


def run_core_only(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_OPTIONAL + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_import_and_version_with_core_dependencies_only() -> None:
    out = run_core_only(
        """
        import cosmos_primitives as cp
        print(cp.__version__)
        cfg = cp.load_config(None, ["train.epoch=2"])
        import cosmos_primitives.parallel, cosmos_primitives.logging, cosmos_primitives.utils
        print(cfg.train.epoch)
        """
    )
    assert out.returncode == 0, out.stderr
    import cosmos_primitives

    assert out.stdout.split() == [cosmos_primitives.__version__, "2"]


@pytest.mark.parametrize(
    ("code", "extra"),
    [
        ("from cosmos_primitives.testing import write_mp4; write_mp4('/tmp/never.mp4')", "video"),
        ("from cosmos_primitives.testing import tiny_wan_vae; tiny_wan_vae()", "wfm"),
        ("from cosmos_primitives.logging import plot_run; plot_run('/tmp')", "plot"),
        (
            "from cosmos_primitives.logging import MetricsTracker\n"
            "from cosmos_primitives.config import LoggingConfig\n"
            "import tempfile; MetricsTracker(tempfile.mkdtemp(), LoggingConfig(logger=['wandb']), rank=0)",
            "wandb",
        ),
    ],
)
def test_missing_extra_is_named(code: str, extra: str) -> None:
    out = run_core_only(code)
    assert out.returncode != 0
    assert "MissingExtraError" in out.stderr
    assert f"pip install 'cosmos_primitives[{extra}]'" in out.stderr


def test_require_passes_through_installed_modules() -> None:
    assert require("json").dumps([1]) == "[1]"
    with pytest.raises(MissingExtraError, match=r"cosmos_primitives\[vllm\]"):
        require("vllm", "vLLM rollouts")


def test_local_json_datasets_read_without_the_hub_extra(tmp_path) -> None:
    """The recipes' own data (``.jsonl`` / ``.json`` records) needs no ``datasets``: without it the
    records come back as dicts equal to what ``datasets`` reads; other files still name the extra."""
    import json

    from cosmos_primitives.data.hf_conversations import load_hf_dataset

    records = [{"question": "Which colour?", "choices": ["red", "blue"], "answer": "A", "image": "0.png"},
               {"question": "And this one?", "choices": ["green", "red"], "answer": "B", "image": "1.png"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "train.json").write_text(json.dumps(records))
    (tmp_path / "train.csv").write_text("question,answer\nq,A\n")
    out = run_core_only(
        f"""
        import json
        from cosmos_primitives.data.hf_conversations import load_hf_dataset
        print(json.dumps([load_hf_dataset({str(tmp_path / 'train.jsonl')!r}),
                          load_hf_dataset({str(tmp_path / 'train.json')!r})]))
        load_hf_dataset({str(tmp_path / 'train.csv')!r})
        """
    )
    assert "MissingExtraError" in out.stderr and "pip install 'cosmos_primitives[hub]'" in out.stderr
    from_jsonl, from_json = json.loads(out.stdout)
    assert from_jsonl == records and from_json == records
    with_datasets = [dict(row) for row in load_hf_dataset(str(tmp_path / "train.jsonl"))]
    assert with_datasets == records


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.jsonl", '{"a": 1}\n{"a": \n', r"bad\.jsonl:2: not a JSON object"),
    ("bad.jsonl", '{"a": 1}\n[1, 2]\n', r"bad\.jsonl: record 1 is a list"),
    ("bad.json", '{"data": []}', r"bad\.json: a \.json dataset must hold a list"),
])
def test_malformed_json_records_name_the_file_and_line(tmp_path, name: str, text: str, message: str) -> None:
    from cosmos_primitives.data.hf_conversations import read_json_records

    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        read_json_records(tmp_path / name)
