#!/usr/bin/env bash
# One device call: sm90 correctness + timing, then the benchmark over the given lengths.
# Usage (on the device, repo root): bash tools/device_bench.sh OUTDIR LEN...
# Needs .whl (lark) and out/bench (python benchmarks/bench.py --compile out/bench; built here
# when not carried); uses FA4
# when an earlier call on this machine copied .fa4a/part_aa to /tmp and .fa4c, .fa4b are
# carried, and cuDNN flex (cudnn.flex_attention) when .cudnnfe is carried too or an earlier call
# copied it to /tmp/cudnnfe (it needs the FA4 bundle's cutlass-dsl and tvm-ffi, so it is
# installed after them).
# LEN... are the public suite's lengths; BENCH_ARGS adds knobs (--suite, --gen-lengths,
# --patterns, --rounds, --no-bwd); bench.py rewrites $OUT/bench/bench.json after every case.
set -u
export PYTHONUNBUFFERED=1
out=$1; shift
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
# the FA4 archive in two parts (tools/fa4_split.sh): part one copied to /tmp by an earlier call
if [ ! -d /tmp/fa4site ] && [ -f /tmp/fa4_part_aa ] && [ -f .fa4c/part_ab ]; then
  mkdir -p /tmp/fa4site && cat /tmp/fa4_part_aa .fa4c/part_ab | tar -xJ -C /tmp/fa4site
fi
if [ -d /tmp/fa4site ] && [ -d .fa4b ] && [ ! -e /tmp/site/.fa4 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fa4b/*.whl >/dev/null 2>&1 \
    && cp -r /tmp/fa4site/* /tmp/site/ && touch /tmp/site/.fa4
fi
# the cuDNN wheel: carried in .cudnnfe, or copied to /tmp/cudnnfe by an earlier call (a call
# that carries the FA4 parts and the artifacts has no room left for it under 64 MiB)
cudnn_whl=""
for d in .cudnnfe /tmp/cudnnfe; do [ -d "$d" ] && [ -z "$cudnn_whl" ] && cudnn_whl=$d; done
if [ -e /tmp/site/.fa4 ] && [ -n "$cudnn_whl" ] && [ ! -e /tmp/site/.cudnnfe ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$cudnn_whl"/*.whl >/dev/null 2>&1 \
    && touch /tmp/site/.cudnnfe
fi
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# The peers this call has: a benchmark without FA4 and cuDNN flex compares cmc with
# Flex-Triton only (run 13's generality call ran so on a fresh machine, unnoticed until its
# table came back), so their absence stops the call unless ALLOW_MISSING_PEERS=1.
missing=""
[ -e /tmp/site/.fa4 ] || missing="FA4 and Flex-FA4 (no /tmp/fa4_part_aa on this machine, or .fa4c/.fa4b not carried)"
[ -e /tmp/site/.cudnnfe ] || missing="${missing:+$missing; }cuDNN flex (neither .cudnnfe carried nor /tmp/cudnnfe, or no FA4 bundle)"
if [ -n "$missing" ] && [ $# -gt 0 ]; then
  echo "device_bench: PEERS MISSING: $missing. On a fresh machine run first: cp .fa4a/part_aa /tmp/fa4_part_aa && cp -r .cudnnfe /tmp/cudnnfe (carry .fa4a, .cudnnfe), or set ALLOW_MISSING_PEERS=1."
  [ "${ALLOW_MISSING_PEERS:-0}" = 1 ] || exit 3
fi
if [ -z "${NO_SM90_CHECK:-}" ]; then
  timeout ${T_SM90:-150} python3 tools/sm90_check.py ${SM90_ARGS:-} 2>&1 | tee "$out/sm90.log" | tail -12
fi
# out/bench not carried (the carry is 64 MiB with the FA4 parts): build it here, on 16 cores
if [ $# -gt 0 ] && [ ! -d "${ARTIFACTS:-out/bench}" ]; then
  echo "device_bench: building ${ARTIFACTS:-out/bench} on this machine"
  # A build cut short leaves some masks without artifacts, and the bench would then time the
  # peers alone on those (2026-12-05 15:48 UTC: T_COMPILE=90 left 5 of 9 generality masks
  # out): stop instead, and remove the partial folder so a rerun builds it again.
  timeout ${T_COMPILE:-240} python3 benchmarks/bench.py --compile "${ARTIFACTS:-out/bench}" >"$out/compile.log" 2>&1
  rc=$?
  tail -3 "$out/compile.log"
  if [ $rc -ne 0 ]; then
    echo "device_bench: BUILD FAILED or timed out (rc $rc, T_COMPILE=${T_COMPILE:-240} s): $out/compile.log"
    rm -rf "${ARTIFACTS:-out/bench}"
    exit 4
  fi
fi
if [ $# -gt 0 ]; then
  timeout ${T_BENCH:-400} python3 benchmarks/bench.py --artifacts ${ARTIFACTS:-out/bench} --lengths "$@" \
    --warmup 10 --rep ${REP:-50} ${BENCH_ARGS:-} --out "$out/bench" 2>&1 | tail -${TAIL:-60}
fi
