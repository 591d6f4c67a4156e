"""check: resolution, inlining, folding and desugaring into ir, and every check error."""

from __future__ import annotations

import pytest

from cmc import ir
from cmc.check import MAX_IR_DEPTH, MAX_IR_SIZE, check
from cmc.contract import Affine, ParamRange
from cmc.errors import MaskError
from cmc.ir import And, BinOp, BoolConst, Call, Cmp, Const, Neg, Not, Or, ParamRef, Same, SegFn, Var
from cmc.parse import parse

from .conftest import SAMPLES

ZERO_TO_LEN = ParamRange(Affine(0, 0), Affine(1, 0))  # the samples' `in [0, len]`

q, k, length = Var("q"), Var("k"), Var("len")


def _mask(text: str, defines: dict[str, int] | None = None) -> ir.Mask:
    return check(parse(text, "t.mask"), defines)


def _allow(body: str, prelude: str = "") -> ir.Pred:
    m = _mask(f"mask m\n{prelude}allow {body}\n")
    assert len(m.allows) == 1
    return m.allows[0]


def _errors(text: str, defines: dict[str, int] | None = None) -> list[tuple[int, int, str]]:
    with pytest.raises(MaskError) as info:
        _mask(text, defines)
    return [
        (d.span.line, d.span.col, d.message) if d.span else (0, 0, d.message)
        for d in info.value.diagnostics
    ]


def _one(text: str, defines: dict[str, int] | None = None) -> tuple[int, int, str]:
    errs = _errors(text, defines)
    assert len(errs) == 1, errs
    return errs[0]


# --------------------------------------------------------------------------- valid masks


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_samples_check(path):
    m = check(parse(path.read_text(), str(path)))
    assert m.name == path.stem and m.allows
    assert m.source == path.read_text() and m.filename == str(path)
    assert m.doc  # every sample documents itself


def test_causal_ir():
    m = _mask("mask causal\nallow k <= q\n")
    assert m.allows == (Cmp("<=", k, q),) and m.denies == () and m.doc == ""
    assert m.predicate == Or((Cmp("<=", k, q),))


def test_hstu_ir_inlines_let_and_const():
    path = next(p for p in SAMPLES if p.stem == "hstu")
    m = check(parse(path.read_text(), str(path)))
    hist = BinOp("-", length, ParamRef("n_targets"))
    assert m.consts == (("CONTEXT", 0),)
    assert m.params == (ir.ParamDecl("n_targets", "batch", ZERO_TO_LEN),)
    assert m.allows == (
        And((Cmp("<", q, Const(0)), Cmp("<", k, hist))),
        And((Cmp("<=", k, q), Cmp("<", k, hist))),
        Cmp("==", k, q),
    )


def test_shared_prefix_ir():
    path = next(p for p in SAMPLES if p.stem == "shared_prefix")
    m = check(parse(path.read_text(), str(path)))
    assert m.params == (
        ir.ParamDecl("prompt_len", "batch", ZERO_TO_LEN),
        ir.ParamDecl("responses", "segments"),
    )
    assert m.allows[1] == And((Cmp("<=", k, q), Same("responses", q, k)))


def test_params_and_consts_in_declaration_order():
    m = _mask(
        "mask m\nparam z : segments\nconst B = 2\nparam a : int\nconst A = -1\n"
        "param m2 : int[batch]\nallow true\n"
    )
    assert [p.name for p in m.params] == ["z", "a", "m2"]
    assert [p.kind for p in m.params] == ["segments", "scalar", "batch"]
    assert m.consts == (("B", 2), ("A", -1))


def test_chains_and_in_desugar_to_and_of_cmp():
    assert _allow("0 <= k < q") == And((Cmp("<=", Const(0), k), Cmp("<", k, q)))
    assert _allow("k in [q - 2, q)") == And((Cmp("<=", BinOp("-", q, Const(2)), k), Cmp("<", k, q)))
    assert _allow("k in [0, q]") == And((Cmp("<=", Const(0), k), Cmp("<=", k, q)))
    assert _allow("k < q <= len != 3") == And(
        (Cmp("<", k, q), Cmp("<=", q, length), Cmp("!=", length, Const(3)))
    )


