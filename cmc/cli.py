"""`cmc` command line: check, show, compile, inspect. User errors print one message, no traceback."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from . import __version__, config
from .errors import CmcError, ParamError, UsageError
from .kernels import BWD_KERNELS, BWD_SM90_BM, KV_HEAVY_FROM

F = TypeVar("F", bound=Callable[..., Any])

# Cells (bools) `cmc show` may allocate for its tile classes: len x key tiles, twice, plus the
# tile grid (cmc/tiles.py classify). 2^28 is 512 MiB of working memory.
SHOW_MAX_CELLS = 1 << 28
# cmc show counts the sm90 tiling's computed pairs with query tiles x (len + 1) counters
SHOW_MAX_PAIR_CELLS = 1 << 25


def _echo(message: str, err: bool = False) -> None:
    """click.echo that cannot fail on a file name of undecodable bytes (Python keeps them as
    lone surrogates): they are shown as \\xNN escapes."""
    safe = message.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    click.echo(safe, err=err)


def _reports_errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CmcError as e:
            if config.debug():
                traceback.print_exc()
            _echo(e.format(), err=True)
            sys.exit(e.exit_code)

    return wrapper  # type: ignore[return-value]


def _defines(values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        name, sep, num = v.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = int(num, 0)
        except ValueError:
            raise UsageError(f"-D {v}: expected NAME=INT") from None
        if not -(2**31) <= out[name.strip()] <= 2**31 - 1:
            raise UsageError(f"-D {v}: the value is outside the int32 range "
                             f"[-2147483648, 2147483647]")
    return out


def _csv(value: str, kind: Callable[[str], Any] = str) -> tuple[Any, ...]:
    try:
        return tuple(kind(x.strip()) for x in value.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"cannot read {value!r} as a comma-separated list") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cmc")
def cli() -> None:
    """CompileMask: compile attention-mask descriptions (.mask) into GPU kernels."""


@cli.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-D", "defines", multiple=True, metavar="NAME=INT", help="Override a const.")
@click.option("--quiet", "-q", is_flag=True, help="Only errors and warnings.")
@_reports_errors
def check_cmd(files: tuple[str, ...], defines: tuple[str, ...], quiet: bool) -> None:
    """Check masks and print their interval tables."""
    from .driver import front
    from .render import table_text
    from .transpose import summary as transposed_summary
    from .transpose import transpose

    defs = _defines(defines)
    failed = False
    for f in files:
        try:
            table = front(f, defs)
        except CmcError as e:
            _echo(e.format(), err=True)
            failed = True
            continue
        if quiet:
            for r in table.residuals:
                _echo(f"{f}: warning: residual: {r.reason}: {r.where}", err=True)
        else:
            _echo(f"{f}: ok")
            _echo(table_text(table))
            transposed = transpose(table)
            _echo(f"transposed: {transposed_summary(transposed)}")
            if not table.exact:
                _echo(f"sm90 residual: {_offset_masks_line(table)}")
            else:
                band = _band_masks_line(table)
                if band:
                    _echo(f"sm90 band tile masks: {band}")
            _echo(f"sm90 kv partial items: {_kv_words_line(table, transposed)}")
            cut = _plan_cut_line(table, transposed)
            if cut:
                _echo(f"plans: {cut}")
    if failed:
        sys.exit(1)


def _show_params(mask: Any, items: tuple[str, ...], length: int) -> dict[str, Any]:
    from .ir import Mask

    assert isinstance(mask, Mask)
    given: dict[str, str] = {}
    for it in items:
        name, sep, val = it.partition("=")
        if not sep:
            raise UsageError(f"--param {it}: expected NAME=VALUE")
        if not name.strip():
            raise UsageError(f"--param {it}: the parameter name is empty (expected NAME=VALUE)")
        given[name.strip()] = val
    out: dict[str, Any] = {}
    for p in mask.params:
        if p.name not in given:
            raise UsageError(f"--param {p.name}=... is required (declared {p.kind})")
        raw = given.pop(p.name)
        if p.kind == "segments":
            try:
                out[p.name] = [int(x.strip(), 0) for x in raw.split(",") if x.strip()]
            except ValueError:
                raise UsageError(f"--param {p.name}={raw}: expected comma-separated "
                                 f"integer starts") from None
        else:
            try:
                out[p.name] = int(raw, 0)
            except ValueError:
                raise UsageError(f"--param {p.name}={raw}: expected an integer") from None
    if given:
        raise UsageError(f"unknown parameter(s): {', '.join(sorted(given))}")
    from .oracle import validate_params

    try:
        validate_params(mask, length, out)
    except ParamError as e:
        raise UsageError(f"--param {e}") from None
    return out


@cli.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--len", "length", type=click.IntRange(1, 1 << 20), required=True,
              help="Sequence length (len x len / tile_n is bounded: about 131K at 128x128).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Run-time value; segments as a comma-separated list of starts.")
@click.option("--tile", default="128x128", show_default=True, metavar="MxN")
@click.option("--png", type=click.Path(dir_okay=False), help="Write a picture of mask and tiles.")
@click.option("-D", "defines", multiple=True, metavar="NAME=INT")
@click.option("--tiling", default="auto", show_default=True, metavar="auto|linear|RxC",
              help="The sm90 tiling to report, as cmc compile --tiling takes it.")
@_reports_errors
def show_cmd(file: str, length: int, params: tuple[str, ...], tile: str, png: str | None,
             defines: tuple[str, ...], tiling: str) -> None:
    """Density, tile classes and the work skipped, for one length and parameter set."""
    from .driver import front
    from .render import ascii_tiles
    from .tiles import EMPTY, FULL, PARTIAL, classify, visible_pairs
    from .transpose import transpose

    try:
        tm, tn = (int(x) for x in tile.lower().split("x"))
        if tm <= 0 or tn <= 0:
            raise ValueError
    except ValueError:
        raise UsageError(f"--tile {tile}: expected MxN with positive integers") from None
    cells = length * (2 * -(-length // tn) + 1) + -(-length // tm) * -(-length // tn)
    if cells > SHOW_MAX_CELLS:
        raise UsageError(
            f"--len {length} with --tile {tm}x{tn}: the tile classes need {cells:,} cells, more "
            f"than cmc show computes ({SHOW_MAX_CELLS:,}); use a shorter --len or larger tiles"
        )
    if png:
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise UsageError("--png needs Pillow, which is not installed: "
                             "pip install 'cmc[png]'") from None
    table = front(file, _defines(defines))
    values = _show_params(table.mask, params, length)
    classes = classify(table, length, values, tm, tn)
    pairs = visible_pairs(table, length, values)
    n = classes.size
    counts = {c: int((classes == c).sum()) for c in (EMPTY, FULL, PARTIAL)}
    _echo(f"{table.mask.name}: len {length}, tile {tm}x{tn}")
    _echo(f"  visible pairs {pairs} of {length * length} (density {pairs / length**2:.4f})")
    _echo(f"  tiles {n}: empty {counts[EMPTY]}, full {counts[FULL]}, partial {counts[PARTIAL]}")
    _echo(f"  work skipped {counts[EMPTY] / n:.1%} of tiles; "
               f"mask work on {counts[PARTIAL] / n:.1%}")
    _echo(ascii_tiles(classes))
    transposed = transpose(table)
    for line in _tiling_lines(table, length, values, pairs, transposed, tiling):
        _echo(line)
    _echo(f"  sm90 kv partial items: {_kv_words_line(table, transposed, tiling)}")
    cut = _plan_cut_line(table, transposed)
    if cut:
        _echo(f"  plans: {cut}")
    for r in table.residuals:
        _echo(f"  warning: residual: {r.reason}: {r.where}")
    if png:
        from .oracle import dense
        from .picture import write_png

        write_png(Path(png), dense(table.mask, length, values) if length <= 8192 else None,
                  classes, tm, tn, length)
        _echo(f"  wrote {png}")


def _offset_masks_line(table: Any) -> str:
    """What the sm90 kernel does on the partial tiles of a table with residual terms."""
    from .tiling import offset_masks

    masks, why = offset_masks(table)
    if masks is None:
        return f"evaluated per element on partial tiles (no tile masks: {why})"
    return (f"per-offset tile masks replace it on partial linear tiles ({why}, "
            f"{masks.classes * 2} KiB in the cubin)")


def _kv_words_line(table: Any, transposed: Any, tiling: str = "auto") -> str:
    """How the sm90 kv kinds mask a partial item under --tiling `tiling`: the forward's offset
    tile masks, transposed, where they cover every partial item of a linear tiling; else
    (where no tile mask covers it) span words of the transposed table (cmc/emit.py
    _span_words) or its predicate per element, and why."""
    from .driver import tiling_for
    from .emit import build_hooks
    from .tiling import tails_note

    t = tiling_for(table, tiling)  # choose_tiling is cached: show's tiling lines made it
    m = t.offset_masks
    if t.kind == "linear" and m is not None and m.band is None:
        phases = f"{m.phases} phases x " if m.phases > 1 else ""
        return (f"the forward's offset tile masks, transposed ({phases}{m.offsets} tile "
                f"offsets{tails_note(m)})")
    hooks_t = build_hooks(transposed, prefix="cmc_tabT")
    how = "span words" if hooks_t.span_words else "the transposed predicate per element"
    return f"{how} ({hooks_t.span_words_why})"


def _plan_cut_line(table: Any, transposed: Any) -> str:
    """Where the kernels' plan builders cut a tile's rows (cmc/emit.py row_split_grid), for
    the forward table and the transposed one; "" where neither has a grid."""
    from .emit import ROW_SPLIT_PARTS, row_split_grid

    parts = []
    for what, t in (("forward", table), ("transposed", transposed)):
        origin, width = row_split_grid(t)
        if width:
            parts.append((what, f"{width} tokens from {origin}"))
    if not parts:
        return ""
    if len(parts) == 2 and parts[0][1] == parts[1][1]:
        where = f"{parts[0][1]}, forward and transposed"
    else:
        where = "; ".join(f"{w}: {g}" for w, g in parts)
    return (f"each term's ranges over a tile's rows are taken per grid row ({where}; at "
            f"most {ROW_SPLIT_PARTS} parts per tile)")


def _band_masks_line(table: Any) -> str:
    """For an exact grid mask: whether the sm90 kernel applies band tile masks on its linear
    tiles (cmc/tiling.py lattice_offset_masks), and why; for a patch tiling only where it
    has them (below its start length); "" for other masks."""
    from .tiling import choose_tiling, grid_of

    if grid_of(table) is None:
        return ""
    t = choose_tiling(table)
    if t.kind != "linear":
        if t.offset_masks is None or t.offset_masks.band is None:
            return ""
        return (f"applied below len {t.min_len}, where the patch tiling is all linear tiles "
                f"({t.offset_masks.classes * 2} KiB in the cubin)")
    if t.offset_masks is None or t.offset_masks.band is None:
        return f"none ({t.reason})"
    return f"applied on interior query tiles ({t.offset_masks.classes * 2} KiB in the cubin)"


def _tiling_lines(table: Any, length: int, values: dict[str, Any], pairs: int,
                  transposed: Any, tiling: str = "auto") -> list[str]:
    """The sm90 kernel's tiling as the tile stage chooses it, its reason, and the pairs it
    computes at this length (TILE^2 per query tile x key tile that a row interval reaches),
    and the sm90 kv kinds' on the transposed table (key tiles of the same tiling against items
    of 64 queries on a linear tiling, against query tiles on a patch tiling)."""
    from .driver import Options, backward_tile, tiling_for
    from .ir import TILE
    from .tiling import backward_count, computed_pairs, tails_note

    t = tiling_for(table, tiling)
    if t.kind == "patch":
        shape = (f"patches of {t.patch_rows} grid rows x {t.patch_cols} tokens (grid width "
                 f"{t.width} from token {t.origin}")
        shape += f"; linear tiles below len {t.min_len})" if t.min_len else ")"
        if length < t.min_len:
            shape += f": at len {length}, linear tiles"
    else:
        shape = f"linear ({TILE}-token tiles)"
    out = [f"  sm90 tiling: {shape}", f"    reason: {t.reason}"]
    if t.heavy_tiles:
        out.append(f"    work units: single tiles, the first {t.heavy_tiles} query tile(s) "
                   "first (their rows see every key)")
    if t.kind == "patch" and t.min_len:
        out.append(f"    short sequences: batches whose max_len is below {t.min_len} run kernels "
                   "built on linear tiles (cmc compile --no-short-kernels: the patch kernels' "
                   "linear tiles)" + (f"; len {length} is one" if length < t.min_len else ""))
    if t.masks is not None:
        pm, inner = t.masks, t.masks.interior
        where = ("every grid query patch" if inner is None else
                 f"interior query patches only (patch rows from {inner.row_top} with "
                 f"{inner.rows_below} grid rows below them at len, patch columns "
                 f"{inner.col_lo}..{inner.col_hi - 1}; border patches evaluate the spans)")
        what = (f"{pm.offsets} patch offsets for each of {inner.col_hi - inner.col_lo} patch "
                "columns" if inner is not None and inner.per_column else
                f"{pm.classes} patch offsets")
        out.append(f"    tile masks: {what} ({pm.classes * 2} KiB in the cubin) on partial "
                   f"tiles of {where}")
    if t.offset_masks is not None and t.offset_masks.band is not None:
        m, b = t.offset_masks, t.offset_masks.band
        what = (f"{m.offsets} tile offsets ({m.lo}..{m.hi - 1}" if m.phases == 1 else
                f"{m.phases} tile phases x {m.offsets} tile offsets ({m.lo}..{m.hi - 1}")
        keys = f", key tiles from {b.key_tile_lo}" if b.key_tile_lo else ""
        where = f" below len {t.min_len}, where every tile is linear" if t.kind == "patch" else ""
        out.append(f"    band tile masks (applied{where}): {what}, {m.classes * 2} KiB in the cubin) on "
                   f"partial tiles of query tiles from {b.tile_top} with {b.tiles_below} tiles "
                   f"below them at len (len <= {b.max_len}){keys}; other tiles evaluate the "
                   "spans")
    elif t.offset_masks is not None:
        m = t.offset_masks
        out.append(f"    tile masks: {m.classes} tile offsets ({m.lo}..{m.hi - 1}"
                   f"{tails_note(m)}, {m.classes * 2} KiB in the cubin) replace the residual "
                   "on partial tiles")
    cells = t.query_tiles(length) * (length + 1)
    if cells > SHOW_MAX_PAIR_CELLS:
        out.append(f"  computed pairs: not counted at len {length} ({cells:,} counters, more than "
                   f"{SHOW_MAX_PAIR_CELLS:,}); use a shorter --len")
        return out
    n = computed_pairs(table, t, length, values)
    per = f"{n / pairs:.2f} per visible pair" if pairs else "no visible pair"
    out.append(f"  computed pairs {n} ({TILE}x{TILE} tiles), {per}")
    bt = backward_tile(table, t, Options(tiling=tiling))
    assert bt is not None
    if bt.kind != t.kind:
        out += [f"  sm90 backward tiling: linear ({TILE}-token tiles)", f"    reason: {bt.reason}"]
    elif t.kind == "patch":
        out.append("  sm90 backward tiling: the forward's"
                   + (f" ({backward_count(table, t)[0]})" if tiling == "auto" else ""))
    item = BWD_SM90_BM if bt.kind == "linear" else TILE
    n = computed_pairs(transposed, bt, length, values, col_tile=item)
    per = f"{n / pairs:.2f} per visible pair" if pairs else "no visible pair"
    out.append(f"  backward (sm90 kv) computed pairs {n} ({TILE} keys x {item} queries), {per}")
    return out


@cli.command("compile")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False))
@click.option("--arch", default="sm_90a,sm_100a", show_default=True)
@click.option("--head-dim", "head_dims", default="64,128", show_default=True)
@click.option("--dtype", "dtypes", default="bf16,fp16", show_default=True)
@click.option("-D", "defines", multiple=True, metavar="NAME=INT")
@click.option("--emit", "emit_kind", type=click.Choice(["itab", "cu", "cubin"]), default="cubin",
              show_default=True, help="Stop after the table, the source, or build everything.")
@click.option("--kernel", type=click.Choice(["auto", "portable"]), default="auto",
              show_default=True,
              help="auto: the wgmma kernel on sm_90a and the portable one elsewhere.")
@click.option("--tiling", default="auto", show_default=True, metavar="auto|linear|RxC",
              help="auto: the tile stage may cut grid masks into patches (sm90 kernel); "
                   "linear: never; RxC (8x16, 16x8, ...): patches of R grid rows x C tokens, "
                   "or an error saying why the mask cannot have them.")
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Also build the backward kernels (dQ, dK, dV); --no-backward keeps "
                   "forward-only artifacts small.")
@click.option("--bwd-kernel", type=click.Choice(BWD_KERNELS), default="auto",
              show_default=True,
              help="On sm_90a the wgmma dK/dV and dQ kernels (the portable ones elsewhere): "
                   "ws: the warp-specialised dK/dV kernel; lockstep: the dK/dV kernel whose "
                   "warpgroups also load; auto: ws (the faster on every tiling measured). "
                   "portable: the portable kernels on every arch.")
@click.option("--dq-layout", type=click.Choice(["token", "block64", "auto"]), default="auto",
              show_default=True,
              help="The backward's fp32 dQ workspace (the manifest's backward.workspace.dq_accum): "
                   "token: [T, heads_q, D]; block64: 64-row blocks in the sm90 accumulator "
                   "order, added by one bulk copy per warpgroup item (linear tilings, not "
                   "--bwd-kernel lockstep); auto: block64 where it is taken, else token (the "
                   "compile line and the manifest say which; block64's backward measured 0-12 % "
                   "faster, docs/benchmarks.md \"Run 50\").")
@click.option("--reg-split", type=click.Choice(["auto", "fixed"]), default="auto",
              show_default=True,
              help="auto: the sm90 forward tries its register splits until one uses no local "
                   "memory; fixed: the default split only (may spill; the warning says so).")
@click.option("--short-kernels/--no-short-kernels", default=True, show_default=True,
              help="Where a patch tiling starts at a length (below it every tile is linear), "
                   "also build its kernels on linear tiles, which the runtime launches when "
                   "every sequence is shorter (the manifest's below_len).")
@click.option("--kv-heavy-from", "kv_heavy_from", default=str(KV_HEAVY_FROM), show_default=True,
              metavar="LEN|off",
              help="Where some key tiles are seen by every query (text or global tokens), the "
                   "sm90 backward's ws kv kinds launch them first when the batch's max_len is "
                   "at least LEN (the manifest's backward.kv_order; shorter batches keep the "
                   "grid's order); off: the grid's order only. Measured up to 9 % slower at 4K, "
                   "-2 to +15 % at 8K, up to 62 % faster at 16K and 32K (docs/kernel-notes.md, "
                   "\"The kv order by length\").")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--check", "check_only", is_flag=True,
              help="Exit 1 and name what differs when the artifacts in OUT are stale.")
@click.option("--no-cache", is_flag=True, help="Rebuild every kernel.")
@_reports_errors
def compile_cmd(files: tuple[str, ...], out_dir: str, arch: str, head_dims: str, dtypes: str,
                defines: tuple[str, ...], emit_kind: str, kernel: str, tiling: str,
                backward: bool, bwd_kernel: str, dq_layout: str, reg_split: str,
                short_kernels: bool, kv_heavy_from: str, jobs: int, check_only: bool,
                no_cache: bool) -> None:
    """Compile masks into OUT/NAME/ (manifest.json, NAME.cu, cubins, NAME.h)."""
    from .artifacts import DTYPES, HEAD_DIMS, SUPPORTED_ARCHS

    archs = _csv(arch)
    hds = _csv(head_dims, int)
    dts = _csv(dtypes)
    for a in archs:
        if a not in SUPPORTED_ARCHS:
            raise UsageError(f"--arch {a}: not one of {', '.join(SUPPORTED_ARCHS)}")
    for h in hds:
        if h not in HEAD_DIMS:
            raise UsageError(f"--head-dim {h}: not one of {', '.join(map(str, HEAD_DIMS))}")
    for d in dts:
        if d not in DTYPES:
            raise UsageError(f"--dtype {d}: not one of {', '.join(DTYPES)}")
    if not (archs and hds and dts):
        raise UsageError("--arch, --head-dim and --dtype each need at least one value")
    from .driver import Options, compile_many, parse_kv_heavy_from, parse_tiling

    parse_tiling(tiling)
    heavy_from = parse_kv_heavy_from(kv_heavy_from)

    opts = Options(archs=archs, dtypes=dts, head_dims=hds,
                   defines=tuple(sorted(_defines(defines).items())), jobs=jobs, kernel=kernel,
                   tiling=tiling, cache=not no_cache, backward=backward,
                   bwd_kernel=bwd_kernel, dq_layout=dq_layout, reg_split=reg_split,
                   short_kernels=short_kernels, kv_heavy_from=heavy_from)
    stale = compile_many(files, Path(out_dir), opts, emit_kind, check_only, echo=_echo)
    if stale:
        for s in stale:
            _echo(f"stale: {s}", err=True)
        sys.exit(1)


@cli.command("inspect")
@click.argument("path", type=click.Path(file_okay=False))
@_reports_errors
def inspect_cmd(path: str) -> None:
    """Validate an artifact folder and list its kernels and their resources."""
    from .inspection import inspect, report_text

    _echo(report_text(inspect(Path(path))))


def main() -> None:
    cli(prog_name="cmc")


if __name__ == "__main__":
    main()
