"""Every environment variable cmc reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def debug() -> bool:
    """CMC_DEBUG=1: the CLI shows tracebacks instead of one-line errors."""
    return os.environ.get("CMC_DEBUG", "") not in ("", "0")


def cache_dir() -> Path:
    """CMC_CACHE_DIR: where content-hashed cubins are kept (default ~/.cache/cmc)."""
    return Path(os.environ.get("CMC_CACHE_DIR") or Path.home() / ".cache" / "cmc")


def cache_enabled() -> bool:
    """CMC_NO_CACHE=1 disables the build cache."""
    return os.environ.get("CMC_NO_CACHE", "") in ("", "0")


def regen_golden() -> bool:
    """CMC_REGEN_GOLDEN=1: golden-file tests rewrite their expected files."""
    return os.environ.get("CMC_REGEN_GOLDEN", "") not in ("", "0")
