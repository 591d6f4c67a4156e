"""Host-side use of an interval table: per-row intervals, dense reconstruction, tile classes.

Not the tile stage: cmc/tiling.py chooses which tokens share a kernel tile (the Tiling that
emit receives); this module reads a finished table back on the host, for tests and tools.

Everything here is computed from the table alone (not the mask predicate), so tests can
compare it with the dense oracle: that is how the table is proven exact and the tile
classes sound.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .evaluate import Env, ParamValue, Shared, eval_expr, eval_pred
from .ir import IntervalTable, Pred, Term

EMPTY, FULL, PARTIAL = 0, 1, 2


@dataclass(frozen=True)
class RowInterval:
    """One (instantiated) term over all rows: guard[q], and [lo[q], hi[q]) clipped to [0, len)."""

    guard: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    residual: Pred | None
    env: Env  # the environment the term was instantiated in (family index, tables)


def instances(term: Term, env: Env) -> Iterator[Env]:
    if term.family is None:
        yield env
        return
    f = term.family
    # tables are stored for t = start..stop-1; TableRef indexes them by t - start
    shifted = {name: [0] * f.start + list(vals) for name, vals in f.tables}
    shared = Shared(f.index)  # what does not read t: evaluated for the first instance only
    for t in range(f.start, f.stop):
        yield Env(env.length, env.params, {**env.vars, f.index: t}, shifted, shared)


def row_intervals(table: IntervalTable, length: int,
                  params: Mapping[str, ParamValue]) -> list[RowInterval]:
    return list(iter_row_intervals(table, length, params))


def iter_row_intervals(table: IntervalTable, length: int,
                       params: Mapping[str, ParamValue]) -> Iterator[RowInterval]:
    """row_intervals one instance at a time (long sequences: one instance's arrays live)."""
    q = np.arange(length, dtype=np.int64)
    base = Env(length, params, {"q": q})
    for term in table.terms:
        for env in instances(term, base):
            g = np.broadcast_to(eval_pred(term.guard, env), q.shape)
            lo = np.broadcast_to(eval_expr(term.lo.expr, env), q.shape)
            hi = np.broadcast_to(eval_expr(term.hi.expr, env), q.shape)
            lo = np.clip(lo, 0, length)
            hi = np.clip(hi, 0, length)
            ok = g & (lo < hi)
            yield RowInterval(ok, np.where(ok, lo, 0), np.where(ok, hi, 0),
                              term.residual, env)


def dense_from_table(table: IntervalTable, length: int,
                     params: Mapping[str, ParamValue]) -> np.ndarray:
    """visible[q, k] as the table says (residuals evaluated densely)."""
    k = np.arange(length, dtype=np.int64)[None, :]
    q = np.arange(length, dtype=np.int64)[:, None]
    vis = np.zeros((length, length), dtype=bool)
    for ri in row_intervals(table, length, params):
        m = ri.guard[:, None] & (ri.lo[:, None] <= k) & (k < ri.hi[:, None])
        if ri.residual is not None:
            m &= eval_pred(ri.residual, ri.env.with_vars(q=q, k=k))
        vis |= m
    return vis


def union_length(rows: list[RowInterval]) -> np.ndarray:
    """Per row, the number of keys in the union of the given intervals."""
    if not rows:
        return np.zeros(0, dtype=np.int64)
    lo = np.stack([r.lo for r in rows], axis=1)
    hi = np.stack([r.hi for r in rows], axis=1)
    order = np.argsort(lo, axis=1, kind="stable")
    lo = np.take_along_axis(lo, order, axis=1)
    hi = np.take_along_axis(hi, order, axis=1)
    prev = np.maximum.accumulate(hi, axis=1)
    prev = np.concatenate([np.zeros((lo.shape[0], 1), dtype=np.int64), prev[:, :-1]], axis=1)
    return np.maximum(0, hi - np.maximum(lo, prev)).sum(axis=1)


VISIBLE_ROWS = 512  # query rows visible_pairs evaluates a residual table's keys for at once


def visible_pairs(table: IntervalTable, length: int, params: Mapping[str, ParamValue]) -> int:
    """Visible (q, k) pairs of one sequence: from intervals when exact, else densely over
    each block of VISIBLE_ROWS rows and the keys its intervals reach (a dilated band at 16K
    evaluates its residual on a band of keys, not on every pair)."""
    rows = row_intervals(table, length, params)
    if table.exact:
        return int(union_length(rows).sum()) if rows else 0
    total = 0
    for a in range(0, length, VISIBLE_ROWS):
        b = min(length, a + VISIBLE_ROWS)
        live = [(ri, ri.guard[a:b] & (ri.lo[a:b] < ri.hi[a:b])) for ri in rows]
        reach = [(int(ri.lo[a:b][g].min()), int(ri.hi[a:b][g].max())) for ri, g in live if g.any()]
        if not reach:
            continue
        k0, k1 = min(r[0] for r in reach), max(r[1] for r in reach)
        q = np.arange(a, b, dtype=np.int64)[:, None]
        k = np.arange(k0, k1, dtype=np.int64)[None, :]
        vis = np.zeros((b - a, k1 - k0), dtype=bool)
        for ri, g in live:
            m = g[:, None] & (ri.lo[a:b, None] <= k) & (k < ri.hi[a:b, None])
            if ri.residual is not None:
                m &= eval_pred(ri.residual, ri.env.with_vars(q=q, k=k))
            vis |= m
        total += int(vis.sum())
    return total


def classify(table: IntervalTable, length: int, params: Mapping[str, ParamValue],
             tile_m: int = 128, tile_n: int = 128) -> np.ndarray:
    """int8 [q tiles, k tiles]: EMPTY, FULL or PARTIAL, over the valid region of each tile.

    Empty: no row of the tile can reach a key of it. Full: on every row, one exact term
    covers all keys of the tile. Otherwise partial.
    """
    nq, nk = -(-length // tile_m), -(-length // tile_n)
    k0 = np.arange(nk, dtype=np.int64) * tile_n
    k1 = np.minimum(k0 + tile_n, length)
    touched = np.zeros((length, nk), dtype=bool)
    covered = np.zeros((length, nk), dtype=bool)
    for ri in row_intervals(table, length, params):
        lo, hi = ri.lo[:, None], ri.hi[:, None]
        touched |= ri.guard[:, None] & (lo < k1[None, :]) & (hi > k0[None, :])
        if ri.residual is None:
            covered |= ri.guard[:, None] & (lo <= k0[None, :]) & (hi >= k1[None, :])
    out = np.full((nq, nk), PARTIAL, dtype=np.int8)
    for i in range(nq):
        rows = slice(i * tile_m, min((i + 1) * tile_m, length))
        t, c = touched[rows], covered[rows]
        out[i, ~t.any(axis=0)] = EMPTY
        out[i, c.all(axis=0)] = FULL
    return out
