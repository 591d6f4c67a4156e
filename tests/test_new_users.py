"""What a new user meets first: `cmc show` at its limits, odd file names, --png without
Pillow, the generated source's header lines, and how to reach `cmc` after `make demo`."""

from __future__ import annotations

import builtins
import os
import re

import pytest
from click.testing import CliRunner

from cmc.cli import SHOW_MAX_CELLS, cli
from cmc.driver import Options, back, front

from .conftest import ROOT

CAUSAL = str(ROOT / "samples/causal.mask")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("args", [["--len", str(1 << 20)], ["--len", "20000", "--tile", "1x1"]])
def test_show_refuses_what_it_cannot_hold(args):
    r = invoke("show", CAUSAL, *args)
    assert r.exit_code == 2, r.output
    assert f"more than cmc show computes ({SHOW_MAX_CELLS:,})" in r.output
    assert isinstance(r.exception, SystemExit)


def test_show_just_inside_the_limit_runs():
    r = invoke("show", CAUSAL, "--len", "100000")
    assert r.exit_code == 0, r.output


def test_undecodable_file_name_is_printed_escaped(tmp_path):
    name = os.fsdecode(b"caus\xffal.mask")
    (tmp_path / name).write_text("mask causal\nallow k <= q\n")
    r = invoke("check", str(tmp_path / name))
    assert r.exit_code == 0 and "caus\\xffal.mask: ok" in r.output, r.output
    (tmp_path / name).write_text("mask causal\nallow k <= qq\n")
    r = invoke("check", str(tmp_path / name))
    assert r.exit_code == 1 and re.search(r"caus\\xffal\.mask:2:\d+: error", r.output), r.output


def test_png_without_pillow_says_how_to_get_it(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("hidden by the test")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    r = invoke("show", CAUSAL, "--len", "64", "--png", str(tmp_path / "x.png"))
    assert r.exit_code == 2, r.output
    assert "pip install 'cmc[png]'" in r.output and "visible pairs" not in r.output
    assert not (tmp_path / "x.png").exists()


def test_generated_source_header_lines():
    lines = back(front(CAUSAL), Options()).text.splitlines()
    assert lines[2].endswith("for sm_90a")
    assert lines[3].startswith("// table: ")


def test_make_demo_puts_cmc_in_reach():
    makefile = (ROOT / "Makefile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "source $(VENV)/bin/activate" in makefile.split("samples:")[1].split("test:")[0]
    assert ".venv/bin/cmc" in readme and "source .venv/bin/activate" in readme
