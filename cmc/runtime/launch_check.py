"""The launch fields of a manifest against the artifact: one check for `cmc inspect` and `load`.

The runtime launches with each kernel's threads, block, grid, dynamic_smem and max_len, so a
manifest edited by hand (or by a broken tool) must be refused before a launch, and by the
same rules wherever it is read (issue 23). Each kernel entry is checked

- against what its cubin records (cmc/cubin.py): its arch, its entry point, the
  __launch_bounds__ thread count and the size of its parameter block;
- against the header's per-variant macros (THREADS, DYNAMIC_SMEM, BLOCK_M, BLOCK_N, MAX_LEN;
  the header's sha256 is checked first: the same build wrote both);
- against the rules that derive grid and max_len from the kind, block_m and the tiling
  (cmc/kernels.py: KernelSpec.grid_rule, TileShape).

Only the runtime-safe modules are used (cmc.abi, cmc.cubin, cmc.kernels, cmc.errors), so
inspect (cmc/inspection.py) calls this too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..abi import kernel_param_bytes
from ..cubin import Cubin, KernelInfo, read_cubin
from ..errors import ArtifactError
from ..kernels import TileShape, spec
from .manifest import Manifest

_DEFINE = re.compile(r"^#define (CMC_[A-Z0-9_]+) (\d+)u?\b", re.M)
_TILING_INTS = ("origin", "width", "patch_rows", "patch_cols", "min_len")


def header_values(header: str) -> dict[str, int]:
    """The integer macros of a generated header (NAME.h), by name."""
    return {m.group(1): int(m.group(2)) for m in _DEFINE.finditer(header)}


def tile_shape(d: Any, where: str) -> TileShape:
    """A kernel entry's "tiling" as the facts its grid rule and max_len follow from."""
    if not isinstance(d, Mapping) or d.get("kind") not in ("linear", "patch") or not all(
            isinstance(d.get(f), int) and not isinstance(d.get(f), bool) for f in _TILING_INTS):
        raise ArtifactError(f"{where}: tiling must be an object with kind linear or patch and "
                            f"int {', '.join(_TILING_INTS)}")
    shape = TileShape(kind=d["kind"], **{f: d[f] for f in _TILING_INTS})
    if shape.kind == "patch" and not (shape.width > 0 and shape.patch_cols > 0
                                      and shape.patch_rows > 0 and shape.origin >= 0):
        raise ArtifactError(f"{where}: a patch tiling needs a positive width, patch_rows and "
                            "patch_cols and an origin >= 0")
    return shape


def entry_cubin(tag: str, k: Mapping[str, Any], data: bytes, problems: list[str]
                ) -> Cubin | None:
    """The entry's cubin (sha256-checked by the caller), None where it cannot be used: one
    that is not a cubin, or lacks the entry point, or (still returned) is for another arch
    is a problem."""
    try:
        cub = read_cubin(data)
    except ArtifactError as e:
        problems.append(f"{tag}: {e}")
        return None
    if cub.arch != k["arch"]:
        problems.append(f"{tag}: the cubin is for {cub.arch}, the manifest says {k['arch']}")
    if k["symbol"] not in cub.kernels:
        problems.append(f"{tag}: no entry point {k['symbol']} in the cubin")
        return None
    return cub


