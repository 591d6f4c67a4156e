"""`cmc inspect OUT/NAME`: validate an artifact folder and list its kernels' resources.

A runtime trusts the folder only as far as it checks it, so this checks everything a loader
relies on: the manifest against schema/manifest.schema.json, its descriptor against the ABI
of this cmc, the source and header against their sha256, and each cubin against its sha256,
its arch read from the ELF itself, its entry symbol, its parameter block size, and the
resources the manifest claims. Every problem found is named in one ArtifactError.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .abi import descriptor_layout_of, tensor_maps
from .cubin import KernelInfo
from .errors import ArtifactError
from .kernels import KernelKind, spec
from .manifest_check import schema_problems
from .package import descriptor_dict
from .runtime.launch_check import entry_cubin, launch_problems
from .runtime.manifest import (
    MANIFEST,
    Manifest,
    parse_manifest,
    read_manifest_json,
    read_name,
    read_params,
)


@dataclass(frozen=True)
class KernelReport:
    symbol: str
    arch: str
    file: str
    dtype: str
    head_dim: int
    kernel: str
    threads: int
    block_m: int
    block_n: int
    registers: int
    shared_static: int
    dynamic_smem: int
    local_bytes: int
    spill_stores: int
    spill_loads: int
    size: int  # bytes of the cubin
    toolkit: str  # ptxas version recorded in the cubin
    reg_split: str = ""  # "P/C" (setmaxnreg kinds), "" for none
    reg_split_reason: str = ""
    fallback: str = ""  # the kind's spill fallback defines it was built with (KernelSpec.spill_fallbacks)


@dataclass(frozen=True)
class InspectReport:
    path: Path
    name: str
    cmc_version: str
    nvrtc_versions: tuple[str, ...]
    descriptor_size: int
    exact: bool
    kernels: tuple[KernelReport, ...]
    notes: tuple[str, ...] = ()


def _read(folder: Path, fname: str, problems: list[str]) -> bytes | None:
    p = folder / fname
    if Path(fname).name != fname or fname in ("", ".", ".."):
        problems.append(f"{fname!r}: not a plain file name")
        return None
    if p.is_symlink() or not p.is_file():
        problems.append(f"{fname}: missing (or not a regular file)")
        return None
    return p.read_bytes()


def _kind_problems(tag: str, k: dict[str, Any]) -> list[str]:
    """The entry's pass, role and launch parameters are its kind's (cmc/kernels.py)."""
    from .kernels import spec

    try:
        s = spec(k["kernel"])
    except ValueError:
        return [f"{tag}: unknown kernel kind {k['kernel']!r}"]
    want = {"pass": s.pass_.value, "role": s.role, "params": list(s.params)}
    return [f"{tag}: {key} {k[key]!r}, the {s.kind.value} kernel's is {v!r}"
            for key, v in want.items() if k[key] != v]


def _backward_problems(m: dict[str, Any]) -> list[str]:
    """The backward section against this cmc's cmc_bwd_args and the kernels it lists: every
    role of its sequences has a kernel on each arch, dtype and head dim that has any."""
    from .package import bwd_args_dict

    b = m.get("backward")
    roles = {(k["arch"], k["dtype"], k["head_dim"], k["role"]) for k in m["kernels"]
             if k["pass"] == "backward"}
    if b is None:
        return ["backward is null but the manifest lists backward kernels"] if roles else []
    out = []
    if b["args"] != bwd_args_dict():
        out.append("backward.args: cmc_bwd_args differs from this cmc's (incompatible cmc?)")
    need = {r for seq in b["sequence"].values() for r in seq}
    groups = {(a, d, h) for a, d, h, _ in roles}
    if not groups:
        out.append("backward: no backward kernels listed")
    for a, d, h in sorted(groups):
        missing = sorted(r for r in need if (a, d, h, r) not in roles)
        if missing:
            out.append(f"backward: {a} {d} d{h} has no kernel for role(s) {', '.join(missing)}")
    return out


def inspect(path: str | Path) -> InspectReport:
    """Validate OUT/NAME; raise ArtifactError naming every problem, else report its kernels."""
    folder = Path(path)
    mpath = folder / MANIFEST
    if not folder.is_dir():
        raise ArtifactError(f"{folder}: not an artifact folder")
    if not mpath.is_file():
        raise ArtifactError(f"{folder}: no {MANIFEST}")
    mpath, m = read_manifest_json(mpath)
    notes: list[str] = []
    errs = schema_problems(m)
    if errs:
        raise ArtifactError(f"{mpath} does not match its schema:\n  " + "\n  ".join(errs))

    problems: list[str] = []
    try:
        expected = descriptor_dict(descriptor_layout_of(read_name(mpath, m), read_params(m)))
        if m["descriptor"] != expected:
            problems.append(
                "descriptor: layout differs from the one this cmc computes for these params "
                "(built by an incompatible cmc?)"
            )
        # the rest is checked against this cmc's layout, so one problem is named once
        manifest = parse_manifest(mpath, {**m, "descriptor": expected})
        return _check(folder, manifest, notes, problems)
    except (ArtifactError, KeyError, TypeError, ValueError) as e:  # reachable without jsonschema
        raise ArtifactError(f"{mpath}: malformed manifest ({type(e).__name__}: {e})") from None


def _check(folder: Path, manifest: Manifest, notes: list[str],
           problems: list[str]) -> InspectReport:
    m = manifest.raw
    header: str | None = None
    for key in ("source", "header"):
        ref = m[key]
        data = _read(folder, ref["file"], problems)
        if data is not None and hashlib.sha256(data).hexdigest() != ref["sha256"]:
            problems.append(f"{ref['file']}: sha256 differs from the manifest")
        elif data is not None and key == "header":
            header = data.decode("utf-8", "replace")
    if m["mask"]["sha256"] != hashlib.sha256(m["mask"]["source"].encode()).hexdigest():
        problems.append("mask: sha256 does not match mask.source")
    problems += _backward_problems(dict(m))

    kernels: list[KernelReport] = []
    infos: dict[str, KernelInfo] = {}
    for k in m["kernels"]:  # (one per role and length class: parse_manifest checked)
        tag = f"{k['file']}"
        data = _read(folder, k["file"], problems)
        if data is None:
            continue
        if hashlib.sha256(data).hexdigest() != k["sha256"]:
            problems.append(f"{tag}: sha256 differs from the manifest (corrupt or replaced)")
            continue
        cub = entry_cubin(tag, k, data, problems)
        if cub is None:
            continue
        info = infos[k["file"]] = cub.kernel(k["symbol"])
        claimed = {
            "registers": info.registers,
            "shared_static": info.shared_static,
            "local_bytes": info.frame_size,
        }
        for field, actual in claimed.items():
            if k[field] != actual:
                problems.append(f"{tag}: manifest says {field} {k[field]}, the cubin {actual}")
        maps = k.get("tensor_maps", [])
        problems += _kind_problems(tag, k)
        if [t.get("tensor") for t in maps] != [t.tensor for t in tensor_maps(k["kernel"])]:
            problems.append(f"{tag}: tensor_maps {maps} are not the {k['kernel']} kernel's")
        kernels.append(
            KernelReport(
                symbol=k["symbol"],
                arch=cub.arch,
                file=k["file"],
                dtype=k["dtype"],
                head_dim=k["head_dim"],
                kernel=k["kernel"],
                threads=k["threads"],
                block_m=k["block_m"],
                block_n=k["block_n"],
                registers=info.registers,
                shared_static=info.shared_static,
                dynamic_smem=k["dynamic_smem"],
                local_bytes=info.frame_size,
                spill_stores=k["spill_stores"],
                spill_loads=k["spill_loads"],
                size=len(data),
                reg_split=_split_text(k.get("reg_split")),
                reg_split_reason=(k.get("reg_split") or {}).get("reason", ""),
                fallback=_fallback_text(k),
                toolkit=cub.toolkit,
            )
        )
    problems += launch_problems(m["mask"]["name"], m["kernels"], m["descriptor"]["size"],
                                infos, header)
    if problems:
        raise ArtifactError(f"{folder}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return InspectReport(
        path=folder,
        name=m["mask"]["name"],
        cmc_version=m["cmc_version"],
        nvrtc_versions=tuple(sorted({k["nvrtc_version"] for k in m["kernels"]})),
        descriptor_size=m["descriptor"]["size"],
        exact=m["interval_table"]["exact"],
        kernels=tuple(kernels),
        notes=tuple(notes),
    )


def _fallback_text(k: dict[str, Any]) -> str:
    """The spill fallback defines among the kernel's NVRTC options ("" for none)."""
    defines = {d for f in spec(KernelKind(k["kernel"])).spill_fallbacks for d in f}
    return " ".join(o for o in k.get("options", ()) if o in defines)


