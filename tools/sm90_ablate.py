"""Ablated builds of the sm90 kernel, for finding what limits it (timing only: wrong results).

Each ablation removes one stage from the consumers' or producer's steady-state loop of the
sm90 kernel (templates/cmc/attn_fwd_sm90_fwd.cuh) by a textual edit of the generated .cu
text, in memory, that must match exactly; no tracked file is touched. The bench artifacts are
compiled from the edited text by cmc's own build and package into out/ab/NAME, to be timed
beside the real kernel with tools/ab_grid.sh. The rate of a variant without stage X
bounds what removing X's cost could give.

    python tools/sm90_ablate.py noexp nopv noload   # -> out/ab/noexp, out/ab/nopv, ...
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

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
               [("      CMC_PROBE(4, load(sm.sK + stage * C::kTile, maps.k, sm.bar_kfull(stage), C::kTile, hkv, wk.j));\n",
                 "      if (lane == 0) mbar_arrive(sm.bar_kfull(stage));\n"),
                ("      CMC_PROBE(4, load(sm.sV + stage * C::kTile, maps.v, sm.bar_vfull(stage), C::kTile, hkv, wk.j));\n",
                 "      if (lane == 0) mbar_arrive(sm.bar_vfull(stage));\n")]),
    "nomask": ("partial tiles are not masked (the tile masks' or spans' cost removed)",
               [("    CMC_PROBE_MARK(pr_mask_);\n    if (!is_full) {\n",
                 "    CMC_PROBE_MARK(pr_mask_);\n    if (false) {\n")]),
    "noepilogue": ("no O stores to global memory (staging, barriers and LSE stay)",
                   [("        if (orow[i] < rlim) st_global_v4(", "        if (orow[i] < 0) st_global_v4(")]),
}


def apply(text: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"ablation pattern not found exactly once: {old!r}")
        text = text.replace(old, new)
    return text


def compile_edited(dest: Path, edit: Callable[[str], str],
                   extra_options: Sequence[str] = (), keys: Sequence[str] = (),
                   tiling: str = "auto") -> None:
    """The bench artifacts (those named in keys, default all) into dest/KEY, each .cu edited
    by `edit` in memory and built by cmc.build.build (with extra_options; the tile stage
    told `tiling`) and cmc.package."""
    import bench

    from cmc.build import build
    from cmc.driver import Options, back, front
    from cmc.package import package

    unknown = sorted(set(keys) - set(bench.ARTIFACTS))
    if unknown:
        raise SystemExit(f"unknown artifact {', '.join(unknown)}; known: {', '.join(bench.ARTIFACTS)}")
    opts = Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(bench.HEAD_DIM,), jobs=2, backward=False,
                   tiling=tiling)
    for key, (mask, defines) in bench.ARTIFACTS.items():
        if keys and key not in keys:
            continue
        table = front(ROOT / mask, defines)
        source = back(table, opts)
        source = dataclasses.replace(source, text=edit(source.text))
        built = build(source, archs=opts.archs, jobs=opts.jobs, extra_options=extra_options)
        print(f"{key} -> {package(built, dest / key, Path(mask).name)}", flush=True)


def main(names: list[str]) -> None:
    for name in names:
        if name not in ABLATIONS:
            raise SystemExit(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}")
    for name in names:
        what, edits = ABLATIONS[name]
        print(f"{name}: {what}", flush=True)
        compile_edited(ROOT / "out" / "ab" / name, lambda text, edits=edits: apply(text, edits))


if __name__ == "__main__":
    main(sys.argv[1:])