def launch_problems(name: str, kernels: Sequence[Mapping[str, Any]], descriptor_size: int,
                    infos: Mapping[str, KernelInfo], header: str | None) -> list[str]:
    """Kernel entries against their cubins (`infos`: the entry's file -> what its cubin records
    of its entry point, for the cubins at hand; by file, as one symbol has a cubin per arch), the sha256-checked header's per-variant macros, and the rules that
    derive grid and max_len from the kind, block_m and the tiling. header None: not at hand
    (its absence or mismatch is reported by the caller). Raises KeyError, TypeError or
    ValueError on an entry that lacks a field or has a wrong type (callers that did not
    validate the schema first turn these into an ArtifactError)."""
    macros = header_values(header) if header is not None else None
    out: list[str] = []
    for k in kernels:
        tag = k["file"]
        shape = tile_shape(k["tiling"], tag)
        kind = spec(k["kernel"])
        variant = kind.variant_tag(k["dtype"], k["head_dim"], k.get("below_len", 0) > 0)
        prefix = f"CMC_{name.upper()}_{variant.upper()}_"
        want: dict[str, Any] = {"grid": kind.grid_rule(shape, k["block_m"]),
                                "max_len": shape.max_len()}
        for field, macro in (("threads", "THREADS"), ("dynamic_smem", "DYNAMIC_SMEM"),
                             ("block_m", "BLOCK_M"), ("block_n", "BLOCK_N")):
            if macros is None:
                break
            if prefix + macro not in macros:
                out.append(f"{tag}: the header has no {prefix + macro}")
            else:
                want[field] = macros[prefix + macro]
        if macros is not None and macros.get(prefix + "MAX_LEN", 0) != (shape.max_len() or 0):
            out.append(f"{tag}: the header's {prefix}MAX_LEN is not the tiling's max_len")
        if macros is not None and macros.get(prefix + "BELOW_LEN", 0) != k.get("below_len", 0):
            out.append(f"{tag}: the header's {prefix}BELOW_LEN is not the manifest's below_len")
        want["block"] = [k["threads"], 1, 1]
        for field, value in want.items():
            if k.get(field) != value:
                source = "rules give" if field in ("grid", "max_len", "block") else "header gives"
                out.append(f"{tag}: manifest says {field} {k.get(field)!r}, the artifact's "
                           f"{source} {value!r}")
        info = infos.get(k["file"])
        if info is None:
            continue
        if info.max_threads is None:
            out.append(f"{tag}: the cubin records no launch bounds")
        elif list(info.max_threads) != [k["threads"], 1, 1]:
            out.append(f"{tag}: manifest launches {k['threads']} threads, the cubin's launch "
                       f"bounds are {list(info.max_threads)}")
        want_bytes = kernel_param_bytes(descriptor_size, k["kernel"])
        if info.param_bytes != want_bytes:
            out.append(f"{tag}: kernel takes {info.param_bytes} parameter bytes, its launch "
                       f"parameters {k.get('params', ['desc'])} make {want_bytes}")
    return out


def read_header(m: Manifest) -> str:
    """The artifact's header (NAME.h), checked against the manifest's sha256."""
    ref = m.raw.get("header")
    if not (isinstance(ref, Mapping) and isinstance(ref.get("file"), str)
            and isinstance(ref.get("sha256"), str)):
        raise ArtifactError(f"{m.path}: the manifest names no header (file, sha256); the "
                            "launch fields are checked against it")
    fname = ref["file"]
    if "/" in fname or "\\" in fname or fname in ("", ".", ".."):
        raise ArtifactError(f"manifest: header.file must be a file name in the artifact "
                            f"folder, not {fname!r}")
    try:
        data = (m.path / fname).read_bytes()
    except OSError as e:
        raise ArtifactError(f"{fname}: cannot read the header ({e.strerror or e})") from e
    if hashlib.sha256(data).hexdigest() != ref["sha256"].lower():
        raise ArtifactError(f"{fname}: sha256 differs from the manifest: the artifact is "
                            "corrupt or stale; recompile")
    return data.decode("utf-8", "replace")


def verify_launch(m: Manifest, cubins: Mapping[str, bytes]) -> None:
    """Refuse launch fields that disagree with the cubins (verify_cubins' bytes), the header
    or the grid and max_len rules, with one ArtifactError naming every problem: what `cmc
    inspect` checks of them, before the runtime launches with them."""
    header = read_header(m)
    problems: list[str] = []
    infos: dict[str, KernelInfo] = {}
    kernels = m.raw["kernels"]
    try:
        for k in kernels:
            cub = entry_cubin(k["file"], k, cubins[k["file"]], problems)
            if cub is not None:
                infos[k["file"]] = cub.kernel(k["symbol"])
        problems += launch_problems(m.name, kernels, m.layout.size, infos, header)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{m.path}: malformed kernel entry ({type(e).__name__}: {e})"
                            ) from None
    if problems:
        raise ArtifactError(f"{m.path}: {len(problems)} problem(s) with the launch fields:\n  "
                            + "\n  ".join(problems))


__all__ = ["entry_cubin", "header_values", "launch_problems", "read_header", "tile_shape",
           "verify_launch"]
