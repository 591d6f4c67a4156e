"""The developer tools under tools/ stay in step with what they edit or count."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", sorted(_tool("sm90_ablate").ABLATIONS))
def test_every_ablation_still_matches_the_kernel_once(name):
    from cmc.emit import sm90_header_text

    ab = _tool("sm90_ablate")
    text = sm90_header_text()  # what every generated sm90 .cu inlines, and the ablations edit
    _, edits = ab.ABLATIONS[name]
    for old, _new in edits:
        assert text.count(old) == 1, f"{name}: {old!r}"
    assert ab.apply(text, edits) != text


@pytest.mark.parametrize("name", sorted(_tool("bwd_ablate").ABLATIONS))
def test_every_bwd_ablation_still_matches_the_kv_kernel(name):
    """tools/bwd_ablate.py edits the generated backward .cu (bwd_kv_sm90's loop): each pattern
    must still occur as often as the tool expects (built on the CPU when the tool was
    written, 2026-12-05: every ablated kv kernel compiles)."""
    from cmc.driver import Options, back, front

    ab = _tool("bwd_ablate")
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), bwd_kernel="lockstep"))
    _, edits = ab.ABLATIONS[name]
    for old, _new, times in edits:
        assert src.text.count(old) == times, f"{name}: {old!r}"
    assert ab.apply(src.text, edits) != src.text


@pytest.mark.parametrize("name", sorted(_tool("bwd_ablate").ALTERNATIVES))
def test_every_bwd_alternative_builds(name):
    """tools/bwd_ablate.py's alternatives: the edited causal source (both head dims) builds the
    kv kernel without spills, with the shared memory the tool launches it with."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import dataclasses

    from cmc.build import build
    from cmc.driver import Options, back, front
    from cmc.kernels import KernelKind

    ab = _tool("bwd_ablate")
    _, edit, extra = ab.ALTERNATIVES[name]
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(64, 128), bwd_kernel="lockstep"))
    kv = tuple(v for v in src.variants if v.kernel is KernelKind.BWD_KV_SM90)
    text = edit(src.text)
    for v in kv:
        assert f'== {v.smem_bytes + extra(v.head_dim)}, "dynamic shared memory"' in text
    built = build(dataclasses.replace(src, text=text, variants=kv), archs=("sm_90a",), jobs=2)
    for c in built.cubins:
        assert c.resources.spill_stores == 0 and c.resources.spill_loads == 0, c.symbol


def test_probed_alternatives_are_the_ones_with_the_probe():
    """bwd_ablate.PROBED (whose kv it reads the probe counters of after timing) is exactly the
    alternatives whose edit defines CMC_WS_PROBE."""
    from cmc.driver import Options, back, front

    ab = _tool("bwd_ablate")
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), bwd_kernel="lockstep"))
    probed = {n for n, (_, edit, _) in ab.ALTERNATIVES.items() if "#define CMC_WS_PROBE 1" in edit(src.text)}
    assert probed == ab.PROBED


def test_ws_patch_loader_alternatives_build_on_patches(monkeypatch):
    """The patch loader's alternatives (bwd_ablate wspcp, wspnoqdo: CMC_WS_PATCH_TMA 0, the
    cp.async rows left out) on CLEAR's patch tiling, where their loader code is instantiated
    (the causal builds above never reach it): the kv without spills at both head dims (the
    shipped TMA path's own check is the manifest's, tests/test_bwd_ws.py)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    for name in ("wspcp", "wspnoqdo"):
        for d in (64, 128):
            regs = ab._build(name, "sm_90a", "clear_patch", "bf16", d)[1]
            kv = {s: r for s, r in regs.items() if "bwd_kv_sm90" in s}
            assert kv and all(r[1:] == (0, 0) for r in kv.values()), (name, d, kv)


def test_lag_alternatives_build_on_patches(monkeypatch):
    """bwd_ablate wslag, wslagpp (CMC_WS_DQ_LAG 1, 2: item n - 1's dQ inside item n, the end item
    a phantom so that the loop keeps one dQ site; 2 with turns): the kv without local memory on
    CLEAR's patches at D 128 (where the lag applies), and checked on patches too."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    for name in ("wslag", "wslagpp"):
        assert name in ab.PATCH_CHECKED and name in ab.WS_BASED and name not in ab.UNCHECKED
    # (on grid96 wslagpp spills 8 bytes since the linear kv's P^T applies its words by R2P,
    # wslag 8 since it applies them inside the exponentials' loop, 2026-12-07: refuted
    # alternatives, timed there, not held to this)
    for name, mask in (("wslag", "clear_patch"), ("wslagpp", "clear_patch")):
        regs = ab._build(name, "sm_90a", mask, "bf16", 128)[1]
        kv = {s: r for s, r in regs.items() if "bwd_kv_sm90" in s}
        assert kv and all(r[1:] == (0, 0) for r in kv.values()), (name, mask, kv)


