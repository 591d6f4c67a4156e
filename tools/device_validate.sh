#!/usr/bin/env bash
# One device call (~8 minutes) that validates everything that has not run on a GPU, most
# important evidence first; each part under its own `timeout`, all inside one deadline, so a
# hang costs that part only and the summary is always written. Usage, on the device, from the
# repository root, with lark carried in .whl (README.md, "GPU validation"):
#   bash tools/device_validate.sh            # a log per part in $OUT, summary in $OUT/summary.txt
# Knobs: BUDGET (seconds from start, 530), NPROC (pytest-xdist workers, 4; 0 = serial),
# CMC_GPU_ARTIFACTS (prebuilt artifact folder: skips the build), SKIP (parts to leave out,
# e.g. "sanitizer torch"). The parts take more than one call's 600 s: run it twice on the
# same warm machine, the second time with SKIP="ws wsmask probe ncu fwd fwdnew" (the artifacts
# are reused from out/gpuart).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$OUT/summary.txt
START=$(date +%s)
DEADLINE=$((START + ${BUDGET:-530}))
: >"$S"
note() { echo "$*" | tee -a "$S"; }

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || note "wheel install from .whl failed (lark missing?)"
export PYTHONPATH=/tmp/site:$PWD
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
note "$(python3 -c 'import sys, torch, cuda.bindings as cb, cmc
from cmc.build import nvrtc_version
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda-bindings",
      cb.__version__, "cmc", cmc.__version__, "nvrtc", nvrtc_version())' 2>&1 | tail -1)"

XDIST=()
if [ "${NPROC:-4}" != 0 ] && python3 -c 'import xdist' 2>/dev/null; then
  XDIST=(-n "${NPROC:-4}")
fi
note "pytest workers: ${XDIST[*]:-serial (NPROC=0 or no pytest-xdist)}"
PYTEST=(python3 -m pytest -q -rfEs -p no:cacheprovider)
python3 -c 'import pytest_timeout' 2>/dev/null && PYTEST+=(--timeout 240)

# step PART LOG LIMIT CMD...: run CMD under min(LIMIT, time left), append to $OUT/LOG, and one
# line to the summary: rc (TIMEOUT for 124/137), seconds, the tool's own last count line.
step() {
  local part=$1 log=$OUT/$2 limit=$3; shift 3
  case " ${SKIP:-} " in *" $part "*) note "[$part] $* : SKIPPED (SKIP)"; return;; esac
  local left=$((DEADLINE - $(date +%s) - 5))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 15 ]; then note "[$part] $* : SKIPPED (budget spent)"; return; fi
  echo "===== $* (limit ${limit}s)" >>"$log"
  local n0 t0
  n0=$(wc -l <"$log"); t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  local rc=$? secs=$(( $(date +%s) - t0 ))
  local verdict=ok
  [ $rc -ne 0 ] && verdict="FAIL rc=$rc"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict="TIMEOUT after ${limit}s"
  local last
  last=$(tail -n +$((n0 + 1)) "$log" | grep -E '[0-9]+ (passed|failed|skipped|errors?)|built [0-9]+ of|^loss |^OK$|^FAILED$|TB/s|WATCHDOG' | tail -1)
  note "[$part] $verdict ${secs}s :: $* :: ${last:0:220}"
  tail -n +$((n0 + 1)) "$log" | grep -E '^(FAILED|ERROR) ' | sed "s/^/    /" | head -15 >>"$S"
}
# carried PART DIR... -- LOG LIMIT CMD...: step, where every DIR (a build made on the CPU and
# carried) is here; else one line naming the missing ones.
carried() {
  local part=$1 missing=""; shift
  while [ "$1" != "--" ]; do [ -d "$1" ] || missing="$missing $1"; shift; done
  shift
  if [ -n "$missing" ]; then note "[$part] SKIPPED (not carried:$missing)"; return; fi
  step "$part" "$@"
}

