"""The dense oracle against matrices worked out by hand, and its parameter validation."""

from __future__ import annotations

import numpy as np
import pytest

from cmc.check import check
from cmc.errors import ParamError
from cmc.oracle import dense, dense_batch, validate_params
from cmc.parse import parse

from .conftest import ROOT


def _sample(name: str, defines: dict[str, int] | None = None):
    path = ROOT / "samples" / f"{name}.mask"
    return check(parse(path.read_text(), str(path)), defines)


def _mask(text: str, defines: dict[str, int] | None = None):
    return check(parse(text, "t.mask"), defines)


def _m(rows: str) -> np.ndarray:
    """'100/110/111' -> the bool matrix with those rows (row q, column k)."""
    return np.array([[c == "1" for c in r] for r in rows.split("/")], dtype=bool)


def _show(a: np.ndarray) -> str:
    return "/".join("".join("1" if x else "0" for x in r) for r in a)


def _eq(got: np.ndarray, rows: str) -> None:
    want = _m(rows)
    assert got.dtype == bool and got.shape == want.shape
    assert (got == want).all(), f"got {_show(got)}, want {rows}"


# --------------------------------------------------------------------------- causal


def test_causal():
    m = _sample("causal")
    _eq(dense(m, 1), "1")
    _eq(dense(m, 4), "1000/1100/1110/1111")
    assert dense(m, 0).shape == (0, 0)


# --------------------------------------------------------------------------- hstu


def test_hstu_targets_see_history_and_themselves():
    _eq(dense(_sample("hstu"), 5, {"n_targets": 2}), "10000/11000/11100/11110/11101")


def test_hstu_no_targets_is_causal():
    _eq(dense(_sample("hstu"), 4, {"n_targets": 0}), "1000/1100/1110/1111")


def test_hstu_all_targets_is_the_diagonal():
    _eq(dense(_sample("hstu"), 4, {"n_targets": 4}), "1000/0100/0010/0001")
    with pytest.raises(ParamError, match="declared range"):  # the sample declares [0, len]
        dense(_sample("hstu"), 3, {"n_targets": 7})
    _eq(dense(_sample("hstu"), 1, {"n_targets": 1}), "1")
    _eq(dense(_sample("hstu"), 1, {"n_targets": 0}), "1")


def test_hstu_context_override():
    m = _sample("hstu", {"CONTEXT": 2})
    assert m.consts == (("CONTEXT", 2),)
    _eq(dense(m, 5, {"n_targets": 1}), "11110/11110/11100/11110/11111")


# --------------------------------------------------------------------------- shared prefix


def test_shared_prefix():
    got = dense(_sample("shared_prefix"), 7, {"prompt_len": 2, "responses": [2, 5]})
    _eq(got, "1000000/1100000/1110000/1111000/1111100/1100010/1100011")


def test_shared_prefix_no_segments_is_causal():
    got = dense(_sample("shared_prefix"), 4, {"prompt_len": 2, "responses": []})
    _eq(got, "1000/1100/1110/1111")


def test_shared_prefix_no_prompt():
    got = dense(_sample("shared_prefix"), 5, {"prompt_len": 0, "responses": [0, 3]})
    _eq(got, "10000/11000/11100/00010/00011")
    _eq(dense(_sample("shared_prefix"), 1, {"prompt_len": 0, "responses": [0]}), "1")


# --------------------------------------------------------------------------- clear


def test_clear_small_grid():
    # TEXT=2 text tokens, then a grid of width 3: positions 2..7 are (y, x) = (0,0) .. (1,2);
    # radius 2 means squared distance < 4, so (0,2) and (2,0) offsets are out, (1,1) is in.
    m = _sample("clear", {"TEXT": 2, "W": 3, "R": 2})
    assert m.consts == (("TEXT", 2), ("W", 3), ("R", 2))
    _eq(
        dense(m, 8),
        "11111111/11111111/11110110/11111111/11011011/11110110/11111111/11011011",
    )


def test_clear_defaults_and_length_one():
    m = _sample("clear")
    _eq(dense(m, 1), "1")
    # 88 grid tokens in one grid row: x sees x' when |x - x'| < 16
    grid = 88 + 2 * sum(88 - d for d in range(1, 16))
    assert dense(m, 600).sum() == 512 * 600 + 88 * 512 + grid
    assert dense(m, 600)[599, 512:].sum() == 16


def test_clear_radius_one_is_text_plus_diagonal():
    _eq(dense(_sample("clear", {"TEXT": 1, "W": 2, "R": 1}), 4), "1111/1100/1010/1001")


# --------------------------------------------------------------------------- semantics