def test_fused_post_alternative_builds_and_refuses_patch_masks(monkeypatch):
    """bwd_ablate wsfuse (CMC_WS_FUSE_POST: the linear ws kv converts dQ, post's work): the kv
    without local memory at both head dims (its conversion runs in the consumers' registers,
    not after the roles join, where WG0's 24 would spill it: 100-196 bytes when it did), and
    the tool refuses it on a patch mask, whose kv does not convert."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    assert "wsfuse" in ab.FUSED_POST and "wsfuse" not in ab.PATCH_CHECKED
    for d in (64, 128):
        regs = ab._build("wsfuse", "sm_90a", "causal", "bf16", d)[1]
        kv = {s: r for s, r in regs.items() if "bwd_kv_sm90" in s}
        assert kv and all(r[1:] == (0, 0) for r in kv.values()), (d, kv)
    monkeypatch.setattr(sys, "argv", ["bwd_ablate.py", "wsfuse", "--mask", "clear_patch"])
    with pytest.raises(SystemExit, match="linear tilings only"):
        ab.main()


def test_persistent_kv_alternative_builds_and_refuses_patch_masks(monkeypatch):
    """bwd_ablate wspers (CMC_WS_PERSIST: the linear ws kv, a CTA per SM over key tiles): the
    kv without local memory at both head dims and on a mask of 81 transposed terms (its second
    plan buffer sized from the source), and the tool refuses it on a patch mask."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    assert "wspers" in ab.PERSISTENT and "wspers" not in ab.PATCH_CHECKED
    for mask, d in (("causal", 64), ("grid96", 128)):
        kernels, regs = ab._build("wspers", "sm_90a", mask, "bf16", d)
        kv = {s: r for s, r in regs.items() if "bwd_kv_sm90" in s}
        assert kv and all(r[1:] == (0, 0) for r in kv.values()), (mask, d, kv)
        if mask == "grid96":  # 81 terms: (8 * 81 + 2) * 4 bytes, rounded to 16
            assert ab._PERSIST_GROWTH[0] == ab.PERSIST_SMEM + 2608
    for name in ("wsperst", "wskvtma"):  # K, V by TMA: the K / V maps follow dq_accum's
        regs = ab._build(name, "sm_90a", "causal", "bf16", 128)[1]
        assert all(r[1:] == (0, 0) for s, r in regs.items() if "bwd_kv_sm90" in s), (name, regs)
        assert name in ab.KV_MAPS and name in ab.WS_BASED
    assert "wskvtma" not in ab.PERSISTENT  # one tile a CTA: the full grid
    monkeypatch.setattr(sys, "argv", ["bwd_ablate.py", "wspers", "--mask", "clear_patch"])
    with pytest.raises(SystemExit, match="linear tilings only"):
        ab.main()