# 1. the sm_90a kv alternatives, first and before the artifact build (they build their own;
#    tools/bwd_ablate.py): the warp-specialised kv (ws, the default on linear tilings; dQ by
#    TMA tensor reduce-adds since run 15; span words on the partial items of grid masks since
#    2026-12-05 19:00 UTC) and wsvis (the same kernel with the transposed predicate per
#    element, as before) checked on bwd_kernel_check's cases (grid96 among them: span words by
#    grid row), beside wsnobulk (ws without the dQ adds; timing only); then TMA loads (tmaload)
#    and red.v4 adds (red4) in the lockstep kv; all timed beside the lockstep kernel at causal
#    4K x 8, 16K x 2
step ws ws.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsvis wsnobulk --check
# 1b. what span words save on a grid mask whose tiles are all partial (grid96: grid_text with
#    W 96, R 40, linear tiles at 4K; run 15: the per-element mask was 43.5 % of ws's kv): ws
#    beside wsvis and wsnomask (P^T unmasked on partial tiles: the floor; timing only)
step wsmask ws.log 100 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsvis wsnomask --mask grid96 --lengths 4096x8
# 1c. where ws's atomic kv spends the 1.1 ms above its deterministic kv (run 15: 2.98 against
#    1.88 ms at causal 4K x 8, while removing any one part of the dQ path saved 0.1 ms or
#    less): its parts removed together (timing only; docs/kernel-notes.md, "Run 15"), and
#    wsprobe: ws with clock laps per phase of an item, printed per mode (kernel notes, "How
#    FA3 and FA4 lay out the same backward, and a cycle probe of the ws kv")
step wsparts ws.log 120 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe wsnodsst wsnodqgemm+wsnostage \
  wsnodsst+wsnodqgemm+wsnostage wsnodsst+wsnodqgemm+wsnostage+wsnobar \
  wsnodsst+wsnodqgemm+wsnostage+wsnobar+wsnobulk --lengths 4096x8
#    ... and the same probe on CLEAR's patch tiling (kv_patch_ws: gathered items, per-row dQ
#    adds; 0.95-0.99 x the lockstep kind there, which CLEAR's default build keeps)
step wsparts ws.log 80 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe --mask clear_patch --lengths 4096x8
#    ... and on grid96's linear items, where span words left 2.7 of the mask's 4.3 ms (run 16)
step wsparts ws.log 80 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe --mask grid96 --lengths 4096x8
# 1d. ws without FA3 / FA4's two small differences in the item (dS^T by stmatrix; LSE into
#    registers under the S^T GEMM; ws's default since run 16), one or both, checked on causal
#    and grid96 and timed beside ws (kernel notes, "Run 16")
step wsfa ws.log 100 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsnostsm wsnolse wsnofa --check --cases causal grid96 \
  --lengths 4096x8
# 1e. ws against lockstep on the patch-tiled masks, through the runtime, cmc only (kernel
#    notes, "ws on patch tilings: dQ by patch-row boxes"), when the two builds are carried:
#    out/benchrun (the default build) and out/abrun/ws (--bwd-kernel ws), each made on the CPU
#    by `bench.py --compile DIR [--bwd-kernel ws]` then `bench.py --runtime-copy DIR DEST`
carried abws out/benchrun out/abrun/ws -- abws.log 130 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/benchrun out/abrun/ws \
    --suite all --patterns clear clear_text g_grid333_w80_r24 g_grid77_w96_r40 g_natten_clamped \
    --lengths 4096 16384 --gen-lengths 4096 16384 --rep 20 --no-plot --out "$OUT/abws"
# 1f. What the forward's mask costs on partial tiles (kernel notes, "The forward's grid gap"):
#    the default build beside tools/sm90_ablate.py's nomask (partial tiles unmasked, timing
#    only), forward only, cmc only; out/abrun/nomask made on the CPU by `python
#    tools/sm90_ablate.py nomask && python benchmarks/bench.py --runtime-copy out/ab/nomask
#    out/abrun/nomask` (2.4 MiB)
carried fwdmask out/benchrun out/abrun/nomask -- fwdmask.log 150 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/benchrun \
    out/abrun/nomask --suite all --patterns causal clear g_grid77_w96_r40 g_grid333_w80_r24 g_grid77_w48_r6 \
    g_grid0_w100_r16 g_natten_clamped g_video3d g_window_rt g_dilated_band --lengths 4096 \
    --gen-lengths 4096 16384 --no-bwd --rep 20 --no-plot --out "$OUT/fwdmask"