def test_logic_flattens_and_keeps_structure():
    assert _allow("k < 1 and (k < 2 and k < 3)") == And(
        (Cmp("<", k, Const(1)), Cmp("<", k, Const(2)), Cmp("<", k, Const(3)))
    )
    assert _allow("not (k < 1 or k < 2)") == Not(Or((Cmp("<", k, Const(1)), Cmp("<", k, Const(2)))))
    assert _allow("true") == BoolConst(True)


def test_regions_are_inlined():
    p = _allow("r and k >= 0", "region r = k <= q\n")
    assert p == And((Cmp("<=", k, q), Cmp(">=", k, Const(0))))


@pytest.mark.parametrize(
    "expr, value",
    [
        ("7 / 2", 3),
        ("-7 / 2", -4),
        ("7 / -2", -4),
        ("-7 % 2", 1),
        ("7 % -2", -1),
        ("-(7 / 2)", -3),
        ("2 * 3 + 4", 10),
        ("min(3, 1, 2)", 1),
        ("max(3, -1)", 3),
        ("abs(-5)", 5),
        ("-2147483648", -(2**31)),
        ("C * C - 1", 2**30 - 1),
    ],
)
def test_constant_folding_floor_semantics(expr, value):
    p = _allow(f"k < {expr}", "const C = 32768\n")
    assert p == Cmp("<", k, Const(value))


def test_folding_stops_at_runtime_values():
    assert _allow("k < q / (2 * 2)") == Cmp("<", k, BinOp("/", q, Const(4)))
    assert _allow("k < -q") == Cmp("<", k, Neg(q))
    assert _allow("k < min(q, 2 + 1)") == Cmp("<", k, Call("min", (q, Const(3))))
    assert _allow("1 < 2") == BoolConst(True)


def test_segment_functions():
    p = _allow("seg(s, k) == seg_start(s, q) + seg_end(s, 0)", "param s : segments\n")
    assert p == Cmp(
        "==",
        SegFn("seg", "s", k),
        BinOp("+", SegFn("seg_start", "s", q), SegFn("seg_end", "s", Const(0))),
    )


def test_defines_override_consts():
    text = "mask m\nconst W = 4\nconst R = 2\nallow k / W < R\n"
    m = _mask(text, {"W": 8})
    assert m.consts == (("W", 8), ("R", 2))
    assert m.allows == (Cmp("<", BinOp("/", k, Const(8)), Const(2)),)
    assert _mask(text).consts == (("W", 4), ("R", 2))


def test_names_may_look_like_keywords():
    p = _allow("k < masked + notable", "const masked = 1\nlet notable = q\n")
    assert p == Cmp("<", k, BinOp("+", Const(1), q))


