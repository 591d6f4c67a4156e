"""parse: .mask text -> ast.Module (positions kept, names unresolved).

The grammar lives in grammar/mask.lark (shipped as package data of cmc.grammar). Parsing is
LALR through Lark's interactive parser, so that on a syntax error we know the token before
the failure, the open brackets and the statement being parsed, and can say what was expected
in words ("expected an integer expression after '<='") rather than as a set of token names.
The Lark tree becomes the AST without recursion and with a depth cap, so no input string can
raise anything but a CmcError.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken
from lark.lark import PostLex

from . import ast
from .errors import Diagnostic, MaskError, Span

MAX_DEPTH = 100  # expression nesting (brackets, operators, unary chains) per statement
MAX_BRACKETS = 64  # open ( and [ at once
# Limits on the input, checked before parsing so that any input is answered in about a second
# (the parser costs tens of microseconds per token; the largest sample has under 300 tokens).
MAX_FILE_BYTES = 1 << 20  # 1 MiB of UTF-8
MAX_LINE_CHARS = 4096
MAX_STATEMENTS = 1000
MAX_TOKENS = 20_000
BOM = "\ufeff"

KEYWORDS = frozenset(
    "mask doc const param let region allow deny int batch segments in and or not true false".split()
)
_STATEMENT_KWS = ("MASK", "DOC", "CONST", "PARAM", "LET", "REGION", "ALLOW", "DENY")
_NAMING_KWS = ("MASK", "CONST", "PARAM", "LET", "REGION")
_ARITH = {"PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "CMP_OP"}
_PRED_BEFORE = {"ALLOW", "DENY", "AND", "OR", "NOT"}
_OPERAND_START = {"INT", "NAME", "TRUE", "FALSE", "LPAR", "MINUS", "NOT"}
_OPEN = {"LPAR": ")", "LSQB": "]"}
_CLOSE = {"RPAR", "RSQB"}
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
# Characters that str.splitlines() treats as line breaks but the lexer does not: spans carry a
# copy of the source with these blanked so Span.source_line() finds the same line as Lark.
_EXTRA_BREAKS = re.compile("\r(?!\n)|[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


class _TooDeep(Exception):
    def __init__(self, token: Token):
        self.token = token


class _Brackets(PostLex):
    """Drops newlines inside ( ) and [ ] so long expressions may wrap; caps bracket depth."""

    always_accept = ()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        for tok in stream:
            if tok.type in _OPEN:
                depth += 1
                if depth > MAX_BRACKETS:
                    raise _TooDeep(tok)
            elif tok.type in _CLOSE:
                depth = max(0, depth - 1)
            elif tok.type == "_NL" and depth > 0:
                continue
            yield tok


def grammar_text() -> str:
    """The grammar, from the installed package data or, in a source tree, from grammar/."""
    try:
        return (importlib.resources.files("cmc.grammar") / "mask.lark").read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        return (Path(__file__).resolve().parent.parent / "grammar" / "mask.lark").read_text("utf-8")


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="basic",
        propagate_positions=True,
        maybe_placeholders=True,
        postlex=_Brackets(),
    )


# --------------------------------------------------------------------------- public entry


def parse(text: str, filename: str = "<string>") -> ast.Module:
    """Parse one .mask file. Raises MaskError (with position and caret) on a syntax error."""
    if not isinstance(text, str):
        raise MaskError(Diagnostic(f"expected mask text as str, got {type(text).__name__}", None))
    if text.startswith(BOM):  # a UTF-8 byte-order mark is not part of the mask
        text = text[1:]
    spans_source = _EXTRA_BREAKS.sub(" ", text)
    ctx = _Ctx(filename, spans_source)
    _check_limits(text, ctx)
    try:
        tree = _run_parser(text if text.endswith("\n") else text + "\n", ctx)
        stmts = _Builder(ctx).build(tree)
    except RecursionError:
        raise MaskError(Diagnostic("the file is nested too deeply to parse", None)) from None
    return ast.Module(tuple(stmts), text, filename)


# a string, a comment, a name or number, or one other character: what the lexer would
# make tokens of, cheaply (comments and blanks are skipped when counting)
_ROUGH_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"?|#[^\n]*|[A-Za-z_0-9]+|[^\sA-Za-z_0-9]')


def _check_limits(text: str, ctx: _Ctx) -> None:
    """File size, line length, statement and token counts, before any parsing: each error
    says the limit, and no echoed text is longer than the caret picture's window."""
    size = len(text) if len(text) > MAX_FILE_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_FILE_BYTES:
        raise ctx.error(f"the file is {size} bytes long; a mask file has at most "
                        f"{MAX_FILE_BYTES} bytes (1 MiB)", ctx.span(1, 1, 1, 2))
    line_no, depth, statements, tokens = 1, 0, 0, 0
    for i, line in enumerate(text.split("\n"), 1):
        if len(line.rstrip("\r")) > MAX_LINE_CHARS:
            raise ctx.error(f"line {i} is {len(line.rstrip(chr(13)))} characters long; lines "
                            f"have at most {MAX_LINE_CHARS} (wrap a long expression inside "
                            "brackets)", ctx.span(i, MAX_LINE_CHARS + 1, i, MAX_LINE_CHARS + 2))
    line_start = 0
    starts_statement = True  # the next token at bracket depth 0 on a new line starts one
    for m in _ROUGH_TOKEN.finditer(text):
        tok = m.group()
        if tok[0] == "#":
            continue
        nl = text.count("\n", line_start, m.start())
        if nl:
            line_no += nl
            line_start = text.rfind("\n", 0, m.start()) + 1
            starts_statement = depth == 0
        col = m.start() - line_start + 1
        tokens += 1
        if tokens > MAX_TOKENS:
            raise ctx.error(f"the file has more than {MAX_TOKENS} tokens (names, numbers, "
                            f"operators); a mask file has at most {MAX_TOKENS}",
                            ctx.span(line_no, col, line_no, col + len(tok)))
        if starts_statement:
            starts_statement = False
            statements += 1
            if statements > MAX_STATEMENTS:
                raise ctx.error(f"more than {MAX_STATEMENTS} statements; a mask file has at "
                                f"most {MAX_STATEMENTS}", ctx.span(line_no, col, line_no, col + 1))
        if tok in "([":
            depth += 1
        elif tok in ")]":
            depth = max(0, depth - 1)