# 1f2. The chosen 8x16 patches against 16x8 (the tile stage's choice before run 17, now
#    `--tiling 16x8`; kernel notes, "Run 17"), forward and backward, cmc only;
#    out/abrun/p16x8: `python benchmarks/bench.py --compile /tmp/p16x8 --tiling 16x8
#    --patterns g_natten_clamped g_grid77_w96_r40 && python benchmarks/bench.py --runtime-copy
#    /tmp/p16x8 out/abrun/p16x8`
carried patchab out/benchrun out/abrun/p16x8 -- patchab.log 120 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/abrun/p16x8 \
    out/benchrun --suite generality --patterns g_natten_clamped g_grid77_w96_r40 \
    --gen-lengths 4096 16384 32768 --rep 20 --no-plot --out "$OUT/patchab"
# 1f3. The band masks of patch tilings' linear tiles (kernel notes, "Band tile masks for the
#    linear tiles of patch tilings"): out/benchrun (built with them) against out/abrun/preband
#    (the same masks built at 40d0768, before them: `git worktree add /tmp/wt40 40d0768`, then
#    there `python benchmarks/bench.py --compile /tmp/preband --patterns g_grid77_w96_r40
#    g_grid333_w80_r24 g_natten_clamped clear clear_text` and `--runtime-copy /tmp/preband
#    out/abrun/preband`, 3.4 MiB), below their start lengths (clear at 2K, the grids at 4K)
carried bandab out/benchrun out/abrun/preband -- bandab.log 120 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/abrun/preband \
    out/benchrun --suite all --patterns clear clear_text g_grid77_w96_r40 g_grid333_w80_r24 \
    g_natten_clamped --lengths 2048 --gen-lengths 4096 --rep 20 --no-plot --out "$OUT/bandab"
# 1f4. Linear tiles where a patch tiling runs them all (every sequence below its start length):
#    out/benchrun against out/abrun/lin (`python benchmarks/bench.py --compile /tmp/lin
#    --tiling linear --patterns g_grid77_w96_r40 g_natten_clamped g_grid333_w80_r24 clear
#    clear_text && python benchmarks/bench.py --runtime-copy /tmp/lin out/abrun/lin`, 4.2
#    MiB: the linear kinds, ws kv and band masks included), below the start lengths (kernel
#    notes, "The queue after run 17": whether a patch artifact should carry linear kinds)
carried linab out/benchrun out/abrun/lin -- linab.log 120 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/benchrun \
    out/abrun/lin --suite all --patterns clear clear_text g_grid77_w96_r40 g_grid333_w80_r24 \
    g_natten_clamped --lengths 2048 --gen-lengths 4096 --rep 20 --no-plot --out "$OUT/linab"
# 1f5. Unchecked interval arithmetic in the plans' term() (cb7cbbe; kernel notes, "Unchecked
#    interval arithmetic"): natten_clamped's kv set-up (predicted 17.6K -> 9-12K cycles per
#    CTA), then out/benchrun (HEAD's build) against out/abrun/rs2 (run 19's: the plans cut at
#    grid rows, before cb7cbbe; rebuild it at e7aee83 with `bench.py --compile` and
#    `--runtime-copy` if gone)
step ivprobe probe.log 60 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe --mask natten \
    --lengths 4096x8
carried ivab out/benchrun out/abrun/rs2 -- ivab.log 150 python3 benchmarks/bench.py --artifacts out/benchrun --ab out/benchrun \
    out/abrun/rs2 --suite all --patterns causal hstu clear clear_text g_natten_clamped g_video3d \
    g_grid77_w48_r6 --lengths 4096 --gen-lengths 4096 16384 --rep 20 --no-plot --out "$OUT/ivab"