def test_bwd_kernel_check_tiled_builds_the_patch_kinds(tmp_path, monkeypatch):
    """build_variant of a TILED_MASKS mask: the backward kinds on CLEAR's patch tiling (their
    grid x is the manifest's patch rule: 25 tiles at 2133 tokens, not ceil(2133 / 128) = 17)
    and the forward still the portable kernel; without it, the same mask's backward is linear."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    from cmc.runtime.params import parse_grid_expr

    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    bkc = _tool("bwd_kernel_check")
    name, dtype, d = bkc.PATCH_VARIANTS[1]
    assert name in bkc.TILED_MASKS
    tiled, _ = bkc.build_variant(name, dtype, d, "sm_90a", sm90=True)
    monkeypatch.setattr(bkc, "TILED_MASKS", {})
    linear, _ = bkc.build_variant(name, dtype, d, "sm_90a", sm90=True)
    assert tiled["fwd"][1] == linear["fwd"][1] == f"cmc_clear_fwd_{dtype}_d{d}"  # portable
    for role in ("kv", "dq"):
        assert parse_grid_expr(tiled[role][6])({"max_len": max(bkc.PATCH_LENS)}) == 25
        assert parse_grid_expr(linear[role][6])({"max_len": max(bkc.PATCH_LENS)}) == 17
    assert tiled["kv"][3] > linear["kv"][3]  # the patch plan's bit sets


def test_patch_order_is_a_permutation_of_patches():
    pc = _tool("patch_cost")
    order = pc.patch_order(512 + 4096, 512, 64, 8, 16)
    assert sorted(order) == list(range(512 + 4096))
    assert list(order[:512]) == list(range(512))  # text tokens first, in order
    first = order[512:512 + 128] - 512  # the first patch: rows 0-7, columns 0-15
    assert sorted(first) == sorted(y * 64 + x for y in range(8) for x in range(16))
    assert pc.patch_order(4096, 0, 64, 3, 16) is None  # 64 rows do not split into 3s
    vis = np.zeros((256, 256), dtype=bool)
    vis[0, 255] = True
    ident = np.arange(256)
    assert pc.tile_counts(vis, ident, ident) == (1, 0)
    # 64-token tiles: the same pair is one of 16 tiles of 64 x 64, and 8 x 8 patches exist
    vis[:64, :64] = True
    assert pc.tile_counts(vis, ident, ident, 64) == (2, 1)
    # 64 query x 32 key tokens: the full block is 2 tiles, the far pair a third, none of them empty
    assert pc.tile_counts(vis, ident, ident, 64, 32) == (3, 2)
    assert pc.patch_order(4096, 0, 64, 8, 8, tile=64) is not None
    assert pc.patch_order(4096 + 100, 100, 64, 8, 8, tile=64) is None  # text not tile-aligned


# --------------------------------------------------------------------------- GPU checks' CPU part


def _manifest(path):
    import json

    return json.loads((path / "manifest.json").read_text())


def test_kernel_check_keeps_what_bwd_kernel_check_imports():
    kc = _tool("kernel_check")
    for name in ("seq_params", "dense_mask", "descriptor_values", "_ok", "device_arch",
                 "Problem", "make_inputs"):
        assert callable(getattr(kc, name)), name
    from cmc.driver import load_mask

    mask = load_mask(ROOT / "samples" / "shared_prefix.mask")
    for b in range(6):
        ps = kc.seq_params(mask, 100, b)
        assert 0 <= ps["prompt_len"] <= 100
        assert ps["responses"] == sorted(ps["responses"])
        assert kc.dense_mask(mask, 100, ps).shape == (100, 100)
    assert kc.seq_params(mask, 100, 3) == kc.seq_params(mask, 100, 3)  # deterministic


def test_kernel_check_arguments():
    kc = _tool("kernel_check")
    a = kc.parse_args([])
    assert (a.masks, a.quick, a.no_timing, a.no_mt2, a.all_variants_all_masks) == (
        None, False, False, False, False)
    a = kc.parse_args(["--masks", "causal,clear", "--quick", "--no-timing", "--no-mt2"])
    assert (a.masks, a.quick, a.no_timing, a.no_mt2) == ("causal,clear", True, True, True)
    tables, _ = kc.load_tables(["causal", "clear"])
    assert sorted(tables) == ["causal", "clear"]
    with pytest.raises(SystemExit):
        kc.load_tables(["no_such_mask"])
    assert kc.variants_of("causal", False) == kc.ALL_VARIANTS
    assert kc.variants_of("prefix_lm", False) == kc.SMALL_VARIANTS


def test_kernel_check_builds_through_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    kc = _tool("kernel_check")
    paths = kc.build_kernels(["causal"], "sm_80", tmp_path / "out", timing=False, jobs=1,
                             only=(("fp16", 64),))
    assert sorted(paths, key=str) == sorted([("causal", None), ("causal", 2)], key=str)
    for (_, mt), path in paths.items():
        (k,) = [k for k in _manifest(path)["kernels"] if k["pass"] == "forward"]
        assert (k["arch"], k["kernel"], k["dtype"], k["head_dim"]) == ("sm_80", "portable",
                                                                       "fp16", 64)
        assert k["block"] == [256 if mt is None else 128, 1, 1]
        assert ("-DCMC_PORTABLE_MT=2" in k["options"]) == (mt == 2)
        from cmc.runtime import read_manifest, verify_cubins
        from cmc.runtime.launch_check import verify_launch

        m = read_manifest(path)
        verify_launch(m, verify_cubins(m))  # what cmc.runtime.load checks before the GPU


def test_sm90_check_arguments():
    sc = _tool("sm90_check")
    a = sc.parse_args([])
    assert a.mask_list == list(sc.MASKS) and a.modes == ("dynamic", "static")
    assert a.length_list == list(sc.LENGTHS) and len(a.variant_list) == 4
    a = sc.parse_args(["--masks", "hstu", "--variants", "fp16_d64", "--sched", "static",
                       "--lengths", "1,129"])
    assert (a.mask_list, a.variant_list, a.modes, a.length_list) == (
        ["hstu"], [("fp16", 64)], ("static",), [1, 129])
    a = sc.parse_args(["--masks", "causal", "--variants", "fp16_d64"])  # the bench's variant
    assert a.variant_list == [("fp16", 64), ("bf16", 128)]
    a = sc.parse_args(["--bench-only"])
    assert (a.mask_list, a.variant_list) == (["causal"], [("bf16", 128)])
    assert sc.jagged(1) == [1, 3] and sc.jagged(129) == [129, 95]


def test_sm90_check_builds_through_the_pipeline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    sc = _tool("sm90_check")
    paths, portable = sc.build_artifacts(["causal"], [("bf16", 64)], tmp_path / "out")
    assert portable is None
    (k,) = [k for k in _manifest(paths["causal"])["kernels"] if k["pass"] == "forward"]
    assert (k["arch"], k["kernel"], k["symbol"]) == ("sm_90a", "sm90",
                                                     "cmc_causal_fwd_sm90_bf16_d64")
    assert sc.WATCHDOG in k["options"] and k["work_counter"]
    assert "causal" in capsys.readouterr().out


def test_runtime_check_case_parameters():
    rc = _tool("runtime_check")
    from cmc.driver import load_mask

    mask = load_mask(ROOT / "samples" / "sliding_window_rt.mask")
    c = rc.Case([100, 7, 50], 4, 2, 64, "bf16", variant=3)
    per_seq = rc.case_params(mask, c)
    assert len({ps["window"] for ps in per_seq}) == 1  # a scalar: one value per launch
    assert per_seq == rc.case_params(mask, c)


def test_bwd_kernel_check_sm90_builds_the_opt_in_kv(tmp_path, monkeypatch):
    """--sm90's builds, without a GPU: the kv role is bwd_kv_sm90 and the dq role bwd_dq_sm90,
    each on its own launch shape (torch is stubbed: the tool imports it for the GPU part
    only)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import types

    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    bkc = _tool("bwd_kernel_check")
    kernels, res = bkc.build_variant("causal", "bf16", 64, "sm_90a", sm90=True)
    assert sorted(kernels) == ["dq", "fwd", "kv", "post", "pre"]
    _, sym, threads, smem, block_m, heads, gx = kernels["kv"]
    assert (sym, threads, block_m, heads, gx) == ("cmc_causal_bwd_kv_sm90_bf16_d64", 256, 128,
                                                  "heads_kv", "ceil_div(max_len, 128)")
    assert smem > 48 * 1024 and res[sym][1:] == (0, 0)
    _, sym, threads, smem, block_m, heads, _ = kernels["dq"]
    assert (sym, threads, block_m, heads) == ("cmc_causal_bwd_dq_sm90_bf16_d64", 256, 128,
                                              "heads_q")
    assert smem > 48 * 1024 and res[sym][1:] == (0, 0)
    assert kernels["pre"][1] == "cmc_causal_bwd_pre_bf16_d64"
    portable, _ = bkc.build_variant("causal", "bf16", 64, "sm_90a")
    assert portable["kv"][1:6:3] == ("cmc_causal_bwd_kv_bf16_d64", 64)


