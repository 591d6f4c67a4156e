"""The sm90 forward's register split (setmaxnreg producer / consumer) as a build choice:
the candidates obey the CTA's register rule, the cache key and the recorded options carry
the split, a kernel that spills at the default gets a clean split (and the manifest says
so), a kernel clean at the default is byte-identical to a build without the mechanism, and
when no split is clean the least-spilling one is kept and the warning names every split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cmc import build as build_mod
from cmc import kernels
from cmc.artifacts import BuiltCubin, BuiltKernels, KernelResources
from cmc.build import build, cache_key, compile_options
from cmc.driver import Options, back, compile_file, front, spill_warnings
from cmc.errors import BuildError
from cmc.inspection import inspect
from cmc.kernels import SM90_REG_SPLITS, KernelKind, RegSplit

from .conftest import SAMPLES

ROOT = Path(__file__).resolve().parent.parent
SM90 = Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), backward=False,
               cache=False)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CMC_NO_CACHE", raising=False)


def sample(stem: str) -> Path:
    return next(p for p in SAMPLES if p.stem == stem)


def test_candidates_obey_the_register_rule():
    assert set(SM90_REG_SPLITS) == {"linear", "patch"}
    for splits in SM90_REG_SPLITS.values():
        assert len(set(splits)) == len(splits) >= 2
        for s in splits:
            assert s.producer % 8 == 0 and s.consumer % 8 == 0
            assert 128 * s.producer + 256 * s.consumer <= 384 * 168, s
    # the defaults the header falls back to without the defines
    assert SM90_REG_SPLITS["linear"][0] == RegSplit(40, 232)
    assert SM90_REG_SPLITS["patch"][0] == RegSplit(56, 224)
    assert kernels.spec(KernelKind.FWD_SM90).reg_split_candidates("patch") == \
        SM90_REG_SPLITS["patch"]
    assert kernels.spec(KernelKind.FWD_PORTABLE).reg_split_candidates("linear") == ()


@pytest.mark.parametrize("p, c", [(48, 232), (40, 236), (16, 240), (40, 264)])
def test_a_split_the_device_would_refuse_is_an_error(p, c):
    with pytest.raises(ValueError, match="register split"):
        RegSplit(p, c)


def test_cache_key_and_options_include_the_split():
    src = back(front(sample("causal")), SM90)
    v = src.variants[0]
    base = compile_options(src.text, "sm_90a", v)
    keys = {cache_key(src.text, src.filename, base)}
    for s in SM90_REG_SPLITS["linear"][1:]:
        opts = compile_options(src.text, "sm_90a", v, s.options())
        assert f"-DCMC_SM90_REGS_PRODUCER={s.producer}" in opts
        assert f"-DCMC_SM90_REGS_CONSUMER={s.consumer}" in opts
        keys.add(cache_key(src.text, src.filename, opts))
    assert len(keys) == len(SM90_REG_SPLITS["linear"])


def test_a_kernel_that_spills_at_the_default_gets_a_clean_split(tmp_path):
    """document_causal's sm90 kernel spills with 40/232 (producer-side plan code) and is clean
    with 56/224 (NVRTC 13.0, 2026-12-06; chunked_causal was the example until its plan's
    interval arithmetic went unchecked, emit._fits_unchecked, and fitted 40/232)."""
    out = compile_file(sample("document_causal"), tmp_path, archs=["sm_90a"], dtypes=["bf16"],
                       head_dims=[128], backward=False, cache=False)
    (k,) = json.loads((out / "manifest.json").read_text())["kernels"]
    assert k["local_bytes"] == k["spill_stores"] == k["spill_loads"] == 0
    assert (k["reg_split"]["producer"], k["reg_split"]["consumer"]) == (56, 224)
    assert k["reg_split"]["reason"].startswith("40/232 spilled ")
    assert k["reg_split"]["reason"].endswith("; 56/224 clean")
    assert k["options"][-2:] == list(RegSplit(56, 224).options())
    report = inspect(out)
    assert report.kernels[0].reg_split == "56/224"


@pytest.fixture
def without_splits(monkeypatch):
    """The build as before the mechanism: the sm90 kind has no register splits."""
    fwd = kernels.SPECS[KernelKind.FWD_SM90]
    monkeypatch.setitem(kernels.SPECS, KernelKind.FWD_SM90,  # type: ignore[index]
                        dataclasses.replace(fwd, reg_splits=None))


def test_a_kernel_clean_at_the_default_is_unchanged(monkeypatch):
    """causal is clean at 40/232: one compile, no defines, the bytes of a build without the
    mechanism."""
    src = back(front(sample("causal")), SM90)
    (c,) = build(src, cache=False).cubins
    assert c.resources.local_bytes == 0 and c.reg_split_reason == "default"
    assert c.reg_split == SM90_REG_SPLITS["linear"][0]
    assert not any("CMC_SM90_REGS" in o for o in c.options)
    fwd = kernels.SPECS[KernelKind.FWD_SM90]
    monkeypatch.setitem(kernels.SPECS, KernelKind.FWD_SM90,  # type: ignore[index]
                        dataclasses.replace(fwd, reg_splits=None))
    plain = build(src, cache=False).cubins[0]
    assert plain.sha256 == c.sha256 and plain.reg_split is None


@pytest.mark.parametrize("stem, kind", [("causal", "linear"), ("clear", "patch")])
def test_the_header_default_is_the_first_candidate(stem, kind, without_splits):
    """Without the defines cmc_sm90::Regs falls back to its own default: it must be the first
    candidate of the tiling, or a default build would not be what the manifest records."""
    opts = dataclasses.replace(SM90, dtypes=("fp16",), head_dims=(64,))
    src = back(front(sample(stem)), opts)
    assert src.variants[0].tiling.kind == kind
    plain = build(src, cache=False).cubins[0]
    given = build(src, cache=False, extra_options=SM90_REG_SPLITS[kind][0].options()).cubins[0]
    assert plain.sha256 == given.sha256
    other = build(src, cache=False, extra_options=SM90_REG_SPLITS[kind][1].options()).cubins[0]
    assert other.sha256 != plain.sha256  # the defines do reach Regs


# ---------------------------------------------------------------- the choice, without NVRTC


def _fake(local: int, st: int, ld: int) -> BuiltCubin:
    return BuiltCubin(arch="sm_90a", symbol="k", filename="x.sm_90a.sm90_bf16_d128.cubin",
                      data=b"", sha256=f"{local}-{st}-{ld}", nvrtc_version="13.0",
                      options=(), build_seconds=0.0,
                      resources=KernelResources(168, 0, local, st, ld), log="")


@pytest.fixture
def linear_variant():
    return back(front(sample("causal")), SM90)


def _outcomes(monkeypatch, results):
    """_build_one over fake compiles: results[i] = (local, st, ld, notes) of candidate i."""
    calls = []

    def fake(source, v, arch, use_cache, extra, split):
        local, st, ld, notes = results[len(calls)]
        calls.append(split)
        if notes:
            raise build_mod._LostPipeline(list(notes), "ptxas log")
        return _fake(local, st, ld)

    monkeypatch.setattr(build_mod, "_compile_checked", fake)
    return calls


def test_none_clean_keeps_the_least_spilling_and_says_so(monkeypatch, linear_variant):
    calls = _outcomes(monkeypatch, [(40, 40, 52, ()), (16, 12, 16, ()), (24, 20, 24, ()),
                                    (16, 12, 16, ())])
    (c,) = build(linear_variant, cache=False).cubins
    assert calls == [None, *SM90_REG_SPLITS["linear"][1:]]  # the default: no defines
    assert c.reg_split == RegSplit(56, 224) and c.sha256 == "16-12-16"  # ties: the earlier
    assert c.reg_split_reason == ("40/232 spilled 92 bytes; 56/224 spilled 28 bytes; "
                                  "72/216 spilled 44 bytes; 88/208 spilled 28 bytes; "
                                  "kept 56/224 (the fewest spilled bytes)")
    (line,) = spill_warnings(BuiltKernels(source=linear_variant, cubins=(c,)))
    assert "16 bytes of local memory" in line and "register split 56/224: 40/232 spilled" in line


def test_a_split_that_loses_the_wgmma_pipeline_is_skipped(monkeypatch, linear_variant):
    calls = _outcomes(monkeypatch, [(8, 4, 4, ()), (0, 0, 0, ("C7512: serialized",)),
                                    (0, 0, 0, ())])
    (c,) = build(linear_variant, cache=False).cubins
    assert len(calls) == 3 and c.reg_split == RegSplit(72, 216)
    assert c.reg_split_reason == ("40/232 spilled 8 bytes; 56/224 lost the wgmma pipeline "
                                  "(C7512); 72/216 clean")
    assert spill_warnings(BuiltKernels(source=linear_variant, cubins=(c,))) == []


def test_every_split_losing_the_pipeline_is_a_build_error(monkeypatch, linear_variant):
    _outcomes(monkeypatch, [(0, 0, 0, ("C7515: serialized",))] * len(SM90_REG_SPLITS["linear"]))
    with pytest.raises(BuildError, match=r"wgmma pipeline \(C7515; register splits tried: "
                                         r"40/232 lost"):
        build(linear_variant, cache=False)


def test_a_clean_default_compiles_once(monkeypatch, linear_variant):
    calls = _outcomes(monkeypatch, [(0, 0, 0, ())])
    (c,) = build(linear_variant, cache=False).cubins
    assert calls == [None] and c.reg_split_reason == "default"


def test_fixed_tries_the_default_only_and_says_so(monkeypatch, linear_variant):
    """--reg-split fixed: the A/B baseline; a spilling default is kept, and the reason says
    why no other split was tried."""
    calls = _outcomes(monkeypatch, [(40, 40, 52, ()), (0, 0, 0, ())])
    (c,) = build(linear_variant, cache=False, reg_split="fixed").cubins
    assert calls == [None] and c.reg_split == RegSplit(40, 232) and c.sha256 == "40-40-52"
    assert c.reg_split_reason == ("40/232 spilled 92 bytes; other splits not tried "
                                  "(--reg-split fixed)")
    with pytest.raises(Exception, match="reg_split must be 'auto' or 'fixed'"):
        build(linear_variant, cache=False, reg_split="best")


def test_the_cli_passes_reg_split_through(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from cmc import cli, driver

    seen = []
    monkeypatch.setattr(driver, "compile_many",
                        lambda files, out, opts, *a, **k: seen.append(opts.reg_split) or [])
    r = CliRunner().invoke(cli.cli, ["compile", str(sample("causal")), "-o", str(tmp_path),
                                      "--reg-split", "fixed"])
    assert r.exit_code == 0, r.output
    assert seen == ["fixed"]
