"""Shared test helpers: the samples, small const overrides, and random parameter values."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "samples").glob("*.mask"))

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++ for the host cross-check")
HOST_HEAD = ("#include <cstdio>\n#include <cstdint>\n#include <cstdlib>\n#include <cstring>\n"
             "#include <vector>\n#define CMC_HOST 1\n")

# A host main()'s one sequence of `len` tokens, batch entry 1 of cu_seqlens {0, 3, 3 + len}:
# the descriptor d (DESC: the mask's struct, replaced by the test) and its seq_t s.
ONE_SEQUENCE = """    int cu[3] = {0, 3, 3 + len};
    DESC d;
    memset(&d, 0, sizeof d);
    d.cu_seqlens = (uint64_t)(uintptr_t)cu;
    const cmc_hooks::seq_t s = cmc_hooks::seq(d, 1);
"""

def host_build(source: str, main: str, exe: Path, defines: str = "",
               sanitize: bool = True) -> Path:
    """An emitted .cu compiled for the host (CMC_HOST) with a test's main() into exe (its
    source beside it as .cpp); asserts that it builds. sanitize: -Wall and UBSan."""
    cpp = exe.with_suffix(".cpp")
    cpp.write_text(HOST_HEAD + defines + source + main)
    flags = ["-Wall", "-fsanitize=undefined", "-fno-sanitize-recover=all"] if sanitize else []
    r = subprocess.run([str(GXX), "-std=c++17", "-O1", *flags, "-Wno-unused-function",
                        "-Wno-unused-variable", "-o", str(exe), str(cpp)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-6000:]
    return exe

# Small constants so that exhaustive checks at lengths <= 40 see every region of a mask.
SMALL_DEFINES: dict[str, dict[str, int]] = {
    "sliding_window": {"WINDOW": 3},
    "chunked_causal": {"CHUNK": 4},
    "hstu": {"CONTEXT": 2},
    "hstu_context": {"CONTEXT": 2, "WINDOW": 3},
    "clear": {"TEXT": 5, "W": 6, "R": 3},
    "longformer": {"GLOBAL": 2, "RADIUS": 3},
    "natten2d": {"W": 5, "K": 3},
    "block_causal_video": {"FRAME": 3},
}

# The masks the interval analysis must make exact (no residual part).
EXACT = {
    "causal", "sliding_window", "sliding_window_rt", "document_causal", "prefix_lm",
    "chunked_causal", "hstu", "hstu_context", "shared_prefix", "clear", "longformer",
    "natten2d", "block_causal_video",
}


def random_params(mask, length: int, rng: np.random.Generator) -> dict:
    """One parameter set for one sequence, edge values drawn often."""
    out: dict = {}
    for p in mask.params:
        if p.kind == "segments":
            n = int(rng.integers(0, 5))
            out[p.name] = sorted(int(x) for x in rng.integers(0, length + 1, size=n))
        else:
            r = rng.random()
            if r < 0.2:
                out[p.name] = 0
            elif r < 0.4:
                out[p.name] = length
            else:
                out[p.name] = int(rng.integers(0, length + 1))
    return out


# The lengths of the exhaustive checks at SMALL_DEFINES.
SMALL_LENGTHS = (1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 40)


def small_cases(mask, seed: int):
    """(length, params) for each of SMALL_LENGTHS: six parameter sets if the mask has
    parameters, else one."""
    rng = np.random.default_rng(seed)
    for length in SMALL_LENGTHS:
        for _ in range(6 if mask.params else 1):
            yield length, random_params(mask, length, rng)


def assert_same_pairs(got: np.ndarray, truth: np.ndarray, what: str) -> None:
    """A dense visibility matrix equals the oracle's; else the first pairs lost and admitted."""
    assert (got == truth).all(), (
        f"{what}: lost {np.argwhere(truth & ~got)[:4].tolist()} "
        f"admitted {np.argwhere(got & ~truth)[:4].tolist()}"
    )


@pytest.fixture(params=SAMPLES, ids=lambda p: p.stem)
def sample(request) -> Path:
    return request.param


def emit_tiled(table, *, tiling=None, **kw):
    """emit with the tilings the driver's tile stage gives these options (emit requires one);
    a tiling given is both passes'."""
    from cmc.artifacts import DEFAULT_ARCHS
    from cmc.driver import Options, backward_tile, tile
    from cmc.emit import emit

    if tiling is None:
        opts = Options(archs=tuple(kw.get("archs", DEFAULT_ARCHS)), kernel=kw.get("kernel", "auto"))
        tiling = tile(table, opts)
        if kw.get("backward"):
            kw["bwd_tiling"] = backward_tile(table, tiling, opts)
    return emit(table, tiling=tiling, **kw)


def pytest_terminal_summary(terminalreporter):
    """The CI fuzz's counts, so that a CI log shows how much was generated and how it ended."""
    from .test_fuzz_parse import FUZZ_COUNTS

    if FUZZ_COUNTS["inputs"]:
        terminalreporter.write_line(
            "cli fuzz: " + ", ".join(f"{k} {v}" for k, v in FUZZ_COUNTS.items()))