class _Ctx:
    def __init__(self, filename: str, source: str):
        self.filename, self.source = filename, source

    def span(self, line: int, col: int, end_line: int, end_col: int) -> Span:
        return Span(self.filename, line, col, end_line, end_col, self.source)

    def tok(self, t: Token) -> Span:
        line, col = t.line or 1, t.column or 1
        end_line = t.end_line or line
        end_col = t.end_column or col + 1
        if t.type == "_NL":  # point at the end of the line, not across the newlines
            end_line, end_col = line, col + 1
        return self.span(line, col, end_line, end_col)

    def meta(self, tree: Tree) -> Span:
        m = tree.meta
        if getattr(m, "empty", True):
            return self.span(1, 1, 1, 2)
        return self.span(m.line, m.column, m.end_line, m.end_column)

    def error(self, message: str, span: Span) -> MaskError:
        return MaskError(Diagnostic(message, span))


# --------------------------------------------------------------------------- syntax errors


def _run_parser(text: str, ctx: _Ctx) -> Tree:
    """Feed tokens one by one, remembering enough context to explain a failure."""
    ip = _parser().parse_interactive(text)
    st = _State()
    try:
        for tok in ip.iter_parse():  # yields each token just before feeding it
            st.advance(tok)
        st.advance(None)
        return cast(Tree, ip.feed_eof(st.prev))
    except UnexpectedCharacters as e:
        raise _char_error(e, text, ctx) from None
    except UnexpectedToken as e:
        try:
            accepts = set(ip.accepts())
        except LarkError:
            accepts = set(e.expected)
        raise _token_error(cast(Token, e.token), accepts, st, ctx) from None
    except _TooDeep as e:
        raise ctx.error(
            f"brackets nested too deeply (more than {MAX_BRACKETS} open at once)", ctx.tok(e.token)
        ) from None
    except LarkError as e:  # anything else Lark can raise: still a positioned MaskError
        raise ctx.error(f"syntax error: {e}", ctx.span(1, 1, 1, 2)) from None


