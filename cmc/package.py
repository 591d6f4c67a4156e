"""Package stage: BuiltKernels -> OUT/NAME/ (manifest.json, NAME.cu, cubins, NAME.h).

The folder is the contract with every runtime, so its bytes must be reproducible: the same
build written twice, anywhere, gives identical files. Hence JSON with sorted keys, indent 2
and a trailing newline; no timestamps, no absolute paths, no build timings; the mask file is
recorded by its base name. All files are rendered in memory first (`render_files`), which is
also what the staleness check (driver.check_stale) compares against.

Nothing is written outside OUT/NAME: the mask name must be a C identifier, the folder must
resolve inside OUT, and only plain file names are written. Files from an earlier build of
the same mask that this build does not produce (a dropped variant's cubin) are removed, so
the folder always equals a fresh build. The folder is written atomically (`package`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .abi import (
    BWD_FLAG_DETERMINISTIC,
    BWD_FLAG_KV_HEAVY,
    DQ_LAYOUTS,
    HEADER_FIELDS,
    DescriptorLayout,
    bwd_args_layout,
    check_identifier,
    tensor_maps,
)
from .artifacts import SCHEMA_VERSION, BuiltCubin, BuiltKernels, KernelVariant
from .errors import ArtifactError
from .kernels import BWD_SEQUENCE, Pass, spec
from .render import table_dict
from .resources import jinja_env

if TYPE_CHECKING:
    import jinja2

    from .ir import ParamDecl

MANIFEST = "manifest.json"
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# Rules every runtime must follow when it fills the descriptor (see cmc/abi.py).
POINTER_ALIGN = 16  # bytes: Q, K, V, O base pointers (vector loads, TMA)
STRIDE_ALIGN_ELEMENTS = 8  # token and head strides of Q, K, V, O, in elements (16 bytes)


def safe_name(name: str) -> str:
    """The mask name, which becomes a folder, file names and C identifiers."""
    try:
        return check_identifier(name)
    except ValueError as e:
        raise ArtifactError(f"refusing to package: {e}") from None


def to_json(obj: Any) -> bytes:
    """The one JSON encoding of artifacts: stable across runs and machines."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def grid_rule(v: KernelVariant) -> list[str]:
    """Grid dimensions as expressions over descriptor fields and `max_ctas`: the kind's rule
    over this variant's tiling (cmc/kernels.py, the one home of the rule: inspect and the
    runtime's load re-derive it there)."""
    return spec(v.kernel).grid_rule(v.tiling.shape, v.block_m)


def _variant_of(built: BuiltKernels, c: BuiltCubin) -> KernelVariant:
    for v in built.source.variants:
        if v.symbol == c.symbol and c.arch in v.archs:
            return v
    raise ArtifactError(f"cubin {c.filename} matches no kernel variant of the source")


def descriptor_dict(layout: DescriptorLayout) -> dict[str, Any]:
    return {
        "struct": layout.struct_name,
        "size": layout.size,
        "align": layout.align,
        "fields": [
            {
                "name": f.name,
                "ctype": f.ctype,
                "offset": f.offset,
                "size": f.size,
                "param": f.param,
                "role": f.role,
            }
            for f in layout.fields
        ],
    }


def layout_dict(layout: DescriptorLayout) -> dict[str, Any]:
    """Tensor shapes and strides, in terms of descriptor fields (T = cu_seqlens[batch])."""

    def tensor(p: str, heads: str) -> dict[str, Any]:
        return {
            "dtype": "kernel",
            "shape": ["T", heads, "head_dim"],
            "strides": [f"{p}_stride_tok", f"{p}_stride_head", 1],
        }

    params: dict[str, Any] = {}
    for f in layout.fields:
        if f.param is None:
            continue
        if f.role == "per_sequence":
            params[f.name] = {"dtype": "int32", "shape": ["batch"]}
        elif f.role == "segment_offsets":
            params[f.name] = {"dtype": "int32", "shape": ["batch + 1"]}
        elif f.role == "segment_starts":
            base = f.name.removesuffix("_starts")
            params[f.name] = {"dtype": "int32", "shape": [f"{base}_offsets[batch]"]}
    header_names = {n for n, _, _ in HEADER_FIELDS}
    assert {"q", "k", "v", "o", "lse", "cu_seqlens"} <= header_names
    return {
        "tokens": (
            "packed: token i of sequence b is row cu_seqlens[b] + i, T = cu_seqlens[batch]; "
            "the batch layout [B, L, H, D] is the packed one with cu_seqlens = [0, L, 2L, ...]"
        ),
        "tensors": {
            "q": tensor("q", "heads_q"),
            "k": tensor("k", "heads_kv"),
            "v": tensor("v", "heads_kv"),
            "o": tensor("o", "heads_q"),
            "lse": {
                "dtype": "float32",
                "shape": ["heads_q", "T"],
                "strides": ["lse_stride_head", 1],
                "optional": True,
            },
            "cu_seqlens": {"dtype": "int32", "shape": ["batch + 1"], "strides": [1]},
        },
        "params": params,
        "alignment": {
            "pointer_bytes": POINTER_ALIGN,
            "stride_elements": STRIDE_ALIGN_ELEMENTS,
        },
        "rules": [
            "heads_q % heads_kv == 0",
            "0 <= cu_seqlens[b] <= cu_seqlens[b + 1]",
            "max_len >= cu_seqlens[b + 1] - cu_seqlens[b] for every b",
            "segment starts are sorted within each sequence, relative to its start",
            "scale_log2 = softmax scale * log2(e)",
        ],
    }


