"""Build stage: NVRTC compiles the emitted source once per (arch, variant) into cubins.

Why the choices below:
- One compile per variant (`-DCMC_VARIANT_<dtype>_d<hd>`) and arch keeps each cubin to a
  single entry point, so its resources and hash describe exactly one kernel.
- The program is named NAME.cu (relative) and no -lineinfo/-G is passed, so no path reaches
  the cubin: the same source and options give the same bytes on any machine.
- `--ptxas-options=-v` is always on: spill counts exist only in the ptxas log. It changes the
  cubin bytes (ptxas records its options in .note.nv.tkinfo), so it must be on for every
  build or none.
- Resources come from the cubin's ELF (cmc/cubin.py); the manifest never relies on log text
  for anything but spills.
- NVRTC releases the GIL: threads scale across cores (measured: 4 compiles of a 1.5 s kernel,
  5.6 s serial, 2.7 s with 2 threads, 3.5 s with 2 processes on a 2-core machine), so
  `jobs` uses a thread pool.
- A content-addressed cache (sha256 over source, program name, options, cmc version, NVRTC
  version and the loaded libnvrtc file) under config.cache_dir() skips unchanged kernels; an
  entry whose bytes do not match its recorded sha256 is rebuilt. build_seconds of a hit is the
  time to read it back.
- Each cubin is checked before it is returned: its arch (from the ELF) is the one asked for,
  it defines the variant's entry symbol, that kernel's parameter block is exactly the
  descriptor, and the launch (threads, registers, static + dynamic shared memory) fits the
  arch. Such problems are BuildErrors at compile time, not launch failures on a GPU.

If the source #includes anything, the CUDA headers of the nvidia-cuda-runtime wheel are put on
the include path. That directory is a machine path, so the recorded options carry the token
`-I$CUDA_INCLUDE` in its place (and the cache key the header packages' versions);
`python -m cmc.build --repro` expands it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import __version__, config
from .abi import kernel_param_bytes, tensor_maps
from .artifacts import (
    SUPPORTED_ARCHS,
    BuiltCubin,
    BuiltKernels,
    EmittedSource,
    KernelResources,
    KernelVariant,
)
from .cubin import Cubin, parse_ptxas_log, read_cubin, wgmma_pipeline_notes
from .errors import ArtifactError, BuildError, UsageError
from .kernels import RegSplit, spec

BASE_OPTIONS = ("-std=c++17", "-default-device", "--ptxas-options=-v")
CUDA_INCLUDE_TOKEN = "-I$CUDA_INCLUDE"
CACHE_FORMAT = 1

# Largest dynamic + static shared memory one block may opt into (bytes), per SM.
MAX_SHARED_PER_BLOCK = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448}
REGISTERS_PER_SM = 65536


@lru_cache(maxsize=1)
def _nvrtc_major_minor() -> tuple[int, int]:
    """Loads NVRTC; a missing library is a BuildError that says what to install."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # ImportError, cuda.pathfinder's DynamicLibNotFoundError, ...
        raise BuildError(
            f"cannot load NVRTC ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "install the pinned nvidia-cuda-nvrtc wheel (pip install cmc pulls it in)"
        ) from None
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """major.minor from nvrtcVersion(), with the wheel's patch level when it is that NVRTC."""
    from importlib import metadata

    major, minor = _nvrtc_major_minor()
    base = f"{major}.{minor}"
    try:
        wheel = metadata.version("nvidia-cuda-nvrtc")
    except metadata.PackageNotFoundError:
        return base
    return wheel if wheel.startswith(base + ".") else base


@lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    """The CUDA headers (cuda.h, cuda_bf16.h, ...) of the nvidia-cuda-runtime wheel."""
    from cuda import pathfinder

    found = pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        raise BuildError("CUDA headers not found (is nvidia-cuda-runtime installed?)")
    return str(found)


def cuda_include_options() -> list[str]:
    """What CUDA_INCLUDE_TOKEN stands for: the CUDA headers, and CCCL's (cuda/std/...)."""
    inc = Path(cuda_include_dir())
    return ["-I" + str(d) for d in (inc, inc / "cccl") if d.is_dir()]


@lru_cache(maxsize=1)
def _nvrtc_library() -> str:
    """Which libnvrtc is loaded, with its size and mtime: part of the cache key, so a cache
    shared by two environments never hands one NVRTC's cubin to the other."""
    try:
        from cuda import pathfinder

        path = Path(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path or "")
        st = path.stat()
        return f"{path}:{st.st_size}:{int(st.st_mtime)}"
    except Exception:
        return "unknown"