# 1i. The kernels for short sequences (kernel notes "Kernels for short sequences"): the A/B
#    through the runtime at lengths below the patch tilings' start (out/abrun/shbase: `bench.py
#    --compile out/ab/shbase --no-short-kernels --patterns clear_text g_grid333_w80_r24
#    g_grid77_w96_r40 g_natten_clamped`, out/abrun/short the same without the flag, each then
#    `--runtime-copy`); their gradients against float64 are part ptma's pytest
#    (test_short_sequences_run_their_own_kernels_and_match_reference)
carried short out/abrun/shbase out/abrun/short -- short.log 170 python3 benchmarks/bench.py \
    --artifacts out/abrun/shbase --ab out/abrun/shbase out/abrun/short --suite all --patterns \
    clear_text g_grid333_w80_r24 g_grid77_w96_r40 g_natten_clamped --lengths 1024 2048 \
    --gen-lengths 4096 --rep 20 --no-plot --out "$OUT/short"
# 1j. post folded into the linear ws kv (bwd_ablate wsfuse, a prototype; kernel notes "Post
#    folded into the kv"): checked on bwd_kernel_check's linear cases, timed beside ws at the
#    lengths where pre and post weigh most (predicted +8 / +6 / +4 % at 1K / 2K / 4K; run 23:
#    correct, -7 / -8 / -8 %, not kept)
step fuse fuse.log 170 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsfuse --check \
    --lengths 1024x32 2048x16 4096x8
# 1k. the persistent linear ws kv (bwd_ablate wspers, a prototype; kernel notes "A persistent
#    kv"): checked with a CTA per SM (bwd_kernel_check's linear cases: about one tile a CTA) and
#    with 3 CTAs (each takes many tiles: the hand-offs between tiles), timed beside ws at the
#    lengths where a CTA's fixed costs weigh most; wspers2 stores dK, dV from registers so the
#    next tile's K, V load under the stores (run 23: correct, slower; wspersl, K, V by TMA and
#    costliest first, -4 % at 1K, +5 % at 16K: not kept; kernel notes "Run 23")
step pers pers.log 240 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wspers wspers2 --check \
    --lengths 1024x32 2048x16 4096x8 16384x2
step pers pers.log 150 env CMC_ARCH=sm_90a CMC_WS_CTAS=3 python3 tools/bwd_ablate.py wspers wspers2 \
    --check --lengths 1024x2
# 1l. K, V by TMA in the one-tile kv_ws (bwd_ablate wskvtma; kernel notes "Run 23", call 3: its
#    run there was on the wrong grid, void): does the loader's first item gain from going out
#    beside K and V? (at 1K, where an item waits 1,717 cycles for Q / dO)
step kvtma kvtma.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wskvtma --check \
    --lengths 1024x32 2048x16 4096x8 16384x2
#    and the probe's full wait split by item position (a CTA's first item against the rest: the
#    CTA's start, or Q / dO misses at short lengths?)
step kvtma kvtma.log 60 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsprobe --lengths 1024x32 4096x8
# 1m. Item n - 1's dQ inside item n (bwd_ablate wslag, CMC_WS_DQ_LAG; wslagpp with turns;
#    kernel notes "The dQ an item late", "Run 24": correct, not faster, slower below 4K): checked
#    on every case (patches too), timed beside ws from 1K to 16K and on a grid mask, the probes
step lag lag.log 300 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wslag wslagpp --check \
    --lengths 1024x32 2048x16 4096x8 16384x2
step lag lag.log 90 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wslag wslagpp --mask grid96 \
    --lengths 4096x8
step lag lag.log 120 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsprobe wslagprobe wslagppprobe \
    --lengths 4096x8
# 1n. Mask words applied by R2P (kernel notes "Mask bits by R2P"): the forward's tile-mask
#    words and the kv's and dq's P^T words tested a word's bits in ascending order (ptxas: 7 bits
#    per R2P instead of a LOP3 per bit), a word cut at len only on items crossing it; the A/B
#    times the atomic mode (the dq's change is checked by parts sm90 and wsrt).
#    out/abrun/r2pbase (8c132d1's build, before the change) against out/abrun/r2p, each made on
#    the CPU by `bench.py --compile DIR --patterns <these>` then `--runtime-copy DIR DEST`
#    (kernel notes "Mask bits by R2P", "To run"); cmc only. Measured in run 25 (kernel notes):
#    out/abrun/r2p is not HEAD's build since (its patch words went back to a bit per element)
carried r2p out/abrun/r2pbase out/abrun/r2p -- r2p.log 240 python3 benchmarks/bench.py \
    --artifacts out/abrun/r2pbase --ab out/abrun/r2pbase out/abrun/r2p --suite all --patterns causal \
    clear clear_text g_grid77_w48_r6 g_natten_clamped g_video3d g_dilated_band \
    --lengths 4096 16384 --gen-lengths 4096 16384 --rep 20 --no-plot --out "$OUT/r2p"
