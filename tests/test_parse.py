"""parse: the samples, the shape and positions of the tree, and syntax-error messages."""

from __future__ import annotations

import pytest

from cmc import ast
from cmc.errors import CmcError, MaskError
from cmc.parse import MAX_BRACKETS, MAX_DEPTH, grammar_text, parse

from .conftest import SAMPLES


def _allow(text: str) -> ast.Expr:
    """The predicate of the one allow statement of `mask m\\nallow <text>`."""
    st = parse(f"mask m\nallow {text}\n").statements[1]
    assert isinstance(st, ast.AllowStmt)
    return st.pred


def _shape(e: ast.Expr) -> str:
    """A fully parenthesised rendering, to test precedence and associativity."""
    if isinstance(e, ast.IntLit):
        return str(e.value)
    if isinstance(e, ast.Name):
        return e.name
    if isinstance(e, ast.BoolLit):
        return "true" if e.value else "false"
    if isinstance(e, ast.BinOp):
        return f"({_shape(e.a)} {e.op} {_shape(e.b)})"
    if isinstance(e, ast.Neg):
        return f"(-{_shape(e.a)})"
    if isinstance(e, ast.Not):
        return f"(not {_shape(e.a)})"
    if isinstance(e, ast.And):
        return "(" + " and ".join(_shape(x) for x in e.items) + ")"
    if isinstance(e, ast.Or):
        return "(" + " or ".join(_shape(x) for x in e.items) + ")"
    if isinstance(e, ast.Compare):
        parts = [_shape(e.operands[0])]
        for op, x in zip(e.ops, e.operands[1:], strict=True):
            parts += [op, _shape(x)]
        return "(" + " ".join(parts) + ")"
    if isinstance(e, ast.InRange):
        close = "]" if e.closed else ")"
        return f"({_shape(e.x)} in [{_shape(e.lo)}, {_shape(e.hi)}{close})"
    if isinstance(e, ast.Call):
        return f"{e.fn}(" + ", ".join(_shape(a) for a in e.args) + ")"
    raise AssertionError(e)


def _err(text: str) -> MaskError:
    with pytest.raises(MaskError) as info:
        parse(text, "t.mask")
    assert len(info.value.diagnostics) == 1
    return info.value


# --------------------------------------------------------------------------- valid input


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_samples_parse(path):
    m = parse(path.read_text(), str(path))
    assert isinstance(m.statements[0], ast.MaskStmt)
    assert m.statements[0].name == path.stem
    assert m.source == path.read_text() and m.filename == str(path)
    assert any(isinstance(s, ast.AllowStmt) for s in m.statements)


def test_grammar_is_package_data():
    text = grammar_text()
    assert "mask_stmt" in text and "%ignore COMMENT" in text


def test_statement_kinds_and_values():
    m = parse(
        'mask m\ndoc "a \\"b\\" \\\\ c\\td"\nconst A = -5\nconst B = 7\nparam s : int\n'
        "param b : int[batch]\nparam g : segments\nlet x = q + 1\nregion r = k < x\n"
        "allow r\ndeny k == 0\n"
    )
    kinds = [type(s).__name__ for s in m.statements]
    assert kinds == [
        "MaskStmt", "DocStmt", "ConstStmt", "ConstStmt", "ParamStmt", "ParamStmt",
        "ParamStmt", "LetStmt", "RegionStmt", "AllowStmt", "DenyStmt",
    ]  # fmt: skip
    doc, a, b = m.statements[1], m.statements[2], m.statements[3]
    assert isinstance(doc, ast.DocStmt) and doc.text == 'a "b" \\ c\td'
    assert isinstance(a, ast.ConstStmt) and a.value.value == -5 and a.value.text == "-5"
    assert isinstance(b, ast.ConstStmt) and b.value.value == 7
    assert [s.kind for s in m.statements[4:7] if isinstance(s, ast.ParamStmt)] == [
        "scalar", "batch", "segments",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text, shape",
    [
        ("a + b * c < d", "((a + (b * c)) < d)"),
        ("a - b - c < d", "(((a - b) - c) < d)"),
        ("a / b % c < d", "(((a / b) % c) < d)"),
        ("-a / 2 < b", "(((-a) / 2) < b)"),
        ("- - a < b", "((-(-a)) < b)"),
        ("a < b or c < d and e < f", "((a < b) or ((c < d) and (e < f)))"),
        ("not a < b and c < d", "((not (a < b)) and (c < d))"),
        ("not not x", "(not (not x))"),
        ("(a < b or c < d) and e", "(((a < b) or (c < d)) and e)"),
        ("a <= k < b", "(a <= k < b)"),
        ("a < b <= c == d != e", "(a < b <= c == d != e)"),
        ("k in [q - 2, q)", "(k in [(q - 2), q))"),
        ("k in [0, len]", "(k in [0, len])"),
        ("min(q, k, 3) > max(1, 2)", "(min(q, k, 3) > max(1, 2))"),
        ("same(s, q, k) and true or false", "((same(s, q, k) and true) or false)"),
        ("f()", "f()"),
        ("(((k)))", "k"),
    ],
)
def test_precedence(text, shape):
    assert _shape(_allow(text)) == shape