def test_big_but_bounded_inlining():
    lets = "".join(f"let a{i} = a{i - 1} + 1\n" for i in range(1, 60))
    p = _allow("k < a59", "let a0 = q\n" + lets)
    depth = 0
    e: ir.Expr = p.b  # type: ignore[union-attr]
    while isinstance(e, BinOp):
        depth, e = depth + 1, e.a
    assert depth == 59 and e == q


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "text, line, col, message",
    [
        (
            "mask m\nallow k < n_targets\nparam n_targets : int\n",
            2,
            11,
            "'n_targets' is used before its definition on line 3 (names must be defined before use)",
        ),
        (
            "mask m\nallow k < n_target\nparam n_targets : int\n",
            2,
            11,
            "unknown name 'n_target'; did you mean 'n_targets'?",
        ),
        (
            "mask m\nparam n_targets : int\nallow k < n_target\n",
            3,
            11,
            "unknown name 'n_target'; did you mean 'n_targets'?",
        ),
        ("mask m\nconst WINDOW = 3\nallow k < window\n", 3, 11, "did you mean 'WINDOW'?"),
        ("mask m\nallow k < zzz\n", 2, 11, "unknown name 'zzz'"),
        (
            "mask m\nconst A = 1\nlet A = 2\nallow k < A\n",
            3,
            5,
            "'A' is already defined on line 2 (as a const)",
        ),
        (
            "mask m\nlet y = k < q\nallow true\n",
            2,
            9,
            "a let defines an integer expression; use 'region' for a predicate",
        ),
        ("mask m\nregion r = q + 1\nallow true\n", 2, 12, "a region is a predicate"),
        ("mask m\nallow q + 1\n", 2, 7, "'allow' takes a predicate (such as k <= q)"),
        ("mask m\ndeny q\nallow true\n", 2, 6, "'deny' takes a predicate"),
        (
            "mask m\nallow (k < q) + 1 < 2\n",
            2,
            8,
            "expected an integer expression, found a predicate",
        ),
        (
            "mask m\nregion r = k < q\nallow r < 3\n",
            3,
            7,
            "found a predicate ('r' is a region, line 2)",
        ),
        (
            "mask m\nlet h = q\nallow k < 1 and h\n",
            3,
            17,
            "found an integer expression ('h' is a let, line 2)",
        ),
        ("mask m\nallow not 3\n", 2, 11, "expected a predicate"),
        (
            "mask m\nparam docs : segments\nallow k < docs\n",
            3,
            11,
            "'docs' is a segments parameter, not an integer; use seg(docs, i)",
        ),
        ("mask m\nparam docs : segments\nallow docs\n", 3, 7, "use same(docs, q, k)"),
        (
            "mask m\nparam n : int[batch]\nallow same(n, q, k)\n",
            3,
            12,
            "the first argument of same must be a segments parameter; 'n' is an int[batch]",
        ),
        ("mask m\nparam n : int\nallow seg(n, q) < 1\n", 3, 11, "'n' is an int parameter"),
        ("mask m\nallow seg(q, q) < 1\n", 2, 11, "must be a segments parameter, not 'q'"),
        ("mask m\nallow seg(1 + 1, q) < 1\n", 2, 11, "must be the name of a segments parameter"),
        ("mask m\nallow seg(zz, q) < 1\n", 2, 11, "unknown name 'zz'"),
        ("mask m\nallow k / 0 < q\n", 2, 11, "division by zero: the divisor is the constant 0"),
        ("mask m\nconst W = 3\nallow k % (W - 3) < q\n", 3, 12, "modulo by zero"),
        ("mask m\nallow k < mn(q, 1)\n", 2, 11, "unknown function 'mn'; did you mean 'min'?"),
        ("mask m\nallow k < foo(q)\n", 2, 11, "unknown function 'foo' (functions: min, max"),
        ("mask m\nlet h = 1\nallow k < h(q)\n", 3, 11, "'h' is not a function"),
        ("mask m\nallow k < min(q)\n", 2, 11, "min takes at least 2 arguments, got 1"),
        ("mask m\nallow k < max()\n", 2, 11, "max takes at least 2 arguments, got 0"),
        ("mask m\nallow k < abs(q, k)\n", 2, 11, "abs takes 1 argument, got 2"),
        ("mask m\nparam s : segments\nallow seg(s) < 1\n", 3, 7, "seg takes 2 arguments"),
        ("mask m\nparam s : segments\nallow same(s, q)\n", 3, 7, "same takes 3 arguments"),
        ("mask m\nallow min < 3\n", 2, 7, "'min' is a function; call it as min(...)"),
        ("const A = 1\nmask m\nallow true\n", 2, 1, "'mask' must be the first statement"),
        ("allow true\n", 1, 1, "a mask file must start with 'mask NAME'"),
        ("# only a comment\n", 1, 1, "empty file"),
        (
            "mask m\nmask n\nallow true\n",
            2,
            1,
            "only one mask per file: 'mask' is already given on line 1",
        ),
        ('mask m\ndoc "a"\ndoc "b"\nallow true\n', 3, 1, "'doc' given twice (first on line 2)"),
        (
            "mask m\ndeny k < q\n",
            1,
            1,
            "the mask has no 'allow' statement: every row would see nothing",
        ),
        ("mask m\nlet len = 3\nallow true\n", 2, 5, "'len' is a reserved word"),
        ("mask m\nparam q : int\nallow true\n", 2, 7, "'q' is a reserved word"),
        ("mask m\nregion same = true\nallow true\n", 2, 8, "'same' is a reserved word"),
        ("mask seg\nallow true\n", 1, 6, "'seg' is a reserved word"),
        (
            "mask m\nlet " + "a" * 65 + " = 3\nallow true\n",
            2,
            5,
            "name is 65 characters long; names have at most 64",
        ),
        (
            "mask m\nallow k < 2147483648\n",
            2,
            11,
            "integer literal 2147483648 is outside the int32",
        ),
        ("mask m\nallow k < -2147483649\n", 2, 11, "integer literal -2147483649 is outside"),
        (
            "mask m\nconst A = 99999999999999999999999999\nallow true\n",
            2,
            11,
            "integer literal 999999999999999999999999... is outside",
        ),
        (
            "mask m\nconst C = 65536\nallow k < C * C\n",
            3,
            11,
            "this constant expression evaluates to 4294967296, outside the int32 range",
        ),
        ("mask m\nallow k < abs(-2147483648)\n", 2, 11, "evaluates to 2147483648"),
    ],
)
def test_check_error_messages(text, line, col, message):
    got_line, got_col, got = _one(text)
    assert message in got, got
    assert (got_line, got_col) == (line, col), got