# 1o. The P^T words inside the exponentials' loop, bits ascending (patch items since run 26:
#    clear's ws kv 8 % faster than a bit per element; linear items since run 27: the grids'
#    backward 4-15 % faster than the word after the loop): ws beside wsbitpatch (patch items a
#    bit per element, runs 21-25), wslinafter (linear words after the loop, runs 25-26) and
#    wsbitlin (linear items bit by bit), checked (kernel notes "Run 26", "Run 27")
step patchword patchword.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsbitpatch wsbitlin \
    --check --cases clear_patch grid96 causal --mask clear_patch --lengths 4096x8 16384x2
step patchword patchword.log 90 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wslinafter wsbitlin \
    --mask grid96 --lengths 4096x8
# 1g2. FA3 / FA4's dQ hand-off (kernel notes "Run 50"): wsfrag (dq_accum in 64-row blocks in
#    accumulator order, one bulk add per warpgroup item; CMC_DQ_BLOCK64) and wslselate (the LSE
#    loads under the S^T issue, as before run 50) timed beside ws in both orders, then checked,
#    with wsplsefirst (patch items' LSE loads first too)
step frag frag.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsfrag wslselate \
    ws wsfrag wslselate --lengths 4096x8 16384x2 2048x16
step frag frag.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsfrag wslselate wsplsefirst \
    --check --lengths 4096x8
# 1g2b. The Dsum loads ahead of dV's issue (kernel notes "After run 50"): wsfragdsum against
#    wsfrag (the shipped linear kv since run 50) in both orders, on causal and grid96, then
#    checked; wsdsumregs (token-major) spills 8 B on grid96's d128 kv, wsfragdsum does not
step dsum dsum.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsfrag wsfragdsum \
    wsfrag wsfragdsum --lengths 4096x8 16384x2 2048x16
step dsum dsum.log 60 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsfrag wsfragdsum wsfrag \
    wsfragdsum --mask grid96 --lengths 4096x8
step dsum dsum.log 90 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py wsfragdsum --check --lengths 4096x8
# 1g3. The LSE offsets and Dsum read by ld.shared.v4 (wsstatv4, kernel notes "Run 29"): checked
#    (both modes, CLEAR's patches too), then timed against ws in both orders
step frag frag.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsstatv4 ws wsstatv4 --check \
    --lengths 4096x8 16384x2 2048x16
# 1h. The ws kv on patch tilings (TMA patch loaders, the default since run 21; kernel notes "Run
#    21"): the patch gradient tests, then checks and timings on CLEAR's patches beside the
#    cp.async loader (wspcp) and the no-copy ceiling (wspnoqdo) at 4,096 (a cut last patch row)
#    and 4,173 (whole patch rows), and the probe at both (where the 6 % of the cut row goes)
step ptma ptma.log 90 "${PYTEST[@]}" "${XDIST[@]}" tests/gpu/test_backward_patch_gpu.py
step ptma ptma.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wspcp wspnoqdo wsprobe \
    --check --cases clear_patch grid96 --mask clear_patch --lengths 4096x8 4173x8
#    where the patch kinds lose to the linear ones below the start length (grid96p: grid96 on
#    8 x 16 patches, linear tiles at 4K through the patch kinds; 16K on patches), each probed
step ptmagrid ptma.log 100 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe --mask grid96p \
    --lengths 4096x8 16384x2
step ptmagrid ptma.log 60 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws wsprobe --mask grid96 --lengths 4096x8
#    and through the runtime: the generality grids' shipped linear backward (out/abrun/g3, from
#    out/benchrun) against `--tiling 8x16` builds whose ws patch kv no longer spills
#    (out/abrun/p816b: `bench.py --compile out/ab/p816b --tiling 8x16 --patterns
#    g_grid77_w96_r40 g_grid333_w80_r24` then `--runtime-copy`; predicted within 0-3 % of run
#    21's spilling build: 1.05-1.08 at 16K, 0.86-0.90 at 4K)
carried ptmaab out/abrun/g3 out/abrun/p816b -- ptmaab.log 120 python3 benchmarks/bench.py \
    --artifacts out/abrun/g3 --ab out/abrun/g3 out/abrun/p816b --suite generality --patterns \
    g_grid77_w96_r40 g_grid333_w80_r24 --gen-lengths 4096 16384 --rep 20 --no-plot --out "$OUT/ptmaab"
