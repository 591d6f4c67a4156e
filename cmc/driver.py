"""The pipeline: the ordered, named stages, each a pure function from one frozen value to the next.

STAGES lists them in order; `run(path, opts, stop_after)` takes one mask file through them
and stops after the named stage (`cmc compile --emit`). compile_file, compile_many and the
staleness check (`cmc compile --check`) all go through run, so the pipeline is strung once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .artifacts import DEFAULT_ARCHS, BuiltKernels, EmittedSource
from .errors import CmcError, MaskError, Span, UsageError
from .ir import LINEAR, IntervalTable, Mask, Tiling
from .kernels import KV_HEAVY_FROM, SPECS, forward_kinds

if TYPE_CHECKING:
    from .ast import Module

STAGES = ("parse", "check", "lower", "tile", "emit", "build", "package")
# `cmc compile --emit KIND` stops after this stage and writes what it made.
EMIT_STOPS = {"itab": "lower", "cu": "emit", "cubin": "package"}


def read_source(path: str | Path, name: str | None = None) -> str:
    """A .mask file's text: at most MAX_FILE_BYTES are read (a larger file is refused without
    reading the rest), a UTF-8 byte-order mark is dropped, and bytes that are not UTF-8 are
    a MaskError at their line and column, with the line shown (U+FFFD for the bad bytes).
    `name` is the file name messages give (default: path)."""
    from .parse import MAX_FILE_BYTES

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CmcError(f"{path}: no such file") from None
    except OSError as e:
        raise CmcError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise MaskError.at(f"the file is larger than {MAX_FILE_BYTES} bytes (1 MiB), the limit "
                           "for a mask file", Span(name or str(path), 1, 1, 1, 1))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
        start = e.start + bom if e.object is not data else e.start
        line_start = data.rfind(b"\n", 0, start) + 1
        line = data.count(b"\n", bom, start) + 1
        col = len(data[max(line_start, bom):start].decode("utf-8", "replace")) + 1
        shown = data[bom:].decode("utf-8", "replace")
        bad = data[start:e.end + (start - e.start)]
        raise MaskError.at(f"not UTF-8 text: byte 0x{bad[:1].hex()} ({e.reason}); a mask "
                           "file is UTF-8",
                           Span(name or str(path), line, col, line, col + 1, shown)) from None


@dataclass(frozen=True)
class Options:
    archs: tuple[str, ...] = DEFAULT_ARCHS
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    head_dims: tuple[int, ...] = (64, 128)
    defines: tuple[tuple[str, int], ...] = ()
    jobs: int = 1
    cache: bool = True
    kernel: str = "auto"  # "auto": each arch's own kind (kernels.forward_kinds); "portable"
    # "auto": the tile stage chooses; "linear": 128 consecutive tokens; "RxC" (8x16, 16x8,
    # ...): patches of R grid rows x C tokens (parse_tiling)
    tiling: str = "auto"
    backward: bool = True  # the backward kernels and the transposed table (--no-backward: off)
    # the wgmma kinds on sm_90a, cmc_bwd elsewhere: "ws" (kv bwd_kv_sm90_ws), "lockstep" (kv
    # bwd_kv_sm90), "auto": ws; "portable": cmc_bwd everywhere (kernels.backward_kinds).
    bwd_kernel: str = "auto"
    # dq_accum's layout (abi.DQ_LAYOUTS): "token", or "block64" (linear backward tilings only;
    # emit.dq_layout_refusal); "auto": block64 where it is not refused, else token (the
    # manifest's dq_accum names the one chosen; the default since run 50)
    dq_layout: str = "auto"
    # "auto": the sm90 forward tries kernels.SM90_REG_SPLITS until one uses no local memory;
    # "fixed": the kind's default split only (the A/B baseline; may spill, and says so).
    reg_split: str = "auto"
    # kernels for short sequences: each patch-tiled kernel with a start length again on linear
    # tiles, launched when every sequence is shorter (short_tile; --no-short-kernels: off)
    short_kernels: bool = True
    # the ws kv kinds can launch the key tiles every query sees first (emit._heavy_keys), and
    # the launcher asks for it from this max_len on (the manifest's backward.kv_order; None:
    # --kv-heavy-from off, the grid's order only; kernels.KV_HEAVY_FROM says why 8192).
    kv_heavy_from: int | None = KV_HEAVY_FROM


@dataclass(frozen=True)
class Progress:
    """What the pipeline has made of one mask file so far (None: that stage has not run)."""

    path: Path
    module: Module | None = None  # parse
    mask: Mask | None = None  # check
    table: IntervalTable | None = None  # lower
    tiling: Tiling | None = None  # tile: the forward's
    bwd_tiling: Tiling | None = None  # tile: the backward's (None: --no-backward)
    short_tiling: Tiling | None = None  # tile: the short sequences' kernels' (None: none)
    source: EmittedSource | None = None  # emit
    built: BuiltKernels | None = None  # build
    artifact: Path | None = None  # package: OUT/NAME
    last: str = ""  # the last stage run ("": none)


def tile(table: IntervalTable, opts: Options) -> Tiling:
    """The tile stage's rule: choose_tiling when a kind that follows the tiling is built
    (the sm90 kernel on sm_90a) and opts.tiling allows it, else linear."""

    kinds = forward_kinds(tuple(dict.fromkeys(opts.archs)), opts.kernel)
    if not any(SPECS[k].tiled for k, _ in kinds):
        if parse_tiling(opts.tiling) is not None:
            raise UsageError(f"--tiling {opts.tiling}: no kernel built here follows a patch "
                             "tiling (the sm90 kernel, --arch sm_90a with --kernel auto)")
        return LINEAR
    return tiling_for(table, opts.tiling)


def backward_tile(table: IntervalTable, forward: Tiling, opts: Options) -> Tiling | None:
    """The backward kinds' tiling: the forward's where --tiling names one (the user asked for
    it), else the tile stage's own choice for the backward (choose_backward_tiling); None
    without a backward."""
    if not opts.backward:
        return None
    if opts.tiling != "auto":
        return forward
    from .tiling import choose_backward_tiling

    return choose_backward_tiling(table, forward)


def short_tile(table: IntervalTable, tilings: Sequence[Tiling | None],
               opts: Options) -> Tiling | None:
    """The tiling of the kernels for short sequences: where a patch tiling of `tilings` (the
    forward's, the backward's) starts at a length (min_len), the tiling --tiling linear gives,
    on which those kinds are built again for sequences shorter than that (emit's below_len);
    None where no tiling has a start length or opts.short_kernels is off."""
    if not opts.short_kernels or not any(
            t is not None and t.kind == "patch" and t.min_len > 0 for t in tilings):
        return None
    return tiling_for(table, "linear")


def tiling_for(table: IntervalTable, value: str) -> Tiling:
    """The tiling that --tiling VALUE (auto, linear or RxC) gives the table on the sm90
    kernel (cmc compile and cmc show)."""
    from .tiling import choose_tiling

    return choose_tiling(table, parse_tiling(value), linear=value == "linear")


def parse_tiling(value: str) -> tuple[int, int] | None:
    """--tiling's patch shape (rows, cols), None for auto and linear; UsageError otherwise."""
    if value in ("auto", "linear"):
        return None
    rows, sep, cols = value.partition("x")
    if not (sep and rows.isdigit() and cols.isdigit()):
        raise UsageError(f"--tiling {value}: expected auto, linear or ROWSxCOLS (a patch "
                         "shape such as 8x16)")
    return int(rows), int(cols)


def parse_kv_heavy_from(value: str) -> int | None:
    """--kv-heavy-from's length (Options.kv_heavy_from), None for off; UsageError otherwise."""
    if value == "off":
        return None
    try:
        n = int(value, 0)
    except ValueError:
        raise UsageError(f"--kv-heavy-from {value}: expected LEN or off") from None
    if not 0 <= n <= 2**31 - 1:
        raise UsageError(f"--kv-heavy-from {value}: outside [0, 2147483647]")
    return n


def _parse(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from .parse import parse

    return replace(p, module=parse(read_source(p.path), str(p.path)))


def _check(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from .check import check

    assert p.module is not None
    return replace(p, mask=check(p.module, dict(opts.defines)))


def _lower(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from .lower import lower

    assert p.mask is not None
    return replace(p, table=lower(p.mask))


def _tile(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    assert p.table is not None
    forward = tile(p.table, opts)
    bwd = backward_tile(p.table, forward, opts)
    return replace(p, tiling=forward, bwd_tiling=bwd,
                   short_tiling=short_tile(p.table, (forward, bwd), opts))


def _emit(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from . import emit

    assert p.table is not None and p.tiling is not None
    if p.bwd_tiling is not None and opts.dq_layout not in ("token", "auto") and (
            why := emit.dq_layout_refusal(opts.dq_layout, opts.bwd_kernel, p.bwd_tiling)):
        raise UsageError(f"--dq-layout {opts.dq_layout}: {why}")
    return replace(p, source=emit.emit(p.table, dtypes=opts.dtypes, head_dims=opts.head_dims,
                                       archs=opts.archs, kernel=opts.kernel, tiling=p.tiling,
                                       backward=opts.backward, bwd_kernel=opts.bwd_kernel,
                                       bwd_tiling=p.bwd_tiling, short_tiling=p.short_tiling,
                                       dq_layout=opts.dq_layout,
                                       kv_heavy_from=opts.kv_heavy_from))


def _build(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from . import build

    assert p.source is not None
    return replace(p, built=build.build(p.source, archs=opts.archs, jobs=opts.jobs,
                                        cache=opts.cache, reg_split=opts.reg_split))


def _package(p: Progress, opts: Options, out_dir: Path | None) -> Progress:
    from .package import package

    assert p.built is not None
    if out_dir is None:
        raise ValueError("the package stage needs an output folder")
    return replace(p, artifact=package(p.built, out_dir, p.path.name))


_RUN: Mapping[str, Callable[[Progress, Options, Path | None], Progress]] = {
    "parse": _parse, "check": _check, "lower": _lower, "tile": _tile, "emit": _emit,
    "build": _build, "package": _package,
}
assert tuple(_RUN) == STAGES


def run(path: str | Path, opts: Options, stop_after: str = "package",
        out_dir: Path | None = None, done: Progress | None = None) -> Progress:
    """One mask file through the stages in order, up to and including `stop_after`; `done`,
    what an earlier run of the same file made, resumes after its last stage."""
    if stop_after not in STAGES:
        raise ValueError(f"no stage {stop_after!r} (stages: {', '.join(STAGES)})")
    p = done or Progress(Path(path))
    for name in STAGES[STAGES.index(p.last) + 1 if p.last else 0:]:
        p = replace(_RUN[name](p, opts, out_dir), last=name)
        if name == stop_after:
            break
    return p


def _defines(defines: Mapping[str, int] | None) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((defines or {}).items()))


def front(path: str | Path, defines: Mapping[str, int] | None = None) -> IntervalTable:
    """parse -> check -> lower."""
    table = run(path, Options(defines=_defines(defines)), "lower").table
    assert table is not None
    return table


def back(table: IntervalTable, opts: Options) -> EmittedSource:
    """tile -> emit for a table already lowered (tools and tests that start from a table)."""
    done = Progress(Path(table.mask.filename), table=table, last="lower")
    source = run(done.path, opts, "emit", done=done).source
    assert source is not None
    return source


def load_mask(path: str | Path, defines: Mapping[str, int] | None = None) -> Mask:
    """parse -> check."""
    mask = run(path, Options(defines=_defines(defines)), "check").mask
    assert mask is not None
    return mask


def compile_file(
    path: str | Path,
    out_dir: str | Path,
    archs: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    head_dims: Sequence[int] | None = None,
    defines: Mapping[str, int] | None = None,
    jobs: int = 1,
    cache: bool = True,
    kernel: str = "auto",
    tiling: str = "auto",
    backward: bool = True,
    bwd_kernel: str = "auto",
    reg_split: str = "auto",
    short_kernels: bool = True,
    dq_layout: str = "auto",
    kv_heavy_from: int | None = KV_HEAVY_FROM,
) -> Path:
    """Every stage; returns OUT/NAME."""
    opts = Options(
        archs=tuple(archs or DEFAULT_ARCHS),
        dtypes=tuple(dtypes or Options.dtypes),
        head_dims=tuple(head_dims or Options.head_dims),
        defines=_defines(defines),
        jobs=jobs,
        cache=cache,
        kernel=kernel,
        tiling=tiling,
        backward=backward,
        bwd_kernel=bwd_kernel,
        dq_layout=dq_layout,
        reg_split=reg_split,
        short_kernels=short_kernels,
        kv_heavy_from=kv_heavy_from,
    )
    artifact = run(path, opts, "package", Path(out_dir)).artifact
    assert artifact is not None
    return artifact


def compile_many(
    files: Sequence[str],
    out_dir: Path,
    opts: Options,
    emit_kind: str = "cubin",
    check_only: bool = False,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """`cmc compile`: every file through the stages up to --emit's (EMIT_STOPS); returns
    stale names when check_only (nothing is written then)."""
    import json

    from .render import table_dict

    if check_only:
        return check_stale(list(files), out_dir, opts)
    from .package import check_out_dir

    stop = EMIT_STOPS[emit_kind]
    fronts = [run(f, opts, "lower") for f in files]
    names = [p.table.mask.name for p in fronts if p.table is not None]
    check_unique_names(files, names)
    check_out_dir(out_dir, names)
    for f, front_done in zip(files, fronts, strict=True):
        p = run(f, opts, stop, out_dir, done=front_done)
        if stop == "lower":
            assert p.table is not None
            name = p.table.mask.name
            dest = _safe_dest(out_dir, name)
            (dest / f"{name}.itab.json").write_text(
                json.dumps(table_dict(p.table), indent=2, sort_keys=True) + "\n")
            echo(f"{f}: wrote {dest / (name + '.itab.json')}")
        elif stop == "emit":
            assert p.source is not None
            dest = _safe_dest(out_dir, p.source.table.mask.name)
            (dest / p.source.filename).write_text(p.source.text)
            echo(f"{f}: wrote {dest / p.source.filename}")
        else:
            assert p.built is not None
            secs = sum(c.build_seconds for c in p.built.cubins)
            layout = f", dq_accum {p.built.source.dq_layout}" if opts.dq_layout == "auto" and p.bwd_tiling else ""
            echo(f"{f}: {len(p.built.cubins)} cubin(s) in {p.artifact} ({secs:.1f} s of NVRTC{layout})")
            for line in spill_warnings(p.built):
                echo(f"{f}: {line}")
    return []


Rebuild = Callable[[Path, Options], BuiltKernels]


def _rebuild(path: Path, opts: Options) -> BuiltKernels:
    built = run(path, opts, "build").built
    assert built is not None
    return built


def check_stale(
    mask_paths: Sequence[str | Path],
    out_dir: Path,
    options: Options,
    rebuild: Rebuild | None = None,
) -> list[str]:
    """`cmc compile --check`: rebuild each mask in memory (the build cache makes this cheap)
    and name every artifact file that differs, is missing, or should no longer be there."""
    from .package import stale_files

    fn = rebuild or _rebuild
    out: list[str] = []
    for mp in mask_paths:
        built = fn(Path(mp), options)
        out.extend(stale_files(built, Path(mp).name, Path(out_dir)))
    return out


def check_unique_names(files: Sequence[str], names: Sequence[str]) -> None:
    """Two masks of one name would share OUT/NAME, the second silently replacing the first."""
    first: dict[str, str] = {}
    clashes = []
    for f, name in zip(files, names, strict=True):
        if name in first:
            clashes.append(f"mask {name} is declared by both {first[name]} and {f}")
        else:
            first[name] = f
    if clashes:
        raise CmcError("; ".join(clashes) + " (one artifact folder per name; rename one)")


def spill_warnings(built: BuiltKernels) -> list[str]:
    """A line per kernel that uses local memory: spills cost bandwidth the numbers assume.
    A kernel with a register split names the splits the build tried; a kernel rebuilt by a
    spill fallback (KernelSpec.spill_fallbacks) says so, clean or not, since it is not the
    kind's default code."""
    lines = []
    for c in built.cubins:
        r = c.resources
        if r.spill_stores or r.spill_loads or r.local_bytes:
            lines.append(
                f"warning: {c.filename}: {r.local_bytes} bytes of local memory per thread, "
                f"{r.spill_stores} bytes spill stores, {r.spill_loads} bytes spill loads"
                + (f" (register split {c.reg_split}: {c.reg_split_reason})" if c.reg_split else "")
                + (f" (spill fallbacks: {c.fallback_reason})" if c.fallback_reason else ""))
        elif c.fallback_reason:
            lines.append(f"note: {c.filename}: rebuilt without local memory ({c.fallback_reason})")
    return lines


def _safe_dest(out_dir: Path, name: str) -> Path:
    from .abi import check_identifier

    dest = (out_dir / check_identifier(name)).resolve()
    if out_dir.resolve() not in dest.parents:
        raise CmcError(f"refusing to write outside {out_dir}")
    dest.mkdir(parents=True, exist_ok=True)
    return dest
