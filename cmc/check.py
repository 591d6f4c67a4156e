"""check: ast.Module -> ir.Mask (names resolved, kinds checked, let/region/const inlined).

Every problem becomes a Diagnostic with the span of the offending token or expression; the
checker goes on after an error (a broken definition is "poisoned" so its uses stay silent) and
raises one MaskError with all of them, in source order. Names must be defined before use:
that keeps the file readable top to bottom and rules out cycles between let and region.
Pure-constant integer arithmetic is folded (floor semantics) so later stages see Const; the
folded value must fit int32, because the kernels compute in int32.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast

from . import ast, ir
from .contract import DEFAULT_RANGE, LEN_MAX, Affine, ParamRange
from .errors import Diagnostic, MaskError, Span, echo
from .parse import KEYWORDS
from .ranges import I64_MAX, I64_MIN, Range, RangeEnv, step, value_range

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_NAME = 64
MAX_IR_DEPTH = 128  # after inlining: later stages walk these trees recursively
MAX_IR_SIZE = 100_000  # nodes, counted as a tree (shared let bodies count once per use)

VARS = ("q", "k", "len")
INT_FUNCS = ("min", "max", "abs")
SEG_FUNCS = ("seg", "seg_start", "seg_end")
FUNCTIONS = (*INT_FUNCS, *SEG_FUNCS, "same")
RESERVED = KEYWORDS | set(VARS) | set(FUNCTIONS)

Kind = Literal["int", "pred", "segments", "error"]
DefKind = Literal["const", "scalar", "batch", "segments", "let", "region"]
_KIND_WORDS = {
    "const": "a const",
    "scalar": "an int parameter",
    "batch": "an int[batch] parameter",
    "segments": "a segments parameter",
    "let": "a let (an integer expression)",
    "region": "a region (a predicate)",
}


_SHORT_KIND = {**_KIND_WORDS, "let": "a let", "region": "a region"}


@dataclass(frozen=True)
class _V:
    """A checked expression: its kind, its IR (None for a segments name or an error)."""

    kind: Kind
    node: ir.Expr | ir.Pred | None = None
    depth: int = 1
    size: int = 1
    segments: str = ""  # the parameter name, when kind == "segments"
    rng: Range | None = None  # an int's value range (None: a leaf, ranged on demand)
    inlined: bool = False  # holds a let or region body (messages about size say so)


_ERR = _V("error")


@dataclass
class _Def:
    name: str
    kind: DefKind
    line: int
    value: _V  # the inlined body (let/region), Const (const) or ParamRef (int params)


def check(module: ast.Module, defines: Mapping[str, int] | None = None) -> ir.Mask:
    """Check a parsed mask; `defines` are `-D NAME=INT` overrides of its consts."""
    checker = _Checker(module, dict(defines or {}))
    try:
        return checker.run()
    except RecursionError:
        raise MaskError(Diagnostic("the mask is nested too deeply to check", None)) from None


class _Checker:
    def __init__(self, module: ast.Module, defines: dict[str, int]):
        self.m = module
        self.defines = defines
        self.diags: list[Diagnostic] = []
        self.defs: dict[str, _Def] = {}
        # the declared parameter ranges so far (names are defined before use): what a user's
        # expression is ranged over, so one that could leave int64 is an error here
        self.param_ranges: dict[str, Range] = {}
        self.range_env = RangeEnv(self.param_ranges)
        # every name a definition statement introduces -> line of its first definition, so a
        # use before the definition can say where the definition is
        self.later: dict[str, int] = {}
        for st in module.statements:
            if isinstance(st, (ast.ConstStmt, ast.ParamStmt, ast.LetStmt, ast.RegionStmt)):
                self.later.setdefault(st.name, st.name_span.line)

    def error(self, message: str, span: Span | None) -> None:
        self.diags.append(Diagnostic(message, span))

    # ------------------------------------------------------------------ statements

    def run(self) -> ir.Mask:
        m = self.m
        stmts = m.statements
        mask_stmt: ast.MaskStmt | None = None
        doc_stmt: ast.DocStmt | None = None
        consts: list[tuple[str, int]] = []
        params: list[ir.ParamDecl] = []
        allows: list[ir.Pred] = []
        denies: list[ir.Pred] = []

        masks = [s for s in stmts if isinstance(s, ast.MaskStmt)]
        if not stmts:
            self.error("empty file: a mask file starts with 'mask NAME'", self._file_start())
        elif not masks:
            self.error("a mask file must start with 'mask NAME'", stmts[0].span)
        elif not isinstance(stmts[0], ast.MaskStmt):
            first = stmts[0].span.line
            self.error(
                f"'mask' must be the first statement (line {first} comes before it)", masks[0].span
            )

        for st in stmts:
            if isinstance(st, ast.MaskStmt):
                if mask_stmt is None:
                    mask_stmt = st
                    self._check_name(st.name, st.name_span)
                else:
                    self.error(
                        f"only one mask per file: 'mask' is already given on line "
                        f"{mask_stmt.span.line}",
                        st.span,
                    )
            elif isinstance(st, ast.DocStmt):
                if doc_stmt is None:
                    doc_stmt = st
                else:
                    self.error(f"'doc' given twice (first on line {doc_stmt.span.line})", st.span)
            elif isinstance(st, ast.ConstStmt):
                v = self._literal(st.value.value, st.value.text, st.value.span)
                value = v.node.value if isinstance(v.node, ir.Const) else 0
                if st.name in self.defines and st.name not in self.defs:
                    value = self._define_value(st.name)
                if self._define(
                    st.name,
                    st.name_span,
                    "const",
                    _V("int", ir.Const(value)) if v.kind == "int" else _ERR,
                ):
                    consts.append((st.name, value))
            elif isinstance(st, ast.ParamStmt):
                if st.kind == "segments":
                    pv = _V("segments", segments=st.name)
                else:
                    pv = _V("int", ir.ParamRef(st.name))
                rng = self._param_range(st)
                self._check_descriptor_names(st, params)
                if self._define(st.name, st.name_span, st.kind, pv):
                    params.append(ir.ParamDecl(st.name, st.kind, rng))
                    self.param_ranges[st.name] = rng.extremes()
            elif isinstance(st, ast.LetStmt):
                body = self._int(
                    st.expr, "a let defines an integer expression; use 'region' for a predicate"
                )
                self._define(st.name, st.name_span, "let", body)
            elif isinstance(st, ast.RegionStmt):
                body = self._pred(
                    st.pred, "a region is a predicate; use 'let' for an integer expression"
                )
                self._define(st.name, st.name_span, "region", body)
            elif isinstance(st, (ast.AllowStmt, ast.DenyStmt)):
                word = "allow" if isinstance(st, ast.AllowStmt) else "deny"
                p = self._pred(
                    st.pred,
                    f"'{word}' takes a predicate (such as k <= q), found an integer expression",
                )
                if p.node is not None:
                    (allows if word == "allow" else denies).append(cast(ir.Pred, p.node))
            else:  # pragma: no cover - the parser makes no other statements
                raise TypeError(f"unknown statement {st!r}")

        if stmts and not any(isinstance(s, ast.AllowStmt) for s in stmts):
            where = mask_stmt.span if mask_stmt is not None else stmts[0].span
            self.error("the mask has no 'allow' statement: every row would see nothing", where)
        self._check_defines()

        if self.diags:
            order = sorted(
                range(len(self.diags)),
                key=lambda i: (
                    (0, 0, 0, i)
                    if self.diags[i].span is None
                    else (
                        1,
                        cast(Span, self.diags[i].span).line,
                        cast(Span, self.diags[i].span).col,
                        i,
                    )
                ),
            )
            raise MaskError([self.diags[i] for i in order])
        assert mask_stmt is not None
        return ir.Mask(
            name=mask_stmt.name,
            doc=doc_stmt.text if doc_stmt is not None else "",
            source=m.source,
            filename=m.filename,
            consts=tuple(consts),
            params=tuple(params),
            allows=tuple(allows),
            denies=tuple(denies),
        )

    def _file_start(self) -> Span:
        return Span(self.m.filename, 1, 1, 1, 2, self.m.source)

    def _check_name(self, name: str, span: Span) -> bool:
        if name in RESERVED:
            self.error(f"'{echo(name)}' is a reserved word and cannot be used as a name", span)
            return False
        if len(name) > MAX_NAME:
            self.error(f"name is {len(name)} characters long; names have at most {MAX_NAME}", span)
        return True

    def _define(self, name: str, span: Span, kind: DefKind, value: _V) -> bool:
        """Register a definition; False (and a diagnostic) if the name cannot be defined."""
        if not self._check_name(name, span):
            return False
        if name in self.defs:
            first = self.defs[name]
            self.error(
                f"'{echo(name)}' is already defined on line {first.line} (as {_KIND_WORDS[first.kind]})",
                span,
            )
            return False
        self.defs[name] = _Def(name, kind, span.line, value)
        return True

    def _define_value(self, name: str) -> int:
        raw = self.defines[name]
        if isinstance(raw, bool) or not isinstance(raw, int):
            self.error(f"-D {echo(name)}={raw!r}: the value must be an integer", None)
            return 0
        if not INT32_MIN <= raw <= INT32_MAX:
            self.error(
                f"-D {echo(name)}={raw}: the value is outside the int32 range "
                f"({INT32_MIN} to {INT32_MAX})",
                None,
            )
            return 0
        return raw

    def _check_defines(self) -> None:
        for name, raw in self.defines.items():
            d = self.defs.get(name)
            if d is not None and d.kind == "const":
                continue
            if d is not None:
                self.error(
                    f"-D {echo(name)}={raw}: '{echo(name)}' is {_KIND_WORDS[d.kind]}, not a const "
                    "(-D sets only consts)",
                    None,
                )
                continue
            consts = [n for n, dd in self.defs.items() if dd.kind == "const"]
            hint = _suggest(name, consts)
            if hint:
                hint = f"; {hint}"
            elif consts:
                hint = f" (its consts: {', '.join(consts)})"
            else:
                hint = " (it has no consts)"
            self.error(f"-D {echo(name)}={raw}: this mask has no const named '{echo(name)}'{hint}", None)

    # ------------------------------------------------------------------ expressions

    def _param_range(self, st: ast.ParamStmt) -> ParamRange:
        """The declared range of an int parameter: ends affine in len (len only per sequence),
        within int32; the default (docs/language.md) when none is given."""
        if st.kind == "segments":
            if st.range is not None:
                self.error("a segments parameter takes no range (its starts lie in [0, len])",
                           st.range[0].span)
            return DEFAULT_RANGE
        if st.range is None:
            return DEFAULT_RANGE
        lo_e, hi_e, closed = st.range
        ends: list[Affine] = []
        for e in (lo_e, hi_e):
            v = self._int(e, "a parameter range takes integer expressions")
            aff = _affine_in_len(v.node) if v.node is not None else None
            if v is _ERR:
                return DEFAULT_RANGE
            if aff is None:
                self.error("a parameter range may use only len, integer literals, consts and "
                           "+ - * by a constant", e.span)
                return DEFAULT_RANGE
            if st.kind == "scalar" and aff.len_coef:
                self.error("an int parameter is one value per launch; its range cannot use len "
                           "(declare it int[batch] for a per-sequence value)", e.span)
                return DEFAULT_RANGE
            ends.append(aff)
        lo, hi = ends
        if not closed:
            hi = Affine(hi.len_coef, hi.add - 1)
        rng = ParamRange(lo, hi)
        if lo.extremes()[0] < INT32_MIN or hi.extremes()[1] > INT32_MAX:
            self.error(f"the range {rng.text()} reaches outside int32 for some len in "
                       f"[0, 2147483647]; parameters are int32", lo_e.span)
            return DEFAULT_RANGE
        if lo.at(1) > hi.at(1) or lo.at(LEN_MAX) > hi.at(LEN_MAX):
            self.error(f"the range {rng.text()} is empty for some len >= 1; no value could be passed",
                       lo_e.span)
            return DEFAULT_RANGE
        return rng

    def _check_descriptor_names(self, st: ast.ParamStmt, params: Sequence[ir.ParamDecl]) -> None:
        """A segments parameter S takes the descriptor fields S_offsets and S_starts (and the
        kernels' p_S_offsets, sg_S, sn_S): a parameter named like one of them would collide."""
        for p in params:
            for seg, other in ((p, st), (st, p)):
                if seg.kind == "segments" and other.name in (f"{seg.name}_offsets",
                                                             f"{seg.name}_starts"):
                    self.error(f"parameter '{echo(other.name)}' collides with the descriptor field of "
                               f"segments parameter '{echo(seg.name)}' ({echo(seg.name)}_offsets, "
                               f"{echo(seg.name)}_starts); rename one", st.name_span)

    def _int(self, e: ast.Expr, wrong_kind: str = "") -> _V:
        v = self._expr(e)
        if v.kind == "pred":
            self.error(
                (wrong_kind or "expected an integer expression, found a predicate")
                + _what(e, self.defs),
                e.span,
            )
            return _ERR
        if v.kind == "segments":
            self.error(
                f"'{echo(v.segments)}' is a segments parameter, not an integer; use "
                f"seg({echo(v.segments)}, i), seg_start({echo(v.segments)}, i), "
                f"seg_end({echo(v.segments)}, i) or same({echo(v.segments)}, a, b)",
                e.span,
            )
            return _ERR
        return v

    def _pred(self, e: ast.Expr, wrong_kind: str = "") -> _V:
        v = self._expr(e)
        if v.kind == "int":
            self.error(
                (wrong_kind or "expected a predicate (such as k <= q), found an integer expression")
                + _what(e, self.defs),
                e.span,
            )
            return _ERR
        if v.kind == "segments":
            self.error(
                f"'{echo(v.segments)}' is a segments parameter, not a predicate; "
                f"use same({echo(v.segments)}, q, k)",
                e.span,
            )
            return _ERR
        return v

    def _expr(self, e: ast.Expr) -> _V:
        if isinstance(e, ast.IntLit):
            return self._literal(e.value, e.text, e.span)
        if isinstance(e, ast.BoolLit):
            return _V("pred", ir.BoolConst(e.value))
        if isinstance(e, ast.Name):
            return self._name(e)
        if isinstance(e, ast.Neg):
            if isinstance(e.a, ast.IntLit):  # -2147483648 is a literal, not -(2147483648)
                return self._literal(-e.a.value, "-" + e.a.text, e.span)
            a = self._int(e.a)
            if a.kind == "error":
                return _ERR
            if isinstance(a.node, ir.Const):
                return self._folded(-a.node.value, e.span)
            return self._compose("int", ir.Neg(cast(ir.Expr, a.node)), [a], e.span)
        if isinstance(e, ast.BinOp):
            return self._binop(e)
        if isinstance(e, ast.Call):
            return self._call(e)
        if isinstance(e, ast.Compare):
            return self._compare(e)
        if isinstance(e, ast.InRange):
            x, lo, hi = self._int(e.x), self._int(e.lo), self._int(e.hi)
            if "error" in (x.kind, lo.kind, hi.kind):
                return _ERR
            c1 = self._cmp("<=", lo, x, e.span)
            c2 = self._cmp("<=" if e.closed else "<", x, hi, e.span)
            return self._compose(
                "pred", ir.And((cast(ir.Pred, c1.node), cast(ir.Pred, c2.node))), [c1, c2], e.span
            )
        if isinstance(e, (ast.And, ast.Or)):
            vals = [self._pred(x) for x in e.items]
            if any(v.kind == "error" for v in vals):
                return _ERR
            cls = ir.And if isinstance(e, ast.And) else ir.Or
            items: list[ir.Pred] = []
            for v in vals:  # flatten (a and b) and c
                if isinstance(v.node, cls):
                    items.extend(v.node.items)
                else:
                    items.append(cast(ir.Pred, v.node))
            return self._compose("pred", cls(tuple(items)), vals, e.span)
        if isinstance(e, ast.Not):
            a = self._pred(e.a)
            if a.kind == "error":
                return _ERR
            return self._compose("pred", ir.Not(cast(ir.Pred, a.node)), [a], e.span)
        raise TypeError(f"not an expression: {e!r}")  # pragma: no cover

    def _literal(self, value: int, text: str, span: Span) -> _V:
        if not INT32_MIN <= value <= INT32_MAX:
            self.error(
                f"integer literal {_short(text)} is outside the int32 range "
                f"({INT32_MIN} to {INT32_MAX}); the kernels compute in int32",
                span,
            )
            return _ERR
        return _V("int", ir.Const(value))

    def _folded(self, value: int, span: Span) -> _V:
        if not INT32_MIN <= value <= INT32_MAX:
            self.error(
                f"this constant expression evaluates to {value}, outside the int32 "
                "range; the kernels compute in int32",
                span,
            )
            return _ERR
        return _V("int", ir.Const(value))

    def _compose(self, kind: Kind, node: ir.Expr | ir.Pred, parts: Sequence[_V], span: Span) -> _V:
        depth = 1 + max((p.depth for p in parts), default=0)
        size = 1 + sum(p.size for p in parts)
        inlined = any(p.inlined for p in parts)
        after = " after inlining the let and region names it uses" if inlined else ""
        if depth > MAX_IR_DEPTH:
            self.error(f"this expression is nested more than {MAX_IR_DEPTH} levels deep{after}",
                       span)
            return _ERR
        if size > MAX_IR_SIZE:
            self.error(f"this expression has more than {MAX_IR_SIZE} operators and operands"
                       f"{after}", span)
            return _ERR
        if kind != "int":
            return _V(kind, node, depth, size, inlined=inlined)
        rng = step(cast(ir.Expr, node), [self._range_of(p) for p in parts], self.range_env)
        if not (I64_MIN <= rng[0] and rng[1] <= I64_MAX):
            self.error(
                f"this expression can reach [{rng[0]}, {rng[1]}] (q, k < len <= {LEN_MAX}, "
                "parameters in their declared ranges), beyond int64: the kernels could not "
                "compute it exactly; declare tighter parameter ranges or restructure it",
                span,
            )
            return _ERR
        return _V(kind, node, depth, size, rng=rng, inlined=inlined)

    def _range_of(self, v: _V) -> Range:
        return v.rng if v.rng is not None else value_range(cast(ir.Expr, v.node), self.range_env)

    def _name(self, e: ast.Name) -> _V:
        n = e.name
        if n in VARS:
            return _V("int", ir.Var(n))
        if n in FUNCTIONS:
            self.error(f"'{echo(n)}' is a function; call it as {echo(n)}(...)", e.span)
            return _ERR
        d = self.defs.get(n)
        if d is not None:
            if d.kind in ("let", "region") and d.value.kind != "error":
                return replace(d.value, inlined=True)
            return d.value
        if n in self.later:
            self.error(
                f"'{echo(n)}' is used before its definition on line {self.later[n]} "
                "(names must be defined before use)",
                e.span,
            )
            return _ERR
        hint = _suggest(n, [*self.defs, *VARS, *self.later])
        self.error(f"unknown name '{echo(n)}'" + (f"; {hint}" if hint else ""), e.span)
        return _ERR

    def _binop(self, e: ast.BinOp) -> _V:
        a, b = self._int(e.a), self._int(e.b)
        if a.kind == "error" or b.kind == "error":
            return _ERR
        if e.op in ("/", "%") and isinstance(b.node, ir.Const) and b.node.value == 0:
            what = "division" if e.op == "/" else "modulo"
            self.error(f"{what} by zero: the divisor is the constant 0", e.b.span)
            return _ERR
        if isinstance(a.node, ir.Const) and isinstance(b.node, ir.Const):
            return self._folded(_fold(e.op, a.node.value, b.node.value), e.span)
        node = ir.BinOp(e.op, cast(ir.Expr, a.node), cast(ir.Expr, b.node))
        return self._compose("int", node, [a, b], e.span)

    def _cmp(self, op: ir.CmpOp, a: _V, b: _V, span: Span) -> _V:
        if isinstance(a.node, ir.Const) and isinstance(b.node, ir.Const):
            return _V("pred", ir.BoolConst(_compare(op, a.node.value, b.node.value)))
        return self._compose(
            "pred", ir.Cmp(op, cast(ir.Expr, a.node), cast(ir.Expr, b.node)), [a, b], span
        )

    def _compare(self, e: ast.Compare) -> _V:
        vals = [self._int(x) for x in e.operands]
        if any(v.kind == "error" for v in vals):
            return _ERR
        cmps = [self._cmp(op, vals[i], vals[i + 1], e.span) for i, op in enumerate(e.ops)]
        if any(c.kind == "error" for c in cmps):
            return _ERR
        if len(cmps) == 1:
            return cmps[0]
        return self._compose(
            "pred", ir.And(tuple(cast(ir.Pred, c.node) for c in cmps)), cmps, e.span
        )

    def _call(self, e: ast.Call) -> _V:
        fn, args = e.fn, e.args
        if fn not in FUNCTIONS:
            for arg in args:  # still report problems inside the arguments
                self._expr(arg)
            if fn in self.defs or fn in VARS:
                self.error(f"'{echo(fn)}' is not a function", e.fn_span)
            else:
                hint = _suggest(fn, list(FUNCTIONS))
                self.error(
                    f"unknown function '{echo(fn)}'"
                    + (f"; {hint}" if hint else f" (functions: {', '.join(FUNCTIONS)})"),
                    e.fn_span,
                )
            return _ERR
        if fn in ("min", "max"):
            if len(args) < 2:
                self._arity(e, f"{echo(fn)} takes at least 2 arguments")
                return _ERR
            vals = [self._int(arg) for arg in args]
            if any(v.kind == "error" for v in vals):
                return _ERR
            if all(isinstance(v.node, ir.Const) for v in vals):
                nums = [cast(ir.Const, v.node).value for v in vals]
                return _V("int", ir.Const(min(nums) if fn == "min" else max(nums)))
            call = ir.Call(
                cast(Literal["min", "max"], fn), tuple(cast(ir.Expr, v.node) for v in vals)
            )
            return self._compose("int", call, vals, e.span)
        if fn == "abs":
            if len(args) != 1:
                self._arity(e, "abs takes 1 argument")
                return _ERR
            x = self._int(args[0])
            if x.kind == "error":
                return _ERR
            if isinstance(x.node, ir.Const):
                return self._folded(abs(x.node.value), e.span)
            return self._compose("int", ir.Call("abs", (cast(ir.Expr, x.node),)), [x], e.span)
        want = 2 if fn in SEG_FUNCS else 3
        if len(args) != want:
            shape = f"{echo(fn)}(S, i)" if want == 2 else "same(S, a, b)"
            self._arity(e, f"{echo(fn)} takes {want} arguments ({shape}, S a segments parameter)")
            return _ERR
        segs = self._segments_arg(fn, args[0])
        rest = [self._int(arg) for arg in args[1:]]
        if segs is None or any(v.kind == "error" for v in rest):
            return _ERR
        if fn == "same":
            same = ir.Same(segs, cast(ir.Expr, rest[0].node), cast(ir.Expr, rest[1].node))
            return self._compose("pred", same, rest, e.span)
        segfn = ir.SegFn(cast(ir.SegFnName, fn), segs, cast(ir.Expr, rest[0].node))
        return self._compose("int", segfn, rest, e.span)

    def _arity(self, e: ast.Call, rule: str) -> None:
        for a in e.args:
            self._expr(a)
        n = len(e.args)
        self.error(f"{rule}, got {n}", e.span)

    def _segments_arg(self, fn: str, a: ast.Expr) -> str | None:
        if not isinstance(a, ast.Name):
            self._expr(a)
            self.error(
                f"the first argument of {echo(fn)} must be the name of a segments parameter", a.span
            )
            return None
        d = self.defs.get(a.name)
        if d is not None and d.kind == "segments":
            return a.name
        if d is not None:
            if d.value.kind == "error":
                return None
            self.error(
                f"the first argument of {echo(fn)} must be a segments parameter; "
                f"'{echo(a.name)}' is {_KIND_WORDS[d.kind]}",
                a.span,
            )
            return None
        if a.name in VARS:
            self.error(
                f"the first argument of {echo(fn)} must be a segments parameter, not '{echo(a.name)}'", a.span
            )
            return None
        self._name(a)  # unknown / used before definition
        return None


# --------------------------------------------------------------------------- helpers


def _fold(op: str, a: int, b: int) -> int:
    """Constant folding with the language's floor semantics (b != 0 for / and %)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // b
    return a % b


def _compare(op: str, a: int, b: int) -> bool:
    return {
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
        "==": a == b,
        "!=": a != b,
    }[op]


def _suggest(name: str, candidates: Sequence[str]) -> str:
    """'did you mean ...?' for a misspelt name, or ''."""
    for c in candidates:
        if c.lower() == name.lower():
            return f"did you mean '{echo(c)}'?"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"did you mean '{echo(close[0])}'?" if close else ""


def _affine_in_len(e: ir.Expr | ir.Pred) -> Affine | None:
    """e as len_coef * len + add when it is one (constants already folded), else None."""
    if isinstance(e, ir.Const):
        return Affine(0, e.value)
    if isinstance(e, ir.Var) and e.name == "len":
        return Affine(1, 0)
    if isinstance(e, ir.Neg):
        a = _affine_in_len(e.a)
        return None if a is None else Affine(-a.len_coef, -a.add)
    if isinstance(e, ir.BinOp) and e.op in "+-*":
        a, b = _affine_in_len(e.a), _affine_in_len(e.b)
        if a is None or b is None:
            return None
        if e.op == "+":
            return Affine(a.len_coef + b.len_coef, a.add + b.add)
        if e.op == "-":
            return Affine(a.len_coef - b.len_coef, a.add - b.add)
        if a.len_coef == 0:
            return Affine(a.add * b.len_coef, a.add * b.add)
        if b.len_coef == 0:
            return Affine(b.add * a.len_coef, b.add * a.add)
    return None


def _what(e: ast.Expr, defs: Mapping[str, _Def]) -> str:
    """' ('hist' is a let ...)' when the offending expression is a defined name."""
    if isinstance(e, ast.Name) and e.name in defs:
        d = defs[e.name]
        return f" ('{echo(e.name)}' is {_SHORT_KIND[d.kind]}, line {d.line})"
    return ""


def _short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else text[:n] + "..."
