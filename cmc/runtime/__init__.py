"""Run compiled artifacts from Python: `attn = cmc.runtime.load("out/causal"); o = attn(q, k, v)`.

Works with PyTorch tensors, CuPy arrays and anything with DLPack or
`__cuda_array_interface__`, over cuda-python's driver API; neither torch nor cupy is
imported here. `cmc.runtime.torch_op.register(attn, name)` makes a torch custom op of it.
"""

from __future__ import annotations

from ._driver import DriverError
from .arrays import ArrayInfo, DeviceArray, describe
from .loader import Attention, Manifest, Plan, load, read_manifest, verify_cubins
from .params import Segments

__all__ = ["ArrayInfo", "Attention", "DeviceArray", "DriverError", "Manifest", "Plan", "Segments",
           "describe", "load", "read_manifest", "verify_cubins"]
