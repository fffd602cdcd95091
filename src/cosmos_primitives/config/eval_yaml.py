"""The evaluation YAML of the Cosmos-Reason1 guide (``datasets``, ``model``, ``evaluation``,
``generation``), read as this library's ``[eval]`` section.

Each key of that layout is mapped onto an ``[eval]`` key, ignored (speed-only: ``num_processes``;
the tokenizer comes with the model folder here: ``tokenizer_model_name``), or refused when it asks
for something ``cp.eval`` does not do (non-zero presence / frequency penalties), the same three ways
as cosmos-rl's training keys (``config/compat/cosmos_rl.py``). The tool's own defaults for keys a YAML
leaves out are the ``[eval]`` defaults. One key is read differently on purpose:
``evaluation.skip_saved`` is honoured here, while the tool reads only its ``--skip_saved`` flag
(the guide's YAML says ``false``, which is what the tool does without the flag).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos_primitives.config.errors import ConfigError

# YAML section.key -> [eval] key
MAPPED = {
    "model.model_name": "model",
    "model.dtype": "dtype",
    "model.tp_size": "tp_size",
    "model.max_length": "max_model_len",
    "evaluation.answer_type": "answer_type",
    "evaluation.skip_saved": "skip_saved",
    "evaluation.fps": "fps",
    "evaluation.seed": "seed",
    "generation.max_retries": "max_retries",
    "generation.max_tokens": "max_response_length",
    "generation.temperature": "temperature",
    "generation.repetition_penalty": "repetition_penalty",
}
IGNORED = {
    "model.tokenizer_model_name": "the tokenizer and processor are read from the model folder",
    "evaluation.num_processes": "speed-only: parallel workers (batches here: eval.batch_size)",
}
# key -> (values asking for nothing, what to do)
REFUSED = {
    "generation.presence_penalty": ((0, 0.0), "presence penalty is not supported; set it to 0"),
    "generation.frequency_penalty": ((0, 0.0), "frequency penalty is not supported; set it to 0"),
}
SECTIONS = ("datasets", "model", "evaluation", "generation")


def is_eval_yaml(tree: dict[str, Any]) -> bool:
    """Whether a parsed YAML file has the guide's layout."""
    return bool(tree) and set(tree) <= set(SECTIONS)


def eval_tree(tree: dict[str, Any], source: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``({"eval": {...}, "unsupported": {...}}, ignored)`` from the guide's layout.

    Raises:
        ConfigError: every unknown key at once, naming the key and ``source``.
    """
    out: dict[str, Any] = {}
    unsupported: dict[str, str] = {}
    ignored: list[tuple[str, str]] = []
    problems: list[str] = []
    datasets = tree.get("datasets")
    if datasets is not None:
        out["datasets"] = list(datasets) if isinstance(datasets, list) else datasets
    for section in SECTIONS[1:]:
        table = tree.get(section) or {}
        if not isinstance(table, dict):
            problems.append(f"{source}: key '{section}' must be a mapping, got {type(table).__name__}")
            continue
        for key, value in table.items():
            path = f"{section}.{key}"
            if path in MAPPED:
                out[MAPPED[path]] = value
            elif path in IGNORED:
                ignored.append((path, IGNORED[path]))
            elif path in REFUSED:
                noop, what = REFUSED[path]
                if value not in noop:
                    unsupported[path] = f"= {value!r}: {what}"
            else:
                known = [k for k in (*MAPPED, *IGNORED, *REFUSED) if k.startswith(section + ".")]
                problems.append(f"{source}: unknown key '{path}'; keys of '{section}': {', '.join(known)}")
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} problems in {source}:\n"
                          + "\n".join(f"  - {p}" for p in problems), problems)
    return {"eval": out, **({"unsupported": unsupported} if unsupported else {})}, ignored


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse a YAML config; errors name the file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a YAML text file (byte {exc.start} is not UTF-8)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: lists or mappings nested too deeply to read; a config nests a few levels") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a YAML config must be a mapping at the top, got {type(data).__name__}")
    return data
