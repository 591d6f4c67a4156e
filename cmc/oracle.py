"""The dense reference: visible(q, k) for every pair, straight from the checked predicate.

Built on cmc/evaluate.py (which evaluates one expression or predicate over arrays); this
module owns what makes it the mask's reference: parameter validation, the [len, len] grid of
every (q, k) and batches of sequences.

Deliberately the simplest correct thing (numpy over the whole [len, len] grid through
cmc.evaluate), so interval tables, tile classes and kernels can all be tested against it.
Parameter values are validated by cmc/contract.py, the validator the runtime and `cmc show`
use too (int32, the declared range, sorted starts in [0, len]); a bad value raises ParamError
naming the parameter and the rule it broke.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .contract import check_in_range, check_int, check_starts
from .errors import ParamError
from .evaluate import Env, eval_pred
from .ir import Mask

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

Params = Mapping[str, Any]


def dense(mask: Mask, length: int, params: Params | None = None) -> np.ndarray:
    """bool [length, length]: row q, column k, for one sequence of the given length.

    `params` maps each scalar and int[batch] parameter to an int, and each segments
    parameter to a sorted list of segment starts (positions inside this sequence).
    """
    length = _length(length)
    values = validate_params(mask, length, params or {})
    q = np.arange(length, dtype=np.int64)[:, None]
    k = np.arange(length, dtype=np.int64)[None, :]
    env = Env(length, values, {"q": q, "k": k})
    vis = np.broadcast_to(np.asarray(eval_pred(mask.predicate, env), dtype=bool), (length, length))
    return np.array(vis, dtype=bool)  # a writable copy, whatever broadcasting happened


def dense_batch(
    mask: Mask,
    lengths: Sequence[int],
    params_per_seq: Sequence[Params] | Params | None = None,
) -> list[np.ndarray]:
    """One dense matrix per sequence of a jagged batch (sequences never see each other).

    `params_per_seq` is either one dict per sequence, or one dict of per-parameter values
    across the batch: a list (one entry per sequence) for int[batch] and segments
    parameters, a single int for a scalar parameter (one value per launch).
    """
    lens = [_length(n) for n in lengths]
    per_seq = _split_batch(mask, len(lens), params_per_seq)
    for p in mask.params:  # a scalar is one value for the whole launch
        if p.kind == "scalar":
            seen = {int(ps[p.name]) for ps in per_seq if p.name in ps and _is_int(ps[p.name])}
            if len(seen) > 1:
                raise ParamError(
                    p.name,
                    f"a scalar parameter takes one value for the whole batch, got {sorted(seen)}",
                )
    return [dense(mask, n, ps) for n, ps in zip(lens, per_seq, strict=True)]


def validate_params(mask: Mask, length: int, params: Params) -> dict[str, int | list[int]]:
    """Check one sequence's values against the mask's declarations; plain ints out."""
    declared = {p.name for p in mask.params}
    for name in params:
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ParamError(
                str(name), f"not a parameter of mask '{mask.name}' (its parameters: {known})"
            )
    out: dict[str, int | list[int]] = {}
    for p in mask.params:
        if p.name not in params:
            raise ParamError(p.name, f"missing ({_kind_word(p.kind)} parameter)")
        v = params[p.name]
        if p.kind == "segments":
            out[p.name] = _segments(p.name, v, length)
        else:
            iv = check_int(p.name, v)
            check_in_range(p.name, np.array([iv]), p.range, np.array([length]))
            out[p.name] = iv
    return out


def _kind_word(kind: str) -> str:
    return {"scalar": "an int", "batch": "an int[batch]", "segments": "a segments"}[kind]


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _segments(name: str, v: Any, length: int) -> list[int]:
    if isinstance(v, (str, bytes)) or _is_int(v) or not hasattr(v, "__iter__"):
        raise ParamError(name, "must be a list of segment starts")
    starts = list(v)
    for s in starts:
        if not _is_int(s):
            raise ParamError(name, f"segment starts must be ints, got {type(s).__name__}")
    return [int(x) for x in check_starts(name, np.array(starts, dtype=np.int64), length)]


def _length(n: Any) -> int:
    if not _is_int(n) or int(n) < 0 or int(n) > INT32_MAX:
        raise ParamError("len", f"a sequence length must be an int in [0, {INT32_MAX}], got {n!r}")
    return int(n)


def _split_batch(
    mask: Mask, batch: int, params: Sequence[Params] | Params | None
) -> list[dict[str, Any]]:
    if params is None:
        return [{} for _ in range(batch)]
    if isinstance(params, Mapping):
        per: list[dict[str, Any]] = [{} for _ in range(batch)]
        kinds = {p.name: p.kind for p in mask.params}
        for name, v in params.items():
            if kinds.get(name) == "scalar":
                for d in per:
                    d[name] = v
                continue
            if name not in kinds:  # report through validate_params, with the known names
                for d in per:
                    d[name] = v
                continue
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
                raise ParamError(name, f"needs one value per sequence (a list of {batch})")
            if len(v) != batch:
                raise ParamError(
                    name, f"needs one value per sequence: got {len(v)} for a batch of {batch}"
                )
            for d, x in zip(per, v, strict=True):
                d[name] = x
        return per
    seqs: list[Any] = list(params)
    if len(seqs) != batch:
        raise ParamError("params", f"one dict per sequence: got {len(seqs)} for a batch of {batch}")
    for d in seqs:
        if not isinstance(d, Mapping):
            raise ParamError(
                "params", f"each sequence's values must be a dict, got {type(d).__name__}"
            )
    return [dict(d) for d in seqs]
