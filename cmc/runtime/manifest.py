"""Read an artifact's manifest: the one reader of manifest.json (the runtime and `cmc inspect`).

The manifest is the whole contract between the compiler and every runtime
(docs/architecture.md): what a kernel kind needs at launch (block, grid rule, shared memory,
tensor maps, work counter) is written there by package from cmc/kernels.py, so nothing here
imports the compiler. Every field is checked before anything touches a GPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..abi import (
    CTYPES,
    DQ_LAYOUTS,
    F32_MAP_COLS,
    F32_MAP_TENSORS,
    HEADER_FIELDS,
    SCHEMA_VERSION,
    TENSOR_MAP_BOX_ROWS,
    TENSOR_MAP_SWIZZLE,
    DescriptorLayout,
    Field,
    map_box,
)
from ..contract import INT32_MAX, INT32_MIN, ParamRange
from ..errors import ArtifactError
from .params import parse_grid_expr

RESERVED = ("q", "k", "v", "scale", "return_lse", "out", "cu_seqlens", "max_len", "stream",
            "plan", "deterministic", "dout", "lse", "dq", "dk", "dv")
PASSES = {"forward": ("fwd",), "backward": ("pre", "kv", "dq", "post")}
KERNEL_PARAMS = (["desc"], ["desc", "maps"], ["desc", "bwd_args"], ["desc", "maps", "bwd_args"])
# cmc_bwd_args (templates/cmc/attn_bwd_portable.cuh, docs/architecture.md, "The backward"): the runtime
# packs these fields by name, so the manifest must list exactly them (offsets may differ).
BWD_ARGS = (("dout", "uint64_t"), ("dq", "uint64_t"), ("dk", "uint64_t"), ("dv", "uint64_t"),
            ("dq_accum", "uint64_t"), ("dsum", "uint64_t"),
            ("dout_stride_tok", "int64_t"), ("dout_stride_head", "int64_t"),
            ("dq_stride_tok", "int64_t"), ("dq_stride_head", "int64_t"),
            ("dk_stride_tok", "int64_t"), ("dk_stride_head", "int64_t"),
            ("dv_stride_tok", "int64_t"), ("dv_stride_head", "int64_t"),
            ("total_tokens", "int32_t"), ("flags", "int32_t"))
WORKSPACES = ("dq_accum", "dsum")
SEQUENCES = {"atomic": ("pre", "kv", "post"), "deterministic": ("pre", "kv", "dq")}
DEFAULT_GRID = ("ceil(max_len / block_m)", "heads_q", "batch")
_ROLES = {"scalar": (("value", "int32_t"),), "batch": (("per_sequence", "uint64_t"),),
          "segments": (("segment_offsets", "uint64_t"), ("segment_starts", "uint64_t"))}


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class KernelEntry:
    """One kernel of the manifest: one (dtype, head_dim) variant built for one arch."""

    symbol: str
    arch: str
    file: str
    sha256: str
    dtype: str
    head_dim: int
    block_m: int
    block_n: int
    threads: int
    block: tuple[int, int, int]
    grid: tuple[Callable[[Mapping[str, int]], int], ...]
    dynamic_smem: int
    tensor_maps: tuple[str, ...] = ()  # tensors whose CUtensorMaps follow the descriptor
    box_rows: tuple[int, ...] = ()  # tokens per box of each map, in tensor_maps' order
    max_len: int | None = None  # longest sequence the kernel takes (patch tilings)
    work_counter: bool = False  # takes its work units from desc.sched (sm90)
    pass_: str = "forward"  # "forward" | "backward"
    role: str = "fwd"  # fwd | pre | kv | dq | post
    params: tuple[str, ...] = ("desc",)  # the kernel's by-value parameters, in order
    # > 0: a kernel for short sequences, launched instead of its role's kernel when
    # max_len < below_len (kernels.SHORT_SUFFIX)
    below_len: int = 0


@dataclass(frozen=True)
class BackwardSpec:
    """The manifest's "backward" section: how to pack cmc_bwd_args, how big the fp32
    workspaces are (rules over T, batch, heads_q, head_dim), and which roles run in which
    order."""

    args: DescriptorLayout
    workspace: Mapping[str, Callable[[Mapping[str, int]], int]]  # name -> bytes rule
    sequence: Mapping[str, tuple[str, ...]]  # "atomic" / "deterministic" -> roles
    dq_layout: str = "token"  # dq_accum's (abi.DQ_LAYOUTS)
    # the ws kv's heavy order (flags bit 1) from this max_len on; None: never (also where an
    # older manifest has no kv_order)
    kv_heavy_from_len: int | None = None

    def flags(self, deterministic: bool, max_len: int) -> int:
        """cmc_bwd_args.flags for a launch: bit 0 deterministic, bit 1 the heavy kv order."""
        heavy = self.kv_heavy_from_len is not None and max_len >= self.kv_heavy_from_len
        return (1 if deterministic else 0) | (2 if heavy else 0)


@dataclass(frozen=True)
class Manifest:
    path: Path  # the artifact folder
    name: str
    raw: Mapping[str, Any]
    params: tuple[tuple[str, str], ...]  # (name, kind) in declaration order
    layout: DescriptorLayout
    kernels: tuple[KernelEntry, ...]
    # the declared range of each int parameter: the contract the kernels were compiled for
    ranges: Mapping[str, ParamRange] = field(default_factory=dict)
    backward: BackwardSpec | None = None  # None: compiled with --no-backward

    def param_fields(self) -> dict[str, dict[str, Field]]:
        out: dict[str, dict[str, Field]] = {}
        for f in self.layout.fields:
            if f.param is not None:
                out.setdefault(f.param, {})[f.role] = f
        return out


def _need(d: Mapping[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if not isinstance(d, Mapping):
        raise ArtifactError(f"manifest: {where} is a {type(d).__name__}, not an object")
    if key not in d:
        raise ArtifactError(f"manifest: {where} has no {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ArtifactError(f"manifest: {where}.{key} has the wrong type ({type(v).__name__})")
    return v


def _read_layout(raw: Mapping[str, Any], params: Sequence[tuple[str, str]]) -> DescriptorLayout:
    d = _need(raw, "descriptor", "manifest", dict)
    fields = []
    for i, f in enumerate(_need(d, "fields", "descriptor", list)):
        where = f"descriptor.fields[{i}]"
        ctype = _need(f, "ctype", where, str)
        if ctype not in CTYPES:
            raise ArtifactError(f"manifest: {where} has unknown C type {ctype!r}")
        size = _need(f, "size", where, int)
        off = _need(f, "offset", where, int)
        if size != CTYPES[ctype][0] or off < 0 or off % size:
            raise ArtifactError(f"manifest: {where} has a bad size/offset ({size}/{off})")
        fields.append(Field(_need(f, "name", where, str), ctype, off, size,
                            f.get("param"), str(f.get("role") or "")))
    size = _need(d, "size", "descriptor", int)
    layout = DescriptorLayout(_need(d, "struct", "descriptor", str), tuple(fields), size,
                              _need(d, "align", "descriptor", int))
    spans = sorted((f.offset, f.offset + f.size, f.name) for f in fields)
    for (_, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise ArtifactError(f"manifest: descriptor fields {an} and {bn} overlap")
    if spans and spans[-1][1] > size:
        raise ArtifactError(f"manifest: descriptor field {spans[-1][2]} runs past its size {size}")
    names = {f.name: f for f in fields}
    for name, ctype, _ in HEADER_FIELDS:
        if name not in names or names[name].ctype != ctype:
            raise ArtifactError(f"manifest: descriptor lacks header field {ctype} {name} "
                                "(built by an incompatible cmc?)")
    by_param: dict[str, dict[str, Field]] = {}
    for f in fields:
        if f.param is not None:
            by_param.setdefault(f.param, {})[f.role] = f
    for pname, kind in params:
        for role, ctype in _ROLES[kind]:
            got = by_param.get(pname, {}).get(role)
            if got is None or got.ctype != ctype:
                raise ArtifactError(f"manifest: parameter {pname} ({kind}) has no {ctype} "
                                    f"descriptor field with role {role!r}")
    return layout


def _read_kernel(k: Mapping[str, Any], i: int) -> KernelEntry:
    where = f"kernels[{i}]"
    file = _need(k, "file", where, str)
    if "/" in file or "\\" in file or file in ("", ".", ".."):
        raise ArtifactError(f"manifest: {where}.file must be a file name in the artifact "
                            f"folder, not {file!r}")
    threads = _need(k, "threads", where, int)
    block = k.get("block", [threads, 1, 1])
    if not (isinstance(block, list) and len(block) == 3 and all(isinstance(b, int) for b in block)):
        raise ArtifactError(f"manifest: {where}.block must be [x, y, z] ints")
    grid_raw = k.get("grid", list(DEFAULT_GRID))
    if not (isinstance(grid_raw, list) and len(grid_raw) == 3):
        raise ArtifactError(f"manifest: {where}.grid must be 3 expressions")
    dtype = _need(k, "dtype", where, str)
    if dtype not in ("bf16", "fp16"):
        raise ArtifactError(f"manifest: {where}.dtype {dtype!r} is not bf16 or fp16")
    maps = k.get("tensor_maps", [])
    if not isinstance(maps, list):
        raise ArtifactError(f"manifest: {where}.tensor_maps must be a list")
    pass_ = k.get("pass", "forward")
    tensors = ("q", "k", "v", "do", *F32_MAP_TENSORS) if pass_ == "backward" else ("q", "k", "v")
    for t in maps:
        if not (isinstance(t, dict) and t.get("tensor") in tensors
                and t.get("swizzle") == TENSOR_MAP_SWIZZLE
                and t.get("box") in [list(map_box(t["tensor"], r)) for r in TENSOR_MAP_BOX_ROWS]):
            raise ArtifactError(f"manifest: {where}.tensor_maps entry {t!r}: this runtime encodes "
                                f"maps of {', '.join(tensors)} (do, dq_accum: backward kernels "
                                f"only) with a box [64, 1, R] (R in {list(TENSOR_MAP_BOX_ROWS)}; "
                                f"dq_accum: [{F32_MAP_COLS}, 1, R]) and swizzle "
                                f"{TENSOR_MAP_SWIZZLE} only (cmc/abi.py)")
    max_len = k.get("max_len")
    if max_len is not None and not (isinstance(max_len, int) and max_len > 0):
        raise ArtifactError(f"manifest: {where}.max_len must be null or a positive int")
    work_counter = k.get("work_counter", False)
    if not isinstance(work_counter, bool):
        raise ArtifactError(f"manifest: {where}.work_counter must be true or false")
    if pass_ not in PASSES:
        raise ArtifactError(f"manifest: {where}.pass must be one of {list(PASSES)}, "
                            f"not {pass_!r}")
    role = k.get("role", PASSES[pass_][0])
    if role not in PASSES[pass_]:
        raise ArtifactError(f"manifest: {where}.role {role!r} is not a {pass_} role "
                            f"({', '.join(PASSES[pass_])})")
    below_len = k.get("below_len", 0)
    if not (isinstance(below_len, int) and not isinstance(below_len, bool) and below_len >= 0):
        raise ArtifactError(f"manifest: {where}.below_len must be an int >= 0")
    kparams = k.get("params", ["desc", "maps"] if maps else ["desc"])
    if kparams not in KERNEL_PARAMS or (("maps" in kparams) != bool(maps)) \
            or (("bwd_args" in kparams) != (pass_ == "backward")):
        raise ArtifactError(f"manifest: {where}.params {kparams!r} is not one this runtime "
                            f"passes for a {pass_} kernel (one of {list(KERNEL_PARAMS)}; "
                            "maps exactly when tensor_maps are listed, bwd_args exactly "
                            "for backward kernels)")
    return KernelEntry(
        symbol=_need(k, "symbol", where, str), arch=_need(k, "arch", where, str), file=file,
        sha256=_need(k, "sha256", where, str).lower(), dtype=dtype,
        head_dim=_need(k, "head_dim", where, int), block_m=_need(k, "block_m", where, int),
        block_n=int(k.get("block_n", 0)), threads=threads,
        block=(int(block[0]), int(block[1]), int(block[2])),
        grid=tuple(parse_grid_expr(g) for g in grid_raw),
        dynamic_smem=_need(k, "dynamic_smem", where, int),
        tensor_maps=tuple(t["tensor"] for t in maps),
        box_rows=tuple(t["box"][2] for t in maps), max_len=max_len, work_counter=work_counter,
        pass_=pass_, role=role, params=tuple(kparams), below_len=below_len)


def _check_roles(kernels: Sequence[KernelEntry]) -> None:
    """One kernel per (arch, dtype, head_dim, role) and length class, and a kernel for short
    sequences only beside a kernel for every length of its role (which longer ones need). The
    loader keys its kernels by these (device._DeviceKernels), so a second one would silently
    replace the first."""
    seen: dict[tuple[str, str, int, str, bool], KernelEntry] = {}
    for k in kernels:
        key = (k.arch, k.dtype, k.head_dim, k.role, k.below_len > 0)
        if key in seen:
            raise ArtifactError(f"manifest: two {k.pass_} {k.role} kernels for {k.arch} {k.dtype} "
                                f"d{k.head_dim}{' for short sequences' if k.below_len else ''} "
                                f"({seen[key].symbol}, {k.symbol})")
        seen[key] = k
    for (arch, dtype, hd, role, short), k in seen.items():
        if short and (arch, dtype, hd, role, False) not in seen:
            raise ArtifactError(f"manifest: {k.symbol} is for sequences below "
                                f"{k.below_len} but no {role} kernel for {arch} {dtype} "
                                f"d{hd} takes longer ones")


def _read_backward(raw: Mapping[str, Any], kernels: Sequence[KernelEntry]) -> BackwardSpec | None:
    """The "backward" section (null or absent: forward only), checked against the kernels:
    every role a sequence names has a kernel for every (arch, dtype, head_dim) that has any
    backward kernel."""
    bwd = raw.get("backward")
    has_kernels = any(k.pass_ == "backward" for k in kernels)
    if bwd is None:
        if has_kernels:
            raise ArtifactError("manifest: backward kernels are listed but \"backward\" is null")
        return None
    if not isinstance(bwd, dict):
        raise ArtifactError("manifest: backward must be an object or null")
    a = _need(bwd, "args", "backward", dict)
    fields = []
    for i, f in enumerate(_need(a, "fields", "backward.args", list)):
        where = f"backward.args.fields[{i}]"
        if not isinstance(f, dict):
            raise ArtifactError(f"manifest: {where} must be an object")
        ctype = _need(f, "ctype", where, str)
        size, off = _need(f, "size", where, int), _need(f, "offset", where, int)
        if ctype not in CTYPES or size != CTYPES[ctype][0] or off < 0 or off % size:
            raise ArtifactError(f"manifest: {where} has a bad C type/size/offset "
                                f"({ctype}/{size}/{off})")
        fields.append(Field(_need(f, "name", where, str), ctype, off, size))
    args = DescriptorLayout(_need(a, "struct", "backward.args", str), tuple(fields),
                            _need(a, "size", "backward.args", int),
                            _need(a, "align", "backward.args", int))
    got = sorted((f.name, f.ctype) for f in fields)
    if got != sorted(BWD_ARGS):
        raise ArtifactError(f"manifest: backward.args must have exactly the cmc_bwd_args fields "
                            f"{[n for n, _ in BWD_ARGS]} with their C types; has "
                            f"{[n for n, _ in got]}")
    spans = sorted((f.offset, f.offset + f.size, f.name) for f in fields)
    for (_, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise ArtifactError(f"manifest: backward.args fields {an} and {bn} overlap")
    if spans[-1][1] > args.size or args.align not in (8, 16) or args.size % args.align:
        raise ArtifactError(f"manifest: backward.args size {args.size} / align {args.align} "
                            "does not hold its fields")
    ws = _need(bwd, "workspace", "backward", dict)
    workspace = {}
    for name in WORKSPACES:
        w = _need(ws, name, "backward.workspace", dict)
        if w.get("dtype") != "float32":
            raise ArtifactError(f"manifest: backward.workspace.{name}.dtype must be float32")
        try:
            workspace[name] = parse_grid_expr(_need(w, "bytes", f"backward.workspace.{name}",
                                                    str))
        except ArtifactError as e:
            raise ArtifactError(f"manifest: backward.workspace.{name}.bytes: {e}") from None
    if set(ws) != set(WORKSPACES):
        raise ArtifactError(f"manifest: backward.workspace must name exactly {list(WORKSPACES)}")
    dq_layout = ws["dq_accum"].get("layout")
    if dq_layout not in DQ_LAYOUTS:
        raise ArtifactError(f"manifest: backward.workspace.dq_accum.layout {dq_layout!r:.40}: not "
                            f"one of {list(DQ_LAYOUTS)}")
    seq = _need(bwd, "sequence", "backward", dict)
    sequence = {}
    for mode, roles in SEQUENCES.items():
        got_roles = _need(seq, mode, "backward.sequence", list)
        if tuple(got_roles) != roles:  # the kernels' contract: what each role leaves behind
            raise ArtifactError(f"manifest: backward.sequence.{mode} must be {list(roles)}, "
                                f"not {got_roles!r}")
        sequence[mode] = roles
    need = {r for roles in sequence.values() for r in roles}
    groups: dict[tuple[str, str, int], set[str]] = {}
    for k in kernels:
        if k.pass_ == "backward" and not k.below_len:
            groups.setdefault((k.arch, k.dtype, k.head_dim), set()).add(k.role)
    for (arch, dtype, hd), g in sorted(groups.items()):
        if need - g:
            raise ArtifactError(f"manifest: backward kernels for {arch} {dtype} d{hd} lack "
                                f"the roles {sorted(need - g)}")
    heavy_from = None
    if (order := bwd.get("kv_order")) is not None:
        if not isinstance(order, dict):
            raise ArtifactError("manifest: backward.kv_order must be an object")
        heavy_from = order.get("heavy_from_len")
        if heavy_from is not None and (isinstance(heavy_from, bool)
                                       or not isinstance(heavy_from, int) or heavy_from < 0):
            raise ArtifactError(f"manifest: backward.kv_order.heavy_from_len {heavy_from!r:.40}:"
                                " not a length >= 0 or null")
    return BackwardSpec(args, workspace, sequence, dq_layout, heavy_from)


MANIFEST = "manifest.json"


MAX_MANIFEST_BYTES = 64 << 20


def parse_manifest_bytes(data: bytes, where: str) -> dict[str, Any]:
    """bytes -> a JSON object, refusing oversized or absurdly nested input (json.loads raises
    RecursionError there) with an ArtifactError, as inspect and load both need."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"{where}: {len(data)} bytes, more than any manifest "
                            f"({MAX_MANIFEST_BYTES} allowed)")
    try:
        obj = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ArtifactError(f"{where}: not a manifest (JSON nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ArtifactError(f"{where}: the manifest is not a JSON object")
    return obj


def read_manifest_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The manifest's path and JSON object, of this schema version (path: the artifact
    folder or the manifest itself)."""
    p = Path(path)
    mpath = p if p.is_file() else p / MANIFEST
    try:
        data = mpath.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{mpath}: no {MANIFEST} (compile the mask first: "
                            "cmc compile x.mask -o out/)") from None
    except OSError as e:
        raise ArtifactError(f"{mpath}: cannot read the manifest: {e}") from e
    raw = parse_manifest_bytes(data, str(mpath))
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(f"{mpath}: schema_version {version!r:.40}, this cmc reads "
                            f"{SCHEMA_VERSION}; recompile with this cmc")
    return mpath, raw


def read_params(raw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The mask's parameters as (name, kind), in declaration order."""
    params = []
    for i, pr in enumerate(_need(raw, "params", "manifest", list)):
        kind = _need(pr, "kind", f"params[{i}]", str)
        if kind not in _ROLES:
            raise ArtifactError(f"manifest: params[{i}] has unknown kind {kind!r}")
        params.append((_need(pr, "name", f"params[{i}]", str), kind))
    for pname, _ in params:
        if pname in RESERVED:
            raise ArtifactError(f"mask parameter {pname!r} collides with a keyword of "
                                "Attention.__call__; rename it in the .mask file")
    return tuple(params)


