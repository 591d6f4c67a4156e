"""Hostile and tampered manifests: inspect and the runtime's manifest reader answer with an
ArtifactError (never a traceback), with jsonschema hidden, and inspect refuses launch fields
that disagree with the cubins, the header or the grid rules; spills are reported."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest

from cmc.errors import ArtifactError
from cmc.inspection import inspect, report_text
from cmc.manifest_check import schema_problems


@pytest.fixture
def no_jsonschema(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "jsonschema" or name.startswith("jsonschema."):
            raise ImportError("hidden by the test")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    from cmc.build import build
    from cmc.package import package

    from .handmade import emitted

    return package(build(emitted(), cache=False, jobs=2), tmp_path_factory.mktemp("out"),
                   "demo.mask")


def _copy(sound: Path, tmp_path: Path, edit) -> Path:
    dest = tmp_path / "demo"
    shutil.copytree(sound, dest)
    m = json.loads((dest / "manifest.json").read_text())
    out = edit(m)
    text = out if isinstance(out, str) else json.dumps(m)
    (dest / "manifest.json").write_text(text)
    return dest


HOSTILE = {
    "no kernels": lambda m: m.update(kernels=[]),
    "source not text": lambda m: m["mask"].update(source=5),
    "deep nesting": lambda m: "[" * 100_000 + "]" * 100_000,
    "deep object": lambda m: '{"schema_version": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "kernel not an object": lambda m: m.update(kernels=[5]),
    "bool for int": lambda m: m["kernels"][0].update(threads=True),
    "params not a list": lambda m: m.update(params={"a": 1}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifests_are_refused_without_jsonschema(sound, tmp_path, no_jsonschema, case):
    from cmc.runtime.manifest import read_manifest

    dest = _copy(sound, tmp_path, HOSTILE[case])
    with pytest.raises(ArtifactError):
        inspect(dest)
    try:
        read_manifest(dest)
    except ArtifactError:
        pass  # the runtime may refuse it; what it may not do is raise anything else


TAMPER = {
    "dynamic_smem": lambda k: k.update(dynamic_smem=k["dynamic_smem"] + 16),
    "threads": lambda k: k.update(threads=k["threads"] * 2, block=[k["threads"] * 2, 1, 1]),
    "block": lambda k: k.update(block=[k["threads"], 2, 1]),
    "grid": lambda k: k.update(grid=["ceil_div(max_len, 64)", "heads_q", "1"]),
    "max_len": lambda k: k.update(max_len=4096),
    "block_m": lambda k: k.update(block_m=k["block_m"] // 2),
}


@pytest.mark.parametrize("field", sorted(TAMPER))
def test_tampered_launch_fields_are_refused(sound, tmp_path, field):
    inspect(sound)
    dest = _copy(sound, tmp_path, lambda m: TAMPER[field](m["kernels"][0]))
    with pytest.raises(ArtifactError, match=field.split("_")[0]):
        inspect(dest)


def test_builtin_validator_agrees_with_jsonschema(sound):
    jsonschema = pytest.importorskip("jsonschema")
    from cmc.manifest_check import manifest_schema

    good = json.loads((sound / "manifest.json").read_text())
    bad = [dict(good, kernels=[]), dict(good, extra=1), dict(good, params=[{"name": "1x"}]),
           dict(good, schema_version="3")]
    validator = jsonschema.Draft202012Validator(manifest_schema())
    for m in [good, *bad]:
        assert bool(schema_problems(m)) == bool(list(validator.iter_errors(m))), m.keys()


@pytest.mark.parametrize("spills", [(0, 0, 0), (48, 52, 44), (16, 0, 0)])
def test_inspect_reports_spills(spills):
    """One warning line per kernel with local memory or spills, none for the others."""
    from cmc.inspection import InspectReport, KernelReport

    local, st, ld = spills
    k = KernelReport(symbol="cmc_x_fwd_sm90_bf16_d128", arch="sm_90a", file="x.cubin",
                     dtype="bf16", head_dim=128, kernel="sm90", threads=384, block_m=128,
                     block_n=128, registers=168, shared_static=0, dynamic_smem=1024,
                     local_bytes=local, spill_stores=st, spill_loads=ld, size=1, toolkit="13.0")
    ok = KernelReport(**{**k.__dict__, "file": "y.cubin", "local_bytes": 0,
                         "spill_stores": 0, "spill_loads": 0})
    text = report_text(InspectReport(path=Path("x"), name="x", cmc_version="0", nvrtc_versions=(),
                                     descriptor_size=1, exact=True, kernels=(k, ok)))
    line = (f"warning: x.cubin: {local} bytes of local memory per thread, {st} bytes spill "
            f"stores, {ld} bytes spill loads")
    assert (line in text) == any(spills)
    assert "warning: y.cubin" not in text
