"""CI for samples/c: the C demo compiles and links (-Werror) against an emitted causal.h (with
and without the backward) and the CUDA headers of the pip wheel, without libcuda (it dlopens
the driver at run time). No GPU here: run against a fake libcuda.so.1
(tests/fake_cuda/fake_libcuda.c), the demo's launches (kernels, order, grids, shared memory)
and its cmc_bwd_args are checked against the manifest, and the versions at which it asks for
the driver's entry points against cudaTypedefs.h. One mask, arch, dtype and head dim."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "samples" / "c" / "attn_demo.c"
FAKE = ROOT / "tests" / "fake_cuda" / "fake_libcuda.c"
# the demo's case (samples/c/attn_demo.c) and the fake's device (fake_libcuda.c)
L, H, D, NUM_SMS = 300, 2, 128, 132


@pytest.fixture(scope="module", params=[(False, "auto"), (True, "auto"), (True, "lockstep"),
                                        (True, "portable")],
                ids=["fwd_only", "backward", "backward_lockstep", "backward_portable"])
def artifact(request, tmp_path_factory) -> Path:
    """The default build (on sm_90a the wgmma kv and dq kinds; causal's kv is the
    warp-specialised one, with tensor maps), --bwd-kernel lockstep and --bwd-kernel portable:
    the demo picks each role's kernel by the header's macros."""
    from cmc.driver import compile_file

    backward, bwd_kernel = request.param
    return compile_file(ROOT / "samples" / "causal.mask", tmp_path_factory.mktemp("art"),
                        archs=["sm_90a"], dtypes=["bf16"], head_dims=[128],
                        backward=backward, bwd_kernel=bwd_kernel)


def cuda_include() -> Path | None:
    try:
        import nvidia.cu13 as m

        for p in m.__path__:
            if (Path(p) / "include" / "cuda.h").is_file():
                return Path(p) / "include"
    except ImportError:
        pass
    for p in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if p and (Path(p) / "include" / "cuda.h").is_file():
            return Path(p) / "include"
    return None


def _cc_and_include() -> tuple[str, Path]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    inc = cuda_include()
    if inc is None:
        pytest.skip("no cuda.h (nvidia-cuda-runtime wheel or CUDA_HOME)")
    return cc, inc


SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


@functools.cache
def _sanitizers_link(cc: str) -> bool:
    """Whether cc builds and runs a program with SANITIZE (libasan and libubsan present)."""
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "t.c", Path(d) / "t"
        src.write_text("int main(void) { return 0; }\n")
        r = subprocess.run([cc, *SANITIZE, "-o", str(exe), str(src)], capture_output=True)
        return r.returncode == 0 and subprocess.run([str(exe)]).returncode == 0


def compile_demo(header_dir: Path, out: Path, sanitize: bool = False
                 ) -> subprocess.CompletedProcess[str]:
    """sanitize: AddressSanitizer and UBSan where cc has them, for the runs on the fake driver
    (whose map encodes write 128 bytes per map into the demo's arrays)."""
    cc, inc = _cc_and_include()
    san = SANITIZE if sanitize and _sanitizers_link(cc) else []
    return subprocess.run(
        [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", *san, f"-I{inc}",
         f"-I{header_dir}", "-o", str(out), str(DEMO), "-ldl", "-lm"],
        capture_output=True, text=True, timeout=120)


def test_demo_builds_against_the_emitted_header(artifact, tmp_path):
    art = artifact
    r = compile_demo(art, tmp_path / "attn_demo")
    assert r.returncode == 0, r.stderr
    nm = shutil.which("nm")
    if nm:  # no driver symbol is linked: every entry point comes from cuGetProcAddress
        syms = subprocess.run([nm, "-u", str(tmp_path / "attn_demo")], capture_output=True,
                              text=True).stdout
        linked = [ln.split()[-1] for ln in syms.splitlines() if ln.strip()]
        assert linked and not [s for s in linked if s.startswith("cu")], linked


def test_demo_fails_to_build_against_a_wrong_struct(tmp_path):
    """The demo really uses the header: a struct without the ABI's fields does not compile."""
    (tmp_path / "causal.h").write_text(
        "struct cmc_causal_desc { int x; };\ntypedef struct cmc_causal_desc cmc_causal_desc;\n")
    r = compile_demo(tmp_path, tmp_path / "attn_demo")
    assert r.returncode != 0


def test_demo_without_a_driver_exits_2(artifact, tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU driver is present (tests/gpu runs the demo)")
    art = artifact
    r = compile_demo(art, tmp_path / "attn_demo")
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(tmp_path / "attn_demo"), str(art)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "libcuda" in run.stderr


# --------------------------------------------------------------------------- a fake driver


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _eval(expr: str, env: dict) -> int:
    return int(eval(expr, {"ceil_div": _ceil_div, "min": min, "max": max,  # our manifest's
                           "__builtins__": {}}, env))                     # own expressions


def run_on_fake_driver(art: Path, tmp_path: Path, args_bytes: int) -> tuple[str, list[str]]:
    """The demo built against art and run with the fake libcuda.so.1: (stdout, log lines)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the fake driver is a Linux shared library")
    cc, inc = _cc_and_include()
    lib = tmp_path / "fake"
    lib.mkdir()
    r = subprocess.run([cc, "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                        f"-I{inc}", "-o", str(lib / "libcuda.so.1"), str(FAKE)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = compile_demo(art, tmp_path / "attn_demo", sanitize=True)
    assert r.returncode == 0, r.stderr
    log = tmp_path / "fake.log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKE_CUDA_LOG": str(log),
           "FAKE_CUDA_ARGS_BYTES": str(args_bytes),
           "ASAN_OPTIONS": "detect_leaks=0"}  # the fake keeps what it hands out
    run = subprocess.run([str(tmp_path / "attn_demo"), str(art)], capture_output=True,
                         text=True, timeout=120, env=env)
    # the fake computes nothing: the outputs stay NaN and the demo says so
    assert run.returncode == 1 and run.stdout.rstrip().endswith("FAIL"), \
        run.stdout + run.stderr
    lines = log.read_text().splitlines()
    check_entry_point_versions(lines, inc)
    return run.stdout, lines


def abi_versions(inc: Path) -> dict[str, set[int]]:
    """Each driver entry point's ABI versions, from cudaTypedefs.h's PFN_<name>_v<version>."""
    text = (inc / "cudaTypedefs.h").read_text()
    out: dict[str, set[int]] = {}
    for name, version in re.findall(r"\bPFN_(cu\w+?)_v(\d+)\b", text):
        out.setdefault(name, set()).add(int(version))
    return out


def check_entry_point_versions(log: list[str], inc: Path) -> None:
    """The demo asks cuGetProcAddress for each entry point at one of its ABI versions (the
    version of the PFN type it declares), never at CUDA_VERSION: on a CUDA 13 driver that
    hands out cuCtxSynchronize_v2(CUcontext), which the old prototype calls with whatever is
    in a register as the context (SIGSEGV on the H200). The fake, like that driver, hands
    out the _v2 ABIs from 13000 on and logs `badctx` when one gets a context that is none."""
    abi = abi_versions(inc)
    asked = [ln.split()[1:] for ln in log if ln.startswith("getproc")]
    assert asked, log
    wrong = [(n, v) for n, v in asked if int(v) not in abi.get(n, set())]
    assert not wrong, f"asked at a version that is no ABI of the name: {wrong}"
    assert not [ln for ln in log if ln.startswith("badctx")], log


def test_demo_launches_what_the_manifest_says(artifact, tmp_path):
    """Forward, then (with the backward) the atomic sequence and the deterministic one twice,
    each kernel from its own cubin with the manifest's grid, block and shared memory; its
    cmc_bwd_args, decoded with the manifest's offsets, point at buffers of the workspace
    rules' sizes, with flags 0 (atomic) or 1 (deterministic)."""
    m = json.loads((artifact / "manifest.json").read_text())
    bwd = m["backward"]
    stdout, log = run_on_fake_driver(artifact, tmp_path, bwd["args"]["size"] if bwd else 0)
    assert not [ln for ln in log if ln.startswith("missing")], log
    allocs = {int(p, 16): int(n) for kind, p, n in (ln.split() for ln in log
                                                    if ln.startswith("alloc"))}
    attrs = [ln.split()[1:] for ln in log if ln.startswith("attr")]
    launches = [ln.split()[1:] for ln in log if ln.startswith("launch")]
    maps_before: list[list[list[str]]] = [[]]  # per launch, the tensor maps encoded since the last
    for ln in log:
        if ln.startswith("tmap"):
            maps_before[-1].append(ln.split()[1:])
        elif ln.startswith("launch"):
            maps_before.append([])
    by_role = {k["role"]: k for k in m["kernels"]}
    modes = []
    if bwd:
        assert bwd["sequence"]["atomic"] and bwd["sequence"]["deterministic"]
        modes = [("atomic", 0)] + [("deterministic", 1)] * 2
    want = ["fwd"] + [r for mode, _ in modes for r in bwd["sequence"][mode]]
    assert [ln[0] for ln in launches] == [by_role[r]["symbol"] for r in want], launches
    if not bwd:
        assert "backward: not in this artifact" in stdout
        return
    assert "the second run is bitwise equal" in stdout
    sizes = {"T": L, "heads_q": H, "heads_kv": H, "head_dim": D, "batch": 1}
    grid_env = {"max_len": L, "batch": 1, "max_ctas": NUM_SMS, **sizes}
    fields = {f["name"]: f for f in bwd["args"]["fields"]}
    flags = [f for mode, f in modes for _ in bwd["sequence"][mode]]
    grad_bytes = L * H * D * 2
    for i, ((sym, *shape), role, flag) in enumerate(zip(launches, want, [None] + flags,
                                                          strict=True)):
        k = by_role[role]
        gx, gy, gz, bx, by, bz, smem = map(int, shape[:7])
        assert [gx, gy, gz] == [_eval(e, grid_env) for e in k["grid"]], (role, shape)
        assert [bx, by, bz] == k["block"] and smem == k["dynamic_smem"], (role, shape)
        if smem > 48 * 1024:
            assert [sym, "8", str(smem)] in attrs, (role, attrs)  # MAX_DYNAMIC_SHARED_SIZE
        if role == "fwd":
            continue
        raw = bytes.fromhex(shape[7])
        a = {n: int.from_bytes(raw[f["offset"]:f["offset"] + f["size"]], "little",
                               signed=f["ctype"].startswith("int"))
             for n, f in fields.items()}
        assert a["flags"] == flag and a["total_tokens"] == L, (role, a)
        for n in ("dout", "dq", "dk", "dv"):
            assert allocs.get(a[n]) == grad_bytes, (n, a)
            assert (a[f"{n}_stride_tok"], a[f"{n}_stride_head"]) == (H * D, D), (n, a)
        assert len({a[n] for n in ("dout", "dq", "dk", "dv", "dq_accum", "dsum")}) == 6, a
        # a kind with tensor maps (the warp-specialised kv: Q, dO, dq_accum) gets them
        # encoded over [T, H, D] with its box rows just before its launch; dO's at the dout
        # buffer; dq_accum's at the workspace, FLOAT32 (7; BFLOAT16 is 9, FLOAT16 6), 4-byte
        # strides, boxes of 32 x 1 x 64
        tm = [t["tensor"] for t in k.get("tensor_maps", [])]
        got = maps_before[i]
        assert len(got) == len(tm), (role, got)
        io = 9 if k["dtype"] == "bf16" else 6
        for t, g in zip(tm, got, strict=True):
            want_map = [D, H, L, D * 4, H * D * 4, 32, 1, 64, 7] if t == "dq_accum" else \
                [D, H, L, D * 2, H * D * 2, 64, 1, k["tensor_maps"][0]["box"][2], io]
            assert [int(x) for x in g[1:]] == want_map, (role, t, g)
            if t in ("do", "dq_accum"):
                want_at = a["dout" if t == "do" else "dq_accum"]
                assert int(g[0], 16) == want_at, (role, g, want_at)
        for n, rule in bwd["workspace"].items():
            assert allocs.get(a[n]) == _eval(rule["bytes"], sizes), (n, rule, allocs.get(a[n]))


FAKE_PROBE = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
int main(int argc, char **argv)
{
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  get_proc_fn get_proc;
  CUresult (*sync_v2)(CUcontext);
  CUresult (*sync_v1)(void);
  CUdriverProcAddressQueryResult st;
  int version = atoi(argv[1]);
  (void)argc;
  if (!lib) return 3;
  *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
  if (get_proc("cuCtxSynchronize", (void **)&sync_v2, version, 0, &st)) return 4;
  *(void **)&sync_v1 = *(void **)&sync_v2;
  /* version 13000: the _v2 ABI, called here with a context that is none */
  printf("%d\n", version >= 13000 ? (int)sync_v2((CUcontext)0x10) : (int)sync_v1());
  return 0;
}
"""


@pytest.mark.parametrize("version,result,badctx", [(2000, 0, False), (13000, 201, True)])
def test_fake_driver_hands_out_the_cuda13_abi(tmp_path, version, result, badctx):
    """The fake's cuGetProcAddress_v2 picks the ABI by the version asked for, as a CUDA 13
    driver does: cuCtxSynchronize at 13000 is cuCtxSynchronize_v2(CUcontext), and a context
    that is none is reported (CUDA_ERROR_INVALID_CONTEXT, `badctx` in the log)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the fake driver is a Linux shared library")
    cc, inc = _cc_and_include()
    lib = tmp_path / "fake"
    lib.mkdir()
    r = subprocess.run([cc, "-O1", "-std=c11", "-shared", "-fPIC", f"-I{inc}",
                        "-o", str(lib / "libcuda.so.1"), str(FAKE)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (tmp_path / "probe.c").write_text(FAKE_PROBE)
    r = subprocess.run([cc, "-std=c11", f"-I{inc}", "-o", str(tmp_path / "probe"),
                        str(tmp_path / "probe.c"), "-ldl"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    log = tmp_path / "fake.log"
    run = subprocess.run([str(tmp_path / "probe"), str(version)], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "LD_LIBRARY_PATH": str(lib),
                              "FAKE_CUDA_LOG": str(log)})
    assert run.returncode == 0 and run.stdout.split() == [str(result)], run
    lines = log.read_text().splitlines()
    assert f"getproc cuCtxSynchronize {version}" in lines, lines
    assert any(ln.startswith("badctx cuCtxSynchronize_v2") for ln in lines) == badctx, lines