def test_race_probe_builds_every_ordering():
    """tools/race_probe.py's kernel (one mode per ordering the ws kv relies on) builds for
    sm_90a, and its modes are the ones its doc runs."""
    pytest.importorskip("cuda.bindings.nvrtc")
    rp = _tool("race_probe")
    assert rp.build("sm_90a")[:4] == b"\x7fELF"
    assert list(rp.MODES) == ["mbar", "noinc", "cpwait", "named", "sync", "none", "mbarwar",
                              "namedwar", "txnoinc"]
    assert all(f" {m} " in rp.__doc__ or f" {m};" in rp.__doc__ for m in rp.MODES)
    validate = (ROOT / "tools" / "device_validate.sh").read_text()
    assert "for m in " + " ".join(rp.MODES) + ";" in validate


def test_bwd_ablate_combines_ws_ablations():
    """`a+b` of ws ablations is one timing-only variant with every part's edits."""
    from cmc.driver import Options, back, front

    ab = _tool("bwd_ablate")
    assert not ab.combo("wsnodqgemm") and not ab.combo("wsnodqgemm+ws")
    assert not ab.combo("wsnostage+wsnostage")
    name = "wsnodqgemm+wsnostage+wsnobar"
    assert ab.combo(name) and name in ab.UNCHECKED and ab.THREADS[name] == ab.WS_THREADS
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), bwd_kernel="lockstep"))
    both = ab.ALTERNATIVES[name][1](src.text)
    for part in name.split("+"):
        one = ab.ALTERNATIVES[part][1](src.text)
        assert one != both and all(new in both for _, new, _ in ab.WS_ABLATIONS[part][1])