# 1g. Where the forward's cycles go on the sparse masks against causal (tools/sm90_probe.py;
#    out/abrun/probe: `python tools/sm90_probe.py build && python benchmarks/bench.py
#    --runtime-copy out/ab/probe out/abrun/probe`, 3.1 MiB)
carried fwdprobe out/abrun/probe -- fwdprobe.log 90 python3 tools/sm90_probe.py run --artifacts out/abrun/probe causal/4096 \
    clear/4096 g_grid77_w96_r40/4096 g_grid0_w100_r16/4096 g_natten_clamped/4096 g_video3d/4096 \
    g_natten_clamped/16384 g_grid77_w96_r40/16384
step tmaload ws.log 120 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py tmaload red4 --check
# 2. the ceiling of fp32 block adds into global memory by path (tools/red_probe.py): is the
#    atomic dQ bound by L2 reductions, or by how the kv kernel issues them?
step probe probe.log 60 python3 tools/red_probe.py
# 2b. hardware counters of the shipped and the ws kv kernel, one atomic run each at causal
#    4K x 8 (ncu reads them on Firecracker machines; KINDS.md): tensor-pipe and L2 use, stalls
if command -v ncu >/dev/null; then
  step ncu ncu.log 150 ncu --clock-control none --target-processes all --kernel-name regex:bwd_kv_sm90 \
    --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section ComputeWorkloadAnalysis env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws --once --lengths 4096x8
fi
# (then) every artifact the tier loads, once, on every core (tools/gpu_artifacts.py), into
# out/gpuart (ignored, so a warm machine keeps it for the next call), stamped with a hash of
# the sources that make it: a second call on the same machine skips the build
if [ -z "${CMC_GPU_ARTIFACTS:-}" ]; then
  stamp=$(find cmc templates samples benchmarks grammar tools/gpu_artifacts.py -type f \
    ! -name '*.pyc' | sort | xargs sha256sum | sha256sum | cut -c1-16)
  if [ "$(cat out/gpuart/STAMP 2>/dev/null)" = "$stamp" ]; then
    note "[build] reused out/gpuart ($stamp)"
  else
    rm -rf out/gpuart
    step build build.log 170 python3 tools/gpu_artifacts.py out/gpuart --jobs "$(nproc)"
    [ -d out/gpuart ] && echo "$stamp" >out/gpuart/STAMP
  fi
  export CMC_GPU_ARTIFACTS=$PWD/out/gpuart
fi
T=tests/gpu
# 3. forward: every sample, the generality masks, the artifact/C-header tier (the C demo's
#    CUDA 13 entry points), then the forward features of 2026-12-05 (each test compiles its own
#    masks): grids at any origin, NATTEN interior tile masks, linear offset tile masks
step fwd fwd.log 150 "${PYTEST[@]}" "${XDIST[@]}" $T/test_gpu_correctness.py \
  $T/test_artifacts_gpu.py $T/test_generality_gpu.py -k "not backward"
step fwdnew fwd.log 120 "${PYTEST[@]}" "${XDIST[@]}" $T/test_gpu_grid_origin.py \
  $T/test_gpu_natten_interior.py $T/test_offset_masks_gpu.py $T/test_gpu_natten2d_band.py
# 4. the sm_90a kinds: bwd_kernel_check --sm90 builds the lockstep ones (bwd_kv_sm90,
#    bwd_dq_sm90; CLEAR patch cases too); the pytest line loads the default build (kv
#    warp-specialised on linear tilings, lockstep on patch tilings)
step sm90 sm90.log 110 env CMC_ARCH=sm_90a python3 tools/bwd_kernel_check.py --sm90
step sm90 sm90.log 100 "${PYTEST[@]}" "${XDIST[@]}" $T/test_backward_gpu.py $T/test_generality_gpu.py \
  $T/test_backward_patch_gpu.py -k "(matches_reference or generality_backward) and sm90 or patch_backward"
