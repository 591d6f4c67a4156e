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

    A sequence of length 0 has no rows, so no expression ever reads its value at that len;
    its value need only lie in the range's hull over every len (`extremes()`), which is what
    the compiler assumed when it typed the kernels' arithmetic (so [1, len] accepts 5 for an
    empty sequence, but not 0). Without lengths (a device cu_seqlens that cannot be read)
    every value is held to that hull as well."""
    vals = np.asarray(values, dtype=np.int64).reshape(-1)
    if vals.size and (vals.min() < INT32_MIN or vals.max() > INT32_MAX):
        b = int(np.nonzero((vals < INT32_MIN) | (vals > INT32_MAX))[0][0])
        raise ParamError(name, f"must fit int32; sequence {b} has {int(vals[b])}")
    hull_lo, hull_hi = rng.extremes()
    if lengths is None:
        bad = np.nonzero((vals < hull_lo) | (vals > hull_hi))[0]
        if bad.size:
            b = int(bad[0])
            hull = f" (for some len: [{hull_lo}, {hull_hi}])" if rng.uses_len else ""
            raise ParamError(name, f"must be in the declared range {rng.text()}{hull}; "
                                   f"got {int(vals[b])}")
        return
    lens = np.broadcast_to(np.asarray(lengths, dtype=np.int64).reshape(-1), vals.shape)
    lo = np.where(lens > 0, rng.lo.len_coef * lens + rng.lo.add, hull_lo)
    hi = np.where(lens > 0, rng.hi.len_coef * lens + rng.hi.add, hull_hi)
    bad = np.nonzero((vals < lo) | (vals > hi))[0]
    if bad.size:
        b = int(bad[0])
        if not rng.uses_len:
            where = f"; got {int(vals[b])}"
        elif lens[b] == 0:
            where = (f"; sequence {b} is empty, so its value need only lie in [{hull_lo}, "
                     f"{hull_hi}] (the range over every len), and is {int(vals[b])}")
        else:
            where = f"; sequence {b} has len {int(lens[b])} and value {int(vals[b])}"
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
