"""Issue 23, front-end classes: overflow in lowered bounds, the instance-limit fallback,
exponential case splitting, always-empty terms, and exactness with extreme constants."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmc.check import check
from cmc.cli import cli
from cmc.ir import Cmp, nodes
from cmc.lower import MAX_TERM_INSTANCES, lower, range_env
from cmc.oracle import dense
from cmc.parse import parse
from cmc.ranges import fits_int64
from cmc.render import table_dict
from cmc.tiles import dense_from_table

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _table(src: str):  # type: ignore[no-untyped-def]
    return lower(check(parse(src, "t.mask")))


def test_overflowing_bound_stays_an_exact_residual() -> None:
    table = _table("mask m\nallow -k / 2147483647 / 2147483647 >= -q\n")
    assert not table.exact
    assert "outside int64" in table.residuals[0].reason
    for length in (1, 50):
        want = dense(table.mask, length)
        assert (dense_from_table(table, length, {}) == want).all()


def test_every_sample_bound_fits_int64() -> None:
    for path in sorted(SAMPLES.glob("*.mask")):
        table = lower(check(parse(path.read_text(), str(path))))
        env = range_env(table.mask)
        for term in table.terms:
            if term.family is None:
                exprs = [term.lo.expr, term.hi.expr] + [
                    side for x in nodes(term.guard) if isinstance(x, Cmp) for side in (x.a, x.b)]
                assert all(fits_int64(e, env) for e in exprs), path.name


def test_instance_limit_fallback_is_reported_everywhere() -> None:
    runner = CliRunner()
    got = runner.invoke(cli, ["check", str(SAMPLES / "clear.mask"), "-D", "R=256"])
    assert got.exit_code == 0
    assert f"more than the {MAX_TERM_INSTANCES} a kernel's plan holds" in got.output
    shown = runner.invoke(cli, ["show", str(SAMPLES / "clear.mask"), "-D", "R=256",
                                "--len", "1024"])
    assert shown.exit_code == 0, shown.output
    assert "a kernel's plan holds" in shown.output
    src = (SAMPLES / "clear.mask").read_text()
    table = lower(check(parse(src, "clear.mask"), {"R": 256}))
    entry = json.loads(json.dumps(table_dict(table)))
    assert entry["exact"] is False and len(entry["terms"]) == 1
    assert "513 term instances" in entry["residuals"][0]["reason"]


def test_many_k_calls_are_bounded_before_expansion() -> None:
    body = " + ".join(f"abs(k - {i})" for i in range(1, 21))
    start = time.monotonic()
    table = _table(f"mask m\nallow {body} <= q\n")
    assert time.monotonic() - start < 3.0
    assert "20 min/max/abs calls" in table.residuals[0].reason
    assert (dense_from_table(table, 40, {}) == dense(table.mask, 40)).all()


def test_always_empty_terms_are_dropped() -> None:
    table = _table("mask m\nallow k <= q\ndeny k < q\ndeny k > q\n")
    assert len(table.terms) == 1 and table.exact
    table = _table("mask m\nallow k in [q + 1, q + 1) or k == q\n")
    assert len(table.terms) == 1


_EXTREME = st.sampled_from([1, 2, 3, 7, 46341, 65536, 2**30, 2147483647, 2147483646])
_CMP = st.sampled_from(["<", "<=", ">", ">=", "=="])


@st.composite
def _extreme_mask(draw: st.DrawFn) -> str:
    atoms = []
    for _ in range(draw(st.integers(1, 3))):
        a, b, c, d = (draw(_EXTREME) for _ in range(4))
        sk = draw(st.sampled_from(["", "-"]))
        sq = draw(st.sampled_from(["", "-"]))
        lhs = draw(st.sampled_from([f"{sk}k * {a} / {b}", f"{sk}k / {a} / {b}",
                                    f"({sk}k + {c}) / {a}", f"{sk}k * {a} + {c}"]))
        rhs = draw(st.sampled_from([f"{sq}q * {d}", f"{sq}q / {d} - {c}", f"{sq}q + len - {d}"]))
        atoms.append(f"{lhs} {draw(_CMP)} {rhs}")
    kind = draw(st.sampled_from(["allow", "deny"]))
    lines = [f"allow {atoms[0]}"] + [f"{kind} {x}" for x in atoms[1:]]
    return "mask m\n" + "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=_extreme_mask(), length=st.integers(1, 24))
def test_table_is_exact_with_extreme_constants(src: str, length: int) -> None:
    table = _table(src)
    want = dense(table.mask, length)
    got = dense_from_table(table, length, {})
    assert np.array_equal(got, want), src


# --------------------------------------------------------------------------- parameter contract

def _mask(src: str):  # type: ignore[no-untyped-def]
    return check(parse(src, "t.mask"))


def test_declared_ranges_are_checked_by_the_oracle() -> None:
    from cmc.errors import ParamError

    free = _mask("mask m\nparam n : int[batch]\nallow k < len - n\n")
    assert dense(free, 4, {"n": 9}).sum() == 0  # no range: n > len means what it says
    bound = _mask("mask m\nparam n : int[batch] in [1, len]\nallow k < len - n\n")
    for bad in (0, 5):
        with pytest.raises(ParamError, match=r"declared range \[1, len\]"):
            dense(bound, 4, {"n": bad})
    assert dense(bound, 4, {"n": 3}).sum() == 4


@pytest.mark.parametrize("src, message", [
    ("param n : int in [0, len]", "its range cannot use len"),
    ("param n : int[batch] in [0, q]", "may use only len, integer literals"),
    ("param n : int[batch] in [5, 1]", "is empty for some len"),
    ("param n : int[batch] in [0, 2 * len]", "reaches outside int32"),
    ("param S : segments in [0, len]", "a segments parameter takes no range"),
    ("param S : segments\nparam S_offsets : int", "collides with the descriptor field"),
    ("param S_starts : int\nparam S : segments", "collides with the descriptor field"),
])
def test_bad_parameter_declarations_have_positions(src: str, message: str) -> None:
    from cmc.errors import MaskError

    with pytest.raises(MaskError) as info:
        _mask(f"mask m\n{src}\nallow k <= q\n")
    d = info.value.diagnostics[0]
    assert message in d.message and d.span is not None and d.span.line >= 2


@pytest.mark.parametrize("args, message", [
    (["--param", "docs=5,2"], "must be sorted"),
    (["--param", "docs=-1"], "must be >= 0"),
    (["--param", "docs=99"], "must be in [0, len]"),
    (["--param", "=5"], "the parameter name is empty"),
])
def test_show_param_uses_the_shared_validator(args: list[str], message: str) -> None:
    got = CliRunner().invoke(cli, ["show", str(SAMPLES / "document_causal.mask"), "--len", "16",
                                   *args])
    assert got.exit_code == 2 and message in got.output, got.output


def test_show_rejects_values_outside_the_declared_range() -> None:
    for value, message in (("99999999999", "must fit int32"), ("17", "declared range")):
        got = CliRunner().invoke(cli, ["show", str(SAMPLES / "hstu.mask"), "--len", "16",
                                       "--param", f"n_targets={value}"])
        assert got.exit_code == 2 and message in got.output, got.output


def test_define_errors_share_one_exit_code() -> None:
    codes = {CliRunner().invoke(cli, ["check", str(SAMPLES / "clear.mask"), "-D", d]).exit_code
             for d in ("W=abc", "W=99999999999", "=5")}
    assert codes == {2}