def test_ws_probe_slots_match_the_kernel_and_the_summary_reads_them():
    """bwd_ablate's probe slots are attn_bwd_sm90_ws.cuh's enum WsProbe, in order; the summary
    divides each phase by the items, the writers' and loader's by theirs, and the CTA's by
    the CTAs (the epilogue by both consumer warpgroups' leads)."""
    import re

    ab = _tool("bwd_ablate")
    text = (ROOT / "templates" / "cmc" / "attn_bwd_sm90_ws.cuh").read_text()
    enum = re.search(r"enum WsProbe : int \{(.*?)\};", text, re.S)
    assert enum is not None
    slots, at = {}, -1
    for name, value in re.findall(r"kPr(\w+)(?: = (\d+))?", enum.group(1)):
        at = int(value) if value else at + 1
        slots[name] = at
    phases = ["Full", "Issue", "Word", "WaitS", "P", "DvDs", "DsSt", "Bar", "IssueDqDk", "WaitDq",
              "StgWait", "Stage", "WaitDk"]
    assert [slots[p] for p in phases] == list(range(len(ab.PROBE_PHASES)))
    assert (slots["Items"], slots["Loop"]) == (ab.PROBE_ITEMS, ab.PROBE_LOOP)
    assert [slots[n] for n in ("WrFull", "WrAdd", "WrItems")] == list(ab.PROBE_WRITER.values())
    assert [slots[n] for n in ("LdEmpty", "LdIssue", "LdItems")] == list(ab.PROBE_LOADER.values())
    assert [slots[n] for n in ("Prologue", "Epilogue", "Ctas")] == list(ab.PROBE_CTA.values())
    assert slots["FirstFull"] == ab.PROBE_FIRST_FULL
    assert [slots[n] for n in ("TileTop", "KvWait", "Tiles", "KvLoad")] == list(ab.PROBE_TILES.values())
    for n in slots:  # every slot is used by the kernel
        assert len(re.findall(rf"\bkPr{n}\b", text)) >= 2, n
    sums = np.zeros(32)
    sums[:13] = np.arange(1, 14) * 100.0  # 10 items
    sums[ab.PROBE_ITEMS], sums[ab.PROBE_LOOP] = 10, 9100.0
    sums[16:19] = (500.0, 300.0, 5)
    sums[20:23] = (40.0, 60.0, 20)
    sums[24:27] = (8000.0, 4000.0, 2)
    sums[ab.PROBE_FIRST_FULL] = 64.0  # of full's 100 over 10 items: 4 first items (2 CTAs)
    lines = ab.probe_summary(sums, calls=2)
    assert "5 warpgroup items per call, 910 cycles per item (phases sum to 910)" in lines[0]
    assert "full 10  issue 20" in lines[1] and "wait_dk 130" in lines[1]
    assert "wait_dk 14.3%" in lines[2]
    assert "staging full wait 100, adds and release 60" in lines[3]
    assert "empty wait 2, issue 3" in lines[4]
    assert "set-up 4000, dK and dV stores 1000 cycles (1 CTAs per call)" in lines[5]
    assert "full wait: a warpgroup's first item 16, the others 6 cycles" in lines[6]
    assert len(lines) == 7  # no persistent tiles counted: no per-tile line


