"""The checked mask and its interval table: the frozen values passed between stages.

Stage contract (see docs/architecture.md):
    parse:  str            -> ast.Module        (positions kept, names unresolved)
    check:  ast.Module     -> Mask              (names resolved, lets/regions/consts inlined)
    lower:  Mask           -> IntervalTable     (row terms with key intervals, residuals)
    emit:   IntervalTable  -> EmittedSource     (CUDA text, kernel specs, descriptor layout)
    build:  EmittedSource  -> BuiltKernels      (cubins per arch/variant via NVRTC)
    package: BuiltKernels  -> artifact folder   (manifest.json, NAME.cu, cubins, NAME.h)

Expressions here are position-free: the checker has already reported every problem with its
position, so later stages only meet well-typed, resolved trees.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from .contract import DEFAULT_RANGE, ParamRange
from .kernels import MAX_KEY_TILES, TILE, TileShape  # noqa: F401  (MAX_KEY_TILES: re-exported)

# --------------------------------------------------------------------------- expressions

IntOp = Literal["+", "-", "*", "/", "%"]
CmpOp = Literal["<", "<=", ">", ">=", "==", "!="]
ParamKind = Literal["scalar", "batch", "segments"]
SegFnName = Literal["seg", "seg_start", "seg_end"]


@dataclass(frozen=True)
class Const:
    value: int


@dataclass(frozen=True)
class Var:
    """q, k or len (positions inside the current sequence; len is its length).

    Families in an interval table also use their index variable (see Family.index).
    """

    name: str


@dataclass(frozen=True)
class ParamRef:
    """A run-time int parameter: a scalar, or the current sequence's value of an int[batch]."""

    name: str


@dataclass(frozen=True)
class BinOp:
    """Integer arithmetic; / and % are floor division and its remainder (Python semantics)."""

    op: IntOp
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Neg:
    a: Expr


@dataclass(frozen=True)
class Call:
    fn: Literal["min", "max", "abs"]
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class SegFn:
    """seg(S, x), seg_start(S, x), seg_end(S, x) for a `segments` parameter S."""

    fn: SegFnName
    segments: str
    arg: Expr


@dataclass(frozen=True)
class TableRef:
    """A compile-time table indexed by an expression (used only inside interval families)."""

    table: str
    index: Expr


Expr = Const | Var | ParamRef | BinOp | Neg | Call | SegFn | TableRef

# --------------------------------------------------------------------------- predicates


@dataclass(frozen=True)
class BoolConst:
    value: bool


@dataclass(frozen=True)
class Cmp:
    op: CmpOp
    a: Expr
    b: Expr


@dataclass(frozen=True)
class And:
    items: tuple[Pred, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Pred, ...]


@dataclass(frozen=True)
class Not:
    a: Pred


@dataclass(frozen=True)
class Same:
    """same(S, a, b): a and b lie in the same segment of S."""

    segments: str
    a: Expr
    b: Expr


Pred = BoolConst | Cmp | And | Or | Not | Same

TRUE = BoolConst(True)
FALSE = BoolConst(False)

# --------------------------------------------------------------------------- checked mask


@dataclass(frozen=True)
class ParamDecl:
    """A run-time parameter; `range` is the declared contract of an int one (unused for
    segments, whose starts always lie in [0, len])."""

    name: str
    kind: ParamKind
    range: ParamRange = DEFAULT_RANGE


@dataclass(frozen=True)
class Mask:
    """A checked mask: visible(q, k) = (OR allows) AND NOT (OR denies), for 0 <= q, k < len."""

    name: str
    doc: str
    source: str  # the .mask text it came from
    filename: str
    consts: tuple[tuple[str, int], ...]  # after -D overrides, in declaration order
    params: tuple[ParamDecl, ...]  # in declaration order: this order fixes the descriptor
    allows: tuple[Pred, ...]
    denies: tuple[Pred, ...]

    @property
    def predicate(self) -> Pred:
        allow: Pred = Or(self.allows) if self.allows else FALSE
        if not self.denies:
            return allow
        return And((allow, Not(Or(self.denies))))

    def param(self, name: str) -> ParamDecl:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