def _header_versions() -> str:
    from importlib import metadata

    parts = []
    for pkg in ("nvidia-cuda-runtime", "nvidia-cuda-cccl"):
        try:
            parts.append(f"{pkg}=={metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{pkg}==?")
    return ",".join(parts)


def _check(err: object, what: str) -> None:
    if int(err) != 0:  # type: ignore[call-overload]
        raise BuildError(f"{what} failed: {err}")


def variant_define(v: KernelVariant) -> str:
    return v.define


def variant_tag(v: KernelVariant) -> str:
    return v.tag


def cubin_filename(name: str, arch: str, v: KernelVariant) -> str:
    return f"{name}.{arch}.{variant_tag(v)}.cubin"


def compile_options(source_text: str, arch: str, v: KernelVariant, extra: Sequence[str] = ()):
    """The options recorded in the manifest (machine paths replaced by tokens)."""
    opts = [f"-arch={arch}", *BASE_OPTIONS, f"-D{variant_define(v)}", *extra]
    if "#include" in source_text:
        opts.append(CUDA_INCLUDE_TOKEN)
    return tuple(opts)


def expand_options(options: Sequence[str]) -> list[str]:
    """Recorded options -> what NVRTC is given."""
    out: list[str] = []
    for o in options:
        out.extend(cuda_include_options() if o == CUDA_INCLUDE_TOKEN else [o])
    return out


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    log: str
    cubin: bytes
    seconds: float


