"""The pipeline, stage by stage. Each stage is a pure function from one frozen value to the next."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .artifacts import DEFAULT_ARCHS, BuiltKernels, EmittedSource
from .errors import CmcError
from .ir import LINEAR, IntervalTable, Mask, Tiling


def read_source(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CmcError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise CmcError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise CmcError(f"{path}: cannot read ({e.strerror})") from None


def front(path: str | Path, defines: Mapping[str, int] | None = None) -> IntervalTable:
    """parse -> check -> lower."""
    from .check import check
    from .lower import lower
    from .parse import parse

    return lower(check(parse(read_source(path), str(path)), dict(defines or {})))


def load_mask(path: str | Path, defines: Mapping[str, int] | None = None) -> Mask:
    from .check import check
    from .parse import parse

    return check(parse(read_source(path), str(path)), dict(defines or {}))


@dataclass(frozen=True)
class Options:
    archs: tuple[str, ...] = DEFAULT_ARCHS
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    head_dims: tuple[int, ...] = (64, 128)
    defines: tuple[tuple[str, int], ...] = ()
    jobs: int = 1
    cache: bool = True
    kernel: str = "auto"  # "auto": sm90 kernel on sm_90a; "portable": mma.sync everywhere
    tiling: str = "auto"  # "auto": the tile stage chooses; "linear": 128 consecutive tokens
    backward: bool = True  # the backward kernels and the transposed table (--no-backward: off)


def tile(table: IntervalTable, opts: Options) -> Tiling:
    """tile: the sm90 kernel's tiling (linear unless an sm_90a wgmma kernel is built)."""
    from .tiling import choose_tiling

    if opts.tiling == "linear" or opts.kernel != "auto" or "sm_90a" not in opts.archs:
        return LINEAR
    return choose_tiling(table)


def back(table: IntervalTable, opts: Options) -> EmittedSource:
    """tile -> emit."""
    from .emit import emit

    return emit(table, dtypes=opts.dtypes, head_dims=opts.head_dims, archs=opts.archs,
                kernel=opts.kernel, tiling=tile(table, opts), backward=opts.backward)


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
) -> Path:
    """parse -> check -> lower -> emit -> build -> package; returns OUT/NAME."""
    from .build import build
    from .package import package

    opts = Options(
        archs=tuple(archs or DEFAULT_ARCHS),
        dtypes=tuple(dtypes or Options.dtypes),
        head_dims=tuple(head_dims or Options.head_dims),
        defines=tuple(sorted((defines or {}).items())),
        jobs=jobs,
        cache=cache,
        kernel=kernel,
        tiling=tiling,
        backward=backward,
    )
    table = front(path, dict(opts.defines))
    source = back(table, opts)
    built: BuiltKernels = build(source, archs=opts.archs, jobs=opts.jobs, cache=opts.cache)
    return package(built, Path(out_dir), Path(path).name)


def compile_many(
    files: Sequence[str],
    out_dir: Path,
    opts: Options,
    emit_kind: str = "cubin",
    check_only: bool = False,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """`cmc compile`: every file through the pipeline (or up to --emit); returns stale names
    when check_only (nothing is written then)."""
    import json

    from .render import table_dict

    if check_only:
        from .package import check_stale

        return check_stale(list(files), out_dir, opts)
    for f in files:
        table = front(f, dict(opts.defines))
        name = table.mask.name
        if emit_kind == "itab":
            dest = _safe_dest(out_dir, name)
            (dest / f"{name}.itab.json").write_text(
                json.dumps(table_dict(table), indent=2, sort_keys=True) + "\n")
            echo(f"{f}: wrote {dest / (name + '.itab.json')}")
            continue
        source = back(table, opts)
        if emit_kind == "cu":
            dest = _safe_dest(out_dir, name)
            (dest / source.filename).write_text(source.text)
            echo(f"{f}: wrote {dest / source.filename}")
            continue
        from .build import build
        from .package import package

        built = build(source, archs=opts.archs, jobs=opts.jobs, cache=opts.cache)
        where = package(built, out_dir, Path(f).name)
        secs = sum(c.build_seconds for c in built.cubins)
        echo(f"{f}: {len(built.cubins)} cubin(s) in {where} ({secs:.1f} s of NVRTC)")
    return []


def _safe_dest(out_dir: Path, name: str) -> Path:
    from .abi import check_identifier

    dest = (out_dir / check_identifier(name)).resolve()
    if out_dir.resolve() not in dest.parents:
        raise CmcError(f"refusing to write outside {out_dir}")
    dest.mkdir(parents=True, exist_ok=True)
    return dest