def nodes(e: Expr | Pred) -> Iterator[Expr | Pred]:
    """Every node of an expression or predicate tree, e first (pre-order)."""
    yield e
    if isinstance(e, (BinOp, Cmp, Same)):
        yield from nodes(e.a)
        yield from nodes(e.b)
    elif isinstance(e, (Neg, Not)):
        yield from nodes(e.a)
    elif isinstance(e, Call):
        for a in e.args:
            yield from nodes(a)
    elif isinstance(e, SegFn):
        yield from nodes(e.arg)
    elif isinstance(e, TableRef):
        yield from nodes(e.index)
    elif isinstance(e, (And, Or)):
        for x in e.items:
            yield from nodes(x)


# --------------------------------------------------------------------------- interval table

Monotone = Literal["const", "nondec", "noninc", "none"]


@dataclass(frozen=True)
class Bound:
    """A k-free integer expression of q (and len, params, segment lookups of q-terms)."""

    expr: Expr
    monotone: Monotone  # in q, over one sequence


@dataclass(frozen=True)
class GridRow:
    """Where a grid family's instances put their keys: instance t keeps them inside row
    ky = base(q) + step * t of the grid k = origin + ky * width + kx (0 <= kx < width).

    That is what lets a kernel tiled by patches of the grid find, for one key row of a
    patch, the one instance that can reach it, instead of evaluating every instance."""

    origin: int
    width: int
    base: Expr  # k-free and index-free
    step: int  # +1 or -1


@dataclass(frozen=True)
class Family:
    """A term instantiated once per compile-time index value t in [start, stop).

    Expressions of the term refer to the index as Var(index) and to tables as
    TableRef(name, ...), where tables maps each name to its values for t = start .. stop-1.
    """

    index: str
    start: int
    stop: int
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()
    grid: GridRow | None = None


@dataclass(frozen=True)
class Term:
    """For rows q with guard(q): keys in [lo(q), hi(q)) ∩ [0, len), and residual(q, k) if set.

    A term without a residual is exact: every key of its interval is visible. A term with a
    residual over-approximates with its interval and the kernel checks the residual per
    element (tiles it touches are never full).
    """

    guard: Pred
    lo: Bound
    hi: Bound
    residual: Pred | None = None
    family: Family | None = None


@dataclass(frozen=True)
class Residual:
    """Why part of a mask was not turned into exact intervals."""

    reason: str
    where: str  # readable rendering of the part that stayed residual


@dataclass(frozen=True)
class IntervalTable:
    """visible(q, k) == OR over terms of term(q, k), for 0 <= q, k < len (terms may overlap)."""

    mask: Mask
    terms: tuple[Term, ...]
    residuals: tuple[Residual, ...] = field(default=())

    @property
    def exact(self) -> bool:
        return all(t.residual is None for t in self.terms)

    def max_intervals_per_row(self) -> int:
        return sum((t.family.stop - t.family.start) if t.family else 1 for t in self.terms)


TileClass = Literal["empty", "full", "partial"]


# --------------------------------------------------------------------------- tiling (tile stage)

# TILE (query rows and keys per tile of the sm90 kernel) and MAX_KEY_TILES (the bound of a
# patch-tiled kernel's plan) live in cmc/kernels.py, beside TileShape, so that the runtime
# can re-derive max_len and the grid rule without the compiler.


@dataclass(frozen=True)
class PatchInterior:
    """The query patches whose tile masks the tile stage proved when border rows and
    columns of the grid see shifted windows (NATTEN's clamp; cmc/tiling.py,
    `interior_patch_masks`): patch row py >= row_top, patch column in [col_lo, col_hi), and
    `rows_below` whole grid rows below the patch at the sequence's length
    (origin + ((py + 1) * patch_rows + rows_below) * width <= len). Other query patches
    have no mask class. `per_column`: each of those patch columns has its own set of
    classes (a border column's clamped window), px - col_lo sets of PatchMasks' offsets."""

    row_top: int
    rows_below: int
    col_lo: int
    col_hi: int  # exclusive
    per_column: bool = False


