"""The checks of a manifest that `cmc inspect` adds to the runtime's reader.

The runtime launches with the manifest's threads, block, grid, dynamic_smem and max_len, so
a manifest edited by hand (or by a broken tool) must be refused before a launch. The
runtime's reader (cmc/runtime/manifest.py, which inspect also uses) checks the JSON and
every field it relies on; it does not import this module (so the runtime needs neither the
schema file nor cmc.cubin), so these two checks run in `cmc inspect` only:

- `schema_problems`: the manifest against schema/manifest.schema.json, by a small validator
  of the keywords that schema uses (so neither inspect nor the runtime needs jsonschema; an
  unknown keyword is an error, never silently skipped).
- `launch_problems`: each kernel's launch fields against what its cubin records (the
  __launch_bounds__ thread count, the parameter block), against the header's macros (the
  header's sha256 is checked first: the same build wrote both), and against the rules that
  derive the grid (cmc/package.py) and max_len (the tiling) from the other fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from .abi import kernel_param_bytes
from .cubin import KernelInfo
from .errors import ArtifactError
from .resources import read_text


@lru_cache(maxsize=1)
def manifest_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(read_text("cmc.schema", "manifest.schema.json"))
    return schema


_TYPES: dict[str, Any] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: isinstance(x, int | float) and not isinstance(x, bool),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}
_ANNOTATIONS = {"description", "title", "$schema", "$id", "$defs", "$comment", "default"}


def schema_problems(manifest: Any) -> list[str]:
    """Schema violations as 'manifest WHERE: what' (empty when it conforms)."""
    root = manifest_schema()
    out: list[str] = []
    _validate(manifest, root, root, "", out)
    return out


def _validate(x: Any, s: Mapping[str, Any], root: Mapping[str, Any], at: str,
              out: list[str]) -> None:
    where = f"manifest {at or '(top)'}"
    for key, want in s.items():
        if key in _ANNOTATIONS:
            continue
        if key == "$ref":
            target: Any = root
            for part in want.removeprefix("#/").split("/"):
                target = target[part]
            _validate(x, target, root, at, out)
        elif key == "type":
            if not _TYPES[want](x):
                out.append(f"{where}: {x!r:.60} is not of type {want!r}")
                return
        elif key == "const":
            if x != want or type(x) is not type(want):
                out.append(f"{where}: {x!r:.60} should be {want!r}")
        elif key == "enum":
            if not any(x == w and type(x) is type(w) for w in want):
                out.append(f"{where}: {x!r:.60} is not one of {want!r}")
        elif key == "if":
            branch = s.get("then") if not _errors_of(x, want, root, at) else s.get("else")
            if branch is not None:
                _validate(x, branch, root, at, out)
        elif key in ("then", "else"):
            continue  # applied by "if"
        elif key == "not":
            if not _errors_of(x, want, root, at):
                out.append(f"{where}: {x!r:.60} matches a form that is not allowed")
        elif key == "oneOf":
            hits = sum(not _errors_of(x, alt, root, at) for alt in want)
            if hits != 1:
                out.append(f"{where}: {x!r:.60} matches {hits} of the allowed forms, not one")
        elif key in ("minimum", "maximum", "minLength", "pattern", "minItems", "maxItems",
                     "required", "properties", "additionalProperties", "propertyNames",
                     "items"):
            _keyword(key, want, x, s, root, at, where, out)
        else:
            raise ArtifactError(f"schema keyword {key!r} is not supported by cmc's validator")


def _errors_of(x: Any, s: Mapping[str, Any], root: Mapping[str, Any], at: str) -> list[str]:
    out: list[str] = []
    _validate(x, s, root, at, out)
    return out


def _keyword(key: str, want: Any, x: Any, s: Mapping[str, Any], root: Mapping[str, Any],
             at: str, where: str, out: list[str]) -> None:
    number = _TYPES["number"](x)
    if key == "minimum" and number and x < want:
        out.append(f"{where}: {x} is less than {want}")
    elif key == "maximum" and number and x > want:
        out.append(f"{where}: {x} is more than {want}")
    elif key == "minLength" and isinstance(x, str) and len(x) < want:
        out.append(f"{where}: shorter than {want} characters")
    elif key == "pattern" and isinstance(x, str) and not re.search(want, x):
        out.append(f"{where}: {x!r:.60} does not match {want!r}")
    elif key == "minItems" and isinstance(x, list) and len(x) < want:
        out.append(f"{where}: fewer than {want} items")
    elif key == "maxItems" and isinstance(x, list) and len(x) > want:
        out.append(f"{where}: more than {want} items")
    elif key == "required" and isinstance(x, dict):
        out.extend(f"{where}: {name!r} is a required property" for name in want if name not in x)
    elif key == "properties" and isinstance(x, dict):
        for name, sub in want.items():
            if name in x:
                _validate(x[name], sub, root, f"{at}/{name}".lstrip("/"), out)
    elif key == "additionalProperties" and isinstance(x, dict):
        known = s.get("properties", {})
        for name, value in x.items():
            if name in known:
                continue
            if want is False:
                out.append(f"{where}: unexpected property {name!r:.60}")
            elif isinstance(want, dict):
                _validate(value, want, root, f"{at}/{name}".lstrip("/"), out)
    elif key == "propertyNames" and isinstance(x, dict):
        for name in x:
            _validate(name, want, root, f"{at}/{name}".lstrip("/"), out)
    elif key == "items" and isinstance(x, list):
        for i, item in enumerate(x):
            _validate(item, want, root, f"{at}/{i}".lstrip("/"), out)


# --------------------------------------------------------------------------- launch fields


def _tiling(d: Mapping[str, Any]) -> Any:
    from .ir import Tiling

    return Tiling(kind=d["kind"], origin=d["origin"], width=d["width"],
                  patch_rows=d["patch_rows"], patch_cols=d["patch_cols"],
                  min_len=d["min_len"], units=d["units"])


_DEFINE = re.compile(r"^#define (CMC_[A-Z0-9_]+) (\d+)u?\b", re.M)


def header_values(header: str) -> dict[str, int]:
    """The integer macros of a generated header (NAME.h), by name."""
    return {m.group(1): int(m.group(2)) for m in _DEFINE.finditer(header)}


def launch_problems(name: str, kernels: Sequence[Mapping[str, Any]], descriptor_size: int,
                    infos: Mapping[str, KernelInfo], header: str | None) -> list[str]:
    """Schema-valid kernel entries against their cubins (`infos`: symbol -> what the cubin
    records, for the cubins at hand), the sha256-checked header's per-variant macros, and the
    rules that derive grid and max_len from block_m and the tiling. header None: not at hand
    (its absence or mismatch is reported by the caller)."""
    from .artifacts import KernelVariant
    from .package import grid_rule

    macros = header_values(header) if header is not None else None
    out: list[str] = []
    for k in kernels:
        tag = k["file"]
        tiling = _tiling(k["tiling"])
        v = KernelVariant(symbol=k["symbol"], dtype=k["dtype"], head_dim=k["head_dim"],
                          block_m=k["block_m"], block_n=k["block_n"], threads=k["threads"],
                          smem_bytes=k["dynamic_smem"], kernel=k["kernel"],
                          archs=(k["arch"],), tiling=tiling)
        prefix = f"CMC_{name.upper()}_{v.tag.upper()}_"
        want: dict[str, Any] = {"grid": grid_rule(v), "max_len": tiling.max_len()}
        for field, macro in (("threads", "THREADS"), ("dynamic_smem", "DYNAMIC_SMEM"),
                             ("block_m", "BLOCK_M"), ("block_n", "BLOCK_N")):
            if macros is None:
                break
            if prefix + macro not in macros:
                out.append(f"{tag}: the header has no {prefix + macro}")
            else:
                want[field] = macros[prefix + macro]
        if macros is not None and macros.get(prefix + "MAX_LEN", 0) != (tiling.max_len() or 0):
            out.append(f"{tag}: the header's {prefix}MAX_LEN is not the tiling's max_len")
        want["block"] = [k["threads"], 1, 1]
        for field, value in want.items():
            if k.get(field) != value:
                out.append(f"{tag}: manifest says {field} {k.get(field)!r}, the artifact's "
                           f"{'header' if field in ('threads', 'dynamic_smem') else 'rules'} "
                           f"give {value!r}")
        info = infos.get(k["symbol"])
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