def test_host_cost_split_attributes_the_benchmarks_backward():
    """host_cost --split: the benchmark's backward (step - forward) = attn.backward + the
    rest, with the rest signed."""
    hc = _tool("host_cost")
    lines = hc.split_lines("causal 4096x8", 0.9, 3.2, 4.35)
    assert lines[0] == ("  causal 4096x8: forward (LSE) 0.900 ms, attn.backward 3.200 ms, autograd "
                        "step 4.350 ms")
    assert lines[1].endswith("(step - forward) 3.450 ms: attn.backward 3.200 + autograd and the "
                             "op's own work +0.250")
    assert hc.split_lines("x", 1.0, 3.0, 3.9)[1].endswith("-0.100")
    assert hc.params_of("hstu", 2, 64) == {"n_targets": [8, 8]} and hc.params_of("causal", 1, 8) == {}


def test_host_cost_finds_both_artifact_layouts(tmp_path):
    """--artifacts takes gpu_artifacts.py's DIR/NAME and bench.py's DIR/CASE/MASK (out/benchrun);
    anything else is refused with the folder named."""
    hc = _tool("host_cost")
    (tmp_path / "causal").mkdir()
    (tmp_path / "causal" / "manifest.json").write_text("{}")
    (tmp_path / "hstu" / "hstu").mkdir(parents=True)
    (tmp_path / "hstu" / "hstu" / "manifest.json").write_text("{}")
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / "two" / d / "manifest.json").write_text("{}")
    assert hc.artifact_dir(tmp_path, "causal") == tmp_path / "causal"
    assert hc.artifact_dir(tmp_path, "hstu") == tmp_path / "hstu" / "hstu"
    for bad, found in (("two", 2), ("none", 0)):
        with pytest.raises(SystemExit, match=f"found {found}"):
            hc.artifact_dir(tmp_path, bad)


