"""Golden diagnostics: each tests/golden/X.mask fails with exactly the text in X.err.

A first line `# cmc-test: -D NAME=INT ...` passes -D overrides. Run with CMC_REGEN_GOLDEN=1
(`make golden`) to rewrite the .err files after an intended change of wording, then review
the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cmc.check import check
from cmc.config import regen_golden
from cmc.driver import read_source
from cmc.errors import CmcError, MaskError
from cmc.parse import parse

from .conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(GOLDEN.glob("*.mask"))
_DIRECTIVE = re.compile(r"^# cmc-test:(.*)$", re.M)


def _defines(text: str) -> dict[str, int]:
    m = _DIRECTIVE.search(text.split("\n", 1)[0])
    out: dict[str, int] = {}
    if m:
        for name, value in re.findall(r"-D\s*(\w+)=(-?\d+)", m.group(1)):
            out[name] = int(value)
    return out


def diagnostics_for(path: Path) -> str:
    """What `cmc check` would print for one file (no traceback, every error)."""
    rel = path.relative_to(ROOT).as_posix()
    try:
        text = read_source(path, rel)  # as the CLI reads it: BOM, undecodable bytes, size
        check(parse(text, rel), _defines(text))
    except MaskError as e:
        return e.format() + "\n"
    except CmcError as e:  # pragma: no cover - a failure of the test's premise
        return f"unexpected {type(e).__name__}: {e}\n"
    return "no error\n"


def test_enough_golden_cases():
    assert len(CASES) >= 20
    for path in CASES:
        assert path.with_suffix(".err").exists() or regen_golden(), f"{path.name}: no .err"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden(path: Path):
    got = diagnostics_for(path)
    expected_path = path.with_suffix(".err")
    if regen_golden():
        expected_path.write_text(got)
    assert got != "no error\n", f"{path.name} is supposed to be invalid"
    assert re.match(r"^(tests/golden/\S+\.mask:\d+:\d+: |)error: ", got), got
    assert got == expected_path.read_text()


def test_golden_several_errors_reports_all():
    got = diagnostics_for(GOLDEN / "several_errors.mask")
    assert len(re.findall(r"^tests/golden/several_errors.mask:\d+:\d+: error:", got, re.M)) >= 6