def nvrtc_compile(text: str, program_name: str, options: Sequence[str]) -> CompileResult:
    """One NVRTC compile to a cubin. Thread-safe: each call has its own program."""
    _nvrtc_major_minor()
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), program_name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in expand_options(options)]
        t0 = time.perf_counter()
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        seconds = time.perf_counter() - t0
        err, n = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "nvrtcGetProgramLogSize")
        buf = b" " * n
        if n:
            (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
            _check(err, "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0").decode("utf-8", "replace")
        if int(res) != 0:
            return CompileResult(False, log or str(res), b"", seconds)
        err, n = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * n
        if n:
            (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
            _check(err, "nvrtcGetCUBIN")
        return CompileResult(True, log, cubin, seconds)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# ------------------------------------------------------------------------------- cache


def cache_key(text: str, program_name: str, options: Sequence[str]) -> str:
    ident = {
        "format": CACHE_FORMAT,
        "cmc": __version__,
        "nvrtc": nvrtc_version(),
        "nvrtc_library": _nvrtc_library(),
        "name": program_name,
        "options": list(options),
        "headers": _header_versions() if CUDA_INCLUDE_TOKEN in options else "",
        "source": hashlib.sha256(text.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _cache_paths(key: str) -> tuple[Path, Path]:
    d = config.cache_dir() / "cubins" / key[:2]
    return d / f"{key}.cubin", d / f"{key}.json"


def _cache_get(key: str) -> tuple[bytes, str] | None:
    """(cubin, ptxas log) if a sound entry exists; anything odd counts as a miss."""
    data_path, meta_path = _cache_paths(key)
    try:
        meta = json.loads(meta_path.read_text())
        data = data_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
        return None
    log = meta.get("log")
    return (data, log) if isinstance(log, str) else None


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cache_put(key: str, data: bytes, log: str) -> None:
    data_path, meta_path = _cache_paths(key)
    meta = {"sha256": hashlib.sha256(data).hexdigest(), "log": log}
    try:  # the cache is an optimisation: an unwritable cache dir is not an error
        _atomic_write(data_path, data)
        _atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
    except OSError:
        pass


# ------------------------------------------------------------------------------- build


def _failure_dir(text: str) -> Path:
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    d = config.cache_dir() / "failed" / digest
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:
        return Path(tempfile.mkdtemp(prefix="cmc-failed-"))


def repro_command(path: Path, options: Sequence[str]) -> str:
    return shlex.join([sys.executable, "-m", "cmc.build", "--repro", str(path), *options])


def _arch_sm(arch: str) -> tuple[int, bool]:
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits), arch.endswith("a")


def _validate(
    cub: Cubin, arch: str, v: KernelVariant, source: EmittedSource, where: str
) -> None:
    """Check that the cubin is what was asked for and can be launched as the manifest says."""
    sm, specific = _arch_sm(arch)
    if (cub.sm, cub.arch_specific) != (sm, specific):
        raise BuildError(f"{where}: NVRTC produced a cubin for {cub.arch}, not {arch}")
    try:
        k = cub.kernel(v.symbol)
    except ArtifactError as e:
        raise BuildError(
            f"{where}: {e}; the block `#if defined({variant_define(v)})` must define "
            f'`extern "C" __global__ void {v.symbol}(...)`'
        ) from None
    maps = tensor_maps(v.kernel)
    want = kernel_param_bytes(source.layout.size, v.kernel)
    if k.param_bytes and k.param_bytes != want:
        what = f" and {len(maps)} tensor maps" if maps else ""
        if "bwd_args" in spec(v.kernel).params:
            what += " and cmc_bwd_args"
        raise BuildError(
            f"{where}: kernel {v.symbol} takes {k.param_bytes} bytes of parameters, but the "
            f"descriptor {source.layout.struct_name} ({source.layout.size} bytes){what} "
            f"make {want}"
        )
    if k.max_threads is not None:
        bound = k.max_threads[0] * k.max_threads[1] * k.max_threads[2]
        if v.threads > bound:
            raise BuildError(
                f"{where}: {v.symbol} is launched with {v.threads} threads but its "
                f"__launch_bounds__ allow {bound}"
            )
    per_warp = -(-k.registers * 32 // 256) * 256
    if per_warp * -(-v.threads // 32) > REGISTERS_PER_SM:
        raise BuildError(
            f"{where}: {v.symbol} uses {k.registers} registers per thread; {v.threads} "
            f"threads need more than the {REGISTERS_PER_SM} registers of one SM"
        )
    limit = MAX_SHARED_PER_BLOCK.get(sm)
    if limit is not None and k.shared_static + v.smem_bytes > limit:
        raise BuildError(
            f"{where}: {v.symbol} needs {k.shared_static} static + {v.smem_bytes} dynamic "
            f"bytes of shared memory; {arch} allows {limit} per block"
        )


def _made_by(cub: Cubin) -> str:
    """The exact NVRTC release: ptxas's version note in the cubin, when it is this NVRTC's."""
    major, minor = _nvrtc_major_minor()
    if cub.toolkit.startswith(f"{major}.{minor}."):
        return cub.toolkit
    return nvrtc_version()


class _LostPipeline(Exception):
    """ptxas's wgmma pipeline notes for one compile: the caller refuses the kernel or tries
    another register split."""

    def __init__(self, notes: list[str], log: str) -> None:
        super().__init__(notes[0])
        self.notes = notes
        self.log = log


def _compile_checked(
    source: EmittedSource, v: KernelVariant, arch: str, use_cache: bool,
    extra: Sequence[str], split: RegSplit | None
) -> BuiltCubin:
    """One checked cubin of the variant with `split` (None: the header's default, no
    define); _LostPipeline if ptxas gave up the wgmma pipeline (checked first, as before)."""
    name = source.filename.removesuffix(".cu")
    split_opts = split.options() if split is not None else ()
    options = compile_options(source.text, arch, v, (*extra, *split_opts))
    where = f"{source.filename} [{arch}, {variant_tag(v)}]"
    t0 = time.perf_counter()
    key = cache_key(source.text, source.filename, options)
    hit = _cache_get(key) if use_cache else None
    if hit is not None:
        data, log = hit
    else:
        res = nvrtc_compile(source.text, source.filename, options)
        if not res.ok:
            d = _failure_dir(source.text)
            path = d / source.filename
            path.write_text(source.text)
            raise BuildError(
                f"NVRTC failed to compile {where}",
                log=res.log,
                source_path=str(path),
                repro=repro_command(path, options),
            )
        data, log = res.cubin, res.log
    if notes := wgmma_pipeline_notes(log):
        if use_cache and hit is None:  # a later build skips this candidate without NVRTC
            _cache_put(key, data, log)
        raise _LostPipeline(notes, log)
    try:
        cub = read_cubin(data)
    except ArtifactError as e:
        raise BuildError(f"{where}: {e}") from None
    _validate(cub, arch, v, source, where)
    if use_cache and hit is None:
        _cache_put(key, data, log)
    spills = parse_ptxas_log(log).get(v.symbol)
    info = cub.kernel(v.symbol)
    resources = KernelResources(
        registers=info.registers,
        shared_static=info.shared_static,
        local_bytes=info.frame_size,
        spill_stores=spills.spill_stores if spills else 0,
        spill_loads=spills.spill_loads if spills else 0,
    )
    built = BuiltCubin(
        arch=arch,
        symbol=v.symbol,
        filename=cubin_filename(name, arch, v),
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        nvrtc_version=_made_by(cub),
        options=options,
        build_seconds=time.perf_counter() - t0,
        resources=resources,
        log=log,
        reg_split=split,
    )
    return built


def _pipeline_error(where: str, notes: list[str], log: str, tried: str = "") -> BuildError:
    return BuildError(
        f"{where}: ptxas did not keep the kernel's wgmma pipeline ({notes[0].split(':')[0]}"
        f"{tried}); the kernel would run correctly but serialised or with waits the source "
        "did not ask for",
        log=log,
    )


def _uses_local(r: KernelResources) -> bool:
    return bool(r.local_bytes or r.spill_stores or r.spill_loads)


def _outcome(label: object, got: BuiltCubin | _LostPipeline) -> str:
    """What one build tried (a register split, a fallback's defines) gave, for a reason."""
    if isinstance(got, _LostPipeline):
        return f"{label} lost the wgmma pipeline ({got.notes[0].split(':')[0]})"
    r = got.resources
    if r.spill_stores or r.spill_loads:
        return f"{label} spilled {r.spill_stores + r.spill_loads} bytes"
    if r.local_bytes:
        return f"{label} used {r.local_bytes} bytes of local memory"
    return f"{label} clean"


def _least_spilling(built: Sequence[BuiltCubin]) -> BuiltCubin:
    """The first of those with the fewest spilled bytes, then the least local memory."""
    return min(built, key=lambda c: (c.resources.spill_stores + c.resources.spill_loads,
                                     c.resources.local_bytes))


def _spill_fallback(source: EmittedSource, v: KernelVariant, arch: str, use_cache: bool,
                    extra: Sequence[str], built: BuiltCubin) -> BuiltCubin:
    """`built` if it uses no local memory or its kind has no spill fallbacks; else the
    kind's fallbacks (KernelSpec.spill_fallbacks) built in turn until one is clean, or the
    fewest spilled bytes of all; fallback_reason says what each gave."""
    fallbacks = spec(v.kernel).spill_fallbacks
    if not fallbacks or not _uses_local(built.resources):
        return built
    t0 = time.perf_counter()
    tried = [built]
    outcomes = [_outcome("default", built)]
    for defines in fallbacks:
        try:
            got = _compile_checked(source, v, arch, use_cache, (*extra, *defines), None)
        except _LostPipeline as lost:
            outcomes.append(_outcome(" ".join(defines), lost))
            continue
        tried.append(got)
        outcomes.append(_outcome(" ".join(defines), got))
        if not _uses_local(got.resources):
            break
    chosen = _least_spilling(tried)
    return dataclasses.replace(chosen, fallback_reason="; ".join(outcomes),
                               build_seconds=built.build_seconds + time.perf_counter() - t0)


def _build_one(
    source: EmittedSource, v: KernelVariant, arch: str, use_cache: bool, extra: Sequence[str],
    reg_split: str = "auto",
) -> BuiltCubin:
    """The variant's cubin. A kind with register splits (kernels.SM90_REG_SPLITS) is built
    with each candidate in order until one uses no local memory and keeps the wgmma pipeline;
    if none does, the one with the fewest spilled bytes (of those that keep the pipeline) is
    kept, and its reason names every split tried and what it gave. reg_split "fixed" tries
    the first (the kind's default) only: the A/B baseline, and a way back if a chosen split
    proves slower than the spill it removed."""
    candidates = spec(v.kernel).reg_split_candidates(v.tiling.kind)
    if reg_split == "fixed":
        candidates = candidates[:1]
    where = f"{source.filename} [{arch}, {variant_tag(v)}]"
    if not candidates:
        try:
            built = _compile_checked(source, v, arch, use_cache, extra, None)
        except _LostPipeline as lost:
            raise _pipeline_error(where, lost.notes, lost.log) from None
        return _spill_fallback(source, v, arch, use_cache, extra, built)
    t0 = time.perf_counter()
    tried: list[BuiltCubin | _LostPipeline] = []
    for i, split in enumerate(candidates):
        try:
            built = _compile_checked(source, v, arch, use_cache, extra, None if i == 0 else split)
        except _LostPipeline as lost:
            tried.append(lost)
            continue
        tried.append(dataclasses.replace(built, reg_split=split))
        if not _uses_local(built.resources):
            break
    outcomes = [_outcome(split, got) for split, got in zip(candidates, tried, strict=False)]
    kept = [got for got in tried if isinstance(got, BuiltCubin)]
    if not kept:
        first = tried[0]
        assert isinstance(first, _LostPipeline)
        raise _pipeline_error(where, first.notes, first.log,
                              f"; register splits tried: {'; '.join(outcomes)}")
    chosen = _least_spilling(kept)
    if len(tried) == 1 and not _uses_local(chosen.resources):
        reason = "default"
    elif reg_split == "fixed":
        reason = f"{'; '.join(outcomes)}; other splits not tried (--reg-split fixed)"
    elif _uses_local(chosen.resources):
        reason = f"{'; '.join(outcomes)}; kept {chosen.reg_split} (the fewest spilled bytes)"
    else:
        reason = "; ".join(outcomes)
    return dataclasses.replace(chosen, reg_split_reason=reason,
                               build_seconds=time.perf_counter() - t0)


def plan(source: EmittedSource, archs: Sequence[str] | None) -> list[tuple[KernelVariant, str]]:
    """(variant, arch) pairs to build, in a fixed order: variants as emitted, their archs."""
    if "/" in source.filename or "\\" in source.filename or not source.filename.endswith(".cu"):
        raise BuildError(f"program name must be a plain NAME.cu, not {source.filename!r}")
    wanted = None if archs is None else list(dict.fromkeys(archs))
    for a in wanted or ():
        if a not in SUPPORTED_ARCHS:
            raise UsageError(f"unsupported arch {a!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    pairs = [(v, a) for v in source.variants for a in v.archs if wanted is None or a in wanted]
    for a in wanted or ():
        if not any(pa == a for _, pa in pairs):
            raise BuildError(f"no kernel variant of {source.filename} targets {a}")
    seen: set[tuple[str, str]] = set()
    for v, a in pairs:
        if (a, variant_tag(v)) in seen:
            raise BuildError(f"two variants of {source.filename} are {variant_tag(v)} on {a}")
        seen.add((a, variant_tag(v)))
    if not pairs:
        raise BuildError(f"{source.filename} has no kernel variants to build")
    return pairs


def build(
    source: EmittedSource,
    archs: Sequence[str] | None = None,
    jobs: int = 1,
    cache: bool = True,
    *,
    extra_options: Sequence[str] = (),
    reg_split: str = "auto",
) -> BuiltKernels:
    """Compile every (variant, arch) of `source`; archs=None builds each variant's own archs.

    jobs <= 0 uses every core. The first failure (in plan order) is raised as BuildError.
    """
    if reg_split not in ("auto", "fixed"):
        raise UsageError(f"reg_split must be 'auto' or 'fixed', not {reg_split!r}")
    pairs = plan(source, archs)
    use_cache = cache and config.cache_enabled()
    workers = (os.cpu_count() or 1) if jobs <= 0 else jobs
    workers = max(1, min(workers, len(pairs)))
    if workers == 1:
        cubins = [_build_one(source, v, a, use_cache, extra_options, reg_split)
                  for v, a in pairs]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures: list[Future[BuiltCubin]] = [
                pool.submit(_build_one, source, v, a, use_cache, extra_options, reg_split)
                for v, a in pairs
            ]
            try:
                cubins = [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    return BuiltKernels(source=source, cubins=tuple(cubins))


# ------------------------------------------------------------------------------- repro


def _repro_main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--repro":
        print("usage: python -m cmc.build --repro FILE.cu [NVRTC options...]", file=sys.stderr)
        return 2
    path = Path(argv[1])
    options = argv[2:]
    res = nvrtc_compile(path.read_text(), path.name, options)
    if res.log:
        print(res.log.rstrip())
    if not res.ok:
        print(f"NVRTC failed ({res.seconds:.2f} s)", file=sys.stderr)
        return 1
    cub = read_cubin(res.cubin)
    spills = parse_ptxas_log(res.log)
    print(f"ok: {cub.arch} cubin, {len(res.cubin)} bytes, {res.seconds:.2f} s")
    for k in cub.kernels.values():
        s = spills.get(k.name)
        print(
            f"  {k.name}: {k.registers} registers, {k.shared_static} B static shared, "
            f"{k.frame_size} B local, spills {s.spill_stores if s else 0}/"
            f"{s.spill_loads if s else 0}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(_repro_main(sys.argv[1:]))
