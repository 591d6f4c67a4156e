#!/usr/bin/env bash
# Kernel A/B on the device: every artifact set under out/ab/ (one folder per variant, made with
# `python benchmarks/bench.py --compile out/ab/NAME`) timed in one process, interleaved per
# case (benchmarks/bench.py --ab). AB_UNCAPPED="NAME ..." adds NAMEu: NAME with its persistent
# grid min(units, num_sms) replaced by one CTA per work unit. AB_CAPPED="NAME ..." adds NAMEc:
# NAME always persistent, max_ctas = ${AB_SMS:-132} whatever the length or layout.
# AB_STATIC="NAME ..." adds NAMEs: NAME without its work counter (static stride, and the
# runtime's static persistence rule).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
for v in ${AB_UNCAPPED:-}; do
  rm -rf out/ab/${v}u && cp -r out/ab/$v out/ab/${v}u
  python3 - out/ab/${v}u <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).rglob("manifest.json"):
    m = json.loads(f.read_text())
    for k in m["kernels"]:
        if k["grid"][0].startswith("min("):
            k["grid"][0] = k["grid"][0][4:].rsplit(",", 1)[0]
    f.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
PY
done
for v in ${AB_STATIC:-}; do
  rm -rf out/ab/${v}s && cp -r out/ab/$v out/ab/${v}s
  python3 - out/ab/${v}s <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).rglob("manifest.json"):
    m = json.loads(f.read_text())
    for k in m["kernels"]:
        k["work_counter"] = False
    f.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
PY
done
for v in ${AB_CAPPED:-}; do
  rm -rf out/ab/${v}c && cp -r out/ab/$v out/ab/${v}c
  python3 - out/ab/${v}c ${AB_SMS:-132} <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).rglob("manifest.json"):
    m = json.loads(f.read_text())
    for k in m["kernels"]:
        k["grid"][0] = k["grid"][0].replace("max_ctas", sys.argv[2])
    f.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
PY
done
python3 benchmarks/bench.py --artifacts out/bench --ab out/ab/*/ --lengths ${AB_LENGTHS:-1024 4096 32768} \
  --patterns ${AB_PATTERNS:-causal hstu shared_prefix clear hstu_jagged} --warmup 5 --rep ${AB_REP:-30} \
  --ab-rounds ${AB_ROUNDS:-3} --out $OUT/ab >$OUT/ab.log 2>&1 || tail -20 $OUT/ab.log
python3 - $OUT/ab/bench.json <<'PY'
import json, sys
rows = {}
for r in json.load(open(sys.argv[1]))["results"]:
    if r["system"].startswith("cmc:"):
        rows.setdefault(r["case"], {})[r["system"][4:]] = r["tflops"]
vs = sorted({v for d in rows.values() for v in d})
print("case".ljust(26) + "".join(v.rjust(10) for v in vs))
for c, d in rows.items():
    print(c.ljust(26) + "".join(f"{d[v]:10.1f}" if d.get(v) else "         -" for v in vs))
PY
