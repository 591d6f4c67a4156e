"""PNG pictures for `cmc show --png`: the mask (when small enough) with its tile classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import CmcError

_TILE_RGB = {0: (245, 245, 245), 1: (40, 110, 200), 2: (250, 170, 60)}  # empty, full, partial


def write_png(path: Path, dense: np.ndarray | None, classes: np.ndarray, tile_m: int,
              tile_n: int, length: int, max_side: int = 1024) -> None:
    """Tile classes as background colours; visible pairs drawn dark on top (downsampled)."""
    try:
        from PIL import Image
    except ImportError:
        raise CmcError("--png needs Pillow: pip install 'cmc[png]'") from None
    step = max(1, -(-length // max_side))
    side = -(-length // step)
    rows = np.arange(side) * step
    img = np.zeros((side, side, 3), dtype=np.uint8)
    cls = classes[(rows // tile_m)[:, None], (rows // tile_n)[None, :]]
    for c, rgb in _TILE_RGB.items():
        img[cls == c] = rgb
    if dense is not None:
        vis = dense[rows[:, None], rows[None, :]]
        img[vis] = (img[vis] * 0.35).astype(np.uint8)
    Image.fromarray(img, "RGB").save(path)