class _State:
    """What the parser has accepted so far: the last token, open brackets, statement start."""

    def __init__(self) -> None:
        self.prev: Token | None = None  # the last token fed successfully
        self.cur: Token | None = None  # the token being fed
        self.stack: list[tuple[Token, bool]] = []  # open ( and [, and whether ( opens a call
        self.stmt: Token | None = None  # first token of the statement being parsed

    def advance(self, tok: Token | None) -> None:
        c = self.cur
        if c is not None:  # `c` was accepted
            if c.type in _OPEN:
                call = c.type == "LPAR" and self.prev is not None and self.prev.type == "NAME"
                self.stack.append((c, call))
            elif c.type in _CLOSE and self.stack:
                self.stack.pop()
            if c.type == "_NL":
                self.stmt = None
            elif self.stmt is None:
                self.stmt = c
            self.prev = c
        self.cur = tok


def _char_error(e: UnexpectedCharacters, text: str, ctx: _Ctx) -> MaskError:
    pos = e.pos_in_stream or 0
    c = text[pos] if 0 <= pos < len(text) else ""
    line, col = e.line, e.column
    if c == '"':
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        return ctx.error("unterminated string", ctx.span(line, col, line, col + (end - pos)))
    span = ctx.span(line, col, line, col + 1)
    hints = {
        "&": "; write 'and'",
        "|": "; write 'or'",
        "!": "; write 'not' (or '!=' to compare)",
        "'": "; strings use double quotes",
        "{": "; use ( ) for grouping",
        ";": "; statements end at the end of the line",
    }
    if c.isprintable() and not c.isspace():
        what = f"'{c}'"
    else:
        what = f"U+{ord(c):04X}" if c else "end of input"
    return ctx.error(f"unexpected character {what}{hints.get(c, '')}", span)


def _describe(tok: Token | None) -> str:
    if tok is None:
        return "the start of the file"
    t, v = tok.type, str(tok)
    if t == "_NL":
        return "the end of the line"
    if t == "$END":
        return "the end of the file"
    if t == "NAME":
        return f"name '{_short(v)}'"
    if t == "INT":
        return f"integer {_short(v)}"
    if t == "STRING":
        return "a string"
    return f"'{v}'"


def _short(v: str, n: int = 24) -> str:
    return v if len(v) <= n else v[:n] + "..."


_DESCRIBE_EXPECTED = {
    "_NL": "the end of the line",
    "$END": "the end of the file",
    "NAME": "a name",
    "INT": "an integer",
    "STRING": "a string",
    "CMP_OP": "a comparison",
    "_KW_INT": "'int'",
}


def _expected_list(accepts: set[str]) -> str:
    names = []
    for t in sorted(accepts):
        if t in _DESCRIBE_EXPECTED:
            names.append(_DESCRIBE_EXPECTED[t])
        else:
            try:
                pat = _parser().get_terminal(t).pattern.value
            except (KeyError, AttributeError):
                continue
            names.append(f"'{pat}'")
    if not names:
        return "something else"
    return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]