def test_error_format_has_file_line_col_and_caret():
    with pytest.raises(MaskError) as info:
        _mask("mask m\nparam n_targets : int\nallow k < n_target\n")
    assert info.value.format().splitlines() == [
        "t.mask:3:11: error: unknown name 'n_target'; did you mean 'n_targets'?",
        "  allow k < n_target",
        "            ^^^^^^^^",
    ]


def test_all_errors_reported_in_source_order():
    text = (
        "mask m\n"
        "let a = zz + 1\n"  # unknown name
        "let b = a + k\n"  # a is poisoned: no cascade
        "const C = 1\n"
        "const C = 2\n"  # redefinition
        "allow b < q and C\n"  # int as predicate
        "allow k / 0 < q\n"  # division by zero
        'doc "x"\n'
        'doc "y"\n'  # doc twice
    )
    errs = _errors(text)
    assert [(line, col) for line, col, _ in errs] == [(2, 9), (5, 7), (6, 17), (7, 11), (9, 1)]
    assert "unknown name 'zz'" in errs[0][2]
    assert "already defined on line 4" in errs[1][2]


def test_poisoned_definitions_stay_silent():
    errs = _errors("mask m\nlet a = zz\nregion r = a < q\nallow r and a < 3\n")
    assert len(errs) == 1 and "zz" in errs[0][2]


@pytest.mark.parametrize(
    "defines, message",
    [
        (
            {"WINDOWS": 3},
            "-D WINDOWS=3: this mask has no const named 'WINDOWS'; did you mean 'WINDOW'?",
        ),
        ({"XYZ": 3}, "-D XYZ=3: this mask has no const named 'XYZ' (its consts: WINDOW)"),
        ({"n": 3}, "-D n=3: 'n' is an int parameter, not a const (-D sets only consts)"),
        ({"WINDOW": 2**31}, "-D WINDOW=2147483648: the value is outside the int32 range"),
    ],
)
def test_define_errors(defines, message):
    line, col, got = _one(
        "mask m\nparam n : int\nconst WINDOW = 4\nallow q - k < WINDOW\n", defines
    )
    assert (line, col) == (0, 0) and got.startswith(message), got


def test_define_can_make_a_divisor_zero():
    line, col, got = _one("mask m\nconst W = 4\nallow k / W < q\n", {"W": 0})
    assert (line, col) == (3, 11) and "division by zero" in got


def test_define_on_mask_without_consts():
    assert _one("mask m\nallow true\n", {"W": 1})[2].endswith("(it has no consts)")


def test_inlining_caps():
    lets = "".join(f"let a{i} = a{i - 1} + 1\n" for i in range(1, MAX_IR_DEPTH + 5))
    _, _, msg = _one(f"mask m\nlet a0 = q\n{lets}allow k < 1\n")
    assert msg.startswith(f"this expression is nested more than {MAX_IR_DEPTH} levels deep "
                          "after inlining the let and region names it uses")
    doubling = "".join(f"let d{i} = d{i - 1} + d{i - 1}\n" for i in range(1, 40))
    errs = _errors(f"mask m\nlet d0 = q\n{doubling}allow k < d39\n")
    assert any(f"more than {MAX_IR_SIZE} operators and operands after inlining" in m
               for _, _, m in errs)
