"""emit: IntervalTable -> EmittedSource (the CUDA text NVRTC compiles, and its entry points).

The kernel itself is hand-written (templates/cmc/attn_fwd_portable.cuh, inlined so the .cu is
self-contained); what is generated here is the mask's hook struct `cmc_hooks` (contract at
the top of that header):

- `visible(s, r, k)`: the mask's own predicate, exact, with every k-free subexpression
  hoisted into a per-row context `row_t` (computed once per row) and `same(S, a, b)` with one
  k-free side turned into an exact membership interval for the other side;
- `term(s, qa, qb, i, out)`: interval arithmetic over the query rows [qa, qb] for every table
  term (a family term is one instance per compile-time index), giving its touched and full
  key ranges;
- `span(s, r, i, lo, hi)`: the exact key interval of term instance i for one row (its guard,
  lo and hi evaluated exactly, k-free parts shared with `visible` through `row_t`), so the
  sm90 kernel masks a partial tile with interval compares instead of the predicate; false
  for a term with a residual (the kernel then evaluates `visible` on that tile).

Integer semantics follow cmc/evaluate.py exactly: floor division and remainder, x / 0 == 0,
x % 0 == x. Every expression node gets a static value range (q, k, len within int32, params
in their declared ranges, which the runtime enforces); a node whose range fits int32 is computed in int32, anything else in int64, so no
intermediate overflows where evaluate's int64 would not.

Only identifiers that pass abi.check_identifier and Python ints reach the C text; the mask's
doc string appears only as a `//` comment stripped to a harmless alphabet.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import jinja2
import numpy as np

from . import artifacts
from .abi import DQ_LAYOUTS, DescriptorLayout, check_identifier, descriptor_layout
from .artifacts import EmittedSource, KernelVariant, KvOrder
from .ir import (
    LINEAR,
    MAX_KEY_TILES,
    TILE,
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
    OffsetMasks,
    Or,
    ParamRef,
    PatchMasks,
    Pred,
    Same,
    SegFn,
    TableRef,
    Term,
    Tiling,
    Var,
    nodes,
)
from .kernels import (
    BWD_KERNELS,
    ROWS_PER_WARP,
    SPECS,
    KernelKind,
    KernelSpec,
    Pass,
    backward_kinds,
    forward_kinds,
)
from .ranges import (
    I32_MAX,
    I32_MIN,
    I64_MAX,
    I64_MIN,
    RangeEnv,
    div_range,
    fdiv,
    fmod,
    mod_range,
    mul_range,
    widest_range,
)
from .resources import jinja_env, read_text
from .tiling import grid_of

TEMPLATE = "kernel.cu.j2"
HOOKS_TEMPLATE = "hooks.cu.j2"
PORTABLE = SPECS[KernelKind.FWD_PORTABLE]
SM90 = SPECS[KernelKind.FWD_SM90]


def patch_key_tiles(tiling: Tiling) -> int | None:
    """The key tiles a patch plan holds bits for (None: a linear plan)."""
    return MAX_KEY_TILES if tiling.kind == "patch" else None


def sm90_plan_ints(n_terms: int, tiling: Tiling = LINEAR) -> int:
    """Ints of one sm90 tile plan (cmc_sm90::plan_ints)."""
    return SM90.plan_ints(n_terms, patch_key_tiles(tiling))


def sm90_smem_bytes(head_dim: int, n_terms: int, tiling: Tiling = LINEAR) -> int:
    """Dynamic shared memory of the sm90 kernel (cmc_sm90::smem_bytes, static_assert'ed)."""
    return SM90.smem(head_dim, sm90_plan_ints(n_terms, tiling))


SM90_CONSUMER_THREADS = 256


def _mask_bits(masks: PatchMasks | OffsetMasks) -> np.ndarray:
    """masks.rows as bits: [class, query row, key column]."""
    raw = b"".join(r.to_bytes(TILE // 8, "little") for r in masks.rows)
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    return bits.reshape(masks.classes, TILE, TILE).astype(np.uint64)


def _pack(bits: np.ndarray, shifts: np.ndarray) -> list[tuple[int, int]]:
    """bits [class, thread, word, bit] (0 / 1) << shifts [thread, word, bit], summed per
    word: (word 0, word 1) per class and thread, class-major."""
    words = (bits << shifts[None].astype(np.uint64)).sum(axis=-1, dtype=np.uint64)
    return [(int(a), int(b)) for a, b in words.reshape(-1, 2).tolist()]


_THREAD = np.arange(SM90_CONSUMER_THREADS)
_GROUP, _WARP, _LANE = _THREAD // 128, _THREAD % 128 // 32, _THREAD % 32


def sm90_mask_words(masks: PatchMasks | OffsetMasks) -> list[tuple[int, int]]:
    """The per-offset tile masks in the sm90 consumers' fragment order: for class c and
    consumer thread t (warpgroup t / 128, warp, lane), entry c * 256 + t holds the column
    bits of its two rows lrow and lrow + 8, bit e * 16 + n for column 8 n + 2 (lane % 4) + e
    (the wgmma accumulator layout, as cmc_colmask32 builds them)."""
    lrow = _GROUP * 64 + _WARP * 16 + (_LANE >> 2)
    n, e = np.divmod(np.arange(32), 2)  # the word's bit e * 16 + n, in (n, e) order
    row = lrow[:, None, None] + np.array([0, 8])[None, :, None]  # [thread, word, 1]
    col = (8 * n + e)[None, None, :] + 2 * (_LANE & 3)[:, None, None]  # [thread, 1, bit]
    shift = np.broadcast_to(e * 16 + n, (SM90_CONSUMER_THREADS, 2, 32))
    return _pack(_mask_bits(masks)[:, row, col], shift)


def sm90_kv_mask_words(masks: PatchMasks | OffsetMasks) -> list[tuple[int, int]]:
    """The per-offset tile masks transposed to bwd_kv_sm90's layout (kv_patch, and the linear
    kv with offset masks): for class c (the forward pair's: query tile vs key tile,
    cmc_patch_class_of or cmc_bwd_offset_class) and kv thread t
    (warpgroup t / 128, warp, lane), entry c * 256 + t holds one word per query half hh
    (x: hh 0, y: hh 1) of its key rows kr = 64 wg + 16 warp + lane / 4 and kr + 8 against the
    half's query columns 64 hh + 8 jj + 2 (lane % 4) + e: key row kr + 8 i, column (jj, e)
    is bit i * 16 + e * 8 + jj (cmc_bwd_kv_mask_bit). masks.rows is per query row of the
    tile, bit per key column (as sm90_mask_words reads it)."""
    kr = 64 * _GROUP + 16 * _WARP + (_LANE >> 2)
    i, e, jj = np.unravel_index(np.arange(32), (2, 2, 8))  # bit i * 16 + e * 8 + jj
    hh = np.array([0, 1])[None, :, None]
    qrow = 64 * hh + (8 * jj + e)[None, None, :] + 2 * (_LANE & 3)[:, None, None]
    kcol = np.broadcast_to(kr[:, None, None] + 8 * i[None, None, :], qrow.shape)
    shift = np.broadcast_to(i * 16 + e * 8 + jj, qrow.shape)
    return _pack(_mask_bits(masks)[:, qrow, kcol], shift)


def _mask_table(masks: PatchMasks | OffsetMasks | None, symbol: str,
                kv: bool = False) -> str:
    """C definition of the tile mask words (global memory: threads read different words);
    `kv`: transposed to bwd_kv_sm90's layout (sm90_kv_mask_words)."""
    if masks is None:
        return ""
    words = sm90_kv_mask_words(masks) if kv else sm90_mask_words(masks)
    lines = [", ".join(f"{{0x{a:08x}u, 0x{b:08x}u}}" for a, b in words[i:i + 4]) + ","
             for i in range(0, len(words), 4)]
    return (f"CMC_MASK_TABLE {symbol}[{len(words)}] = {{\n"
            + _indent(lines, 2) + "\n};")


def _mask_tables(tiling: Tiling, suffix: str = "") -> str:
    """The tile mask tables of a tiling: patch offsets, linear tile offsets, or both (a patch
    tiling's band masks for its linear tiles below the patches' start length); `suffix`
    ("_b": the backward's hooks, cmc_hooks_b) ends their symbols."""
    return "\n\n".join(t for t in (
        _mask_table(tiling.masks, f"cmc_patch_mask_words{suffix}"),
        _mask_table(tiling.offset_masks, f"cmc_offset_mask_words{suffix}")) if t)


def rows_per_warp(head_dim: int) -> int:
    """Query rows per warp of the portable kernel (16 * MT, cmc_portable::Shape<MT>)."""
    return ROWS_PER_WARP[head_dim]


# More term instances than this and the per-CTA plan would crowd shared memory (the sm90
# kernel keeps two plans next to two Q tiles: 512 terms is 227 KiB at head dim 128); lower
# replaces a larger table by one catch-all term and records why (lower.MAX_TERM_INSTANCES).
MAX_TERMS = 512
SMEM_LIMIT = 227 * 1024  # opt-in dynamic shared memory per block, sm_90 and sm_100

POS_MAX = I32_MAX - 1  # q, k < len <= INT32_MAX

_DOC_ALLOWED = re.compile(r"[^A-Za-z0-9 ,.:;()_+\-=<>]")


def smem_bytes(head_dim: int, n_terms: int) -> int:
    """Dynamic shared memory of the portable kernel (cmc_portable::smem_bytes)."""
    return PORTABLE.smem(head_dim, PORTABLE.plan_ints(n_terms, None))


def sanitize_doc(doc: str, limit: int = 200) -> str:
    """The doc string as it may appear in a `//` comment: a small alphabet, one line."""
    return _DOC_ALLOWED.sub("", doc.replace("\n", " "))[:limit].strip()


# =========================================================================== static ranges


def _fits32(lo: int, hi: int) -> bool:
    return I32_MIN <= lo and hi <= I32_MAX


def _const_value(e: Expr) -> int | None:
    """The value of a constant-only expression (evaluate semantics), else None."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Neg):
        v = _const_value(e.a)
        return None if v is None else -v
    if isinstance(e, BinOp):
        a, b = _const_value(e.a), _const_value(e.b)
        if a is None or b is None:
            return None
        return {"+": a + b, "-": a - b, "*": a * b, "/": fdiv(a, b), "%": fmod(a, b)}[e.op]
    if isinstance(e, Call):
        vs = [_const_value(x) for x in e.args]
        if any(v is None for v in vs) or not vs:
            return None
        ints = [v for v in vs if v is not None]
        if e.fn == "abs":
            return abs(ints[0])
        return min(ints) if e.fn == "min" else max(ints)
    return None


def uses_k(e: Expr | Pred) -> bool:
    if isinstance(e, Var):
        return e.name == "k"
    if isinstance(e, (Const, ParamRef, BoolConst)):
        return False
    if isinstance(e, BinOp):
        return uses_k(e.a) or uses_k(e.b)
    if isinstance(e, (Neg, Not)):
        return uses_k(e.a)
    if isinstance(e, Call):
        return any(uses_k(a) for a in e.args)
    if isinstance(e, SegFn):
        return uses_k(e.arg)
    if isinstance(e, TableRef):
        return uses_k(e.index)
    if isinstance(e, Cmp):
        return uses_k(e.a) or uses_k(e.b)
    if isinstance(e, (And, Or)):
        return any(uses_k(x) for x in e.items)
    if isinstance(e, Same):
        return uses_k(e.a) or uses_k(e.b)
    raise TypeError(f"not an expression or predicate: {e!r}")


def uses_var(e: Expr | Pred, name: str) -> bool:
    return any(isinstance(x, Var) and x.name == name for x in nodes(e))


def uses_table(e: Expr | Pred) -> bool:
    return any(isinstance(x, TableRef) for x in nodes(e))


# =========================================================================== C literals


def _lit(v: int, wide: bool) -> str:
    if wide:
        if not I64_MIN <= v <= I64_MAX:
            raise ValueError(f"integer {v} does not fit int64")
        if v == I64_MIN:
            return "(-9223372036854775807LL - 1)"
        return f"({v}LL)" if v < 0 else f"{v}LL"
    if v == I32_MIN:
        return "(-2147483647 - 1)"
    return f"({v})" if v < 0 else str(v)


def _cast(code: str, from_wide: bool, to_wide: bool) -> str:
    if from_wide == to_wide:
        return code
    return f"(cmc_i64)({code})" if to_wide else f"(int)({code})"


@dataclass(frozen=True)
class _C:
    """A C expression with the static range of its value (its type follows from the range)."""

    code: str
    lo: int
    hi: int

    @property
    def wide(self) -> bool:
        return not _fits32(self.lo, self.hi)

    @property
    def ctype(self) -> str:
        return "cmc_i64" if self.wide else "int"

    def as_type(self, wide: bool) -> str:
        return _cast(self.code, self.wide, wide)


def _unsigned_op(x: str, op: str, c: int, wide: bool) -> str:
    """x / c or x % c for x >= 0 and c > 0 (floor == truncation), in unsigned arithmetic:
    a multiply-high and a shift instead of cmc_fdiv's sign fix-ups."""
    if wide:
        return f"(cmc_i64)((unsigned long long)({x}) {op} {c}ull)"
    return f"(int)((unsigned)({x}) {op} {c}u)"


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _narrow_k(p: Pred, holds: bool, rng: tuple[int, int]) -> tuple[int, int]:
    """k's range once p is known to be `holds`, where p compares k with a constant (else,
    or if the result would be empty, rng unchanged)."""
    if not isinstance(p, Cmp):
        return rng
    op: str
    if isinstance(p.a, Var) and p.a.name == "k":
        op, c = p.op, _const_value(p.b)
    elif isinstance(p.b, Var) and p.b.name == "k":
        op, c = _FLIP[p.op], _const_value(p.a)
    else:
        return rng
    if c is None:
        return rng
    if not holds:
        op = _NEGATE[op]
    lo, hi = rng
    if op in ("<", "<="):
        hi = min(hi, c - 1 if op == "<" else c)
    elif op in (">", ">="):
        lo = max(lo, c + 1 if op == ">" else c)
    elif op == "==":
        lo, hi = max(lo, c), min(hi, c)
    return (lo, hi) if lo <= hi else rng


def _pow2(c: int) -> int | None:
    return c.bit_length() - 1 if c > 0 and c & (c - 1) == 0 else None


# =========================================================================== scope


@dataclass
class _Scope:
    """Names of one mask inside the hooks: params, segments and (in a family) the index."""

    params: Mapping[str, str]  # name -> kind
    index: str | None = None
    index_range: tuple[int, int] = (0, 0)
    tables: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    # each int parameter's declared range over every len (the runtime enforces it), which
    # types the arithmetic it meets; a name missing here is any int32
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def param_range(self, name: str) -> tuple[int, int]:
        return self.ranges.get(name, (I32_MIN, I32_MAX))

    def param(self, name: str) -> str:
        kind = self.params.get(name)
        if kind not in ("scalar", "batch"):
            raise ValueError(f"unknown int parameter {name!r}")
        return f"s.p_{check_identifier(name)}"

    def segs(self, name: str) -> tuple[str, str]:
        if self.params.get(name) != "segments":
            raise ValueError(f"unknown segments parameter {name!r}")
        n = check_identifier(name)
        return f"s.sg_{n}", f"s.sn_{n}"


# =========================================================================== exact C (rows/elements)


class _ExactGen:
    """Exact integer C for the predicate. mode "elem": q is r.q, k is k, and k-free
    subtrees come from the row context; mode "row": q is the local q, no k."""

    def __init__(self, scope: _Scope):
        self.scope = scope
        self.hoisted: dict[object, tuple[str, str]] = {}  # key -> (field, ctype)
        self.row_lines: list[str] = []
        # the largest len (q, k < len): INT32_MAX, or a kernel's max_len (patch tilings)
        self.len_max = I32_MAX
        # k's range where the code being emitted runs (mode "elem"): narrowed by the
        # comparisons of k with a constant that && and || have already decided (_narrow_k)
        self.k_range: tuple[int, int] | None = None

    def _k_bounds(self) -> tuple[int, int]:
        return self.k_range or (0, self.len_max - 1)

    # ------------------------------------------------------------------ hoisting
    def _hoist_expr(self, e: Expr) -> _C:
        c = self.expr(e, "row")
        key = ("e", e)
        if key not in self.hoisted:
            name = f"h{len(self.hoisted)}"
            self.hoisted[key] = (name, c.ctype)
            self.row_lines.append(f"r.{name} = {c.code};")
        return _C(f"r.{self.hoisted[key][0]}", c.lo, c.hi)

    def _hoist_pred(self, p: Pred) -> str:
        key = ("p", p)
        if key not in self.hoisted:
            code = self.pred(p, "row")
            name = f"h{len(self.hoisted)}"
            self.hoisted[key] = (name, "bool")
            self.row_lines.append(f"r.{name} = {code};")
        return f"r.{self.hoisted[key][0]}"

    def _hoist_member(self, segments: str, a: Expr, other: _C) -> tuple[str, str, bool]:
        """Exact membership interval [lo, hi) of same(S, a, .): lo is seg_start unless a is in
        segment -1, hi the next start unless a is in the last segment; those open sides get
        sentinels outside the other side's static range."""
        wide = other.wide or other.hi >= I32_MAX
        lo_sent = _lit(I64_MIN, True) if wide else _lit(max(other.lo, I32_MIN), False)
        hi_sent = _lit(I64_MAX, True) if wide else _lit(other.hi + 1, False)
        key = ("m", segments, a, wide, lo_sent, hi_sent)
        if key not in self.hoisted:
            idx = len(self.hoisted)
            ctype = "cmc_i64" if wide else "int"
            self.hoisted[key] = (f"h{idx}", ctype)
            sg, sn = self.scope.segs(segments)
            ac = self.expr(a, "row")
            j = f"j{idx}"
            self.row_lines.append(
                f"{{ const int {j} = cmc_seg({sg}, {sn}, {ac.as_type(True)}); "
                f"r.h{idx} = {j} < 0 ? {lo_sent} : ({ctype}){sg}[{j}]; "
                f"r.h{idx}_hi = {j} + 1 < {sn} ? ({ctype}){sg}[{j} + 1] : {hi_sent}; }}"
            )
        name = self.hoisted[key][0]
        return f"r.{name}", f"r.{name}_hi", wide

    def row_fields(self) -> list[str]:
        out: list[str] = []
        for key, (name, ctype) in self.hoisted.items():
            out.append(f"{ctype} {name};")
            if isinstance(key, tuple) and key[0] == "m":
                out.append(f"{ctype} {name}_hi;")
        return out

    # ------------------------------------------------------------------ expressions
    def _uses_index(self, e: Expr | Pred) -> bool:
        ix = self.scope.index
        return ix is not None and (uses_var(e, ix) or uses_table(e))

    def expr(self, e: Expr, mode: str) -> _C:
        cv = _const_value(e)
        if cv is not None:
            return _C(_lit(cv, not _fits32(cv, cv)), cv, cv)
        if (mode == "elem" and not uses_k(e) and not isinstance(e, (Var, ParamRef))
                and not self._uses_index(e)):
            return self._hoist_expr(e)
        if isinstance(e, Var):
            if self.scope.index is not None and e.name == self.scope.index:
                return _C("cmc_t", *self.scope.index_range)
            if e.name == "q":
                return _C("r.q" if mode == "elem" else "q", 0, self.len_max - 1)
            if e.name == "k":
                if mode != "elem":
                    raise ValueError("k in a k-free context")
                return _C("k", *self._k_bounds())
            if e.name == "len":
                return _C("s.len", 0, self.len_max)
            raise ValueError(f"unknown variable {e.name!r} in a mask predicate")
        if isinstance(e, ParamRef):
            return _C(self.scope.param(e.name), *self.scope.param_range(e.name))
        if isinstance(e, BinOp):
            return self._binop(e, mode)
        if isinstance(e, Neg):
            a = self.expr(e.a, mode)
            lo, hi = -a.hi, -a.lo
            wide = a.wide or not _fits32(lo, hi)
            return _C(f"(-{a.as_type(wide)})", lo, hi)
        if isinstance(e, Call):
            args = [self.expr(x, mode) for x in e.args]
            if not args:
                raise ValueError(f"{e.fn}() without arguments")
            if e.fn == "abs":
                a = args[0]
                lo, hi = (a.lo, a.hi) if a.lo >= 0 else (
                    (-a.hi, -a.lo) if a.hi <= 0 else (0, max(-a.lo, a.hi)))
                wide = a.wide or not _fits32(lo, hi)
                return _C(f"cmc_abs({a.as_type(wide)})", lo, hi)
            acc = args[0]
            pick = min if e.fn == "min" else max
            for b in args[1:]:
                lo, hi = pick(acc.lo, b.lo), pick(acc.hi, b.hi)
                wide = acc.wide or b.wide
                code = f"cmc_{e.fn}({acc.as_type(wide)}, {b.as_type(wide)})"
                acc = _C(_cast(code, wide, not _fits32(lo, hi)), lo, hi)
            return acc
        if isinstance(e, SegFn):
            a = self.expr(e.arg, mode)
            sg, sn = self.scope.segs(e.segments)
            if e.fn == "seg":
                return _C(f"cmc_seg({sg}, {sn}, {a.as_type(True)})", -1, I32_MAX - 1)
            if e.fn == "seg_start":
                return _C(f"cmc_seg_start({sg}, {sn}, {a.as_type(True)})", I32_MIN, I32_MAX)
            return _C(f"cmc_seg_end({sg}, {sn}, s.len, {a.as_type(True)})", I32_MIN, I32_MAX)
        if isinstance(e, TableRef):
            if e.table not in self.scope.tables:
                raise ValueError("table references belong to interval families, not predicates")
            arr, vals = self.scope.tables[e.table]
            idx = self.expr(e.index, mode)
            return _C(f"cmc_tab_at({arr}, {max(1, len(vals))}, {idx.code})",
                      min(vals, default=0), max(vals, default=0))
        raise TypeError(f"not an expression: {e!r}")

    def _binop(self, e: BinOp, mode: str) -> _C:
        a = self.expr(e.a, mode)
        b = self.expr(e.b, mode)
        ra, rb = (a.lo, a.hi), (b.lo, b.hi)
        if e.op == "+":
            lo, hi = a.lo + b.lo, a.hi + b.hi
        elif e.op == "-":
            lo, hi = a.lo - b.hi, a.hi - b.lo
        elif e.op == "*":
            lo, hi = mul_range(ra, rb)
        elif e.op == "/":
            lo, hi = div_range(ra, rb)
        else:
            lo, hi = mod_range(ra, rb)
        res_wide = not _fits32(lo, hi)
        wide = a.wide or b.wide or res_wide
        x, y = a.as_type(wide), b.as_type(wide)
        c = b.lo if b.lo == b.hi else None
        if e.op in "+-*":
            code = f"({x} {e.op} {y})"
        elif e.op == "/":
            s = _pow2(c) if c is not None else None
            if c == 0:
                code = _lit(0, wide)
            elif c == 1:
                code = x
            elif s is not None:
                code = f"({x} >> {s})"  # arithmetic shift == floor division by 2^s
            elif c is not None and c > 0 and a.lo >= 0:
                code = _unsigned_op(x, "/", c, wide)  # floor == truncation when x >= 0
            else:
                code = f"cmc_fdiv({x}, {y})"
        else:
            s = _pow2(c) if c is not None else None
            if c == 0:
                code = x
            elif c in (1, -1):
                code = _lit(0, wide)
            elif s is not None and c is not None:
                code = f"({x} & {_lit(c - 1, wide)})"  # two's complement: floor remainder
            elif c is not None and c > 0 and a.lo >= 0:
                code = _unsigned_op(x, "%", c, wide)
            else:
                code = f"cmc_fmod({x}, {y})"
        return _C(_cast(code, wide, res_wide), lo, hi)

    # ------------------------------------------------------------------ predicates
    def pred(self, p: Pred, mode: str) -> str:
        if isinstance(p, BoolConst):
            return "true" if p.value else "false"
        if mode == "elem" and not uses_k(p) and not self._uses_index(p):
            return self._hoist_pred(p)
        if isinstance(p, Cmp):
            a, b = self.expr(p.a, mode), self.expr(p.b, mode)
            wide = a.wide or b.wide
            return f"({a.as_type(wide)} {p.op} {b.as_type(wide)})"
        if isinstance(p, (And, Or)):
            if not p.items:
                return "true" if isinstance(p, And) else "false"
            # C evaluates an item only when the ones before it left the result open: each
            # true (&&) or false (||), which may bound k for the items after it
            held, codes = self.k_range, []
            for x in p.items:
                codes.append(self.pred(x, mode))
                if mode == "elem":
                    self.k_range = _narrow_k(x, isinstance(p, And), self._k_bounds())
            self.k_range = held
            return "(" + (" && " if isinstance(p, And) else " || ").join(codes) + ")"
        if isinstance(p, Not):
            return f"(!{self.pred(p.a, mode)})"
        if isinstance(p, Same):
            sg, sn = self.scope.segs(p.segments)
            if mode == "elem" and uses_k(p.a) != uses_k(p.b):
                free, other = (p.a, p.b) if not uses_k(p.a) else (p.b, p.a)
                oc = self.expr(other, mode)
                lo, hi, wide = self._hoist_member(p.segments, free, oc)
                v = oc.as_type(wide)
                return f"({lo} <= {v} && {v} < {hi})"
            a, b = self.expr(p.a, mode), self.expr(p.b, mode)
            return (f"(cmc_seg({sg}, {sn}, {a.as_type(True)}) == "
                    f"cmc_seg({sg}, {sn}, {b.as_type(True)}))")
        raise TypeError(f"not a predicate: {p!r}")


# =========================================================================== interval C (terms)


# cmc_iv's saturation bound (CMC_IV_BIG in attn_fwd_portable.cuh)
IV_BIG = 1 << 61


class _IvGen:
    """Straight-line interval arithmetic (cmc_iv, int64 with saturation) for one term;
    `unchecked`: cmc_ivu's operations, without the saturation and infinity tests
    (_fits_unchecked proved they never fire)."""

    def __init__(self, scope: _Scope, table_names: dict[str, str], unchecked: bool = False):
        self.scope = scope
        self.table_names = table_names  # table -> C array name
        self.lines: list[str] = []
        self.memo: dict[object, str] = {}
        self.ops = "cmc_ivu" if unchecked else "cmc_iv"

    def _emit(self, key: object, code: str, ctype: str = "cmc_iv") -> str:
        if key in self.memo:
            return self.memo[key]
        name = f"v{len(self.memo)}"
        self.lines.append(f"const {ctype} {name} = {code};")
        self.memo[key] = name
        return name

    def iv(self, e: Expr) -> str:
        key = ("e", e)
        if key in self.memo:
            return self.memo[key]
        ops = self.ops
        if isinstance(e, Const):
            return self._emit(key, f"{ops}_pt({_lit(e.value, True)})")
        if isinstance(e, Var):
            if e.name == "q":
                return self._emit(key, f"{ops}_mk(qa, qb)")
            if e.name == "len":
                return self._emit(key, f"{ops}_pt(s.len)")
            if self.scope.index is not None and e.name == self.scope.index:
                return self._emit(key, f"{ops}_pt(cmc_t)")
            raise ValueError(f"variable {e.name!r} in a k-free bound or guard")
        if isinstance(e, ParamRef):
            return self._emit(key, f"{ops}_pt({self.scope.param(e.name)})")
        if isinstance(e, BinOp):
            fn = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod"}[e.op]
            a, b = self.iv(e.a), self.iv(e.b)
            return self._emit(key, f"{ops}_{fn}({a}, {b})")
        if isinstance(e, Neg):
            return self._emit(key, f"cmc_iv_neg({self.iv(e.a)})")
        if isinstance(e, Call):
            args = [self.iv(x) for x in e.args]
            if not args:
                raise ValueError(f"{e.fn}() without arguments")
            if e.fn == "abs":
                return self._emit(key, f"cmc_iv_abs({args[0]})")
            acc = args[0]
            for n, b in enumerate(args[1:]):
                acc = self._emit(("fold", e, n), f"cmc_iv_{e.fn}({acc}, {b})")
            self.memo[key] = acc
            return acc
        if isinstance(e, SegFn):
            a = self.iv(e.arg)
            sg, sn = self.scope.segs(e.segments)
            if e.fn == "seg":
                return self._emit(key, f"cmc_iv_seg({sg}, {sn}, {a})")
            if e.fn == "seg_start":
                return self._emit(key, f"cmc_iv_seg_start({sg}, {sn}, {a})")
            return self._emit(key, f"cmc_iv_seg_end({sg}, {sn}, s.len, {a})")
        if isinstance(e, TableRef):
            if e.table not in self.table_names:
                raise ValueError(f"unknown table {e.table!r}")
            arr, vals = self.table_names[e.table], self.scope.tables[e.table][1]
            idx = self.iv(e.index)
            return self._emit(
                key, f"cmc_iv_tab({arr}, {max(1, len(vals))}, {idx}, "
                f"{_lit(min(vals, default=0), False)}, {_lit(max(vals, default=0), False)})")
        raise TypeError(f"not an expression: {e!r}")

    def tv(self, p: Pred) -> str:
        key = ("p", p)
        if key in self.memo:
            return self.memo[key]
        if isinstance(p, BoolConst):
            return self._emit(key, f"cmc_tv_const({'true' if p.value else 'false'})", "cmc_tv")
        if isinstance(p, Cmp):
            a, b = self.iv(p.a), self.iv(p.b)
            code = {
                "<": f"cmc_tv_lt({a}, {b})",
                "<=": f"cmc_tv_le({a}, {b})",
                ">": f"cmc_tv_lt({b}, {a})",
                ">=": f"cmc_tv_le({b}, {a})",
                "==": f"cmc_tv_eq({a}, {b})",
                "!=": f"cmc_tv_ne({a}, {b})",
            }[p.op]
            return self._emit(key, code, "cmc_tv")
        if isinstance(p, (And, Or)):
            fn = "and" if isinstance(p, And) else "or"
            if not p.items:
                return self.tv(BoolConst(isinstance(p, And)))
            acc = self.tv(p.items[0])
            for n, x in enumerate(p.items[1:]):
                acc = self._emit(("fold", p, n), f"cmc_tv_{fn}({acc}, {self.tv(x)})", "cmc_tv")
            self.memo[key] = acc
            return acc
        if isinstance(p, Not):
            return self._emit(key, f"cmc_tv_not({self.tv(p.a)})", "cmc_tv")
        if isinstance(p, Same):
            sg, sn = self.scope.segs(p.segments)
            ja = self._emit(("seg", p.a), f"cmc_iv_seg({sg}, {sn}, {self.iv(p.a)})")
            jb = self._emit(("seg", p.b), f"cmc_iv_seg({sg}, {sn}, {self.iv(p.b)})")
            return self._emit(key, f"cmc_tv_eq({ja}, {jb})", "cmc_tv")
        raise TypeError(f"not a predicate: {p!r}")


# =========================================================================== hooks


@dataclass(frozen=True)
class Hooks:
    """The generated parts of NAME.cu."""

    n_terms: int
    tables: tuple[str, ...]  # C definitions of compile-time tables
    seq_fields: tuple[str, ...]
    seq_lines: tuple[str, ...]
    row_fields: tuple[str, ...]
    row_lines: tuple[str, ...]
    visible: str
    term_blocks: tuple[str, ...]
    span_blocks: tuple[str, ...]
    tiling: Tiling = LINEAR
    grid_terms: str = "false"  # C condition on i: instance i is a grid-family instance
    grid_blocks: tuple[str, ...] = ()  # grid_span, one block per grid family
    other_terms: tuple[tuple[int, int], ...] = ()  # (first instance, count) of the others
    span_grid: tuple[int, int] = (0, 128)  # (origin, width) of the grid grid_span rows are on
    span_words: bool = False  # the sm90 backward kinds mask partial linear items by span words
    span_words_why: str = ""  # why or why not (cmc check, cmc show)
    # (origin, width) of the grid at whose rows the plan builders cut a tile's rows
    # (row_split_grid; width 0: they do not)
    row_split: tuple[int, int] = (0, 0)


def _indent(lines: Sequence[str], n: int) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln else ln for ln in lines)


def _wrap_ints(values: Sequence[int], per_line: int = 16) -> list[str]:
    out = []
    for i in range(0, len(values), per_line):
        out.append(", ".join(_lit(v, False) for v in values[i:i + per_line]) + ",")
    return out or ["0,"]


def _fits_unchecked(term: Term, scope: _Scope) -> bool:
    """Whether every value term()'s interval arithmetic meets lies strictly inside
    (-IV_BIG, IV_BIG) for any rows, len and parameters: ranges.widest_range over the whole
    domain, whose operations are cmc_iv's (corners, floor division, one-block remainders), so
    by inclusion it bounds every interval the kernel computes on a tile's rows. Then the
    saturation and infinity tests never fire, and cmc_ivu gives the same intervals without
    them (natten_clamped's transposed term: 732 PTX instructions, 203 unchecked)."""
    env = RangeEnv(dict(scope.ranges),
                   {scope.index: scope.index_range} if scope.index is not None else None,
                   {name: (min(vals, default=0), max(vals, default=0))
                    for name, (_, vals) in scope.tables.items()})
    roots = [term.lo.expr, term.hi.expr,
             *(x for n in nodes(term.guard) if isinstance(n, (Cmp, Same)) for x in (n.a, n.b))]
    # a table's index is evaluated too, but widest_range takes the table's values for it
    roots += [n.index for r in list(roots) for n in nodes(r) if isinstance(n, TableRef)]
    for e in roots:
        lo, hi = widest_range(e, env)
        if not -IV_BIG < lo <= hi < IV_BIG:
            return False
    return True


def _term_block(term: Term, base: int, count: int, scope: _Scope, tabs: dict[str, str],
                comment: str) -> list[str]:
    g = _IvGen(scope, tabs, unchecked=_fits_unchecked(term, scope))
    guard = g.tv(term.guard)
    lo = g.iv(term.lo.expr)
    hi = g.iv(term.hi.expr)
    exact = "true" if term.residual is None else "false"
    body = [*g.lines, f"cmc_term_out(out, {guard}, {lo}, {hi}, {exact}, s.len);", "return;"]
    if term.family is None:
        head = f"if (i == {base}) {{  // {comment}"
        return [head, _indent(body, 2), "}"]
    fam = term.family
    head = f"if (i >= {base} && i < {base + count}) {{  // {comment}"
    first = f"const int cmc_t = {_lit(fam.start, False)} + (i - {base});"
    return [head, _indent([first, *body], 2), "}"]


def _span_block(term: Term, base: int, count: int, ex: _ExactGen, comment: str) -> list[str]:
    """Exact [lo, hi) of one term instance for row r, clamped to [0, len); empty when the
    guard fails. Shares ex's row context (hoisted k-free, index-free subtrees)."""
    if term.residual is not None:
        body = ["lo = 0; hi = 0;", "return false;"]
    else:
        guard = ex.pred(term.guard, "elem")
        lo, hi = ex.expr(term.lo.expr, "elem"), ex.expr(term.hi.expr, "elem")
        body = [f"if ({guard}) {{",
                f"  lo = cmc_key_clamp({lo.as_type(True)}, s.len);",
                f"  hi = cmc_key_clamp({hi.as_type(True)}, s.len);",
                "} else {", "  lo = 0; hi = 0;", "}", "return true;"]
    if term.family is None:
        return [f"if (i == {base}) {{  // {comment}", _indent(body, 2), "}"]
    first = f"const int cmc_t = {_lit(term.family.start, False)} + (i - {base});"
    return [f"if (i >= {base} && i < {base + count}) {{  // {comment}",
            _indent([first, *body], 2), "}"]


def _grid_block(term: Term, f: int, ex: _ExactGen, comment: str) -> list[str]:
    """grid_span of grid family f: the one instance t whose keys lie in grid row ky
    (ky = base(q) + step * t), exactly as its span, or empty."""
    fam = term.family
    assert fam is not None and fam.grid is not None and term.residual is None
    base = ex.expr(fam.grid.base, "elem")
    tl = f"ky - {base.as_type(False)}" if fam.grid.step == 1 else f"{base.as_type(False)} - ky"
    guard = ex.pred(term.guard, "elem")
    lo, hi = ex.expr(term.lo.expr, "elem"), ex.expr(term.hi.expr, "elem")
    return [
        f"if (f == {f}) {{  // {comment}",
        f"  const int cmc_tl = {tl};",
        f"  if (cmc_tl < {_lit(fam.start, False)} || cmc_tl >= {_lit(fam.stop, False)}) "
        "{ lo = 0; hi = 0; return; }",
        "  const int cmc_t = (int)cmc_tl;",
        f"  if ({guard}) {{",
        f"    lo = cmc_key_clamp({lo.code}, s.len);",
        f"    hi = cmc_key_clamp({hi.code}, s.len);",
        "  } else {", "    lo = 0; hi = 0;", "  }",
        "  return;",
        "}",
    ]


def _other_term_code(others: Sequence[tuple[int, int]]) -> str:
    """other_term(n): the n-th instance outside the grid families, a constant expression."""
    starts = [sum(c for _, c in others[:i]) for i in range(len(others))]
    code = "0"
    for (first, count), at in reversed(list(zip(others, starts, strict=True))):
        code = f"(n < {at + count} ? {first} + (n - {at}) : {code})"
    return code


def _check_table(table: IntervalTable) -> None:
    for t in table.terms:
        parts: list[Expr | Pred] = [t.guard, t.lo.expr, t.hi.expr]
        if any(uses_k(x) for x in parts):
            raise ValueError("interval table guards and bounds must be free of k")
        if t.family is not None:
            f = t.family
            if not (I32_MIN <= f.start <= I32_MAX and I32_MIN <= f.stop <= I32_MAX):
                raise ValueError("family index range must fit int32")
            for _, vals in f.tables:
                if any(not I32_MIN <= v <= I32_MAX for v in vals):
                    raise ValueError("family table values must fit int32")


def build_hooks(table: IntervalTable, tiling: Tiling = LINEAR, prefix: str = "cmc_tab") -> Hooks:
    """Generate the hook pieces for `table` (pure; deterministic). `prefix` names its
    family tables, so that two hook structs (forward and transposed) share one source."""
    mask = table.mask
    _check_table(table)
    params = {check_identifier(p.name): p.kind for p in mask.params}
    ranges = {check_identifier(p.name): p.range.extremes() for p in mask.params
              if p.kind != "segments"}
    scope = _Scope(params, ranges=ranges)

    seq_fields = ["int len;", "cmc_i64 tok0;"]
    seq_lines = [
        "const int* cu = reinterpret_cast<const int*>(d.cu_seqlens);",
        "s.tok0 = cu[b];",
        "s.len = cu[b + 1] - cu[b];",
    ]
    for p in mask.params:
        n = check_identifier(p.name)
        if p.kind == "scalar":
            seq_fields.append(f"int p_{n};  // scalar")
            seq_lines.append(f"s.p_{n} = d.p_{n};")
        elif p.kind == "batch":
            seq_fields.append(f"int p_{n};  // int[batch]")
            seq_lines.append(f"s.p_{n} = reinterpret_cast<const int*>(d.p_{n})[b];")
        else:
            seq_fields.append(f"const int* sg_{n};  // segment starts of this sequence")
            seq_fields.append(f"int sn_{n};")
            seq_lines.append(
                f"{{ const int* off = reinterpret_cast<const int*>(d.p_{n}_offsets); "
                f"s.sg_{n} = reinterpret_cast<const int*>(d.p_{n}_starts) + off[b]; "
                f"s.sn_{n} = off[b + 1] - off[b]; }}"
            )

    # Element predicate and row context.
    ex = _ExactGen(scope)
    visible = ex.pred(mask.predicate, "elem")

    # Terms.
    counts = [(t.family.stop - t.family.start) if t.family else 1 for t in table.terms]
    counts = [max(0, c) for c in counts]
    terms: tuple[Term, ...] = table.terms
    if sum(counts) > MAX_TERMS:  # lower turns such a table into one catch-all term, said so
        raise ValueError(f"{sum(counts)} term instances; lower keeps at most {MAX_TERMS}")
    tables: list[str] = []
    blocks: list[str] = []
    spans: list[str] = []
    grid_blocks: list[str] = []
    grid_ranges: list[str] = []
    others: list[tuple[int, int]] = []
    grid_terms: list[tuple[Term, _Scope, str]] = []
    patch = tiling.kind == "patch"
    # the grid whose families grid_span covers: the patch tiling's, or a linear tiling's
    # mask grid when that pays (its residual-free families only)
    span_grid = ((tiling.origin, tiling.width) if patch
                 else _linear_span_grid(table, counts) if tiling.kind == "linear" else None)
    base = 0
    for ti, (term, count) in enumerate(zip(terms, counts, strict=True)):
        tscope = scope
        tabs: dict[str, str] = {}
        if term.family is not None:
            fam = term.family
            tscope = _Scope(params, fam.index, (fam.start, fam.stop - 1), {}, ranges)
            for tj, (tname, vals) in enumerate(fam.tables):
                arr = f"{prefix}{ti}_{tj}"
                tabs[tname] = arr
                tscope.tables[tname] = (arr, tuple(vals))
                body = _wrap_ints(vals)
                tables.append(f"CMC_TABLE int {arr}[{max(1, len(vals))}] = {{\n"
                              + _indent(body, 2) + "\n};")
        if count == 0:
            continue
        comment = f"term {ti}" + (f", family of {count}" if term.family else "")
        if term.residual is not None:
            comment += ", with residual"
        blocks.append("\n".join(_term_block(term, base, count, tscope, tabs, comment)))
        ex.scope = tscope
        spans.append("\n".join(_span_block(term, base, count, ex, comment)))
        fg = term.family.grid if term.family is not None else None
        if (fg is not None and (fg.origin, fg.width) == span_grid
                and (patch or term.residual is None)):
            grid_terms.append((term, tscope, comment))
            grid_ranges.append(f"(i >= {base} && i < {base + count})")
        else:
            others.append((base, count))
        ex.scope = scope
        base += count
    # grid_span runs in a patch-tiled kernel, whose launches are refused past
    # tiling.max_len(), or a linear one (no bound): its integers are typed for that bound
    # (int32 where it fits). Last,
    # so that a row field it adds (typed for the bound) is never used by another hook.
    if grid_terms:
        ex.len_max = tiling.max_len() or I32_MAX
        for term, tscope, comment in grid_terms:
            ex.scope = tscope
            grid_blocks.append("\n".join(_grid_block(term, len(grid_blocks), ex, comment)))
        ex.scope = scope
        ex.len_max = I32_MAX
    other_terms = tuple(others) if grid_blocks else ()
    grid = span_grid if grid_blocks and span_grid else (0, 128)
    span_words, why = _span_words(table, counts, len(grid_blocks),
                                  sum(c for _, c in other_terms), grid[1])
    return Hooks(
        n_terms=base,
        tables=tuple(tables),
        seq_fields=tuple(seq_fields),
        seq_lines=tuple(seq_lines),
        row_fields=tuple(ex.row_fields()),
        row_lines=tuple(ex.row_lines),
        visible=visible,
        term_blocks=tuple(blocks),
        span_blocks=tuple(spans),
        tiling=tiling if grid_blocks or tiling.kind == "linear" else replace(
            LINEAR, units=tiling.units, reason=f"{tiling.reason}; no grid family on the "
            f"tiling's grid: linear tiles"),
        grid_terms=" || ".join(grid_ranges) or "false",
        grid_blocks=tuple(grid_blocks),
        other_terms=other_terms,
        span_grid=grid,
        span_words=span_words,
        span_words_why=why,
        row_split=row_split_grid(table),
    )


# The plan builders cut a tile's rows into at most this many grid rows (more: one part).
ROW_SPLIT_PARTS = 4


def row_split_grid(table: IntervalTable) -> tuple[int, int]:
    """The grid (origin, width) at whose rows the plan builders cut a tile's rows
    (cmc_plan_terms: each part's term() on a thread of its own, united), or (0, 0): the
    table's grid (tiling.grid_of), on which a grid mask's rows divide. Interval arithmetic
    over rows of several grid rows loses what ties a row's quotient to its remainder (q / W
    and q % W each take their whole range): natten_clamped's transposed term ranges touched
    10-14 % more kv items than have a visible pair (751 against 680 at 4K), video3d's
    forward ranges 16-19 % more key tiles, and exactly those by grid row (2026-12-06, a host
    count). Cutting is sound for any cut points: each part's ranges hold for its rows, the
    touched hull of the parts for all of them, and the intersection of their full ranges
    too. term() itself does not cut (the patch plans call it per box, within a grid row:
    the cut inlined there spilled the forward producer's 56-296 bytes)."""
    g = grid_of(table)
    return (g.origin, g.width) if g is not None else (0, 0)


# Span words (_span_words): at most this many spans per key row and item (their code is
# inlined per span: natten_clamped's 12 families x 2 grid rows spilled 32 bytes in the patch
# kv, 2026-12-05).
SPAN_WORD_SPANS = 10


def _span_words(table: IntervalTable, counts: Sequence[int], grid_families: int,
                others: int, width: int) -> tuple[bool, str]:
    """Whether the sm90 backward kinds mask a partial linear item (64 consecutive columns: the
    kv's queries with the transposed hooks, the deterministic dq's keys with the forward's) by
    span words of these hooks (templates/cmc/attn_bwd_sm90.cuh, cmc_bwd_kv_span_word) instead
    of the predicate per element, and why: a grid mask (its predicate divides and reduces per
    element) whose terms are all residual-free, with at most SPAN_WORD_SPANS spans per key
    row and item: grid families times the grid rows 64 columns meet, plus the other
    instances, or every instance. Other masks keep the predicate, which costs them less
    than the spans (run 27: span words made causal's backward 3-7 % slower, hstu's and
    shared_prefix's no faster)."""
    if grid_of(table) is None:
        return False, "not a grid mask: its predicate is cheaper than spans"
    if any(t.residual is not None for t in table.terms):
        return False, "a term has a residual"
    if grid_families:
        rows = (64 - 1) // width + 2
        spans = grid_families * rows + others
        what = (f"{grid_families} grid famil{'y' if grid_families == 1 else 'ies'} x {rows} "
                f"grid rows + {others} other instance{'' if others == 1 else 's'}")
    else:
        spans = sum(counts)
        what = f"{spans} instance{'' if spans == 1 else 's'}"
    if spans > SPAN_WORD_SPANS:
        return False, f"{spans} spans per key row and item, more than {SPAN_WORD_SPANS}: {what}"
    return True, f"{spans} spans per key row and item: {what}"


def _linear_span_grid(table: IntervalTable, counts: Sequence[int]) -> tuple[int, int] | None:
    """The grid (origin, width) whose residual-free families a linear tiling's partial tiles
    OR by grid row (grid_span, as the patch kernel does) instead of by instance, or None:
    when a 128-key tile meets fewer (grid rows x families) than those families have
    instances, by a factor of 2: each family's span code is inlined per row, and video3d's
    three families (15 rows x families against 27 instances) spilled 96 bytes in every
    register split (2026-12-05). Measured (kernel notes, "Unmasked patches: the rule
    withdrawn"): per instance, the linear kernel ran g_grid77_w96_r40 (79 instances) 2.2 x
    slower than per grid row."""
    grid = grid_of(table)
    if grid is None:
        return None
    fams = [c for t, c in zip(table.terms, counts, strict=True)
            if t.family is not None and t.family.grid is not None and t.residual is None]
    rows = (TILE - 1) // grid.width + 2  # grid rows one tile of TILE consecutive keys meets
    return (grid.origin, grid.width) if fams and 2 * rows * len(fams) < sum(fams) else None


# =========================================================================== template


def _read_resource(name: str) -> str:
    return read_text("cmc.templates", name)


def _env() -> jinja2.Environment:
    return jinja_env()


def _probe_value(ctype: str, tag: int) -> str:
    pattern = 0x0101010101010101 * tag
    if ctype == "uint64_t":
        return f"0x{pattern:016x}ULL"
    if ctype == "int64_t":
        return f"(int64_t)0x{pattern:016x}ULL"
    small = 0x01010101 * tag
    if ctype == "int32_t":
        return f"(int32_t)0x{small:08x}u"
    if ctype == "float":
        return f"__builtin_bit_cast(float, 0x{small:08x}u)"
    raise ValueError(f"unknown descriptor C type {ctype!r}")


def _layout_fields(layout: DescriptorLayout) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, f in enumerate(layout.fields):
        tag = i % 250 + 1
        out.append({
            "name": check_identifier(f.name),
            "offset": int(f.offset),
            "last": int(f.offset + f.size - 1),
            "tag": tag,
            "probe": _probe_value(f.ctype, tag),
        })
    return out


def _variant(kind: KernelKind, archs: tuple[str, ...], name: str, dtype: str, head_dim: int,
             n_terms: int, tiling: Tiling, below_len: int = 0,
             n_terms_t: int = 0) -> KernelVariant:
    """Kind `kind`'s variant for (dtype, head dim): its plan sized by the term count of the
    table it walks (n_terms, or n_terms_t for a kind that walks the transposed one), on
    `tiling` if the kind follows the tiling (else linear tiles); `below_len`: a kernel for
    sequences shorter than that (KernelSpec.variant_symbol, variant_tag)."""
    s = SPECS[kind]
    own = tiling if s.tiled else LINEAR
    if s.walks == "transposed":
        n_terms = n_terms_t
    return KernelVariant(
        symbol=s.variant_symbol(name, dtype, head_dim, below_len > 0),
        dtype=dtype,
        head_dim=head_dim,
        block_m=s.block_m,
        block_n=s.block_n,
        threads=s.threads[head_dim],
        smem_bytes=s.smem(head_dim, s.plan_ints(n_terms, patch_key_tiles(own))),
        kernel=kind,
        archs=archs,
        tiling=own,
        below_len=below_len,
    )


def _variants(name: str, dtypes: Sequence[str], head_dims: Sequence[int],
              archs: Sequence[str], n_terms: int, kernel: str,
              tiling: Tiling = LINEAR) -> tuple[KernelVariant, ...]:
    """One variant per (dtype, head dim) and forward kind (kernels.forward_kinds)."""
    kinds = forward_kinds(tuple(archs), kernel)
    out = []
    for dt in dict.fromkeys(dtypes):
        if dt not in artifacts.DTYPES:
            raise ValueError(f"unsupported dtype {dt!r} (supported: {artifacts.DTYPES})")
        for hd in dict.fromkeys(head_dims):
            if hd not in artifacts.HEAD_DIMS:
                raise ValueError(f"unsupported head dim {hd!r} (supported: {artifacts.HEAD_DIMS})")
            out += [_variant(kind, kind_archs, name, dt, int(hd), n_terms, tiling)
                    for kind, kind_archs in kinds]
    if not out:
        raise ValueError("no kernel variants requested")
    return tuple(out)


def _kernel_facts(tiling: Tiling) -> Tiling:
    """The tiling without its reason: what the kernels compile from."""
    return replace(tiling, reason="")


def header_text(kind_spec: KernelSpec) -> str:
    """A kind's hand-written kernel as the .cu inlines it: its header parts, in order."""
    return "\n\n".join(_read_resource(h).rstrip("\n") for h in kind_spec.headers)


def sm90_header_text() -> str:
    """The sm90 forward's header parts as the .cu inlines them (the ablation tools edit this)."""
    return header_text(SM90)


def _backward_variants(name: str, dtypes: Sequence[str], head_dims: Sequence[int],
                       archs: Sequence[str], n_terms: int, n_terms_t: int,
                       bwd_kernel: str = "auto",
                       tiling: Tiling = LINEAR) -> tuple[KernelVariant, ...]:
    """One variant per (dtype, head dim) and backward kind (kernels.backward_kinds, with
    `bwd_kernel`'s choice), each its own cubin; a kind's plan is sized by the table it walks
    (kv: the transposed one); the kinds that follow the tiling (bwd_dq_sm90) get `tiling`."""
    kinds = backward_kinds(tuple(archs), bwd_kernel)
    out = []
    for dt in dict.fromkeys(dtypes):
        for hd in dict.fromkeys(head_dims):
            out += [_variant(kind, kind_archs, name, dt, int(hd), n_terms, tiling,
                             n_terms_t=n_terms_t)
                    for kind, kind_archs in kinds]
    return tuple(out)


def _short_variants(name: str, variants: Sequence[KernelVariant], n_terms: int, n_terms_t: int,
                    tiling: Tiling) -> tuple[KernelVariant, ...]:
    """Each variant on a patch tiling with a start length again on linear `tiling`, for
    sequences shorter than that start (below_len = min_len): there the patch kernel cuts them
    into linear tiles too, but pays the patch path (its plan code, 16-token TMA boxes)."""
    return tuple(
        _variant(v.kernel, v.archs, name, v.dtype, v.head_dim, n_terms, tiling,
                 below_len=v.tiling.min_len, n_terms_t=n_terms_t)
        for v in variants
        if v.tiling.kind == "patch" and v.tiling.min_len > 0)


KV_MASK_SYMBOL = "cmc_patch_mask_words_t"
# The kv kinds that read the forward's tile masks in kv's layout (cmc_hooks_t's accessors).
KV_SM90_KINDS = (KernelKind.BWD_KV_SM90, KernelKind.BWD_KV_SM90_WS)
KV_OFFSET_MASK_SYMBOL = "cmc_offset_mask_words_t"


def _mask_guard(variants: Sequence[KernelVariant], kinds: Sequence[KernelKind]) -> str:
    """The preprocessor condition under which a tile mask table is compiled: the host build
    and the variants of `kinds`, which read it. Every other cubin of NAME.cu leaves the table
    out (77 classes are 154 KiB per table) and its hooks leave out the accessor, so a variant
    that did read it would not compile."""
    return " || ".join(["defined(CMC_HOST)", *(f"defined({v.define})" for v in variants
                                                if v.kernel in kinds)])


def _backward_parts(variants: Sequence[KernelVariant], hooks_t: Hooks,
                    struct_name: str, tiling: Tiling = LINEAR) -> dict[str, object]:
    """One set's transposed hooks in NAME.cu: with bwd_kv_sm90 (or its ws kind) and the
    forward's tile masks also those masks in kv's layout (sm90_kv_mask_words): patch masks
    (`tiling.masks`) as KV_MASK_SYMBOL and `cmc_hooks_t::patch_masks_t()`, linear offset masks
    (`tiling.offset_masks`, with or without a band) as KV_OFFSET_MASK_SYMBOL and
    `cmc_hooks_t::offset_masks_t()`."""
    kv = any(v.kernel in KV_SM90_KINDS for v in variants)
    kv_masks = kv and tiling.masks is not None
    kv_offset = kv and tiling.offset_masks is not None
    return {
        "tables": list(hooks_t.tables),
        "mask_table": "\n\n".join(t for t in (
            _mask_table(tiling.masks, KV_MASK_SYMBOL, kv=True) if kv_masks else "",
            _mask_table(tiling.offset_masks, KV_OFFSET_MASK_SYMBOL, kv=True) if kv_offset else "",
        ) if t),
        "mask_guard": _mask_guard(variants, KV_SM90_KINDS),
        "hooks": render_hooks(hooks_t, struct_name, "cmc_hooks_t",
                              KV_MASK_SYMBOL if kv_masks else None,
                              KV_OFFSET_MASK_SYMBOL if kv_offset else None),
    }


def _backward_entry(v: KernelVariant) -> dict[str, object]:
    """A backward variant's entry point in NAME.cu."""
    return {
        "symbol": check_identifier(v.symbol),
        "define": v.define,
        "threads": int(v.threads),
        "smem_bytes": int(v.smem_bytes),
        "threads_expr": SPECS[v.kernel].threads_expr.format(head_dim=int(v.head_dim)),
        "smem_expr": SPECS[v.kernel].smem_expr.format(head_dim=int(v.head_dim)),
        "maps": "maps" in SPECS[v.kernel].params,
        "entry": SPECS[v.kernel].entry.format(
            head_dim=int(v.head_dim), bf16="true" if v.dtype == "bf16" else "false"),
    }


SHORT_SET = "CMC_SHORT_SET"  # defined in the cubins of the kernels for short sequences


@dataclass(frozen=True)
class HookSet:
    """The hooks one set of kernels reads: the forward table on the forward's tiling (cmc_hooks),
    on the backward's where that differs (cmc_hooks_b), and the transposed table (cmc_hooks_t,
    None: forward only). NAME.cu holds the main set and, where a patch tiling has a start
    length, the set for short sequences on linear tiles, each under its own preprocessor
    branch, so both keep these names."""

    hooks: Hooks
    hooks_t: Hooks | None = None
    hooks_b: Hooks | None = None


def _hook_set(variants: Sequence[KernelVariant], hs: HookSet, struct_name: str,
              guard: str) -> dict[str, object]:
    """One set's part of NAME.cu (`variants`: the set's own, which its mask guards name)."""
    bwd = [v for v in variants if SPECS[v.kernel].pass_ is Pass.BACKWARD]
    own_b = hs.hooks_b if bwd else None
    fwd_readers = (SM90.kind,) if own_b else (SM90.kind, KernelKind.BWD_DQ_SM90)
    return {
        "guard": guard,
        "tables": list(hs.hooks.tables),
        "mask_table": _mask_tables(hs.hooks.tiling),
        "mask_guard": _mask_guard(variants, fwd_readers),
        "hooks": render_hooks(hs.hooks, struct_name, "cmc_hooks"),
        "hooks_b": ({
            "tables": list(own_b.tables),
            "mask_table": _mask_tables(own_b.tiling, "_b"),
            "mask_guard": _mask_guard(variants, (KernelKind.BWD_DQ_SM90,)),
            "hooks": render_hooks(own_b, struct_name, "cmc_hooks_b", suffix="_b"),
            "tiling": own_b.tiling.kind,
        } if own_b else None),
        "backward": (_backward_parts(bwd, hs.hooks_t, struct_name,
                                     (hs.hooks_b or hs.hooks).tiling)
                     if hs.hooks_t is not None and bwd else None),
    }


def render(table: IntervalTable, variants: Sequence[KernelVariant], hooks: Hooks,
           hooks_t: Hooks | None = None, hooks_b: Hooks | None = None,
           short: HookSet | None = None, dq_layout: str = "token") -> str:
    """NAME.cu; with `hooks_t` (the transposed table's hooks) also the backward variants, and
    with `hooks_b` the forward table's hooks on the backward's own tiling as cmc_hooks_b (else
    cmc_hooks_b is cmc_hooks). `short`: the hooks of the variants for short sequences
    (below_len), on linear tiles, compiled where SHORT_SET is defined."""
    mask = table.mask
    name = check_identifier(mask.name)
    layout = descriptor_layout(mask)
    struct_name = check_identifier(layout.struct_name)
    tmpl = _env().get_template(TEMPLATE)
    fwd = [v for v in variants if SPECS[v.kernel].pass_ is Pass.FORWARD]
    bwd = [v for v in variants if SPECS[v.kernel].pass_ is Pass.BACKWARD]
    main_v = [v for v in variants if not v.below_len]
    short_v = [v for v in variants if v.below_len]
    if short_v and short is None:
        raise ValueError("variants for short sequences need the short set's hooks")
    sets = [_hook_set(main_v, HookSet(hooks, hooks_t, hooks_b), struct_name,
                      f"#if !defined({SHORT_SET})" if short_v else "")]
    if short_v:
        assert short is not None
        sets.append(_hook_set(short_v, short, struct_name,
                              f"#else  // {SHORT_SET}: linear tiles, for sequences below the "
                              "patch tilings' start length"))
    return tmpl.render(
        mask_name=name,
        doc=sanitize_doc(mask.doc),
        struct_name=check_identifier(layout.struct_name),
        desc_struct=layout.c_struct(),
        desc_size=int(layout.size),
        fields=_layout_fields(layout),
        kernel_header=header_text(PORTABLE),
        sm90_header=(header_text(SM90)
                     if any(v.kernel is SM90.kind for v in fwd) else ""),
        kinds=KernelKind,
        block_m=PORTABLE.block_m,
        block_n=PORTABLE.block_n,
        n_terms=hooks.n_terms,
        short_set=SHORT_SET,
        short_defines=[v.define for v in short_v],
        sets=sets,
        backward=({
            "header": "\n\n".join(_read_resource(h).rstrip("\n") for h in dict.fromkeys(
                h for v in bwd for h in SPECS[v.kernel].headers)),
            "variants": [_backward_entry(v) for v in bwd],
            "dq_block64": dq_layout == "block64",
            "heavy_keys": hooks_t.tiling.heavy_tiles,
        } if hooks_t is not None and bwd else None),
        variants=[{
            "symbol": check_identifier(v.symbol),
            "define": v.define,
            "kernel": v.kernel,
            "bf16": "true" if v.dtype == "bf16" else "false",
            "head_dim": int(v.head_dim),
            "threads": int(v.threads),
            "mt": rows_per_warp(int(v.head_dim)) // 16,
            "smem_bytes": int(v.smem_bytes),
        } for v in fwd],
    )


def render_hooks(hooks: Hooks, struct_name: str, hooks_name: str,
                 masks_t: str | None = None, offset_masks_t: str | None = None,
                 suffix: str = "") -> str:
    """The hook struct `hooks_name` (its tables are rendered by the caller, once each);
    `masks_t`, `offset_masks_t`: the symbols of the forward's patch or linear offset masks in
    bwd_kv_sm90's layout (patch_masks_t(), offset_masks_t()); `suffix`: its own mask tables'
    (_mask_tables), "_b" for cmc_hooks_b, whose tables CMC_BWD_MASKS guards."""
    return _env().get_template(HOOKS_TEMPLATE).render(
        hooks_name=hooks_name,
        mask_suffix=suffix,
        masks_macro="CMC_BWD_MASKS" if suffix else "CMC_FWD_MASKS",
        masks_t=masks_t,
        offset_masks_t=offset_masks_t,
        struct_name=struct_name,
        n_terms=hooks.n_terms,
        seq_fields=_indent(hooks.seq_fields, 4),
        seq_lines=_indent(hooks.seq_lines, 4),
        row_fields=_indent(hooks.row_fields, 4) if hooks.row_fields else "",
        row_lines=_indent(hooks.row_lines, 4) if hooks.row_lines else "",
        visible=hooks.visible,
        term_blocks=[_indent(b.split("\n"), 4) for b in hooks.term_blocks],
        span_blocks=[_indent(b.split("\n"), 4) for b in hooks.span_blocks],
        tiling=hooks.tiling,
        patch=1 if hooks.tiling.kind == "patch" else 0,
        masks=hooks.tiling.masks,
        offset_masks=hooks.tiling.offset_masks,
        grid_terms=hooks.grid_terms,
        grid_blocks=[_indent(b.split("\n"), 4) for b in hooks.grid_blocks],
        n_other=sum(c for _, c in hooks.other_terms),
        other_term=_other_term_code(hooks.other_terms),
        span_grid=hooks.span_grid,
        span_words=1 if hooks.span_words else 0,
        row_split=hooks.row_split,
        row_split_parts=ROW_SPLIT_PARTS,
    ).rstrip("\n")


def dq_layout_refusal(dq_layout: str, bwd_kernel: str, bwd_tiling: Tiling) -> str:
    """Why the backward kinds cannot share dq_accum in `dq_layout` ("" where they can):
    "block64" takes the ws and portable kinds on linear tilings (a patch item's rows are not
    one block; the lockstep kv adds token-major)."""
    if dq_layout == "block64":
        if bwd_kernel == "lockstep":
            return "the lockstep kv (--bwd-kernel lockstep) adds dQ token-major only"
        if bwd_tiling.kind != "linear":
            return (f"the backward's tiling is {bwd_tiling.kind} (patch items' rows are not one "
                    "64-row block); it needs linear tiles (--tiling linear)")
    return ""


def _heavy_keys(transposed: IntervalTable, tiling: Tiling, bwd_tiling: Tiling | None,
                from_len: int | None) -> Tiling:
    """The transposed hooks' tiling: linear, naming the heavy key tiles (key tiles every
    query sees, tiling.heavy_tiles of the transposed table; for a patch backward tiling at
    most its linear tiles before the grid origin) that the ws kv kinds can launch first
    (None: --kv-heavy-from off)."""
    if from_len is None:
        return LINEAR
    from .tiling import with_heavy_first

    n = with_heavy_first(transposed, bwd_tiling or tiling).heavy_tiles
    return replace(LINEAR, heavy_tiles=n) if n else LINEAR


def emit(
    table: IntervalTable,
    dtypes: Sequence[str] = ("bf16",),
    head_dims: Sequence[int] = (64, 128),
    archs: Sequence[str] = artifacts.DEFAULT_ARCHS,
    kernel: str = "auto",
    *,
    tiling: Tiling,
    backward: bool = False,
    bwd_kernel: str = "auto",
    bwd_tiling: Tiling | None = None,
    short_tiling: Tiling | None = None,
    dq_layout: str = "token",
    kv_heavy_from: int | None = None,
) -> EmittedSource:
    """The CUDA source of every (dtype, head dim) variant for `table`: each arch's kind
    (kernels.forward_kinds: the sm90 (wgmma) kernel for sm_90a when kernel == "auto", the
    portable (mma.sync) kernel elsewhere). `tiling` is the tile stage's, used by the kinds
    that follow it (driver.tile). `backward` adds the transposed table's hooks (`cmc_hooks_t`),
    the backward header and one variant per backward kind, dtype and head dim; without it
    the text is the forward's alone. `bwd_tiling` is the backward kinds' (driver.backward_tile;
    None: `tiling`); where it differs, the forward table's hooks are rendered a second time on
    it (cmc_hooks_b). `bwd_kernel` picks the backward kinds (kernels.backward_kinds with the
    backward tiling's kind): on sm_90a the wgmma kernels, whose headers are inlined only then,
    "portable" cmc_bwd everywhere. `short_tiling` (driver.short_tile: linear tiles) adds, for
    every variant on a patch tiling with a start length (min_len), the same kind on it for
    sequences shorter than that (below_len; its hooks under SHORT_SET). `dq_layout` is
    dq_accum's (abi.DQ_LAYOUTS; dq_layout_refusal says where "block64" is not available), or
    "auto": block64 where it is available, else token; the result names the one chosen.
    `kv_heavy_from`: the ws kv kinds can launch the key tiles every query sees first
    (_heavy_keys, CMC_WS_HEAVY_FIRST), and the launcher asks for it from this max_len on
    (the result's kv_order; None: grid order only)."""
    if kernel not in artifacts.KERNELS:
        raise ValueError(f"unsupported kernel {kernel!r} (supported: {artifacts.KERNELS})")
    if bwd_kernel not in BWD_KERNELS:
        raise ValueError(f"unsupported backward kernel {bwd_kernel!r} (supported: {BWD_KERNELS})")
    for a in archs:
        if a not in artifacts.SUPPORTED_ARCHS:
            raise ValueError(f"unsupported arch {a!r} (supported: {artifacts.SUPPORTED_ARCHS})")
    name = check_identifier(table.mask.name)
    hooks = build_hooks(table, tiling)
    variants = _variants(name, dtypes, head_dims, tuple(dict.fromkeys(archs)), hooks.n_terms,
                         kernel, hooks.tiling)
    transposed = None
    hooks_t = None
    hooks_b = None
    if backward:
        from .transpose import transpose

        transposed = transpose(table)
        hooks_t = build_hooks(transposed, _heavy_keys(transposed, tiling, bwd_tiling,
                                                      kv_heavy_from), prefix="cmc_tabT")
        if bwd_tiling is not None and _kernel_facts(bwd_tiling) != _kernel_facts(tiling):
            hooks_b = build_hooks(table, bwd_tiling, prefix="cmc_tabB")
        b_tiling = (hooks_b.tiling if hooks_b is not None
                    else bwd_tiling if bwd_tiling is not None and hooks.tiling is tiling
                    else hooks.tiling)
        variants += _backward_variants(name, dtypes, head_dims, tuple(dict.fromkeys(archs)),
                                       hooks.n_terms, hooks_t.n_terms, bwd_kernel, b_tiling)
    short = None
    if short_tiling is not None:
        if short_tiling.kind != "linear":
            raise ValueError("the kernels for short sequences are on linear tiles")
        hooks_s = build_hooks(table, short_tiling)
        short_v = _short_variants(name, variants, hooks_s.n_terms,
                                  hooks_t.n_terms if hooks_t is not None else 0, hooks_s.tiling)
        if short_v:
            variants += short_v
            short = HookSet(hooks_s, hooks_t)
    if dq_layout not in (*DQ_LAYOUTS, "auto"):
        raise ValueError(f"unsupported dq_accum layout {dq_layout!r} (supported: "
                         f"{[*DQ_LAYOUTS, 'auto']})")
    if not backward:
        dq_layout = "token"  # no workspace: the forward-only text and manifest name none
    elif dq_layout == "auto":
        dq_layout = "token" if dq_layout_refusal("block64", bwd_kernel, b_tiling) else "block64"
    elif why := dq_layout_refusal(dq_layout, bwd_kernel, b_tiling):
        raise ValueError(f"dq_accum layout {dq_layout}: {why}")
    text = render(table, variants, hooks, hooks_t, hooks_b, short, dq_layout)
    return EmittedSource(
        table=table,
        layout=descriptor_layout(table.mask),
        filename=f"{name}.cu",
        text=text,
        variants=variants,
        transposed=transposed,
        dq_layout=dq_layout,
        kv_order=(KvOrder(hooks_t.tiling.heavy_tiles, kv_heavy_from)
                  if hooks_t is not None and hooks_t.tiling.heavy_tiles
                  and kv_heavy_from is not None
                  and any(v.kernel == KernelKind.BWD_KV_SM90_WS for v in variants) else None),
    )
