"""The declared parameter contract: what values each int parameter accepts, checked by one
validator shared by the runtime, the oracle and `cmc show --param`.

Dependency-free on purpose (numpy and cmc.errors only): cmc.runtime imports it without
importing any compiler module. A range is inclusive and each end is affine in len, the
current sequence's length (`param n : int[batch] in [0, len]`); the manifest carries it as
{"lo": [len_coef, add], "hi": [len_coef, add]}.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ParamError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
LEN_MAX = INT32_MAX


@dataclass(frozen=True)
class Affine:
    """len_coef * len + add."""

    len_coef: int
    add: int

    def at(self, length: int) -> int:
        return self.len_coef * length + self.add

    def extremes(self) -> tuple[int, int]:
        """Smallest and largest value over every len in [0, LEN_MAX]."""
        a, b = self.at(0), self.at(LEN_MAX)
        return min(a, b), max(a, b)

    def text(self) -> str:
        if self.len_coef == 0:
            return str(self.add)
        lenpart = "len" if self.len_coef == 1 else f"{self.len_coef} * len"
        if self.add == 0:
            return lenpart
        return f"{lenpart} {'+' if self.add > 0 else '-'} {abs(self.add)}"


@dataclass(frozen=True)
class ParamRange:
    """lo <= value <= hi for every sequence (both ends inclusive), and value in int32."""

    lo: Affine
    hi: Affine

    @property
    def uses_len(self) -> bool:
        return self.lo.len_coef != 0 or self.hi.len_coef != 0

    def text(self) -> str:
        return f"[{self.lo.text()}, {self.hi.text()}]"

    def extremes(self) -> tuple[int, int]:
        """The values a parameter can take for some len (clipped to int32)."""
        return max(INT32_MIN, self.lo.extremes()[0]), min(INT32_MAX, self.hi.extremes()[1])

    def to_json(self) -> dict[str, list[int]]:
        return {"lo": [self.lo.len_coef, self.lo.add], "hi": [self.hi.len_coef, self.hi.add]}

    @staticmethod
    def from_json(obj: Any) -> ParamRange:
        """The manifest's form; ValueError when it is not two [int, int] pairs."""
        if not isinstance(obj, dict) or set(obj) != {"lo", "hi"}:
            raise ValueError("a range is {\"lo\": [len_coef, add], \"hi\": [len_coef, add]}")
        ends = []
        for key in ("lo", "hi"):
            v = obj[key]
            if (not isinstance(v, list) or len(v) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
                raise ValueError(f"range {key} must be [len_coef, add] (two integers)")
            ends.append(Affine(v[0], v[1]))
        return ParamRange(ends[0], ends[1])


FULL_INT32 = ParamRange(Affine(0, INT32_MIN), Affine(0, INT32_MAX))
DEFAULT_RANGE = FULL_INT32  # what a param without `in [..]` accepts (docs/language.md)


def check_int(name: str, value: Any) -> int:
    """A Python or numpy integer (not bool) that fits int32: rule 'must be an int32'."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ParamError(name, f"must be an int; got {type(value).__name__}")
    v = int(value)
    if not INT32_MIN <= v <= INT32_MAX:
        raise ParamError(name, f"must fit int32; got {v}")
    return v


def check_in_range(name: str, values: np.ndarray, rng: ParamRange,
                   lengths: np.ndarray | None) -> None:
    """Rule 'must be in the declared range': values[b] within rng at lengths[b].

    Without lengths (not readable here) only the len-free ends are checked."""
    vals = np.asarray(values, dtype=np.int64)
    if vals.size and (vals.min() < INT32_MIN or vals.max() > INT32_MAX):
        b = int(np.nonzero((vals < INT32_MIN) | (vals > INT32_MAX))[0][0])
        raise ParamError(name, f"must fit int32; sequence {b} has {int(vals[b])}")
    if lengths is None:
        if rng.uses_len:
            return
        lens = np.zeros_like(vals)
    else:
        lens = np.asarray(lengths, dtype=np.int64)
    lo = rng.lo.len_coef * lens + rng.lo.add
    hi = rng.hi.len_coef * lens + rng.hi.add
    bad = np.nonzero((vals < lo) | (vals > hi))[0]
    if bad.size:
        b = int(bad[0])
        where = f"; sequence {b} has len {int(lens[b])} and value {int(vals[b])}" \
            if rng.uses_len else f"; got {int(vals[b])}"
        raise ParamError(name, f"must be in the declared range {rng.text()}{where}")


def check_starts(name: str, starts: Sequence[int] | np.ndarray, length: int | None,
                 seq: int | None = None) -> np.ndarray:
    """Segment starts of one sequence: ints, sorted (non-decreasing, never sorted for the
    caller), each in [0, len]. Returns them as int64."""
    where = "" if seq is None else f"sequence {seq}: "
    s = np.asarray(starts)
    if s.ndim != 1 or (s.size and not np.issubdtype(s.dtype, np.integer)):
        raise ParamError(name, f"{where}starts must be a flat list of ints")
    s = s.astype(np.int64)
    if s.size and (np.diff(s) < 0).any():
        i = int(np.nonzero(np.diff(s) < 0)[0][0])
        raise ParamError(name, f"{where}starts must be sorted (non-decreasing); "
                               f"start {i + 1} ({int(s[i + 1])}) < start {i} ({int(s[i])})")
    if s.size and s[0] < 0:
        raise ParamError(name, f"{where}starts must be >= 0; got {int(s[0])}")
    if length is not None and s.size and s[-1] > length:
        raise ParamError(name, f"{where}starts must be in [0, len] = [0, {length}]; "
                               f"got {int(s[-1])}")
    return s
