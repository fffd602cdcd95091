"""Import optional dependencies by name, failing with the extra that provides them."""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> extra of cosmos_primitives that installs it
EXTRA_OF_MODULE = {
    "decord": "video",
    "av": "video",
    "diffusers": "wfm",
    "peft": "lora",
    "aiohttp": "wfm",
    "vllm": "vllm",
    "boto3": "s3",
    "botocore": "s3",
    "huggingface_hub": "hub",
    "datasets": "hub",
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "matplotlib": "plot",
    "math_verify": "math",
    "torchvision": "video",
}


class MissingExtraError(ImportError):
    """A feature needs an optional dependency that is not installed."""


def require(module: str, feature: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install.

    Args:
        module: importable module name, e.g. ``"decord"`` or ``"diffusers.models"``.
        feature: what the caller was doing, used in the message (e.g. ``"video decoding"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = EXTRA_OF_MODULE.get(top)
        what = f" for {feature}" if feature else ""
        if extra is None:
            raise MissingExtraError(f"'{module}' is needed{what} but could not be imported: {exc}") from exc
        raise MissingExtraError(
            f"'{top}' is needed{what} but is not installed. "
            f"Install it with: pip install 'cosmos_primitives[{extra}]'"
        ) from exc
