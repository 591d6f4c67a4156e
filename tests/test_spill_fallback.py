"""Spill fallbacks (KernelSpec.spill_fallbacks): a kind whose default build uses local memory
on some mask is rebuilt with the kind's fallback defines, the clean build is kept, its options
(and so the manifest) name the defines, and the compile line says so; a clean default is left
alone; when nothing is clean the least-spilling build is kept and the warning names each try.
The ws kv's fallbacks are its LSE order (natten2d's d128 kv spills with the LSE read first),
then its partial items without span words (the raster window's d128 kv spills in both LSE
orders with them), then both."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cmc import build as build_mod
from cmc.artifacts import BuiltCubin, BuiltKernels, KernelResources
from cmc.build import build
from cmc.driver import Options, back, compile_file, front, spill_warnings
from cmc.inspection import inspect, report_text
from cmc.kernels import KernelKind, spec

ROOT = Path(__file__).resolve().parent.parent
LSE_LATE = "-DCMC_WS_LSE_FIRST=0"
NO_SPANS = "-DCMC_BWD_KV_SPANS=0"
OPTS = Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), cache=False)


def _ws_kv(stem: str, where: str = "samples"):
    src = back(front(ROOT / where / f"{stem}.mask"), OPTS)
    return dataclasses.replace(src, variants=tuple(
        v for v in src.variants if v.kernel is KernelKind.BWD_KV_SM90_WS and not v.below_len))


def test_the_ws_kv_falls_back_to_the_late_lse_order():
    assert spec(KernelKind.BWD_KV_SM90_WS).spill_fallbacks == ((LSE_LATE,), (NO_SPANS,),
                                                                (LSE_LATE, NO_SPANS))
    src = _ws_kv("natten2d")
    (c,) = build(src, cache=False).cubins
    r = c.resources
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0)
    assert LSE_LATE in c.options
    assert c.fallback_reason.startswith("default spilled ") and c.fallback_reason.endswith(
        f"{LSE_LATE} clean")
    (line,) = spill_warnings(BuiltKernels(source=src, cubins=(c,)))
    assert line.startswith("note: ") and "rebuilt without local memory" in line


def test_the_raster_windows_kv_falls_back_to_the_predicate():
    """raster_local's d128 kv (band tile masks and span words) spills in both LSE orders;
    without span words it is clean (its partial items evaluate the transposed predicate)."""
    (c,) = build(_ws_kv("raster_local", "benchmarks/generality"), cache=False).cubins
    assert c.resources.local_bytes == 0 and NO_SPANS in c.options and LSE_LATE not in c.options
    assert c.fallback_reason.startswith("default spilled ")
    assert f"{LSE_LATE} spilled" in c.fallback_reason
    assert c.fallback_reason.endswith(f"{NO_SPANS} clean")


def test_a_clean_default_is_not_rebuilt():
    (c,) = build(_ws_kv("causal"), cache=False).cubins
    assert c.fallback_reason == "" and LSE_LATE not in c.options
    assert c.resources.local_bytes == 0


def test_the_manifest_names_the_fallback(tmp_path):
    out = compile_file(ROOT / "samples" / "natten2d.mask", tmp_path, archs=["sm_90a"],
                       dtypes=["bf16"], head_dims=[128])
    m = json.loads((out / "manifest.json").read_text())
    (kv,) = [k for k in m["kernels"] if k["role"] == "kv" and not k.get("below_len")]
    assert LSE_LATE in kv["options"]
    text = report_text(inspect(out))
    assert f"note: {kv['file']}: built with its kind's spill fallback {LSE_LATE}" in text


def _fake(local: int, st: int, ld: int, options: tuple[str, ...]) -> BuiltCubin:
    return BuiltCubin(arch="sm_90a", symbol="k", filename="x.sm_90a.bwd_kv_sm90ws_bf16_d128.cubin",
                      data=b"", sha256=f"{local}-{st}-{ld}", nvrtc_version="13.0",
                      options=options, build_seconds=0.0,
                      resources=KernelResources(168, 0, local, st, ld), log="")


def test_none_clean_keeps_the_least_spilling_and_warns(monkeypatch):
    calls = []

    def fake(source, v, arch, use_cache, extra, split):
        calls.append(tuple(extra))
        return _fake(16, 20, 24, tuple(extra)) if not calls[1:] else _fake(8, 4, 4, tuple(extra))

    monkeypatch.setattr(build_mod, "_compile_checked", fake)
    src = _ws_kv("causal")
    (c,) = build(src, cache=False).cubins
    assert calls == [(), (LSE_LATE,), (NO_SPANS,), (LSE_LATE, NO_SPANS)]
    assert c.sha256 == "8-4-4" and c.options == (LSE_LATE,)  # the first of the least
    assert c.fallback_reason == (f"default spilled 44 bytes; {LSE_LATE} spilled 8 bytes; "
                                 f"{NO_SPANS} spilled 8 bytes; {LSE_LATE} {NO_SPANS} spilled "
                                 "8 bytes")
    (line,) = spill_warnings(BuiltKernels(source=src, cubins=(c,)))
    assert line.startswith("warning: ") and "spill fallbacks: default spilled 44" in line


@pytest.mark.parametrize("kind", [k for k in KernelKind if k is not KernelKind.BWD_KV_SM90_WS])
def test_only_the_ws_kv_has_fallbacks(kind):
    assert spec(kind).spill_fallbacks == ()
