"""`cmc inspect`: a sound folder passes; every kind of damage is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cmc.artifacts import BuiltKernels
from cmc.build import build
from cmc.errors import ArtifactError
from cmc.inspection import inspect, report_text
from cmc.package import package

from .handmade import emitted


@pytest.fixture(scope="module")
def built() -> BuiltKernels:
    return build(emitted(), cache=False, jobs=2)


@pytest.fixture
def folder(built, tmp_path) -> Path:
    return package(built, tmp_path / "out", "demo.mask")


def edit_manifest(folder: Path, fn) -> None:
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def problems(folder: Path) -> str:
    with pytest.raises(ArtifactError) as exc:
        inspect(folder)
    return str(exc.value)


def test_sound_folder(folder, built):
    r = inspect(folder)
    assert r.name == "demo" and r.notes == ()
    assert [(k.arch, k.symbol) for k in r.kernels] == [(c.arch, c.symbol) for c in built.cubins]
    for k, c in zip(r.kernels, built.cubins, strict=True):
        assert (k.registers, k.shared_static, k.local_bytes) == (
            c.resources.registers, c.resources.shared_static, c.resources.local_bytes)
        assert k.size == len(c.data) and k.toolkit
    text = report_text(r)
    assert "all checks passed" in text
    assert "cmc_demo_fwd_fp16_d128" in text and "sm_100a" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_corrupt_cubin(folder):
    p = folder / "demo.sm_90a.bf16_d64.cubin"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))
    msg = problems(folder)
    assert "demo.sm_90a.bf16_d64.cubin: sha256 differs" in msg and "1 problem" in msg


def test_arch_is_read_from_the_elf(folder):
    """A cubin swapped in under another arch's name, manifest hash updated, is still caught."""
    src = folder / "demo.sm_80.fp16_d128.cubin"
    dst = folder / "demo.sm_90a.fp16_d128.cubin"
    shutil.copy(src, dst)
    edit_manifest(folder, lambda m: [k.update(sha256=next(
        x["sha256"] for x in m["kernels"] if x["file"] == src.name))
        for k in m["kernels"] if k["file"] == dst.name])
    msg = problems(folder)
    assert "the cubin is for sm_80, the manifest says sm_90a" in msg


def test_resource_claims_are_checked(folder):
    def lie(m):
        m["kernels"][0]["registers"] += 1
        m["kernels"][1]["shared_static"] = 0
    edit_manifest(folder, lie)
    msg = problems(folder)
    assert "manifest says registers" in msg and "manifest says shared_static 0" in msg
    assert "2 problem(s)" in msg


def test_missing_files(folder):
    (folder / "demo.sm_100a.fp16_d128.cubin").unlink()
    (folder / "demo.h").unlink()
    msg = problems(folder)
    assert "demo.sm_100a.fp16_d128.cubin: missing" in msg and "demo.h: missing" in msg


def test_source_and_header_hashes(folder):
    with open(folder / "demo.cu", "a") as f:
        f.write("// edited\n")
    assert "demo.cu: sha256 differs" in problems(folder)


def test_schema_violations(folder):
    edit_manifest(folder, lambda m: m["kernels"][0].pop("registers"))
    msg = problems(folder)
    assert "does not match its schema" in msg and "'registers' is a required property" in msg


def test_descriptor_must_match_this_cmcs_abi(folder):
    edit_manifest(folder, lambda m: m["descriptor"]["fields"][-1].update(offset=172))
    assert "descriptor: layout differs" in problems(folder)


def test_entry_symbol(folder):
    edit_manifest(folder, lambda m: m["kernels"][2].update(symbol="cmc_demo_other"))
    assert "no entry point cmc_demo_other" in problems(folder)


def test_not_an_artifact_folder(tmp_path, folder):
    with pytest.raises(ArtifactError, match="not an artifact folder"):
        inspect(tmp_path / "nope")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        inspect(tmp_path)
    (folder / "manifest.json").write_text("{ not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        inspect(folder)
    (folder / "manifest.json").write_text('{"schema_version": 99}')
    with pytest.raises(ArtifactError, match="schema_version 99"):
        inspect(folder)


def test_cli_inspect(folder):
    from click.testing import CliRunner

    from cmc.cli import cli

    ok = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert ok.exit_code == 0 and "all checks passed" in ok.output
    (folder / "demo.sm_80.bf16_d64.cubin").write_bytes(b"junk")
    bad = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert bad.exit_code == 1 and "sha256 differs" in bad.output


# ------------------------------------------------------------------------------ backward


@pytest.fixture(scope="module")
def bwd_built() -> BuiltKernels:
    from .handmade import BWD_VARIANTS, VARIANTS

    return build(emitted(VARIANTS + BWD_VARIANTS), archs=["sm_80"], cache=False, jobs=2)


@pytest.fixture
def bwd_folder(bwd_built, tmp_path) -> Path:
    return package(bwd_built, tmp_path / "bwd", "demo.mask")


def test_backward_folder_passes(bwd_folder):
    r = inspect(bwd_folder)
    assert {k.kernel for k in r.kernels} >= {"bwd_pre", "bwd_kv", "bwd_dq", "bwd_post"}


def test_backward_missing_role(bwd_folder):
    edit_manifest(bwd_folder, lambda m: m.update(
        kernels=[k for k in m["kernels"] if k["role"] != "dq"]))
    text = problems(bwd_folder)  # the manifest reader names it before inspect's own check
    assert "lack the roles ['dq']" in text or "no kernel for role(s) dq" in text


def test_backward_wrong_args(bwd_folder):
    edit_manifest(bwd_folder, lambda m: m["backward"]["args"]["fields"][-1].update(offset=112))
    text = problems(bwd_folder)  # the manifest reader names it before inspect's own check
    assert "fields flags and total_tokens overlap" in text or "cmc_bwd_args differs" in text


def test_backward_wrong_params(bwd_folder):
    def bad(m):
        next(k for k in m["kernels"] if k["role"] == "kv")["params"] = ["desc"]
    edit_manifest(bwd_folder, bad)
    text = problems(bwd_folder)  # the manifest reader names it before inspect's own check
    assert "bwd_args exactly for backward kernels" in text or \
        "params ['desc'], the bwd_kv kernel's is ['desc', 'bwd_args']" in text


def test_backward_null_with_backward_kernels(bwd_folder):
    edit_manifest(bwd_folder, lambda m: m.update(backward=None))
    assert 'backward kernels are listed but "backward" is null' in problems(bwd_folder)
