"""The positioned syntax tree that parse produces and check consumes.

Every node carries the errors.Span of the text it came from, so the checker can point at the
offending token or expression. Names are not resolved here and the tree is untyped: integer
expressions and predicates share one node family, because "an integer where a predicate is
expected" is a check error with a position, not a syntax error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import Span

ParamKind = Literal["scalar", "batch", "segments"]
ArithOp = Literal["+", "-", "*", "/", "%"]
CmpOp = Literal["<", "<=", ">", ">=", "==", "!="]

# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class IntLit:
    """A decimal literal. `text` is kept because a huge literal is reported as written."""

    value: int
    text: str
    span: Span = field(repr=False)


@dataclass(frozen=True)
class BoolLit:
    value: bool
    span: Span = field(repr=False)


@dataclass(frozen=True)
class Name:
    """Any identifier in an expression: q, k, len, a const, param, let or region name."""

    name: str
    span: Span = field(repr=False)


@dataclass(frozen=True)
class BinOp:
    op: ArithOp
    a: Expr
    b: Expr
    span: Span = field(repr=False)
    op_span: Span = field(repr=False)


@dataclass(frozen=True)
class Neg:
    a: Expr
    span: Span = field(repr=False)


@dataclass(frozen=True)
class Call:
    """fn(args...): min, max, abs, seg, seg_start, seg_end, same (or an unknown name)."""

    fn: str
    args: tuple[Expr, ...]
    span: Span = field(repr=False)
    fn_span: Span = field(repr=False)


@dataclass(frozen=True)
class Compare:
    """A comparison chain: operands[0] ops[0] operands[1] ops[1] operands[2] ..."""

    ops: tuple[CmpOp, ...]
    operands: tuple[Expr, ...]
    span: Span = field(repr=False)
    op_spans: tuple[Span, ...] = field(repr=False)


@dataclass(frozen=True)
class InRange:
    """x in [lo, hi) (half-open) or x in [lo, hi] (closed)."""

    x: Expr
    lo: Expr
    hi: Expr
    closed: bool
    span: Span = field(repr=False)


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]
    span: Span = field(repr=False)


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]
    span: Span = field(repr=False)


@dataclass(frozen=True)
class Not:
    a: Expr
    span: Span = field(repr=False)


Expr = IntLit | BoolLit | Name | BinOp | Neg | Call | Compare | InRange | And | Or | Not

# --------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class MaskStmt:
    name: str
    name_span: Span = field(repr=False)
    span: Span = field(repr=False)


@dataclass(frozen=True)
class DocStmt:
    text: str  # escapes already decoded
    span: Span = field(repr=False)


@dataclass(frozen=True)
class ConstStmt:
    name: str
    name_span: Span = field(repr=False)
    value: IntLit  # a negative literal carries its minus sign in value and span
    span: Span = field(repr=False)


@dataclass(frozen=True)
class ParamStmt:
    name: str
    name_span: Span = field(repr=False)
    kind: ParamKind
    span: Span = field(repr=False)
    kind_span: Span = field(repr=False)
    range: tuple[Expr, Expr, bool] | None = None  # `in [lo, hi)` / `in [lo, hi]` (closed)


@dataclass(frozen=True)
class LetStmt:
    name: str
    name_span: Span = field(repr=False)
    expr: Expr
    span: Span = field(repr=False)


@dataclass(frozen=True)
class RegionStmt:
    name: str
    name_span: Span = field(repr=False)
    pred: Expr
    span: Span = field(repr=False)


@dataclass(frozen=True)
class AllowStmt:
    pred: Expr
    span: Span = field(repr=False)


@dataclass(frozen=True)
class DenyStmt:
    pred: Expr
    span: Span = field(repr=False)


Statement = MaskStmt | DocStmt | ConstStmt | ParamStmt | LetStmt | RegionStmt | AllowStmt | DenyStmt
Definition = ConstStmt | ParamStmt | LetStmt | RegionStmt


@dataclass(frozen=True)
class Module:
    """One parsed .mask file, statements in source order."""

    statements: tuple[Statement, ...]
    source: str = field(repr=False)
    filename: str


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of e, for generic walks."""
    if isinstance(e, BinOp):
        return (e.a, e.b)
    if isinstance(e, (Neg, Not)):
        return (e.a,)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Compare):
        return e.operands
    if isinstance(e, InRange):
        return (e.x, e.lo, e.hi)
    if isinstance(e, (And, Or)):
        return e.items
    return ()