def test_bwd_ablate_encodes_the_ws_maps_with_the_builds_box_rows(monkeypatch):
    """TmaBwd's maps must have the boxes the ws kind was built for (abi.tensor_maps of the
    build's tiling): 64 rows on the linear cases, one patch row (16) on CLEAR's patch cases,
    whose writers add dQ by boxes of that many rows."""
    import types

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    ab = _tool("bwd_ablate")
    bkc = _tool("bwd_kernel_check")
    assert {ab._box_rows(v) for v in bkc.VARIANTS} == {64}
    assert [ab._box_rows(v) for v in bkc.PATCH_VARIANTS] == [16, 16]


def test_device_validate_names_only_known_bwd_ablate_variants_and_masks(monkeypatch):
    """Every `bwd_ablate.py` call in tools/device_validate.sh names variants the tool knows
    (its ablations, alternatives, or a+b of ws ablations) and bwd_kernel_check's masks: a
    variant removed from the tool (wsptma, wswordfirst at run 21) must leave the device's
    script too, or its part fails on a machine that costs minutes to get."""
    import re
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    bkc = _tool("bwd_kernel_check")
    lines = (ROOT / "tools" / "device_validate.sh").read_text().splitlines()
    text = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#")).replace("\\\n", " ")
    calls = re.findall(r"tools/bwd_ablate\.py([^\n;']*)", text)
    assert len(calls) >= 10
    for call in calls:
        words = call.split()
        names = []
        for w in words:
            if w.startswith("--"):
                break
            names.append(w)
        assert names, call
        for n in names:
            assert n in ab.ABLATIONS or n in ab.ALTERNATIVES or ab.combo(n), (n, call)
        for flag in ("--mask", "--cases"):
            if flag in words:
                i = words.index(flag) + 1
                while i < len(words) and not words[i].startswith("--"):
                    assert words[i] in bkc.MASKS, (words[i], call)
                    i += 1


def test_grid96p_is_grid96_on_the_forwards_patches(monkeypatch):
    """bwd_ablate --mask grid96p times the ws kv of grid96 on 8 x 16 patches (the patch kinds
    on linear tiles below len 6222): the same mask as grid96, its maps' boxes one patch row
    (16 tokens) where grid96's are 64."""
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    ab = _tool("bwd_ablate")
    bkc = sys.modules["bwd_kernel_check"]
    assert bkc.MASKS["grid96p"] == bkc.MASKS["grid96"] and bkc.TILED_MASKS["grid96p"] == "8x16"
    assert ab._box_rows(("grid96p", "bf16", 128)) == 16
    assert ab._box_rows(("grid96", "bf16", 128)) == 64



