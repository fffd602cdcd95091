"""``[wfm]``: world-model RL (FlowGRPO / DDRL) knobs (REFERENCE.md sections 3 and 4)."""

from __future__ import annotations

from cosmos_primitives.config.base import Section


class WFMConfig(Section):
    """``[wfm]``."""

    num_inference_steps: int = 20
    guidance_scale: float = 1.0
    kl_beta: float = 0.0
    data_beta: float = 0.0