def kernel_dict(built: BuiltKernels, c: BuiltCubin) -> dict[str, Any]:
    v = _variant_of(built, c)
    r = c.resources
    s = spec(v.kernel)
    return {
        "pass": s.pass_.value,
        "role": s.role,
        "params": list(s.params),
        "symbol": c.symbol,
        "arch": c.arch,
        "file": c.filename,
        "sha256": c.sha256,
        "dtype": v.dtype,
        "head_dim": v.head_dim,
        "block_m": v.block_m,
        "block_n": v.block_n,
        "threads": v.threads,
        "block": [v.threads, 1, 1],
        "grid": grid_rule(v),
        "work_counter": spec(v.kernel).work_counter,
        "dynamic_smem": v.smem_bytes,
        "registers": r.registers,
        "shared_static": r.shared_static,
        "local_bytes": r.local_bytes,
        "spill_stores": r.spill_stores,
        "spill_loads": r.spill_loads,
        "reg_split": None if c.reg_split is None else {
            "producer": c.reg_split.producer,
            "consumer": c.reg_split.consumer,
            "reason": c.reg_split_reason,
        },
        "kernel": v.kernel.value,
        "tensor_maps": [{"tensor": t.tensor, "box": list(t.box), "swizzle": t.swizzle}
                        for t in tensor_maps(v.kernel, v.tiling.box_rows)],
        "tiling": v.tiling.to_dict(),
        "max_len": v.tiling.max_len(),
        # > 0: launched instead of the role's other kernel when every sequence is shorter
        "below_len": v.below_len,
        "nvrtc_version": c.nvrtc_version,
        "options": list(c.options),
    }


def param_dict(p: ParamDecl) -> dict[str, Any]:
    """One params entry; an int parameter carries its declared range, the contract the
    compiler assumed and the runtime checks (segments starts always lie in [0, len])."""
    out: dict[str, Any] = {"name": p.name, "kind": p.kind}
    if p.kind != "segments":
        out["range"] = p.range.to_json()
    return out


def bwd_args_dict() -> dict[str, Any]:
    """cmc_bwd_args, the backward kernels' second launch parameter (cmc/abi.py)."""
    lay = bwd_args_layout()
    return {
        "struct": lay.struct_name,
        "size": lay.size,
        "align": lay.align,
        "fields": [{"name": f.name, "ctype": f.ctype, "offset": f.offset, "size": f.size}
                   for f in lay.fields],
    }


def backward_dict(built: BuiltKernels) -> dict[str, Any] | None:
    """The manifest's "backward" section (None: compiled with --no-backward): the args
    struct, the fp32 workspaces' rules, the launch order per mode, the ws kv's order (flags bit 1
    from heavy_from_len on; null: never), the transposed table."""
    src = built.source
    if src.transposed is None:
        return None
    return {
        "args": bwd_args_dict(),
        "workspace": {
            "dq_accum": {"dtype": "float32", "shape": list(DQ_LAYOUTS[src.dq_layout][0]),
                         "bytes": DQ_LAYOUTS[src.dq_layout][1], "layout": src.dq_layout},
            "dsum": {"dtype": "float32", "shape": ["2", "heads_q", "T"],
                     "bytes": "8 * T * heads_q"},
        },
        "sequence": {mode: list(roles) for mode, roles in BWD_SEQUENCE.items()},
        "kv_order": ({"heavy_tiles": src.kv_order.heavy_tiles,
                      "heavy_from_len": src.kv_order.from_len} if src.kv_order is not None
                     else {"heavy_tiles": 0, "heavy_from_len": None}),
        "transposed_table": table_dict(src.transposed),
    }