def test_ab_build_compiles_another_commit_from_its_own_tree(tmp_path):
    """tools/ab_build.py builds HEAD's tree (git archive) through bench.py --compile, and
    --runtime keeps only what the runtime loads (that the tree's own cmc builds is the next
    test's)."""
    import json
    import subprocess

    root = Path(__file__).resolve().parent.parent
    dest = tmp_path / "ab"
    r = subprocess.run([sys.executable, str(root / "tools" / "ab_build.py"), "HEAD", str(dest),
                        "--patterns", "causal", "--runtime"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (manifest,) = dest.rglob("manifest.json")
    assert any(k["kernel"] == "sm90" for k in json.loads(manifest.read_text())["kernels"])
    assert not list(dest.rglob("*.cu")) and list(dest.rglob("*.cubin"))


def test_ab_build_this_suite_builds_a_new_mask_with_an_older_compiler(tmp_path):
    """--this-suite: a mask added to the suite with the change it measures (g_image_spans,
    whose transposed table the change made exact) built by the commit before it: the
    artifact says residual. Skipped where history does not reach that commit."""
    import json
    import subprocess

    root = Path(__file__).resolve().parent.parent
    added = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--diff-filter=A",
                            "-1", "--", "benchmarks/generality/image_spans.mask"],
                           capture_output=True, text=True).stdout.strip()
    base = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "-q", f"{added}^"],
                          capture_output=True, text=True).stdout.strip()
    if not added or not base:
        pytest.skip("the history does not reach the commit before g_image_spans")
    dest = tmp_path / "ab"
    tool = [sys.executable, str(root / "tools" / "ab_build.py"), base, str(dest), "--patterns",
            "g_image_spans", "--runtime"]
    r = subprocess.run(tool, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 or not list(dest.rglob("manifest.json"))  # no such case there
    r = subprocess.run([*tool, "--this-suite"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (manifest,) = dest.rglob("manifest.json")
    assert not json.loads(manifest.read_text())["backward"]["transposed_table"]["exact"]


def test_ab_build_samples_compare_their_cubins(tmp_path):
    """--samples builds the tree's own samples; --compare passes against a build of the same
    tree (NVRTC is deterministic) and names a cubin that differs or is missing, exiting 1."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    tool = [sys.executable, str(root / "tools" / "ab_build.py"), "HEAD"]
    first, second = tmp_path / "a", tmp_path / "b"
    r = subprocess.run([*tool, str(first), "--samples", "causal"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cubins = sorted(first.rglob("*.cubin"))
    assert cubins and all(p.parent.name == "causal" for p in cubins)
    r = subprocess.run([*tool, str(second), "--samples", "causal", "--compare", str(first)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"{len(cubins)} cubins, all equal" in r.stdout, r.stdout + r.stderr
    spec = importlib.util.spec_from_file_location("ab_build", root / "tools" / "ab_build.py")
    assert spec is not None and spec.loader is not None
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    cubins[0].write_bytes(cubins[0].read_bytes() + b"\0")
    cubins[1].unlink()
    bad = ab.compare(second, first)
    assert bad == sorted([f"{cubins[0].relative_to(first)}: differs",
                          f"{cubins[1].relative_to(first)}: not under {first}"])


def test_ab_build_refuses_when_the_checkouts_templates_win(tmp_path):
    """The child drops the editable install's finder, so cmc and its templates come from the
    exported tree; kept (the filter disabled), the finder maps cmc.templates to this
    checkout and the child refuses instead of building the wrong sources."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("ab_build", root / "tools" / "ab_build.py")
    assert spec is not None and spec.loader is not None
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    finder = [f for f in sys.meta_path
              if "editable" in getattr(f, "__name__", type(f).__name__).lower()]
    if not finder:
        pytest.skip("cmc is not an editable install here: nothing maps it to the checkout")
    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for child, refuses in ((ab.CHILD, False),
                           (ab.CHILD.replace('"editable" not in', '"no-such-finder" not in'), True)):
        r = subprocess.run([sys.executable, "-c", child, str(tree), "--help"],
                           capture_output=True, text=True, timeout=120)
        assert (r.returncode != 0) == refuses, r.stderr[-2000:]
        assert ("not the tree at" in r.stderr) == refuses, r.stderr[-2000:]


def test_compile_edited_refuses_an_unknown_artifact(tmp_path):
    ab = _tool("sm90_ablate")
    with pytest.raises(SystemExit, match="unknown artifact nope"):
        ab.compile_edited(tmp_path, lambda text: text, keys=["nope"])
    assert not any(tmp_path.iterdir())


def test_sched_sim_heavy_orders_hold_every_unit_once():
    ss = _tool("sched_sim")
    seqs = [np.array([40.0, 3.0, 3.0, 2.5]), np.array([30.0, 2.0, 2.0])]
    first = ss.heavy_first(seqs, 4, 2, 4096, 1)
    assert first[:4] == [40.0, 40.0, 30.0, 30.0]  # the heavy tile of every (sequence, head)
    assert sorted(first) == sorted(ss.grouped_tiles(seqs, 4, 2, 4096))
    kv = ss.kv_heavy_first(seqs, 4, 2, 1)
    assert kv[:4] == [ss.KV_SETUP + 40.0] * 2 + [ss.KV_SETUP + 30.0] * 2
    assert sorted(kv) == sorted(ss.kv_grid(seqs, 4, 2, 4096, False))
    assert ss.static_makespan([1.0] * (ss.SMS + 1)) == 2.0
