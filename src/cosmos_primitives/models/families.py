"""Built-in name maps, one file per model family; importing this package registers them."""

from cosmos_primitives.models.name_maps import register_family
from cosmos_primitives.models.qwen2 import QWEN2
from cosmos_primitives.models.qwen2_5_vl import QWEN2_5_VL
from cosmos_primitives.models.qwen3 import QWEN3
from cosmos_primitives.models.qwen3_vl import QWEN3_VL

for _family in (QWEN2, QWEN2_5_VL, QWEN3, QWEN3_VL):
    register_family(_family, replace=True)

__all__ = ["QWEN2", "QWEN2_5_VL", "QWEN3", "QWEN3_VL"]
