"""Readable renderings of IR: expressions, predicates, interval tables, tile pictures."""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import (
    And,
    BinOp,
    BoolConst,
    Call,
    Cmp,
    Const,
    Expr,
    IntervalTable,
    Neg,
    Not,
    Or,
    ParamRef,
    Pred,
    Same,
    SegFn,
    TableRef,
    Term,
    Var,
)

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


def expr_str(e: Expr, parent: int = 0) -> str:
    if isinstance(e, Const):
        return str(e.value) if e.value >= 0 or parent == 0 else f"({e.value})"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, ParamRef):
        return e.name
    if isinstance(e, BinOp):
        p = _PREC[e.op]
        s = f"{expr_str(e.a, p)} {e.op} {expr_str(e.b, p + 1)}"
        return f"({s})" if p < parent else s
    if isinstance(e, Neg):
        return f"-{expr_str(e.a, 3)}"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, SegFn):
        return f"{e.fn}({e.segments}, {expr_str(e.arg)})"
    if isinstance(e, TableRef):
        return f"{e.table}[{expr_str(e.index)}]"
    raise TypeError(e)


def pred_str(p: Pred, parent: int = 0) -> str:
    if isinstance(p, BoolConst):
        return "true" if p.value else "false"
    if isinstance(p, Cmp):
        return f"{expr_str(p.a)} {p.op} {expr_str(p.b)}"
    if isinstance(p, And):
        s = " and ".join(pred_str(x, 2) for x in p.items) or "true"
        return f"({s})" if parent > 2 else s
    if isinstance(p, Or):
        s = " or ".join(pred_str(x, 1) for x in p.items) or "false"
        return f"({s})" if parent > 1 else s
    if isinstance(p, Not):
        return f"not {pred_str(p.a, 3)}"
    if isinstance(p, Same):
        return f"same({p.segments}, {expr_str(p.a)}, {expr_str(p.b)})"
    raise TypeError(p)


def term_dict(t: Term) -> dict[str, Any]:
    d: dict[str, Any] = {
        "guard": pred_str(t.guard),
        "lo": expr_str(t.lo.expr),
        "hi": expr_str(t.hi.expr),
        "lo_monotone": t.lo.monotone,
        "hi_monotone": t.hi.monotone,
        "residual": None if t.residual is None else pred_str(t.residual),
        "family": None,
    }
    if t.family is not None:
        f = t.family
        d["family"] = {
            "index": f.index,
            "start": f.start,
            "stop": f.stop,
            "tables": {name: list(vals) for name, vals in f.tables},
        }
        if f.grid is not None:
            d["family"]["grid"] = {"origin": f.grid.origin, "width": f.grid.width,
                                   "base": expr_str(f.grid.base), "step": f.grid.step}
    return d


def table_dict(table: IntervalTable) -> dict[str, Any]:
    """The manifest's readable form of an interval table."""
    return {
        "exact": table.exact,
        "max_intervals_per_row": table.max_intervals_per_row(),
        "terms": [term_dict(t) for t in table.terms],
        "residuals": [{"reason": r.reason, "where": r.where} for r in table.residuals],
    }


def table_text(table: IntervalTable) -> str:
    """What `cmc check` prints: one block per row class (guard), its intervals."""
    lines = [f"mask {table.mask.name}: {len(table.terms)} term(s), "
             f"up to {table.max_intervals_per_row()} interval(s) per row, "
             f"{'exact' if table.exact else 'with residual parts'}"]
    for i, t in enumerate(table.terms):
        fam = ""
        if t.family is not None:
            f = t.family
            fam = f"  for {f.index} in [{f.start}, {f.stop})"
            for name, vals in f.tables:
                fam += f"  {name} = {list(vals)}"
        lines.append(f"  [{i}] when {pred_str(t.guard)}:{fam}")
        lines.append(f"      k in [{expr_str(t.lo.expr)}, {expr_str(t.hi.expr)})"
                     f"   lo {t.lo.monotone}, hi {t.hi.monotone}")
        if t.residual is not None:
            lines.append(f"      and {pred_str(t.residual)}   (residual, checked per element)")
    for r in table.residuals:
        lines.append(f"  warning: residual: {r.reason}: {r.where}")
    return "\n".join(lines)


_GLYPH = {0: ".", 1: "#", 2: "+"}  # empty, full, partial


def ascii_tiles(classes: np.ndarray, max_cells: int = 64) -> str:
    """Tile classes as characters: '.' empty, '#' full, '+' partial (downsampled if large)."""
    nq, nk = classes.shape
    step = max(1, -(-max(nq, nk) // max_cells))
    rows = []
    for i in range(0, nq, step):
        row = []
        for j in range(0, nk, step):
            block = classes[i : i + step, j : j + step]
            if (block == 2).any() or ((block == 1).any() and (block == 0).any()):
                row.append("+")
            else:
                row.append(_GLYPH[int(block.flat[0])])
        rows.append("".join(row))
    return "\n".join(rows)