@dataclass(frozen=True)
class PatchMasks:
    """The mask of every partial (query patch, key patch) tile pair inside the grid, one per
    patch offset: the tile stage proved it depends only on (dpy, dpx) = key patch - query
    patch, in patch rows and patch columns (cmc/tiling.py, `patch_masks`).

    rows[c * TILE + lr] has bit lk set when local key lk of the key patch is visible from
    local query lr of the query patch (local index = box * patch_cols + column), for the
    class c = (dpy - dpy_lo) * (dpx_hi - dpx_lo) + (dpx - dpx_lo), plus (px - col_lo) times
    offsets() with an interior per column. Offsets outside the two ranges see nothing. Valid
    only when the key patch lies wholly below len, and, with `interior`, only for the query
    patches it names."""

    dpy_lo: int
    dpy_hi: int  # exclusive
    dpx_lo: int
    dpx_hi: int  # exclusive
    rows: tuple[int, ...]
    interior: PatchInterior | None = None  # None: every grid query patch

    @property
    def offsets(self) -> int:
        return (self.dpy_hi - self.dpy_lo) * (self.dpx_hi - self.dpx_lo)

    @property
    def classes(self) -> int:
        i = self.interior
        return self.offsets * (i.col_hi - i.col_lo if i is not None and i.per_column else 1)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"classes": self.classes, "dpy": [self.dpy_lo, self.dpy_hi],
                                  "dpx": [self.dpx_lo, self.dpx_hi]}
        if self.interior is not None:
            i = self.interior
            out["interior"] = {"row_top": i.row_top, "rows_below": i.rows_below,
                               "cols": [i.col_lo, i.col_hi]}
            if i.per_column:
                out["interior"]["per_column"] = True  # type: ignore[index]
        return out

    def tile(self, dpy: int, dpx: int) -> list[int]:
        """The 128 row bitmaps of offset (dpy, dpx) (all zero outside the ranges)."""
        if not (self.dpy_lo <= dpy < self.dpy_hi and self.dpx_lo <= dpx < self.dpx_hi):
            return [0] * TILE
        c = (dpy - self.dpy_lo) * (self.dpx_hi - self.dpx_lo) + (dpx - self.dpx_lo)
        return list(self.rows[c * TILE:(c + 1) * TILE])


@dataclass(frozen=True)
class LinearBand:
    """The tile pairs of a linear tiling whose tile masks the tile stage proved for a grid
    mask (cmc/tiling.py, `lattice_offset_masks`): query tile qt >= tile_top with
    (qt + 1 + tiles_below) * TILE <= len <= max_len, against key tiles kt >= key_tile_lo
    (the first key tile wholly in the grid: the tokens before the origin are not in the
    masks). Other pairs (and every length above max_len) have no mask."""

    tile_top: int
    tiles_below: int
    max_len: int
    key_tile_lo: int = 0

    def holds(self, qt: int, length: int, kt: int | None = None) -> bool:
        return (qt >= self.tile_top and (qt + 1 + self.tiles_below) * TILE <= length
                and length <= self.max_len and (kt is None or kt >= self.key_tile_lo))


@dataclass(frozen=True)
class OffsetMasks:
    """The mask of every partial (query tile, key tile) pair of a linear tiling, one per tile
    offset dt = key tile - query tile: the tile stage proved that moving q and k together by
    a tile leaves the mask unchanged (cmc/tiling.py `offset_masks`, cmc/periodic.py), so the
    pair's mask depends only on dt. Where the offsets are unbounded but the masks repeat past
    some offset, the offsets below lo reuse the first `below` of the table and those from hi
    the last `above` (index()).

    rows[c * TILE + lr] has bit lk set when key kt * TILE + lk is visible from query
    qt * TILE + lr, for the class c = phase * offsets + index(dt) with phase = qt % phases
    (a grid whose width does not divide TILE repeats every `phases` tiles: lattice masks).
    Offsets outside [lo, hi) without a period see nothing. Valid only for a key tile wholly
    below len (the kernel cuts the last one at len)."""

    lo: int
    hi: int  # exclusive
    rows: tuple[int, ...]
    band: LinearBand | None = None  # valid only for the tile pairs it names
    phases: int = 1
    below: int = 0  # offsets dt < lo: those of lo + (dt - lo) mod below (0: none visible)
    above: int = 0  # offsets dt >= hi: those of hi - above + (dt - hi) mod above

    def index(self, dt: int) -> int | None:
        """dt's offset in the table (dt - lo for dt in [lo, hi)), or None: nothing visible."""
        d = dt - self.lo
        if d < 0 and self.below:
            d %= self.below
        n = self.offsets
        if d >= n and self.above:
            d = n - self.above + (d - n) % self.above
        return d if 0 <= d < n else None

    @property
    def offsets(self) -> int:
        return self.hi - self.lo

    @property
    def classes(self) -> int:
        return self.phases * self.offsets

    def tile(self, dt: int, qt: int = 0) -> list[int]:
        """The 128 row bitmaps of offset dt for query tile qt's phase (all zero outside the
        range)."""
        d = self.index(dt)
        if d is None:
            return [0] * TILE
        c = (qt % self.phases) * self.offsets + d
        return list(self.rows[c * TILE:(c + 1) * TILE])