def manifest_dict(
    built: BuiltKernels, mask_file: str, source_bytes: bytes, header_bytes: bytes
) -> dict[str, Any]:
    src = built.source
    mask = src.table.mask
    name = safe_name(mask.name)
    return {
        "schema_version": SCHEMA_VERSION,
        "cmc_version": __version__,
        "mask": {
            "name": name,
            "doc": mask.doc,
            "file": Path(mask_file).name,
            "source": mask.source,
            "sha256": sha256(mask.source.encode()),
        },
        "constants": dict(mask.consts),
        "params": [param_dict(p) for p in mask.params],
        "descriptor": descriptor_dict(src.layout),
        "interval_table": table_dict(src.table),
        "layout": layout_dict(src.layout),
        "source": {"file": src.filename, "sha256": sha256(source_bytes)},
        "header": {"file": f"{name}.h", "sha256": sha256(header_bytes)},
        "kernels": [kernel_dict(built, c) for c in built.cubins],
        "backward": backward_dict(built),
    }


# --------------------------------------------------------------------------- the header


def _jinja() -> jinja2.Environment:
    return jinja_env()


def _c_string(s: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]*", s):
        raise ArtifactError(f"refusing to put {s!r} in a C string")
    return f'"{s}"'


# The header's `which` of each tensor a map can describe (cmc_NAME_tensor_map_args_of and,
# for dO and dq_accum, cmc_NAME_bwd_tensor_map_args_of).
HEADER_MAP_WHICH = {"q": 0, "k": 1, "v": 2, "do": 3, "dq_accum": 4}


def render_header(built: BuiltKernels, mask_file: str) -> str:
    """NAME.h: descriptor struct with checked offsets, kernel names, launch rule."""
    src = built.source
    name = safe_name(src.table.mask.name)
    up = name.upper()
    variants = []
    bwd_variants = []
    for v in src.variants:
        cubins = [c for c in built.cubins if c.symbol == v.symbol]
        if not cubins:
            continue
        ks = spec(v.kernel)
        common = {
            "tag": v.tag,
            "TAG": v.tag.upper(),
            "symbol": _c_string(v.symbol),
            "threads": v.threads,
            "block_m": v.block_m,
            "block_n": v.block_n,
            "smem": v.smem_bytes,
            "kernel": v.kernel.value,
            "cubins": [
                {"ARCH": c.arch.upper(), "arch": c.arch, "file": _c_string(c.filename)}
                for c in cubins
            ],
            # the tiling the kernel follows (grid rules, query_tiles)
            "tiling": 1 if v.tiling.kind == "patch" else 0,
            "origin": v.tiling.origin,
            "width": v.tiling.width,
            "patch_rows": v.tiling.patch_rows,
            "patch_cols": v.tiling.patch_cols,
            "min_len": v.tiling.min_len,
            "max_len": v.tiling.max_len() or 0,
            "below_len": v.below_len,
        }
        if ks.pass_ is Pass.BACKWARD:
            maps = tensor_maps(v.kernel, v.tiling.box_rows)  # as the manifest lists them
            bwd_variants.append({
                **common,
                "role": ks.role,
                "heads": "heads_kv" if "heads_kv" in ks.grid else "heads_q",
                "maps": [HEADER_MAP_WHICH[m.tensor] for m in maps],
                "box_rows": maps[0].box[2] if maps else 0,
                "head_dim": v.head_dim,
                "bf16": v.dtype == "bf16",
            })
            continue
        variants.append({
            **common,
            "persistent": ks.persistent,
            "tensor_maps": len(ks.tensor_maps),
            "box_rows": v.tiling.box_rows,
        })
    return _jinja().get_template("header.h.j2").render(
        name=name,
        NAME=up,
        cmc_version=__version__,
        mask_file=Path(mask_file).name,
        struct=src.layout.c_struct(),
        struct_name=src.layout.struct_name,
        fields=src.layout.fields,
        size=src.layout.size,
        align=src.layout.align,
        variants=variants,
        bwd_variants=bwd_variants,
        bwd=bwd_args_layout() if src.transposed is not None else None,
        bwd_flag_deterministic=BWD_FLAG_DETERMINISTIC,
        bwd_flag_kv_heavy=BWD_FLAG_KV_HEAVY,
        kv_heavy_from=(src.kv_order.from_len if src.kv_order is not None else -1),
        dq_block64=src.dq_layout == "block64",
    )


# --------------------------------------------------------------------------- writing


