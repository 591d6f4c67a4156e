"""The benchmark's masks without a GPU: every predicate (the peers' mask_mod) against the dense
oracle of its .mask file, the endpoint layout cuDNN flex takes, and the report rendering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cmc.driver import load_mask
from cmc.oracle import dense

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import masks  # noqa: E402

SPECS = {s.key: s for s in bench.all_specs()}


def _pred_dense(spec: masks.Spec, lengths: list[int], params: list[dict]) -> list[np.ndarray]:
    mod = masks.mask_mod(spec.pred, lengths, params, spec.jagged, np.asarray)
    out, off = [], 0
    for i, n in enumerate(lengths):
        pos = np.arange(n)
        if spec.jagged:
            q, k = off + pos[:, None], off + pos[None, :]
            out.append(np.asarray(mod(0, 0, q, k), dtype=bool))
        else:
            out.append(np.broadcast_to(mod(i, 0, pos[:, None], pos[None, :]), (n, n)))
        off += n
    return out


@pytest.mark.parametrize("key", sorted(SPECS))
def test_predicate_matches_oracle(key: str) -> None:
    spec = SPECS[key]
    rng = np.random.default_rng(7)
    lengths = [1000, 1337, 1536] if spec.jagged else [1536, 1536]
    params = [spec.make_params(rng, n) for n in lengths]
    mask = load_mask(ROOT / spec.mask, spec.defines)
    for n, p, got in zip(lengths, params, _pred_dense(spec, lengths, params), strict=True):
        want = dense(mask, n, p)
        assert want.any() and not want.all()
        assert int((got != want).sum()) == 0, (key, n, p)


def test_jagged_documents_do_not_see_each_other() -> None:
    spec = SPECS["g_prefix_lm_jagged"]
    lengths, params = [300, 200], [{"prefix": 100}, {"prefix": 50}]
    mod = masks.mask_mod(spec.pred, lengths, params, True, np.asarray)
    pos = np.arange(500)
    vis = mod(0, 0, pos[:, None], pos[None, :])
    assert not vis[:300, 300:].any() and not vis[300:, :300].any()
    assert vis[300, 300 + 49] and not vis[300, 300 + 50]


def _roundtrip(vis: np.ndarray) -> np.ndarray:
    ends = masks.endpoints_from_dense(vis)
    assert ends.dtype == np.int32 and ends.shape[0] % 2 == 1 and ends.shape[1] == vis.shape[0]
    assert (np.diff(ends.astype(np.int64), axis=0) >= 0).all()
    assert ends.min() >= 0 and ends.max() <= vis.shape[1]
    return ends


def test_endpoints_known_rows() -> None:
    vis = np.zeros((4, 10), dtype=bool)
    vis[0, :3] = True                      # [0,3): F = 3, no leading empty interval
    vis[1, 2:4] = vis[1, 7:] = True        # [0,0) U [2,4) U [7,10)
    vis[3, :] = True
    ends = _roundtrip(vis)
    assert ends.shape[0] == 5
    assert list(ends[:, 0]) == [3, 3, 3, 3, 3]
    assert list(ends[:, 1]) == [0, 2, 4, 7, 10]
    assert list(ends[:, 2]) == [0, 0, 0, 0, 0]  # a row that sees nothing
    assert list(ends[:, 3]) == [10] * 5
    assert (masks.dense_from_endpoints(ends, 10) == vis).all()


@pytest.mark.parametrize("key", ["clear", "g_grid333_w80_r24", "g_natten_clamped", "g_video3d",
                                 "g_dilated_band", "g_strided", "g_dilated_causal", "g_fixed_sparse",
                                 "shared_prefix"])
def test_endpoints_roundtrip_oracle(key: str) -> None:
    spec = SPECS[key]
    n = 1400
    p = spec.make_params(np.random.default_rng(3), n)
    vis = dense(load_mask(ROOT / spec.mask, spec.defines), n, p)
    ends = _roundtrip(vis)
    assert (masks.dense_from_endpoints(ends, n) == vis).all()


def test_endpoints_nfunc_floor_and_random() -> None:
    rng = np.random.default_rng(0)
    vis = rng.random((64, 50)) < 0.5
    r, c = masks.edges_from_dense(vis)
    ends = masks.endpoints_from_edges(r, c, 64, nfunc=100)
    assert ends.shape[0] == 101
    assert (masks.dense_from_endpoints(ends, 50) == vis).all()


def test_cases_cover_both_suites() -> None:
    cases = bench.make_cases(np.random.default_rng(1), (4096,), "all", (4096, 16384))
    pats = {c.pattern for c in cases}
    assert {"causal", "clear_text", "hstu_jagged"} <= pats
    assert {s.key for s in masks.GENERALITY} <= pats
    gen = [c for c in cases if c.suite == "generality"]
    assert {c.length for c in gen} == {4096, 16384}
    for c in cases:
        assert sum(c.lengths) <= bench.TOKENS and len(c.params) == len(c.lengths)
    jag = next(c for c in gen if c.pattern == "g_prefix_lm_jagged")
    assert jag.jagged and len(set(jag.lengths)) > 1
    assert bench.cmc_params(next(c for c in gen if c.pattern == "g_window_rt")) == {"window": 777}
    assert "docs" in bench.cmc_params(next(c for c in gen if c.pattern == "g_doc_window"))


CANNED = [
    bench.Result("causal/4096", "causal", 4096, "cmc", 1.0, 500.0, 0.5, extra={}),
    bench.Result("causal/4096", "causal", 4096, "fa4", 1.0, 550.0, 2.0, bwd_tflops=480.0,
                 step_tflops=500.0),
    bench.Result("causal/4096", "causal", 4096, "cudnn-flex", 1.0, 600.0, 3.0, mask_build_ms=1.2,
                 bwd_tflops=520.0, step_tflops=540.0),
    bench.Result("g_video3d/4096", "g_video3d", 4096, "cmc", 1.0, 100.0),
    bench.Result("g_video3d/4096", "g_video3d", 4096, "flex-fa4", None, None,
                 note="failed: NotImplementedError: backward"),
    bench.Result("g_video3d/4096", "g_video3d", 4096, "flex-triton", 2.0, 50.0),
]


def test_markdown_and_summary_from_canned_results() -> None:
    md = bench.markdown(CANNED)
    lines = md.splitlines()
    assert lines[0].startswith("| case | L | cmc fwd |") and "cuDNN flex" in lines[0]
    causal = next(x for x in lines if x.startswith("| causal | 4096"))
    assert "| 600.0 |" in causal and "| 0.83 |" in causal  # 500 / best peer 600
    assert "520.0" in causal  # cuDNN flex backward column
    video = next(x for x in lines if x.startswith("| g_video3d | 4096"))
    assert "2.00" in video  # against Flex-Triton, the only peer that ran
    assert "flex-fa4: failed: NotImplementedError" in md
    s = bench.summarize(CANNED)
    assert "causal/4096" in s and "0.83" in s


def test_estimate_mentions_cases() -> None:
    cases = bench.make_cases(np.random.default_rng(1), (4096,), "public", (4096,))
    text = bench.estimate(cases, rounds=3, rep=30, bwd=True)
    assert f"{len(cases)} cases" in text and "min" in text


def test_cli_help_and_merge(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench.py"), "--help"],
                         capture_output=True, text=True, check=True)
    for knob in ("--suite", "--no-bwd", "--rounds", "--rep", "--patterns", "--lengths"):
        assert knob in run.stdout
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"meta": {"date": "x"},
                             "results": [bench.asdict(r) for r in CANNED]}))
    subprocess.run([sys.executable, str(ROOT / "benchmarks/bench.py"), "--merge", str(f),
                    "--out", str(tmp_path / "m"), "--no-plot"], check=True, capture_output=True)
    assert "cuDNN flex" in (tmp_path / "m" / "bench.md").read_text()


def test_runtime_copy_leaves_out_the_sources_and_loads(tmp_path: Path) -> None:
    """--runtime-copy: every file but NAME.cu, and the copy still reads as an artifact (the
    runtime never opens the source)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.driver import compile_file
    from cmc.runtime.manifest import read_manifest

    art = compile_file(ROOT / "samples" / "causal.mask", tmp_path / "bench" / "causal",
                       archs=["sm_90a"], dtypes=["bf16"], head_dims=[64], backward=False)
    n = bench.runtime_copy(tmp_path / "bench", tmp_path / "run")
    kept = sorted(p.relative_to(tmp_path / "run") for p in (tmp_path / "run").rglob("*")
                  if p.is_file())
    src = sorted(p.relative_to(tmp_path / "bench") for p in (tmp_path / "bench").rglob("*")
                 if p.is_file() and p.suffix != ".cu")
    assert kept == src and n == sum((tmp_path / "run" / p).stat().st_size for p in kept)
    assert (art / "causal.cu").is_file() and not list((tmp_path / "run").rglob("*.cu"))
    read_manifest(tmp_path / "run" / art.relative_to(tmp_path / "bench"))


def test_bench_refuses_a_case_name_it_does_not_have(tmp_path) -> None:
    """A typo in --patterns (or an older tree's suite) is an error, not an empty run."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--compile",
                        str(tmp_path / "x"), "--patterns", "causal", "g_nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--patterns g_nope: no such case" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()