def test_deny_removes_pairs():
    m = _mask("mask m\nallow true\ndeny k > q\ndeny k == 0 and q == 2\n")
    _eq(dense(m, 3), "100/110/011")


def test_runtime_zero_divisor():
    # x / 0 == 0 and x % 0 == x at run time: row 2 divides by zero.
    m = _mask("mask m\nallow k == 6 / (q - 2)\n")
    _eq(dense(m, 4), "0000/0000/1000/0000")  # q=0: 6/-2=-3, q=1: -6, q=2: 0, q=3: 6
    m = _mask("mask m\nallow k == q % (q - 2)\n")
    _eq(dense(m, 4), "1000/1000/0010/1000")  # 0%-2=0, 1%-1=0, 2%0=2, 3%1=0


def test_floor_division_of_negatives():
    m = _mask("mask m\nallow k == (q - 3) / 2 + 2\n")  # q=0: -3/2=-2 -> k=0
    _eq(dense(m, 4), "1000/0100/0100/0010")  # q=1: -1 -> 1, q=2: -1/2 = -1 -> 1


def test_segment_functions_and_segment_minus_one():
    m = _mask(
        "mask m\nparam s : segments\nallow k == seg_start(s, q) or k == seg_end(s, q) - 1 "
        "or k == seg(s, q) + 1\n"
    )
    # starts [2, 4] in len 6: segment -1 = [0,2), 0 = [2,4), 1 = [4,6)
    got = dense(m, 6, {"s": [2, 4]})
    _eq(got, "110000/110000/011100/011100/001011/001011")


def test_repeated_starts_make_empty_segments():
    m = _mask("mask m\nparam s : segments\nallow same(s, q, k)\n")
    _eq(dense(m, 4, {"s": [1, 1, 3, 4]}), "1000/0110/0110/0001")


def test_batch_forms():
    m = _sample("shared_prefix")
    per_seq = [{"prompt_len": 1, "responses": [1]}, {"prompt_len": 0, "responses": []}]
    by_param = {"prompt_len": [1, 0], "responses": [[1], []]}
    a = dense_batch(m, [2, 3], per_seq)
    b = dense_batch(m, [2, 3], by_param)
    assert len(a) == 2 and all((x == y).all() for x, y in zip(a, b, strict=True))
    _eq(a[0], "10/11")
    _eq(a[1], "100/110/111")
    w = _sample("sliding_window_rt")
    got = dense_batch(w, [3, 2], {"window": 1})
    _eq(got[0], "100/010/001")
    _eq(got[1], "10/01")


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "params, name, rule",
    [
        ({}, "n_targets", "missing"),
        ({"n_targets": 1.0}, "n_targets", "must be an int"),
        ({"n_targets": True}, "n_targets", "must be an int"),
        ({"n_targets": 2**31}, "n_targets", "must fit int32"),
        ({"n_targets": 5}, "n_targets", "must be in the declared range [0, len]"),
        ({"n_targets": 1, "n_target": 2}, "n_target", "not a parameter of mask 'hstu'"),
    ],
)
def test_param_errors(params, name, rule):
    with pytest.raises(ParamError) as info:
        dense(_sample("hstu"), 4, params)
    assert info.value.param == name and rule in info.value.rule
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "starts, rule",
    [
        ([3, 1], "must be sorted"),
        ([-1], "must be >= 0"),
        ([5], "must be in [0, len]"),
        (3, "must be a list"),
        ("12", "must be a list"),
        ([1.5], "must be ints"),
    ],
)
def test_segment_errors(starts, rule):
    with pytest.raises(ParamError) as info:
        dense(_sample("document_causal"), 4, {"docs": starts})
    assert info.value.param == "docs" and rule in info.value.rule


def test_segment_values_accept_numpy():
    got = validate_params(_sample("document_causal"), 4, {"docs": np.array([0, 4])})
    assert got == {"docs": [0, 4]} and all(type(x) is int for x in got["docs"])


def test_batch_errors():
    with pytest.raises(ParamError, match="one value for the whole batch"):
        dense_batch(_sample("sliding_window_rt"), [2, 2], [{"window": 1}, {"window": 2}])
    with pytest.raises(ParamError, match="got 1 for a batch of 2"):
        dense_batch(_sample("hstu"), [2, 2], {"n_targets": [1]})
    with pytest.raises(ParamError, match="one dict per sequence"):
        dense_batch(_sample("hstu"), [2, 2], [{"n_targets": 1}])
    with pytest.raises(ParamError, match="missing"):
        dense_batch(_sample("hstu"), [2, 2])
    with pytest.raises(ParamError):
        dense(_sample("causal"), -1)
