"""Build stage: NVRTC per (arch, variant), resources from the ELF, cache, errors, repro."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmc import build as build_mod
from cmc.artifacts import BuiltKernels
from cmc.build import (
    CUDA_INCLUDE_TOKEN,
    build,
    cache_key,
    compile_options,
    nvrtc_compile,
    nvrtc_version,
)
from cmc.cubin import EM_CUDA, parse_ptxas_log, read_cubin, wgmma_pipeline_notes
from cmc.errors import ArtifactError, BuildError, UsageError

from .handmade import VARIANTS, emitted, source_text

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CMC_NO_CACHE", raising=False)


@pytest.fixture(scope="module")
def built() -> BuiltKernels:
    return build(emitted(), cache=False, jobs=2)


@pytest.fixture
def count_compiles(monkeypatch):
    calls: list[tuple[str, ...]] = []
    real = build_mod.nvrtc_compile

    def counting(text, name, options):
        calls.append(tuple(options))
        return real(text, name, options)

    monkeypatch.setattr(build_mod, "nvrtc_compile", counting)
    return calls


def test_one_cubin_per_variant_and_arch(built):
    got = [(c.symbol, c.arch, c.filename) for c in built.cubins]
    assert got == [
        ("cmc_demo_fwd_bf16_d64", "sm_80", "demo.sm_80.bf16_d64.cubin"),
        ("cmc_demo_fwd_bf16_d64", "sm_90a", "demo.sm_90a.bf16_d64.cubin"),
        ("cmc_demo_fwd_fp16_d128", "sm_80", "demo.sm_80.fp16_d128.cubin"),
        ("cmc_demo_fwd_fp16_d128", "sm_90a", "demo.sm_90a.fp16_d128.cubin"),
        ("cmc_demo_fwd_fp16_d128", "sm_100a", "demo.sm_100a.fp16_d128.cubin"),
    ]
    for c in built.cubins:
        cub = read_cubin(c.data)
        assert cub.arch == c.arch
        # one entry point per cubin: the variant's
        assert list(cub.kernels) == [c.symbol]
        assert c.sha256 == hashlib.sha256(c.data).hexdigest()
        assert c.nvrtc_version == nvrtc_version() == cub.toolkit
        assert c.options[0] == f"-arch={c.arch}"
        assert "--ptxas-options=-v" in c.options
        assert c.build_seconds > 0


def test_resources_from_elf_agree_with_ptxas(built):
    for c in built.cubins:
        log = parse_ptxas_log(c.log)[c.symbol]
        r = c.resources
        assert (r.registers, r.local_bytes, r.shared_static) == (
            log.registers,
            log.stack_frame,
            log.shared,
        ), c.filename
        info = read_cubin(c.data).kernel(c.symbol)
        assert info.param_bytes == built.source.layout.size  # one by-value descriptor
        assert info.max_threads is not None and info.max_threads[0] >= 128


def test_static_shared_excludes_reserved_smem_on_sm90(built):
    # tile[D * 4] floats: 1024 B for d64, 2048 B for d128, on every arch
    for c in built.cubins:
        want = 4 * 4 * (64 if "d64" in c.filename else 128)
        assert c.resources.shared_static == want
        raw = read_cubin(c.data).kernel(c.symbol).shared_section
        assert raw == want + (1024 if c.arch != "sm_80" else 0)


def test_arch_suffix_comes_from_nv_compat():
    v = dataclasses.replace(VARIANTS[0], archs=("sm_90", "sm_90a"))
    b = build(emitted((v,)), cache=False)
    arch_of = {c.arch: read_cubin(c.data) for c in b.cubins}
    assert {a: (x.sm, x.arch_specific) for a, x in arch_of.items()} == {
        "sm_90": (90, False),
        "sm_90a": (90, True),
    }
    # and e_flags alone cannot tell them apart
    flags = {struct.unpack_from("<I", c.data, 48)[0] for c in b.cubins}
    assert len(flags) == 1


def test_arch_selection():
    src = emitted()
    b = build(src, archs=["sm_90a"], cache=False)
    assert [c.filename for c in b.cubins] == [
        "demo.sm_90a.bf16_d64.cubin",
        "demo.sm_90a.fp16_d128.cubin",
    ]
    with pytest.raises(UsageError, match="sm_75"):
        build(src, archs=["sm_75"])
    with pytest.raises(BuildError, match="no kernel variant .* targets sm_86"):
        build(src, archs=["sm_86"])


def test_same_bytes_every_time_and_with_threads(built):
    again = build(emitted(), cache=False, jobs=1)
    assert [c.data for c in again.cubins] == [c.data for c in built.cubins]


def test_cache_skips_unchanged_kernels(count_compiles, tmp_path):
    src = emitted()
    first = build(src)
    assert len(count_compiles) == 5
    second = build(src, jobs=2)
    assert len(count_compiles) == 5  # all five from the cache
    assert [c.data for c in second.cubins] == [c.data for c in first.cubins]
    assert [c.resources for c in second.cubins] == [c.resources for c in first.cubins]
    # a changed source rebuilds only what it changes: every kernel here
    build(emitted(text=src.text + "\n// changed\n"))
    assert len(count_compiles) == 10
    # an option change misses; cache=False always compiles
    build(src, archs=["sm_80"], extra_options=("-DEXTRA=1",))
    assert len(count_compiles) == 12
    build(src, archs=["sm_80"], cache=False)
    assert len(count_compiles) == 14
    assert (tmp_path / "cache" / "cubins").is_dir()


def test_cache_env_switch(count_compiles, monkeypatch):
    src = emitted()
    build(src, archs=["sm_80"])
    monkeypatch.setenv("CMC_NO_CACHE", "1")
    build(src, archs=["sm_80"])
    assert len(count_compiles) == 4


def test_corrupt_cache_entry_is_rebuilt(count_compiles, tmp_path):
    src = emitted((VARIANTS[0],))
    good = build(src, archs=["sm_80"])
    entries = list((tmp_path / "cache" / "cubins").rglob("*.cubin"))
    assert len(entries) == 1
    entries[0].write_bytes(b"\x7fELF garbage")
    again = build(src, archs=["sm_80"])
    assert len(count_compiles) == 2
    assert again.cubins[0].data == good.cubins[0].data
    assert entries[0].read_bytes() == good.cubins[0].data  # repaired


def test_cache_key_covers_inputs():
    v = VARIANTS[0]
    opts = compile_options("x", "sm_90a", v)
    base = cache_key("x", "demo.cu", opts)
    assert base == cache_key("x", "demo.cu", opts)
    assert base != cache_key("y", "demo.cu", opts)
    assert base != cache_key("x", "other.cu", opts)
    assert base != cache_key("x", "demo.cu", compile_options("x", "sm_80", v))


def test_includes_get_the_cuda_headers_as_a_token():
    text = source_text(extra="#include <cuda_fp16.h>\n#include <cuda/std/cstdint>\n"
                       "using cuda::std::uint64_t; using cuda::std::int64_t;"
                       " using cuda::std::int32_t;\n")
    b = build(emitted((VARIANTS[0],), text=text), archs=["sm_90a"], cache=False)
    (c,) = b.cubins
    assert CUDA_INCLUDE_TOKEN in c.options
    assert not any(o.startswith("-I/") for o in c.options)  # no machine path recorded
    assert b"/" + b"site-packages" not in c.data


def test_spills_come_from_the_ptxas_log():
    text = source_text() + r"""
