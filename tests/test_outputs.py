"""`cmc compile` output handling: duplicate names and unusable -o are refused before anything
is built, and the artifact folder is replaced atomically (a failure mid-write leaves the
previous build untouched)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import cmc.build
import cmc.package
from cmc.build import build
from cmc.cli import cli
from cmc.errors import ArtifactError
from cmc.package import check_out_dir, package

from .conftest import ROOT
from .handmade import emitted

CAUSAL = str(ROOT / "samples/causal.mask")


def _no_build(*args, **kwargs):
    raise AssertionError("built although the command should have stopped before building")


def _compile(*args: str):
    return CliRunner().invoke(cli, ["compile", *args])


@pytest.fixture()
def refuse_build(monkeypatch):
    monkeypatch.setattr(cmc.build, "build", _no_build)


def test_duplicate_mask_names_are_refused_before_building(tmp_path, refuse_build):
    twin = tmp_path / "twin.mask"
    twin.write_text("mask causal\nallow k < q\n")
    r = _compile(CAUSAL, str(twin), "-o", str(tmp_path / "out"))
    assert r.exit_code == 1, r.output
    assert f"mask causal is declared by both {CAUSAL} and {twin}" in r.output
    assert isinstance(r.exception, SystemExit), r.exception
    assert not (tmp_path / "out").exists()
    r = _compile(CAUSAL, str(twin), "-o", str(tmp_path / "out"), "--emit", "itab")
    assert r.exit_code == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["file", "through_file", "read_only", "name_is_file",
                                  "name_is_link"])
def test_unusable_out_is_refused_before_building(tmp_path, refuse_build, case):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    out = {"file": a_file, "through_file": a_file / "sub", "read_only": Path("/proc/cmc_out"),
           "name_is_file": tmp_path / "o1", "name_is_link": tmp_path / "o2"}[case]
    if case == "name_is_file":
        out.mkdir()
        (out / "causal").write_text("not a folder")
    if case == "name_is_link":
        out.mkdir()
        (out / "causal").symlink_to(tmp_path)
    r = _compile(CAUSAL, "-o", str(out))
    assert r.exit_code in (1, 2), r.output  # 2: click's own check of an existing file
    assert not isinstance(r.exception, AssertionError), r.output
    assert isinstance(r.exception, SystemExit), r.exception
    assert str(out) in r.output or out.name in r.output, r.output


def test_check_out_dir_probes_the_file_system(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cmc.package.tempfile, "mkdtemp", no_space)
    with pytest.raises(ArtifactError, match="cannot write there .No space left"):
        check_out_dir(tmp_path)


@pytest.fixture(scope="module")
def built():
    return build(emitted(), cache=False, jobs=2)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("fail_at", [1, 4, "swap"])
def test_a_failure_mid_write_leaves_the_previous_folder(built, tmp_path, monkeypatch, fail_at):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    dest = package(built, out, "demo.mask")
    (dest / "notes.txt").write_text("mine")
    (dest / "demo.sm_86.bf16_d64.cubin").write_bytes(b"from an older build")
    before = _snapshot(dest)
    real_write, real_replace = cmc.package._write, os.replace
    calls = {"n": 0}

    def failing_write(folder, fname, data):
        calls["n"] += 1
        if calls["n"] == fail_at:
            (folder / fname).write_bytes(data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        real_write(folder, fname, data)

    def failing_replace(src, dst):
        if Path(src).name.startswith(".demo.tmp-"):
            raise OSError(16, "Device or resource busy")
        real_replace(src, dst)

    monkeypatch.setattr(cmc.package, "_write", failing_write)
    if fail_at == "swap":
        monkeypatch.setattr(cmc.package.os, "replace", failing_replace)
    with pytest.raises(ArtifactError, match="cannot write the artifact folder.*unchanged"):
        package(built, out, "demo.mask")
    assert _snapshot(dest) == before
    assert [p.name for p in out.iterdir()] == ["demo"]  # no temporary folder left behind


def test_a_successful_write_replaces_the_whole_folder(built, tmp_path, monkeypatch):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    dest = package(built, out, "demo.mask")
    (dest / "notes.txt").write_text("mine")
    (dest / "demo.sm_86.bf16_d64.cubin").write_bytes(b"from an older build")
    (dest / "manifest.json").write_text("{}")
    package(built, out, "demo.mask")
    names = {p.name for p in dest.iterdir()}
    assert "notes.txt" in names and "demo.sm_86.bf16_d64.cubin" not in names
    assert json.loads((dest / "manifest.json").read_text())["mask"]["name"] == "demo"
    assert [p.name for p in out.iterdir()] == ["demo"]
