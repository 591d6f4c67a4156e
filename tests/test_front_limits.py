"""Issue 23, front-end classes: user arithmetic that could leave int64, the declared ranges
typing the emitted arithmetic, limits on huge inputs, undecodable bytes and the BOM."""

from __future__ import annotations

import pytest

from cmc.check import check
from cmc.emit import build_hooks
from cmc.errors import MaskError
from cmc.lower import lower
from cmc.parse import parse


def _errors(src: str) -> list[str]:
    with pytest.raises(MaskError) as e:
        check(parse(src, "t.mask"))
    return [d.format() for d in e.value.diagnostics]


# --------------------------------------------------------------------------- int64 overflow


@pytest.mark.parametrize("expr, col, width", [
    ("q*q*q*q*q", 7, 5),  # the first product that can leave int64 is q*q*q
    ("k - q*q*q", 11, 5),
    ("abs(q * len) * len", 7, 18),
    ("max(q, 1) * q * len", 7, 19),
])
def test_user_arithmetic_that_can_leave_int64_is_an_error(expr: str, col: int, width: int) -> None:
    (msg,) = _errors(f"mask m\nallow {expr} < k\n")
    head, _, caret = msg.split("\n")
    assert head.startswith(f"t.mask:2:{col}: error: this expression can reach [")
    assert "beyond int64" in head
    assert caret == "  " + " " * (col - 1) + "^" * width


def test_the_reported_range_is_the_expressions_range() -> None:
    (msg,) = _errors("mask m\nallow q * q * q < k\n")
    m = 2**31 - 2
    assert f"[0, {m * m * m}]" in msg


def test_declared_parameter_ranges_decide_what_fits() -> None:
    # q * q fits int64 (< 2^62); times a parameter of any int32 it does not
    check(parse("mask m\nallow q * q < k\n", "t.mask"))
    assert _errors("mask m\nparam n : int\nallow q * q * n < k\n")
    check(parse("mask m\nparam n : int in [-2, 1]\nallow q * q * n < k\n", "t.mask"))
    assert _errors("mask m\nparam n : int[batch] in [0, len]\nallow q * q * n < k\n")
    # a let is ranged where it is defined, once
    (msg,) = _errors("mask m\nlet a = q * q\nlet b = a * len\nallow b < k\n")
    assert msg.startswith("t.mask:3:9:")


def _hooks_text(src: str) -> str:
    h = build_hooks(lower(check(parse(src, "t.mask"))))
    return "\n".join((*h.seq_lines, *h.row_lines, h.visible, *h.term_blocks, *h.span_blocks))


def test_int64_expressions_are_emitted_in_int64() -> None:
    assert "(cmc_i64)" in _hooks_text("mask m\nallow k * k <= q * q\n")


def test_emit_types_parameters_by_their_declared_range() -> None:
    """len - n fits int32 when n is declared in [0, len]; without a range it needs int64."""
    body = "let hist = len - n\nallow k < hist and k <= q\n"
    declared = _hooks_text("mask m\nparam n : int[batch] in [0, len]\n" + body)
    undeclared = _hooks_text("mask m\nparam n : int[batch]\n" + body)
    assert "(s.len - s.p_n)" in declared and "(cmc_i64)(s.p_n)" not in declared
    assert "((cmc_i64)(s.len) - (cmc_i64)(s.p_n))" in undeclared