def _token_error(tok: Token, exp: set[str], st: _State, ctx: _Ctx) -> MaskError:
    """Say in words what was expected where the parse failed."""
    prev, stack = st.prev, st.stack
    kind = st.stmt.type if st.stmt is not None else None
    if tok.type == "$END":
        if prev is not None:
            line, col = prev.end_line or 1, prev.end_column or 1
            span = ctx.span(line, col, line, col + 1)
        else:
            span = ctx.span(1, 1, 1, 2)
    else:
        span = ctx.tok(tok)
    found = _describe(tok)
    after = f"'{prev}'" if prev is not None and prev.type != "_NL" else None
    at_end = tok.type in ("_NL", "$END")

    def expected(what: str, say_after: bool = True) -> MaskError:
        msg = f"expected {what}" + (f" after {after}" if after and say_after else "")
        return ctx.error(msg if at_end else f"{msg}, found {found}", span)

    # An open bracket the statement never closed (newlines inside brackets are skipped, so
    # the failure shows up at the next line or at the end of the file).
    if (
        stack
        and kind != "PARAM"
        and (at_end or tok.type in _STATEMENT_KWS or (tok.line or 0) > (stack[-1][0].line or 0))
    ):
        b = stack[-1][0]
        close = "')' or ']'" if b.type == "LSQB" else "')'"
        return ctx.error(f"'{b}' is never closed (expected {close})", ctx.tok(b))
    if tok.type in _CLOSE and not stack:
        return ctx.error(f"unmatched '{tok}'", span)
    if tok.type == "EQUAL" and "EQUAL" not in exp:
        return ctx.error("unexpected '='; use '==' to compare", span)
    if tok.type == "STRING" and kind != "DOC":
        return ctx.error("unexpected string: a string may only follow 'doc'", span)
    if prev is None or prev.type == "_NL":  # at the start of a statement
        if tok.type == "NAME":
            return ctx.error(
                f"unknown statement '{_short(str(tok))}'; a statement starts with mask, doc, "
                "const, param, let, region, allow or deny",
                span,
            )
        return ctx.error(
            f"expected a statement (mask, doc, const, param, let, region, allow or deny), "
            f"found {found}",
            span,
        )
    if prev.type in _NAMING_KWS and "NAME" in exp:  # mask / const / param / let / region
        if str(tok) in KEYWORDS:
            return ctx.error(f"'{tok}' is a reserved word and cannot be used as a name", span)
        return expected("a name")
    if prev.type == "DOC":
        return expected('a string in double quotes (doc "text")', False)
    if kind == "CONST":
        if prev.type == "NAME":
            return expected("'=' and an integer literal (const NAME = INT)", False)
        if prev.type in ("EQUAL", "MINUS"):
            return expected(
                "an integer literal such as 16 or -1 (use 'let' for an expression)", False
            )
        if prev.type == "INT":
            return ctx.error(
                "a const takes a single integer literal; use 'let' for an expression", span
            )
    if kind == "PARAM":
        if prev.type == "NAME":
            return expected("':' and a type (param NAME : int | int[batch] | segments)", False)
        if prev.type == "COLON":
            return expected("a parameter type (int, int[batch] or segments)", False)
        if prev.type in ("LSQB", "BATCH") or (prev.type == "_KW_INT" and not at_end):
            return ctx.error("expected 'int[batch]' (the only array type is int[batch])", span)
    if kind in ("LET", "REGION") and prev.type == "NAME" and "EQUAL" in exp:
        return expected(f"'=' and the {'expression' if kind == 'LET' else 'predicate'}")
    if prev.type == "IN" and "LSQB" in exp:
        return expected("an interval '[lo, hi)' or '[lo, hi]'")
    if exp & {"INT", "NAME"}:  # an operand was expected
        if prev.type in _PRED_BEFORE or (prev.type == "EQUAL" and kind == "REGION"):
            return expected("a predicate")
        if prev.type in _ARITH or (prev.type == "EQUAL" and kind == "LET"):
            return expected("an integer expression")
        if prev.type in ("LPAR", "COMMA") and stack and stack[-1][1]:
            return expected("an argument")
        if prev.type in ("LSQB", "COMMA"):
            return expected("an integer expression")
        return expected("an expression")
    if stack and not at_end and "NAME" not in exp:
        top, call = stack[-1]
        if top.type == "LSQB" and "COMMA" in exp:
            return expected("',' between the bounds of the interval", False)
        if call and "COMMA" in exp:
            return expected("',' or ')' in the argument list", False)
        if "RPAR" in exp and "RSQB" not in exp:
            return expected("an operator or ')'", False)
    if "RSQB" in exp and "RPAR" in exp and "NAME" not in exp:
        return expected("')' or ']' to close the interval")
    if at_end:
        return ctx.error(
            "the statement ends too early"
            + (f" after {after}" if after else "")
            + f"; expected {_expected_list(exp)}",
            span,
        )
    if exp == {"_NL"}:
        return ctx.error(
            f"unexpected {found} after the end of the statement (one statement per line)", span
        )
    if "_NL" in exp:
        return ctx.error(
            f"unexpected {found}; expected an operator or the end of the statement "
            "(one statement per line)",
            span,
        )
    return ctx.error(f"unexpected {found}; expected {_expected_list(exp)}", span)