def read_ranges(raw: Mapping[str, Any]) -> dict[str, ParamRange]:
    """The declared range of every int parameter (required: the compiler assumed it, so a
    runtime that checked less could pass values the kernels were not compiled for)."""
    out: dict[str, ParamRange] = {}
    for i, pr in enumerate(_need(raw, "params", "manifest", list)):
        if pr.get("kind") == "segments":
            continue
        try:
            rng = ParamRange.from_json(_need(pr, "range", f"params[{i}]", dict))
        except ValueError as e:
            raise ArtifactError(f"manifest: params[{i}]: {e}") from None
        ends = (rng.lo.len_coef, rng.lo.add, rng.hi.len_coef, rng.hi.add)
        if not all(INT32_MIN <= x <= INT32_MAX for x in ends):
            raise ArtifactError(f"manifest: params[{i}]: range ends must be int32")
        out[str(pr["name"])] = rng
    return out


def read_name(mpath: Path, raw: Mapping[str, Any]) -> str:
    mask_info = raw.get("mask")
    mask: Mapping[str, Any] = mask_info if isinstance(mask_info, dict) else {}
    return str(mask.get("name") or mpath.parent.name)


def parse_manifest(mpath: Path, raw: Mapping[str, Any]) -> Manifest:
    """Check every field a loader relies on and give the typed view of it."""
    params = read_params(raw)
    kernels = tuple(_read_kernel(k, i) for i, k in enumerate(_need(raw, "kernels", "manifest",
                                                                   list)))
    if not kernels:
        raise ArtifactError(f"{mpath}: the manifest lists no kernels")
    _check_roles(kernels)
    return Manifest(mpath.parent, read_name(mpath, raw), raw, params, _read_layout(raw, params),
                    kernels, read_ranges(raw), _read_backward(raw, kernels))


def read_manifest(path: str | Path) -> Manifest:
    """Parse and check manifest.json (path: the artifact folder or the manifest itself)."""
    return parse_manifest(*read_manifest_json(path))


def verify_cubins(m: Manifest) -> dict[str, bytes]:
    """Read every cubin the manifest lists and check its sha256: file name -> bytes."""
    out: dict[str, bytes] = {}
    for k in m.kernels:
        if k.file in out:
            continue
        path = m.path / k.file
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ArtifactError(f"{k.file}: cannot read the cubin ({e.strerror or e})") from e
        digest = hashlib.sha256(data).hexdigest()
        if digest != k.sha256:
            raise ArtifactError(f"{k.file}: sha256 mismatch (manifest {k.sha256[:16]}..., file "
                                f"{digest[:16]}...): the artifact is corrupt or stale; recompile")
        out[k.file] = data
    return out


# --------------------------------------------------------------------------- per device


__all__ = ["BackwardSpec", "DEFAULT_GRID", "MANIFEST", "RESERVED", "KernelEntry", "Manifest", "parse_manifest",
           "read_manifest", "read_manifest_json", "read_name", "read_params", "read_ranges",
           "verify_cubins"]