def render_files(built: BuiltKernels, mask_file: str) -> dict[str, bytes]:
    """Every file of OUT/NAME by its name, in memory; the manifest comes last."""
    src = built.source
    name = safe_name(src.table.mask.name)
    if src.filename != f"{name}.cu":
        raise ArtifactError(f"source file {src.filename!r} should be {name}.cu for mask {name}")
    source_bytes = src.text.encode("utf-8")
    header_bytes = render_header(built, mask_file).encode("utf-8")
    files: dict[str, bytes] = {c.filename: c.data for c in built.cubins}
    if len(files) != len(built.cubins):
        raise ArtifactError("two cubins share a file name")
    files[src.filename] = source_bytes
    files[f"{name}.h"] = header_bytes
    files[MANIFEST] = to_json(manifest_dict(built, mask_file, source_bytes, header_bytes))
    for f in files:
        if not _FILE_NAME.match(f) or f in (".", ".."):
            raise ArtifactError(f"refusing to write file {f!r}")
    return files


def artifact_dir(out_dir: Path, name: str) -> Path:
    """OUT/NAME, refusing a name or a link that would land outside OUT."""
    safe_name(name)
    root = Path(out_dir).resolve()
    dest = root / name
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise ArtifactError(f"{dest} exists and is not a folder; refusing to write there")
    if dest.resolve().parent != root:
        raise ArtifactError(f"{dest} resolves outside {root}; refusing to write there")
    return dest


def _ours(fname: str, name: str) -> bool:
    """Files a build of mask NAME may have written (so may remove when it no longer does)."""
    return fname in (MANIFEST, f"{name}.cu", f"{name}.h") or (
        fname.startswith(f"{name}.") and fname.endswith(".cubin")
    )


def _write(dest: Path, fname: str, data: bytes) -> None:
    with open(dest / fname, "xb") as f:  # a fresh folder: nothing to replace or follow
        f.write(data)
    os.chmod(dest / fname, 0o644)


def check_out_dir(out_dir: Path, names: Sequence[str] = ()) -> None:
    """Refuse, before anything is built, an OUT that cannot take artifact folders: a file, a
    path through a file, an unwritable or read-only place, or a NAME that is not a folder.

    It probes by creating (and removing) a temporary folder in OUT, so permissions, read-only
    mounts and quotas are all answered by the file system itself."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"-o {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(dir=out, prefix=".cmc-probe-")
        os.rmdir(probe)
    except OSError as e:
        raise ArtifactError(f"-o {out}: cannot write there ({e.strerror or e})") from None
    for name in names:
        artifact_dir(out, name)


def package(built: BuiltKernels, out_dir: Path, mask_file: str) -> Path:
    """Write OUT/NAME/ atomically and return it.

    Every file goes into a temporary sibling OUT/.NAME.tmp-*, which then takes NAME's place
    by rename, so OUT/NAME is always either the previous build or this one, never a mixture.
    Files in an old OUT/NAME that no build of NAME writes (notes of the user's) are carried
    over; files of NAME's earlier builds that this build does not produce are dropped."""
    files = render_files(built, mask_file)
    name = built.source.table.mask.name
    check_out_dir(out_dir)
    dest = artifact_dir(out_dir, name)
    try:
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{name}.tmp-"))
    except OSError as e:
        raise ArtifactError(f"{dest.parent}: cannot write there ({e.strerror or e})") from None
    old: Path | None = None
    try:
        os.chmod(staging, 0o755)
        for fname, data in files.items():
            _write(staging, fname, data)
        if dest.is_dir():
            for p in sorted(dest.iterdir()):
                if p.name not in files and not _ours(p.name, name) and p.is_file() \
                        and not p.is_symlink():
                    shutil.copy2(p, staging / p.name)
            old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{name}.old-"))
            os.replace(dest, old / name)
        os.replace(staging, dest)
    except BaseException as e:
        if old is not None and (old / name).exists() and not dest.exists():
            os.replace(old / name, dest)  # put the previous build back
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if isinstance(e, OSError):
            raise ArtifactError(f"{dest}: cannot write the artifact folder "
                                f"({e.strerror or e}); it is unchanged") from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dest


# --------------------------------------------------------------------------- --check


def stale_files(built: BuiltKernels, mask_file: str, out_dir: Path) -> list[str]:
    """Paths under OUT/NAME that differ from, are missing from, or are left over from `built`."""
    files = render_files(built, mask_file)
    name = built.source.table.mask.name
    dest = artifact_dir(out_dir, name)
    out = []
    for fname, data in files.items():
        p = dest / fname
        try:
            same = p.is_file() and not p.is_symlink() and p.read_bytes() == data
        except OSError:
            same = False
        if not same:
            out.append(str(p))
    if dest.is_dir():
        for p in sorted(dest.iterdir()):
            if p.name not in files and _ours(p.name, name):
                out.append(str(p))
    return out