# --------------------------------------------------------------------------- tree -> AST

_KEEPS_DEPTH = {"sum", "product", "paren"}


class _Builder:
    """Lark tree -> AST, bottom-up with an explicit stack (no recursion), depth-capped."""

    def __init__(self, ctx: _Ctx):
        self.ctx = ctx

    def build(self, tree: Tree) -> list[ast.Statement]:
        out: list[ast.Statement] = []
        for st in tree.children:
            if isinstance(st, Tree):
                out.append(cast(ast.Statement, self._convert(st)[0]))
        return out

    def _convert(self, root: Tree) -> tuple[Any, int]:
        done: dict[int, tuple[Any, int]] = {}
        work: list[tuple[Tree, bool]] = [(root, False)]
        while work:
            node, ready = work.pop()
            if ready:
                kids = [done.pop(id(c)) if isinstance(c, Tree) else c for c in node.children]
                done[id(node)] = self._make(node, kids)
                continue
            work.append((node, True))
            work.extend((c, False) for c in node.children if isinstance(c, Tree))
        return done[id(root)]

    # Each child is a Token, None (an absent optional) or a (node, depth) pair.
    def _make(self, t: Tree, kids: list[Any]) -> tuple[Any, int]:
        span = self.ctx.meta(t)
        subs = [k for k in kids if isinstance(k, tuple)]
        depth = 1 + max((d for _, d in subs), default=0)
        if depth > MAX_DEPTH:
            raise self.ctx.error(
                f"expression nested too deeply (more than {MAX_DEPTH} levels)", span
            )
        node = getattr(self, "_" + str(t.data))(t, kids, span)
        if t.data in _KEEPS_DEPTH:  # these return (node, depth) themselves
            return cast(tuple[Any, int], node)
        return node, depth

    # statements
    def _mask_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.MaskStmt:
        return ast.MaskStmt(str(k[0]), self.ctx.tok(k[0]), span)

    def _doc_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.DocStmt:
        return ast.DocStmt(self._string(k[0]), span)

    def _const_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.ConstStmt:
        return ast.ConstStmt(str(k[0]), self.ctx.tok(k[0]), k[1][0], span)

    def _const_value(self, t: Tree, k: list[Any], span: Span) -> ast.IntLit:
        digits = cast(Token, k[-1])
        lit = _int_lit(digits, self.ctx.tok(digits))
        if len(k) == 2:  # with a minus sign
            return ast.IntLit(-lit.value, "-" + lit.text, span)
        return lit

    def _param_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.ParamStmt:
        kind, kind_span = k[1][0]
        rng = k[2][0] if len(k) > 2 and k[2] is not None else None
        return ast.ParamStmt(str(k[0]), self.ctx.tok(k[0]), kind, span, kind_span, rng)

    def _scalar_type(self, t: Tree, k: list[Any], span: Span) -> tuple[str, Span]:
        return ("scalar", span)

    def _batch_type(self, t: Tree, k: list[Any], span: Span) -> tuple[str, Span]:
        return ("batch", span)

    def _segments_type(self, t: Tree, k: list[Any], span: Span) -> tuple[str, Span]:
        return ("segments", span)

    def _let_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.LetStmt:
        return ast.LetStmt(str(k[0]), self.ctx.tok(k[0]), k[1][0], span)

    def _region_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.RegionStmt:
        return ast.RegionStmt(str(k[0]), self.ctx.tok(k[0]), k[1][0], span)

    def _allow_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.AllowStmt:
        return ast.AllowStmt(k[0][0], span)

    def _deny_stmt(self, t: Tree, k: list[Any], span: Span) -> ast.DenyStmt:
        return ast.DenyStmt(k[0][0], span)

    # predicates
    def _or_expr(self, t: Tree, k: list[Any], span: Span) -> ast.Or:
        return ast.Or(tuple(x[0] for x in k), span)

    def _and_expr(self, t: Tree, k: list[Any], span: Span) -> ast.And:
        return ast.And(tuple(x[0] for x in k), span)

    def _not_op(self, t: Tree, k: list[Any], span: Span) -> ast.Not:
        return ast.Not(k[1][0], span)

    def _chain(self, t: Tree, k: list[Any], span: Span) -> ast.Compare:
        operands = tuple(x[0] for x in k[0::2])
        ops = tuple(cast(ast.CmpOp, str(x)) for x in k[1::2])
        return ast.Compare(ops, operands, span, tuple(self.ctx.tok(x) for x in k[1::2]))

    def _in_range(self, t: Tree, k: list[Any], span: Span) -> ast.InRange:
        lo, hi, closed = k[1][0]
        return ast.InRange(k[0][0], lo, hi, closed, span)

    def _interval(self, t: Tree, k: list[Any], span: Span) -> tuple[ast.Expr, ast.Expr, bool]:
        return (k[1][0], k[2][0], k[3][0])

    def _half_open(self, t: Tree, k: list[Any], span: Span) -> bool:
        return False

    def _closed(self, t: Tree, k: list[Any], span: Span) -> bool:
        return True

    # integer expressions
    def _sum(self, t: Tree, k: list[Any], span: Span) -> tuple[ast.Expr, int]:
        return self._left_assoc(k)

    _product = _sum

    def _left_assoc(self, k: list[Any]) -> tuple[ast.Expr, int]:
        """a op b op c ... as ((a op b) op c): one level of depth per operator."""
        acc, depth = k[0]
        for op, (rhs, rd) in zip(k[1::2], k[2::2], strict=True):
            depth = 1 + max(depth, rd)
            op_span = self.ctx.tok(op)
            s = _join(_span_of(acc), _span_of(rhs))
            if depth > MAX_DEPTH:
                raise self.ctx.error(
                    f"expression nested too deeply (more than {MAX_DEPTH} levels)", s
                )
            acc = ast.BinOp(cast(ast.ArithOp, str(op)), acc, rhs, s, op_span)
        return acc, depth

    def _neg(self, t: Tree, k: list[Any], span: Span) -> ast.Neg:
        return ast.Neg(k[1][0], span)

    def _int_lit(self, t: Tree, k: list[Any], span: Span) -> ast.IntLit:
        return _int_lit(k[0], span)

    def _name(self, t: Tree, k: list[Any], span: Span) -> ast.Name:
        return ast.Name(str(k[0]), span)

    def _bool_lit(self, t: Tree, k: list[Any], span: Span) -> ast.BoolLit:
        return ast.BoolLit(str(k[0]) == "true", span)

    def _call(self, t: Tree, k: list[Any], span: Span) -> ast.Call:
        args = k[2][0] if k[2] is not None else ()
        return ast.Call(str(k[0]), args, span, self.ctx.tok(k[0]))

    def _args(self, t: Tree, k: list[Any], span: Span) -> tuple[ast.Expr, ...]:
        return tuple(x[0] for x in k)

    def _paren(self, t: Tree, k: list[Any], span: Span) -> tuple[ast.Expr, int]:
        return k[1]  # the inner expression, its own span and depth

    def _string(self, tok: Token) -> str:
        body = str(tok)[1:-1]
        out: list[str] = []
        i = 0
        while i < len(body):
            c = body[i]
            if c == "\\":
                nxt = body[i + 1] if i + 1 < len(body) else ""
                if nxt not in _ESCAPES:
                    col = (tok.column or 1) + 1 + i
                    raise self.ctx.error(
                        f"unknown escape '\\{nxt}' in string (use \\\", \\\\, \\n or \\t)",
                        self.ctx.span(tok.line or 1, col, tok.line or 1, col + 2),
                    )
                out.append(_ESCAPES[nxt])
                i += 2
            else:
                out.append(c)
                i += 1
        return "".join(out)


def _int_lit(tok: Token, span: Span) -> ast.IntLit:
    text = str(tok)
    digits = text.lstrip("0") or "0"
    # Python refuses int() of more than ~4300 digits; anything past 40 is out of range anyway.
    value = int(digits) if len(digits) <= 40 else 10**40
    return ast.IntLit(value, text, span)


def _span_of(e: ast.Expr) -> Span:
    return e.span


def _join(a: Span, b: Span) -> Span:
    return Span(a.file, a.line, a.col, b.end_line, b.end_col, a.source)
