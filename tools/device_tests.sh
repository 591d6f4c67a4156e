#!/usr/bin/env bash
# One device call: GPU test tier, kernel checks, C sample. Logs go to $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, cuda.bindings; print('torch', torch.__version__)"
timeout ${T_TESTS:-330} python3 -m pytest tests/gpu -m gpu -q -rs --timeout 300 -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | tail -40
echo "== kernel_check (portable)"
timeout ${T_KC:-200} python3 tools/kernel_check.py ${KC_ARGS:-} 2>&1 | tee $OUT/kernel_check.log | tail -30
if [ -n "${SM90:-}" ]; then
  echo "== sm90_check"
  timeout ${T_SM90:-150} python3 tools/sm90_check.py ${SM90_ARGS:-} 2>&1 | tee $OUT/sm90.log | tail -30
fi
