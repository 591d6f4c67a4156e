"""The command line: exit codes 0 / 1 (user error) / 2 (usage), messages without tracebacks."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cmc.cli import cli

from .conftest import EXACT, ROOT, SAMPLES


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_check_all_samples_exact():
    r = run("check", *map(str, SAMPLES))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    transposed = [x for x in lines if x.startswith("transposed: ")]
    assert not any("residual" in x for x in lines)
    for p in SAMPLES:
        assert f"mask {p.stem}:" in r.output
    assert len(EXACT) == len(SAMPLES)
    assert len(transposed) == len(SAMPLES)
    assert all(x.startswith("transposed: exact, up to ") for x in transposed)


def test_check_reports_error_with_position_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.mask"
    bad.write_text("mask bad\nallow k <= qq\n")
    r = CliRunner().invoke(cli, ["check", str(bad)])
    assert r.exit_code == 1
    assert f"{bad}:2:" in r.output and "^" in r.output
    assert "Traceback" not in r.output


def test_check_missing_file_is_user_error(tmp_path):
    r = CliRunner().invoke(cli, ["check", str(tmp_path / "nope.mask")])
    assert r.exit_code == 1 and "no such file" in r.output


def test_show_counts_tiles_for_causal():
    r = run("show", str(ROOT / "samples/causal.mask"), "--len", "512", "--tile", "128x128")
    assert r.exit_code == 0, r.output
    assert "tiles 16: empty 6, full 6, partial 4" in r.output
    assert "visible pairs 131328 of 262144" in r.output


def test_show_with_params_and_png(tmp_path):
    png = tmp_path / "sp.png"
    r = run("show", str(ROOT / "samples/shared_prefix.mask"), "--len", "300",
            "--param", "prompt_len=60", "--param", "responses=60,150,220",
            "--tile", "64x64", "--png", str(png))
    assert r.exit_code == 0, r.output
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_show_missing_param_is_usage_error():
    r = CliRunner().invoke(cli, ["show", str(ROOT / "samples/hstu.mask"), "--len", "64"])
    assert r.exit_code == 2 and "n_targets" in r.output


def test_defines_override_and_bad_define():
    r = run("check", str(ROOT / "samples/sliding_window.mask"), "-D", "WINDOW=8")
    assert r.exit_code == 0 and "q - 7" in r.output, r.output
    r = CliRunner().invoke(cli, ["check", str(ROOT / "samples/causal.mask"), "-D", "X"])
    assert r.exit_code == 2


def test_compile_emit_itab(tmp_path):
    r = run("compile", str(ROOT / "samples/hstu.mask"), "-o", str(tmp_path), "--emit", "itab")
    assert r.exit_code == 0, r.output
    table = json.loads((tmp_path / "hstu" / "hstu.itab.json").read_text())
    assert table["exact"] and len(table["terms"]) == 2


def test_compile_usage_errors(tmp_path):
    r = CliRunner().invoke(cli, ["compile", str(ROOT / "samples/causal.mask"), "-o",
                                 str(tmp_path), "--arch", "sm_75"])
    assert r.exit_code == 2 and "sm_75" in r.output
    r = CliRunner().invoke(cli, ["compile", str(ROOT / "samples/causal.mask"), "-o",
                                 str(tmp_path), "--head-dim", "96"])
    assert r.exit_code == 2


def test_show_reports_the_sm90_tiling_and_its_computed_pairs():
    r = run("show", str(ROOT / "samples/causal.mask"), "--len", "512", "--tile", "128x128")
    assert r.exit_code == 0, r.output
    # 10 of the 16 tiles of 128 x 128 are reached (the diagonal and below)
    assert "  sm90 tiling: linear (128-token tiles)\n    reason: default\n" in r.output
    assert f"computed pairs {10 * 128 * 128} (128x128 tiles), 1.25 per visible pair" in r.output
    # the kv's items: key tile kt against the 64-query items from 2 kt on (8 + 6 + 4 + 2 of them)
    assert (f"backward (sm90 kv) computed pairs {20 * 128 * 64} (128 keys x 64 queries), 1.25 per "
            "visible pair") in r.output
    r = run("show", str(ROOT / "samples/clear.mask"), "--len", "4096")
    assert r.exit_code == 0, r.output
    assert ("sm90 tiling: patches of 8 grid rows x 16 tokens (grid width 128 from token 512; "
            "linear tiles below len 2560)") in r.output
    assert "    reason: computed pairs at len 8704: linear " in r.output
    assert "(128x128 tiles), 1.59 per visible pair" in r.output
    assert "backward (sm90 kv) computed pairs 9502720 (128 keys x 128 queries), 1.59" in r.output
    r = run("show", str(ROOT / "samples/clear.mask"), "--len", "2000")  # below min_len
    assert ": at len 2000, linear tiles" in r.output
    r = run("show", str(ROOT / "benchmarks/generality/video3d.mask"), "--len", "2048")
    assert "sm90 tiling: linear (128-token tiles)" in r.output
    assert "16x8" in r.output and "per visible pair" in r.output
    # run-time parameters are counted with the given values
    r = run("show", str(ROOT / "samples/shared_prefix.mask"), "--len", "300",
            "--param", "prompt_len=60", "--param", "responses=60,150,220")
    assert r.exit_code == 0 and "per visible pair" in r.output, r.output


def test_show_does_not_count_pairs_past_its_budget():
    r = run("show", str(ROOT / "samples/causal.mask"), "--len", "66000", "--tile", "512x512")
    assert r.exit_code == 0, r.output
    assert "computed pairs: not counted at len 66000" in r.output


def test_tiling_option_asks_for_a_patch_shape(tmp_path):
    """--tiling RxC: that patch shape on a grid mask (its reason says it was asked for, in show
    and in the manifest), and for anything else a usage error naming the rule, never a
    silent linear tiling."""
    natten = str(ROOT / "benchmarks/generality/natten_clamped.mask")
    r = run("show", natten, "--len", "8192", "--tiling", "8x16")
    assert r.exit_code == 0, r.output
    assert "sm90 tiling: patches of 8 grid rows x 16 tokens" in r.output
    assert "    reason: asked for (--tiling 8x16); computed pairs at len 6144: " in r.output
    auto = run("show", natten, "--len", "8192")
    assert "patches of 8 grid rows x 16 tokens" in auto.output
    assert "16x8 5570560 (x 1.23: the producer's TMA boxes)" in auto.output
    linear = run("show", natten, "--len", "8192", "--tiling", "linear")
    assert "sm90 tiling: linear (128-token tiles)\n    reason: asked for (--tiling linear)" \
        in linear.output
    # linear tiles asked for keep the tile masks proved for them (here the band masks, as
    # below the patches' start length), not a bare linear tiling
    assert "asked for (--tiling linear); band tile masks: tile masks of 33 classes" \
        in linear.output
    r = run("compile", natten, "-o", str(tmp_path), "--arch", "sm_90a", "--emit", "itab",
            "--tiling", "8x16")
    assert r.exit_code == 0, r.output
    bad = {
        ("7x16", "samples/clear.mask", "sm_90a"):
            "--tiling 7x16: the sm90 kernel's patches are 128 tokens: 16x8, 8x16, 4x32, 2x64",
        ("8by16", "samples/clear.mask", "sm_90a"):
            "--tiling 8by16: expected auto, linear or ROWSxCOLS",
        ("8x16", "samples/causal.mask", "sm_90a"): "--tiling 8x16: mask causal has no grid",
        ("2x64", "benchmarks/generality/natten_clamped.mask", "sm_90a"):
            "--tiling 2x64: 64 tokens per patch row must divide the grid width 96 and be "
            "smaller than it",
        ("8x16", "samples/clear.mask", "sm_100a"):
            "--tiling 8x16: no kernel built here follows a patch tiling",
    }
    for (shape, mask, arch), msg in bad.items():
        r = CliRunner().invoke(cli, ["compile", str(ROOT / mask), "-o", str(tmp_path), "--arch",
                                     arch, "--emit", "itab", "--tiling", shape])
        assert r.exit_code == 2 and msg in r.output, (shape, mask, r.output)