# 4b. each sm90 kv kind on every sample through the runtime (--bwd-kernel ws: its Q and dO
#    tensor maps a launch parameter; --bwd-kernel lockstep), and CLEAR's patch tiling, against
#    the float64 reference
step wsrt sm90.log 120 "${PYTEST[@]}" "${XDIST[@]}" $T/test_backward_gpu.py $T/test_backward_patch_gpu.py \
  -k "matches_reference and (ws or lockstep)"
# 4c. racecheck and synccheck of the ws kv, one sample test per process (2026-12-05: hazards on
#    the LSE ring's reads and synccheck errors in a 10-test process, clean when run alone)
#    (the part fails when any run does: its verdict is not only the last run's)
step wssan wssan.log 150 bash -c 'rc=0; for t in causal-packed-bf16-d128 chunked_causal-packed-bf16-d128 \
  chunked_causal-batch-fp16-d64 document_causal-packed-bf16-d128 clear-packed-bf16-d128; do
  for tool in racecheck synccheck; do echo "== $tool $t"; compute-sanitizer --tool $tool \
    --target-processes all --print-limit 6 --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider "tests/gpu/test_backward_gpu.py::test_backward_matches_reference[$t-ws]" \
    >/tmp/wssan.out 2>&1 || rc=1; grep -v "^\s*$" /tmp/wssan.out | tail -40
  done; done; exit $rc'
# 4d. does racecheck model the orderings wssan's hazards sit on? One correct two-warp kernel
#    per ordering (mbarrier after st.shared, cp.async + .noinc, cp.async.wait_all + arrive,
#    bar.arrive / bar.sync), a __syncthreads control and an unordered one
#    (tools/race_probe.py; docs/kernel-notes.md, "Run 15")
step raceprobe wssan.log 60 bash -c 'for m in mbar noinc cpwait named sync none mbarwar namedwar txnoinc; do echo "== $m"; \
  compute-sanitizer --tool racecheck --print-limit 2 python3 tools/race_probe.py $m 2>&1 | \
  grep -E "values|hazard|RACECHECK SUMMARY|Error" | head -6; done'
# 5. backward, portable kernels (--bwd-kernel portable), then the runtime path
step bwd bwd.log 75 python3 tools/bwd_kernel_check.py
step bwd bwd.log 100 "${PYTEST[@]}" "${XDIST[@]}" $T/test_backward_gpu.py $T/test_generality_gpu.py \
  -k "(matches_reference or generality_backward) and portable"
# 6. torch (the default build): autograd Function, custom op under torch.compile, CUDA graph of
#    fwd+bwd, training
step torch torch.log 120 "${PYTEST[@]}" $T/test_backward_gpu.py -k "autograd or compile or graph"
step torch torch.log 90 python3 examples/train_tiny.py --out "$CMC_GPU_ARTIFACTS"
# 6b. where the benchmark's backward column spends more than the kernels' sequence (run 15:
#    3.45 against 3.18 ms at causal 4K x 8): attn.backward alone beside the autograd step
#    (tools/host_cost.py --split on the default build: out/benchrun, the bench's, where it is
#    carried, so that a first call can run it with SKIP="build ..."; else out/gpuart)
split_art=$CMC_GPU_ARTIFACTS
[ -d out/benchrun ] && split_art=$PWD/out/benchrun
step split torch.log 60 python3 tools/host_cost.py --artifacts "$split_art" causal hstu --split 4096x8
# 7. compute-sanitizer memcheck, forward then backward (skips without compute-sanitizer)
step sanitizer sanitizer.log 200 "${PYTEST[@]}" $T/test_sanitizer.py \
  $T/test_backward_gpu.py::test_backward_memcheck
# 8. the kv kernel's ablations (timing only) and the other dQ alternatives
step ablate ablate.log 150 env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py nored noload nosync tiledq bulkdq
step probe probe.log 40 python3 tools/red_probe.py red2 bulk rows --ctas 132 --iters 1024
note "total $(( $(date +%s) - START ))s of budget ${BUDGET:-530}s"
