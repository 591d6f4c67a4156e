#!/usr/bin/env python3
"""Build every artifact the GPU tier loads into one folder, in parallel processes, so that
the tier runs with CMC_GPU_ARTIFACTS=OUT instead of building mask by mask inside pytest.

    python3 tools/gpu_artifacts.py OUT [--arch sm_90a] [--jobs N] [--no-portable]

Layout (what tests/gpu/gpu_common.artifact and tests/gpu/test_generality_gpu.py read):
  OUT/NAME                      samples/NAME.mask, the default backward (--bwd-kernel auto:
                                the wgmma kinds on sm_90a, kv warp-specialised; --dq-layout
                                auto: dq_accum in 64-row blocks on linear tilings)
  OUT/bwd_portable/NAME         the same with --bwd-kernel portable
  OUT/bwd_ws/NAME               the same with --bwd-kernel ws (samples only; sm_90a)
  OUT/bwd_lockstep/NAME         the same with --bwd-kernel lockstep (samples only; sm_90a)
  OUT/dq_token/NAME             the default with --dq-layout token (samples only)
  OUT/bwd_portable_block64/NAME --bwd-kernel portable --dq-layout block64 (samples on linear
                                backward tilings only)
  OUT/gen/KEY/NAME              benchmarks/masks.py GENERALITY spec KEY (its -D values)
  OUT/gen/KEY/bwd_portable/NAME the same with --bwd-kernel portable
Every build is bf16 and fp16, head dims 64 and 128, with the backward. One mask per process
(`compile_file(jobs=1)`): the masks are many and their kernels few, so this keeps every core
busy. Prints each build's seconds; exit 1 if any build failed (the others are still built).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

Job = tuple[str, str, dict[str, int], str, str]  # (label, mask path, defines, out dir, bwd)


def jobs_for(out: Path, portable: bool, ws: bool = False) -> list[Job]:
    from masks import GENERALITY

    from tests.gpu.gpu_common import BUILDS, block64_allowed

    kinds = ["auto"] + (["portable"] if portable else [])
    samples = sorted((ROOT / "samples").glob("*.mask"))
    jobs: list[Job] = []
    for kind in kinds:
        sub = BUILDS[kind][0]
        for p in samples:
            jobs.append((f"{p.stem} {kind}", str(p), {}, str(out / sub), kind))
        for s in GENERALITY:
            jobs.append((f"{s.key} {kind}", str(ROOT / s.mask), dict(s.defines),
                         str(out / "gen" / s.key / sub), kind))
    # the default kinds token-major, and the portable ones in blocks where the tiling takes
    # them (tests/gpu's "token" and "portable_block64" choices)
    for p in samples:
        jobs.append((f"{p.stem} token", str(p), {}, str(out / BUILDS["token"][0]), "token"))
    if portable:
        for p in samples:
            if block64_allowed(p.stem):
                jobs.append((f"{p.stem} portable_block64", str(p), {},
                             str(out / BUILDS["portable_block64"][0]), "portable_block64"))
    if ws:  # each sm90 kv kind on every sample (tests/gpu's "ws" and "lockstep" choices):
        # last, so a build cut short by device_validate's limit has the default artifacts
        for kind in ("ws", "lockstep"):
            for p in samples:
                jobs.append((f"{p.stem} {kind}", str(p), {}, str(out / BUILDS[kind][0]), kind))
    return jobs


def build_one(path: str, defines: dict[str, int], out: str, build: str, arch: str) -> float:
    """Seconds of one build (`build`: a tests/gpu/gpu_common.BUILDS name)."""
    from cmc.driver import compile_file
    from tests.gpu.gpu_common import BUILDS

    _, kind, layout = BUILDS[build]
    t0 = time.perf_counter()
    compile_file(path, out, archs=[arch], dtypes=["bf16", "fp16"], head_dims=[64, 128],
                 defines=defines, jobs=1, bwd_kernel=kind, dq_layout=layout)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-portable", action="store_true",
                    help="skip the --bwd-kernel portable builds (OUT/bwd_portable)")
    ap.add_argument("--no-ws", action="store_true",
                    help="skip the --bwd-kernel ws and lockstep builds (OUT/bwd_ws, "
                         "OUT/bwd_lockstep; built for sm_90a only)")
    opts = ap.parse_args()
    jobs = jobs_for(opts.out, not opts.no_portable, opts.arch == "sm_90a" and not opts.no_ws)
    t0 = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(max_workers=max(1, min(opts.jobs, len(jobs)))) as pool:
        futs = {pool.submit(build_one, path, defs, out, kind, opts.arch): label
                for label, path, defs, out, kind in jobs}
        for f in as_completed(futs):
            try:
                print(f"  {futs[f]:32s} {f.result():6.1f} s", flush=True)
            except Exception as e:  # report every failure, keep building the rest
                failed += 1
                print(f"  {futs[f]:32s} FAILED {type(e).__name__}: {e}", flush=True)
    print(f"built {len(jobs) - failed} of {len(jobs)} artifacts for {opts.arch} into "
          f"{opts.out} in {time.perf_counter() - t0:.1f} s ({opts.jobs} processes)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