def test_layout_comments_crlf_and_missing_final_newline():
    text = "# a header\r\n\r\n   mask m   # trailing\r\n\n\n\tallow k <= q # c\r\n# end"
    m = parse(text)
    assert [type(s).__name__ for s in m.statements] == ["MaskStmt", "AllowStmt"]
    last = parse("mask m\nallow k <= q").statements[1]
    assert isinstance(last, ast.AllowStmt) and _shape(last.pred) == "(k <= q)"
    assert (last.span.line, last.span.col, last.span.end_col) == (2, 1, 13)


def test_newlines_inside_brackets_continue_the_statement():
    m = parse("mask m\nallow (k <= q and\n    k >= 0)\nallow k in [0,\n 3)\n")
    assert len(m.statements) == 3
    e = m.statements[1]
    assert isinstance(e, ast.AllowStmt) and isinstance(e.pred, ast.And)
    assert (e.span.line, e.span.end_line) == (2, 3)


def test_spans():
    m = parse("mask m\nlet hist = len - n_targets\nallow k <= q and k < hist\n", "f.mask")
    let = m.statements[1]
    assert isinstance(let, ast.LetStmt)
    assert (let.name_span.line, let.name_span.col, let.name_span.end_col) == (2, 5, 9)
    assert isinstance(let.expr, ast.BinOp)
    assert (let.expr.span.col, let.expr.span.end_col) == (12, 27)
    assert (let.expr.op_span.col, let.expr.op_span.end_col) == (16, 17)
    assert let.span.file == "f.mask" and let.span.source_line() == "let hist = len - n_targets"
    allow = m.statements[2]
    assert isinstance(allow, ast.AllowStmt) and isinstance(allow.pred, ast.And)
    first, second = allow.pred.items
    assert isinstance(second, ast.Compare)
    assert (second.span.col, second.span.end_col) == (18, 26)
    assert (second.op_spans[0].col, second.op_spans[0].end_col) == (20, 21)
    assert (allow.pred.span.col, allow.pred.span.end_col) == (7, 26)


def test_huge_literal_is_kept_as_text():
    e = _allow("k < " + "9" * 4000)
    assert isinstance(e, ast.Compare)
    lit = e.operands[1]
    assert isinstance(lit, ast.IntLit) and lit.text == "9" * 4000 and lit.value > 2**31


def test_keyword_prefixes_are_names():
    e = _allow("masked < android + notable + inx + true_")
    assert _shape(e) == "(masked < (((android + notable) + inx) + true_))"


# --------------------------------------------------------------------------- syntax errors