extern "C" __global__ void cmc_demo_fwd_bf16_d256(const __grid_constant__ cmc_demo_desc d) {
  const float* x = reinterpret_cast<const float*>(d.q);
  float a[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) a[i] = x[threadIdx.x * 48 + i];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int i = 0; i < 48; ++i) a[i] = a[i] * a[(i + 7) % 48] + a[(i + 13) % 48];
  float s = 0;
#pragma unroll
  for (int i = 0; i < 48; ++i) s += a[i] * i;
  reinterpret_cast<float*>(d.o)[threadIdx.x] = s;
}
"""
    v = dataclasses.replace(
        VARIANTS[0], symbol="cmc_demo_fwd_bf16_d256", head_dim=256, archs=("sm_90a",)
    )
    b = build(emitted((v,), text=text), cache=False, extra_options=("-maxrregcount=24",))
    r = b.cubins[0].resources
    assert r.registers <= 24
    assert r.spill_stores > 0 and r.spill_loads > 0 and r.local_bytes > 0


def test_nvrtc_failure_reports_log_source_and_repro():
    text = source_text() + "\nthis is not cuda;\n"
    with pytest.raises(BuildError) as exc:
        build(emitted(text=text), archs=["sm_80"])
    e = exc.value
    assert "error" in e.log and "demo.cu(" in e.log
    path = Path(e.source_path)
    assert path.name == "demo.cu" and path.read_text() == text
    assert "-m cmc.build --repro" in e.repro and "-DCMC_VARIANT_bf16_d64" in e.repro
    formatted = e.format()
    assert "NVRTC log:" in formatted and e.repro in formatted
    # the repro command reproduces the failure
    proc = subprocess.run(e.repro, shell=True, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert "this" in proc.stdout and "error" in proc.stdout


def test_repro_of_good_source_prints_resources(tmp_path):
    p = tmp_path / "demo.cu"
    p.write_text(source_text())
    opts = compile_options(source_text(), "sm_90a", VARIANTS[1])
    proc = subprocess.run(
        [sys.executable, "-m", "cmc.build", "--repro", str(p), *opts],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok: sm_90a cubin" in proc.stdout and "cmc_demo_fwd_fp16_d128" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "cmc.build"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_missing_entry_point():
    v = dataclasses.replace(VARIANTS[0], symbol="cmc_demo_fwd_nope", archs=("sm_80",))
    with pytest.raises(BuildError, match="no kernel 'cmc_demo_fwd_nope'"):
        build(emitted((v,), text=source_text((VARIANTS[0],))), cache=False)


def test_parameter_block_must_be_the_descriptor():
    text = (
        "#if defined(CMC_VARIANT_bf16_d64)\n"
        'extern "C" __global__ void cmc_demo_fwd_bf16_d64(float* x) { x[0] = 1; }\n#endif\n'
    )
    with pytest.raises(BuildError, match="takes 8 bytes of parameters.*184 bytes"):
        build(emitted((dataclasses.replace(VARIANTS[0], archs=("sm_80",)),), text=text))


def test_launch_limits_are_checked():
    too_many = dataclasses.replace(VARIANTS[0], threads=512, archs=("sm_80",))
    with pytest.raises(BuildError, match="__launch_bounds__ allow 128"):
        build(emitted((too_many,), text=source_text((VARIANTS[0],))), cache=False)
    big = dataclasses.replace(VARIANTS[0], smem_bytes=240 * 1024, archs=("sm_90a",))
    with pytest.raises(BuildError, match="shared memory; sm_90a allows 232448"):
        build(emitted((big,), text=source_text((VARIANTS[0],))), cache=False)


def test_bad_plans():
    with pytest.raises(BuildError, match="plain NAME.cu"):
        build(dataclasses.replace(emitted(), filename="/tmp/demo.cu"))
    dup = (VARIANTS[0], dataclasses.replace(VARIANTS[0], symbol="other"))
    with pytest.raises(BuildError, match="two variants"):
        build(emitted(dup))
    with pytest.raises(BuildError, match="no kernel variants"):
        build(emitted(()))


def test_nvrtc_compile_directly():
    r = nvrtc_compile('extern "C" __global__ void k() {}', "k.cu", ["-arch=sm_80"])
    assert r.ok and read_cubin(r.cubin).arch == "sm_80"
    r = nvrtc_compile("nonsense", "k.cu", ["-arch=sm_80"])
    assert not r.ok and r.cubin == b"" and "k.cu(1)" in r.log


# ----------------------------------------------------------------------------- ELF reader


def test_read_cubin_rejects_non_cubins(built):
    data = built.cubins[0].data
    with pytest.raises(ArtifactError, match="no ELF magic"):
        read_cubin(b"hello")
    other = bytearray(data)
    struct.pack_into("<H", other, 18, 62)  # EM_X86_64
    with pytest.raises(ArtifactError, match=f"EM_CUDA \\({EM_CUDA}\\)"):
        read_cubin(bytes(other))
    with pytest.raises(ArtifactError, match="truncated|runs past"):
        read_cubin(data[: len(data) // 2])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_read_cubin_never_crashes_on_corruption(built, data):
    """Any corruption is an ArtifactError or a parse, never another exception."""
    blob = bytearray(built.cubins[1].data)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    try:
        read_cubin(bytes(blob[:cut]) if data.draw(st.booleans()) else bytes(blob))
    except ArtifactError:
        pass


def test_parse_ptxas_log():
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'a' for 'sm_90a'\n"
        "ptxas info    : Function properties for a\n"
        "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 16 bytes cumulative stack size, "
        "2048 bytes smem\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_90a'\n"
        "ptxas info    : Function properties for b\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 8 registers, used 0 barriers\n"
    )
    got = parse_ptxas_log(log)
    assert (got["a"].registers, got["a"].spill_stores, got["a"].spill_loads) == (40, 8, 4)
    assert (got["a"].stack_frame, got["a"].shared) == (16, 2048)
    assert (got["b"].registers, got["b"].shared) == (8, 0)


def test_wgmma_pipeline_notes():
    serial = (
        "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to non wgmma instructions defining accumulator registers of a wgmma "
        "between start and end of the pipeline stage in the function 'k'\n"
        "ptxas info    : (C7519) warpgroup.arrive is injected in around line 4135 by compiler to "
        "allow use of registers in GMMA in function 'k'\n"
    )
    notes = wgmma_pipeline_notes(serial + "ptxas info    : Used 168 registers, used 6 barriers\n")
    assert [n.split(":")[0] for n in notes] == ["C7515", "C7519"]
    assert "serialized" in notes[0]
    assert wgmma_pipeline_notes("ptxas info    : Used 168 registers, used 6 barriers\n") == []


def test_a_kernel_whose_wgmma_pipeline_ptxas_gives_up_is_rejected():
    text = (
        "#if defined(CMC_VARIANT_bf16_d64)\n"
        'extern "C" __global__ void __launch_bounds__(128) cmc_demo_fwd_bf16_d64(float* x) {\n'
        "  __shared__ __align__(1024) unsigned short t[64 * 16 + 8 * 16];\n"
        "  const unsigned a = (unsigned)__cvta_generic_to_shared(t);\n"
        "  const unsigned long long da = ((a & 0x3FFFF) >> 4) | (8ull << 32);\n"
        "  const unsigned long long db = (((a + 2048) & 0x3FFFF) >> 4) | (8ull << 32);\n"
        "  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;\n"
        '  asm volatile("wgmma.fence.sync.aligned;\\n");\n'
        '  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, '
        '%4, %5, 1, 1, 1, 0, 0;\\n" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), '
        '"l"(db));\n'
        '  asm volatile("wgmma.commit_group.sync.aligned;\\n");\n'
        "  d0 = d0 + x[1];  // a plain instruction reads an accumulator of the running wgmma\n"
        '  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");\n'
        "  x[threadIdx.x] = d0 + d1 + d2 + d3;\n"
        "}\n#endif\n"
    )
    v = dataclasses.replace(VARIANTS[0], archs=("sm_90a",))
    with pytest.raises(BuildError, match=r"did not keep the kernel's wgmma pipeline \(C75") as exc:
        build(emitted((v,), text=text), cache=False)
    assert "injected" in exc.value.log or "serialized" in exc.value.log
