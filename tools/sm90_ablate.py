"""Ablated builds of the sm90 kernel, for finding what limits it (timing only: wrong results).

Each ablation removes one stage from the consumers' or producer's steady-state loop of
templates/cmc/attn_fwd_sm90.cuh by a textual edit that must match exactly. The bench
artifacts are compiled with the edited header into out/ab/NAME (restored afterwards), to be
timed beside the real kernel with tools/ab_grid.sh. The rate of a variant without stage X
bounds what removing X's cost could give.

    python tools/sm90_ablate.py noexp nopv noload   # -> out/ab/noexp, out/ab/nopv, ...
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "templates" / "cmc" / "attn_fwd_sm90.cuh"

LOOP_PV = "          issue_pv<BF16, D>(o, p, sV + stage * C::kTile);\n"
LOOP_SOFTMAX = "          CMC_PROBE(8, softmax(wk.j, c0, c1));\n"
ABLATIONS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "noexp": ("the 64 exponentials per thread and tile become plain FMAs",
              [(f"s[4 * n2 + {i}] = ex2(fmaf(", f"s[4 * n2 + {i}] = (fmaf(") for i in range(4)]),
    "nosoftmax": ("no mask, max, exp, sum in the steady-state loop (c0 = c1 = 1)",
                  [(LOOP_SOFTMAX, "          c0 = c1 = 1.f;\n")]),
    "nopv": ("no P V GEMM in the steady-state loop (QK, softmax and loads stay)",
             [(LOOP_PV, "")]),
    "noload": ("the loader copies no K / V (a plain arrive completes each FULL barrier)",
               [("        CMC_PROBE(4, load(sK + stage * C::kTile, maps.k, bar_kfull(stage), C::kTile, hkv, wk.j));\n",
                 "        if (lane == 0) mbar_arrive(bar_kfull(stage));\n"),
                ("        CMC_PROBE(4, load(sV + stage * C::kTile, maps.v, bar_vfull(stage), C::kTile, hkv, wk.j));\n",
                 "        if (lane == 0) mbar_arrive(bar_vfull(stage));\n")]),
    "nomask": ("partial tiles are not masked (the tile masks' or spans' cost removed)",
               [("          if (!is_full) {\n", "          if (false) {\n")]),
    "noepilogue": ("no O stores to global memory (staging, barriers and LSE stay)",
                   [("        if (orow[i] < len) st_global_v4(", "        if (orow[i] < 0) st_global_v4(")]),
}


def apply(text: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"ablation pattern not found exactly once: {old!r}")
        text = text.replace(old, new)
    return text


def main(names: list[str]) -> None:
    original = HEADER.read_text()
    try:
        for name in names:
            if name not in ABLATIONS:
                raise SystemExit(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}")
            what, edits = ABLATIONS[name]
            HEADER.write_text(apply(original, edits))
            print(f"{name}: {what}", flush=True)
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--compile",
                            str(ROOT / "out" / "ab" / name)], check=True)
    finally:
        HEADER.write_text(original)


if __name__ == "__main__":
    main(sys.argv[1:])