@pytest.mark.parametrize(
    "text, line, col, message",
    [
        ("mask m\nallow k <=\n", 2, 11, "expected an integer expression after '<='"),
        ("mask m\nallow k <= q and\n", 2, 17, "expected a predicate after 'and'"),
        ("mask m\nallow\n", 2, 6, "expected a predicate after 'allow'"),
        ("mask m\nlet y =\n", 2, 8, "expected an integer expression after '='"),
        ("mask m\nregion r =\n", 2, 11, "expected a predicate after '='"),
        ("mask m\nallow k + * q\n", 2, 11, "expected an integer expression after '+', found '*'"),
        ('mask m\ndoc "abc\n', 2, 5, "unterminated string"),
        ("mask m\nallow k @ q\n", 2, 9, "unexpected character '@'"),
        ("mask m\nallow k && q\n", 2, 9, "unexpected character '&'; write 'and'"),
        ("mask m\nallow k\x00\n", 2, 8, "unexpected character U+0000"),
        ("mask m\nallow (k <= q\nallow k == q\n", 2, 7, "'(' is never closed (expected ')')"),
        ("mask m\nallow k in [0, 3\n", 2, 12, "'[' is never closed (expected ')' or ']')"),
        ("mask m\nallow k <= q)\n", 2, 13, "unmatched ')'"),
        ("mask m\nallow k = q\n", 2, 9, "unexpected '='; use '==' to compare"),
        ("mask m\nfoo k\n", 2, 1, "unknown statement 'foo'; a statement starts with mask"),
        ("mask m\nlet and = 3\n", 2, 5, "'and' is a reserved word and cannot be used as a name"),
        ("mask m\nconst X = 3 + 4\n", 2, 13, "a const takes a single integer literal"),
        ("mask m\nconst X = q\n", 2, 11, "expected an integer literal such as 16 or -1"),
        ("mask m\nconst X\n", 2, 8, "expected '=' and an integer literal"),
        ("mask m\nparam p : float\n", 2, 11, "expected a parameter type (int, int[batch] or"),
        ("mask m\nparam p : int[foo]\n", 2, 15, "expected 'int[batch]'"),
        ("mask m\nparam p\n", 2, 8, "expected ':' and a type"),
        ("mask m x\n", 1, 8, "unexpected name 'x' after the end of the statement"),
        ("mask m\nallow k < q q\n", 2, 13, "expected an operator or the end of the statement"),
        ("mask m\nallow k in (0, 3)\n", 2, 12, "expected an interval '[lo, hi)' or '[lo, hi]'"),
        ("mask m\nallow k in [0 3)\n", 2, 15, "expected ',' between the bounds of the interval"),
        ("mask m\nallow min(k q)\n", 2, 13, "expected ',' or ')' in the argument list"),
        ("mask m\nallow min(,)\n", 2, 11, "expected an argument after '(', found ','"),
        ("mask m\nallow (k q)\n", 2, 10, "expected an operator or ')'"),
        ("mask\n", 1, 5, "expected a name after 'mask'"),
        ("mask 3\n", 1, 6, "expected a name after 'mask', found integer 3"),
        ('mask m\n"x"\n', 2, 1, "a string may only follow 'doc'"),
        ('mask m\ndoc "a\\qb"\n', 2, 7, "unknown escape '\\q' in string"),
        ("mask m\nallow k < 'a'\n", 2, 11, "strings use double quotes"),
        ("mask m\ndoc abc\n", 2, 5, 'expected a string in double quotes (doc "text")'),
    ],
)
def test_syntax_error_messages(text, line, col, message):
    e = _err(text)
    d = e.diagnostics[0]
    assert d.span is not None
    assert message in d.message, d.message
    assert (d.span.file, d.span.line, d.span.col) == ("t.mask", line, col), d.format()
    out = e.format()
    assert out.startswith(f"t.mask:{line}:{col}: error: ")
    assert "^" in out.splitlines()[-1]


def test_caret_picture():
    e = _err("mask m\nallow k <= q q\n")
    assert e.format().splitlines() == [
        "t.mask:2:14: error: unexpected name 'q'; expected an operator or the end of the "
        "statement (one statement per line)",
        "  allow k <= q q",
        "               ^",
    ]


def test_depth_caps():
    e = _err("mask m\nallow " + "(" * (MAX_BRACKETS + 1) + "k < q" + ")" * (MAX_BRACKETS + 1))
    assert "brackets nested too deeply" in e.diagnostics[0].message
    e = _err("mask m\nallow " + "- " * (MAX_DEPTH + 5) + "k < q\n")
    assert "nested too deeply" in e.diagnostics[0].message
    e = _err("mask m\nallow k < " + " + ".join(["q"] * (MAX_DEPTH + 5)) + "\n")
    assert "nested too deeply" in e.diagnostics[0].message
    ok = parse("mask m\nallow " + "(" * MAX_BRACKETS + "k < q" + ")" * MAX_BRACKETS)
    assert len(ok.statements) == 2


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "\n\n",
        "\x00\x01\x02",
        "\ufeffmask m",
        "mask m\n\u2028allow k < q",
        "(((((",
        ")))",
        "mask m\nallow " + "not " * 5000 + "k < q",
        "mask m\nallow " + "(" * 10000,
        "mask m\nallow k < " + "1" * 100000,
        "\r\r\r",
        "mask m\r allow k < q",
    ],
)
def test_junk_raises_only_cmc_errors(junk):
    try:
        parse(junk)
    except CmcError as e:
        assert e.format()


def test_non_string_input():
    with pytest.raises(MaskError):
        parse(b"mask m\n")  # type: ignore[arg-type]
