"""Issue 23, front-end classes: user arithmetic that could leave int64, the declared ranges
typing the emitted arithmetic, limits on huge inputs, undecodable bytes and the BOM."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmc.check import check
from cmc.cli import cli
from cmc.driver import front, read_source
from cmc.emit import build_hooks
from cmc.errors import MaskError
from cmc.lower import lower
from cmc.parse import MAX_FILE_BYTES, MAX_STATEMENTS, parse


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


# --------------------------------------------------------------------------- huge inputs


def test_ten_megabyte_one_line_file_is_rejected_fast(tmp_path: Path) -> None:
    path = tmp_path / "huge.mask"
    path.write_text("mask m\nallow k < " + "q" * 10_000_000 + "\n")
    t = time.perf_counter()
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert time.perf_counter() - t < 1.0
    assert result.exit_code == 1 and len(result.output) < 500
    assert f"larger than {MAX_FILE_BYTES} bytes (1 MiB)" in result.output


def test_limits_hold_for_text_given_directly() -> None:
    big = "mask m\nallow k < q\n" + "# filler\n" * (MAX_FILE_BYTES // 9)
    t = time.perf_counter()
    with pytest.raises(MaskError, match="bytes long; a mask file has at most"):
        parse(big, "t.mask")
    (msg,) = _errors("mask m\nallow k < " + "q" * 1_000_000 + "\n")
    assert len(msg) < 600 and "characters long" in msg
    assert time.perf_counter() - t < 1.0
    ok = "mask m\n" + "allow k <= q\n" * (MAX_STATEMENTS - 1)
    check(parse(ok, "t.mask"))  # exactly at the limit
    with pytest.raises(MaskError, match=f"more than {MAX_STATEMENTS} statements"):
        parse(ok + "allow k <= q\n", "t.mask")
    wrapped = "mask m\n" + "allow (k <=\n  q)\n" * (MAX_STATEMENTS - 1)
    check(parse(wrapped, "t.mask"))  # lines inside brackets continue a statement


def test_a_long_name_is_echoed_truncated() -> None:
    name = "n" * 1_000_000
    msgs = _errors(f"mask m\nconst {name} = 1\nconst {name} = 2\nallow k < {name}x\n"[:4000])
    assert all(len(m) < 1200 for m in msgs)
    msgs = _errors(f"mask m\nallow k < {name[:4000]}\n")
    assert all(len(m) < 600 and "(4000 characters)" in m for m in msgs)


# --------------------------------------------------------------------------- encodings


def test_undecodable_bytes_have_a_position_and_a_caret(tmp_path: Path) -> None:
    path = tmp_path / "bad.mask"
    path.write_bytes(b"mask m\nallow k <= q  # \xc3\xa9t\xe9\n")
    with pytest.raises(MaskError) as e:
        read_source(path)
    head, line, caret = e.value.format().split("\n")
    assert head == f"{path}:2:19: error: not UTF-8 text: byte 0xe9 (invalid continuation " \
                   "byte); a mask file is UTF-8"
    assert caret.index("^") == line.index("\ufffd")


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.mask"
    path.write_bytes(b"\xef\xbb\xbfmask m\nallow k <= q\n")
    assert front(path).mask.name == "m"
    assert check(parse("\ufeffmask m\nallow k <= q\n", "t.mask")).name == "m"
    path.write_bytes(b"\xef\xbb\xbfmask m\n\xffallow k <= q\n")
    with pytest.raises(MaskError, match=r":2:1: error: not UTF-8"):
        read_source(path)


def test_size_messages_name_inlining_only_when_it_happened() -> None:
    lets = "".join(f"let a{i} = a{i - 1} + 1\n" for i in range(1, 140))
    (msg,) = _errors(f"mask m\nlet a0 = q\n{lets}allow k < 1\n")
    assert "after inlining the let and region names it uses" in msg
    flat = "mask m\nallow k < " + " + ".join(["q"] * 2000) + "\n"
    for m in _errors(flat):
        assert "inlining" not in m