def _split_text(split: dict[str, object] | None) -> str:
    return "" if not split else f"{split['producer']}/{split['consumer']}"


def report_text(r: InspectReport) -> str:
    """What `cmc inspect` prints."""
    head = (
        f"{r.path}: mask {r.name}, cmc {r.cmc_version}, NVRTC {', '.join(r.nvrtc_versions)}, "
        f"descriptor {r.descriptor_size} B, interval table "
        f"{'exact' if r.exact else 'with residual parts'}; all checks passed"
    )
    cols = ("symbol", "arch", "kernel", "threads", "regs", "smem static", "smem dyn", "local",
            "spill st/ld", "regs P/C", "bytes")
    rows = [
        (
            k.symbol,
            k.arch,
            k.kernel,
            str(k.threads),
            str(k.registers),
            str(k.shared_static),
            str(k.dynamic_smem),
            str(k.local_bytes),
            f"{k.spill_stores}/{k.spill_loads}",
            k.reg_split or "-",
            str(k.size),
        )
        for k in r.kernels
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = [head, ("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))).rstrip()]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += [f"note: {n}" for n in r.notes]
    lines += [f"note: {k.file}: built with its kind's spill fallback {k.fallback}"
              for k in r.kernels if k.fallback]
    lines += [
        f"warning: {k.file}: {k.local_bytes} bytes of local memory per thread, "
        f"{k.spill_stores} bytes spill stores, {k.spill_loads} bytes spill loads"
        + (f" (register split {k.reg_split}: {k.reg_split_reason})" if k.reg_split else "")
        for k in r.kernels
        if k.spill_stores or k.spill_loads or k.local_bytes
    ]
    return "\n".join(lines)
