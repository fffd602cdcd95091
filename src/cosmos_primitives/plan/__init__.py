"""Memory plan: bytes per GPU of a run from its config and the model's ``config.json``, before
anything is built (``python -m cosmos_primitives.plan CONFIG [overrides]``; the recipes log it at
start-up with :func:`log_memory_plan`).

    shape = cp.plan.ModelShape.from_hf_config(cp.plan.read_hf_config(cfg.policy.model_name_or_path),
                                              freeze_patterns=cfg.policy.freeze_patterns)
    estimate = cp.plan.estimate_memory(cfg, shape, world_size=4, device_memory=80 << 30)
    print(estimate.report(80 << 30))
"""

from cosmos_primitives.plan.estimate import MemoryEstimate, activation_bytes_per_token, estimate_memory
from cosmos_primitives.plan.shape import ModelShape, read_hf_config
from cosmos_primitives.plan.startup import log_memory_plan, plan_for_config

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "log_memory_plan",
]