@dataclass(frozen=True)
class Tiling:
    """Which tokens share a 128 x 128 tile of the sm90 kernel (the tile stage's result):
    linear (128 consecutive tokens), or patches of a token grid (cmc/tiling.py)."""

    kind: str  # "linear" | "patch"
    origin: int = 0  # first grid token (patch tilings)
    width: int = 0  # grid width in tokens
    patch_rows: int = 1
    patch_cols: int = TILE
    reason: str = ""
    masks: PatchMasks | None = None  # per-offset tile masks (patch tilings that allow them)
    min_len: int = 0  # patch tilings: shorter sequences are cut into linear tiles only
    units: str = "pairs"  # the work counter's unit: "pairs" of query tiles | single "tiles"
    heavy_tiles: int = 0  # single tiles: the leading query tiles taken first (tiling.with_heavy_first)
    offset_masks: OffsetMasks | None = None  # per-offset tile masks (linear, q - k masks)

    def origin_for(self, length: int) -> int:
        """The grid origin the kernel uses for one sequence: below min_len the whole
        sequence is linear tiles (as if the grid began at its end)."""
        return length if length < self.min_len else self.origin

    @property
    def box_rows(self) -> int:
        """Tokens per TMA box: one grid row of a patch (a linear tile is one box)."""
        return self.patch_cols if self.kind == "patch" else TILE

    def query_tiles(self, length: int) -> int:
        """Tiles of one sequence of `length` tokens (the same for keys)."""
        if self.kind == "linear":
            return -(-length // TILE)
        origin = self.origin_for(length)
        lin = -(-min(length, origin) // TILE)
        rows = -(-max(0, length - origin) // self.width)
        return lin + -(-rows // self.patch_rows) * (self.width // self.patch_cols)

    @property
    def shape(self) -> TileShape:
        """The launch facts (kernels.TileShape): what the grid rule and max_len follow from."""
        return TileShape(kind=self.kind, origin=self.origin, width=self.width,
                         patch_rows=self.patch_rows, patch_cols=self.patch_cols,
                         min_len=self.min_len)

    def max_len(self) -> int | None:
        """The longest sequence the kernel's plan can hold (None: no limit)."""
        return self.shape.max_len()

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "origin": self.origin, "width": self.width,
                "patch_rows": self.patch_rows, "patch_cols": self.patch_cols,
                "reason": self.reason, "min_len": self.min_len, "units": self.units,
                **({} if self.heavy_tiles == 0 else {"heavy_tiles": self.heavy_tiles}),
                "masks": None if self.masks is None else self.masks.to_dict(),
                "offset_masks": None if self.offset_masks is None else {
                    "classes": self.offset_masks.classes,
                    "offsets": [self.offset_masks.lo, self.offset_masks.hi],
                    **({} if self.offset_masks.phases == 1 else
                       {"phases": self.offset_masks.phases}),
                    **({} if self.offset_masks.below == 0 else
                       {"period_below": self.offset_masks.below}),
                    **({} if self.offset_masks.above == 0 else
                       {"period_above": self.offset_masks.above}),
                    **({} if self.offset_masks.band is None else {"band": {
                        "tile_top": self.offset_masks.band.tile_top,
                        "tiles_below": self.offset_masks.band.tiles_below,
                        "max_len": self.offset_masks.band.max_len,
                        **({} if self.offset_masks.band.key_tile_lo == 0 else
                           {"key_tile_lo": self.offset_masks.band.key_tile_lo})}})}}


LINEAR = Tiling("linear", reason="default")
