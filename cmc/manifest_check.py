"""The schema check of a manifest for `cmc inspect`.

- `schema_problems`: the manifest against schema/manifest.schema.json, by a small validator
  of the keywords that schema uses (so inspect does not need jsonschema; an unknown keyword
  is an error, never silently skipped). The runtime's reader (cmc/runtime/manifest.py)
  checks the fields it uses by hand.
- The launch fields, which the runtime launches with (each kernel against what its cubin
  records, the header's macros and the rules that derive grid and max_len), are checked by
  cmc/runtime/launch_check.py, which the runtime's load and inspect both call, so a
  manifest edited by hand (or by a broken tool) is refused by the same rules wherever it
  is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

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
