"""The sm90 forward's work units (struct Sched, templates/cmc/attn_fwd_sm90_schedule.cuh) and
the ws kv's CTA order (ws_kv_cta): their source compiled for the host, every unit mapped, and
the heavy prefix (cmc/tiling.py heavy_tiles, with_heavy_first) found where the mask has one."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from cmc.driver import Options, front, tile
from cmc.tiling import choose_tiling, heavy_tiles, with_heavy_first

from .conftest import GXX, ROOT, needs_gxx

STUBS = """#include <cstdio>
#include <initializer_list>
#define CMC_DEV inline
static struct { int x; } gridDim = {132};
static unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }
static void __threadfence() {}
static unsigned atomicExch(unsigned* p, unsigned v) { unsigned o = *p; *p = v; return o; }
static void producer_bar() {}
"""

# Every unit of each (nqt, heads, batch, max_len, heavy) maps to a distinct (qt, h, b) of the
# grid, and the first heavy * heads * batch units are the heavy tiles; exit 1 naming a case.
MAIN = """
template <int HEAVY> int check(int nqt, int heads, int batch, int max_len) {
  Sched sc;
  sc.init(nqt, heads, batch, 1, max_len, 128, true);
  const int units = sc.units(batch), first = HEAVY < nqt ? HEAVY : nqt;
  static unsigned char seen[1 << 20];
  if (units != nqt * heads * batch || units > (1 << 20)) return 1;
  for (int i = 0; i < units; ++i) seen[i] = 0;
  for (int u = 0; u < units; ++u) {
    int h = -1, b = -1;
    const int qt = sc.tile<HEAVY>(u, 0, h, b);
    if (sc.tile<HEAVY>(u, 1, h, b) != -1) return 2;
    if (qt < 0 || qt >= nqt || h < 0 || h >= heads || b < 0 || b >= batch) return 3;
    if ((u < first * heads * batch) != (qt < first)) return 4;
    const int i = (b * heads + h) * nqt + qt;
    if (seen[i]++) return 5;
  }
  return 0;
}
int main() {
  const int nqts[] = {1, 2, 3, 7, 32, 128};
  const int lens[] = {128, 4096, 16384, 65536};
  for (int nqt : nqts)
    for (int heads : {1, 3, 16})
      for (int batch : {1, 2, 5})
        for (int len : lens) {
          int r = check<0>(nqt, heads, batch, len) | check<1>(nqt, heads, batch, len) << 4 |
                  check<4>(nqt, heads, batch, len) << 8;
          if (r) { std::printf("nqt %d heads %d batch %d len %d: %x\\n", nqt, heads, batch, len, r); return 1; }
        }
  std::puts("ok");
  return 0;
}
"""


def _sched_source() -> str:
    text = (ROOT / "templates" / "cmc" / "attn_fwd_sm90_schedule.cuh").read_text()
    m = re.search(r"^struct Sched \{.*?^\};\n", text, re.M | re.S)
    assert m, "struct Sched not found in the schedule header"
    return m.group(0)


def _host_run(exe, source: str) -> None:
    """Builds source (g++, UBSan) into exe and runs it: it must print "ok"."""
    cpp = exe.with_suffix(".cpp")
    cpp.write_text(source)
    r = subprocess.run([str(GXX), "-std=c++17", "-O1", "-Wall", "-fsanitize=undefined",
                        "-fno-sanitize-recover=all", "-o", str(exe), str(cpp)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), run.stdout + run.stderr


@needs_gxx
def test_every_unit_is_one_tile_and_heavy_tiles_come_first(tmp_path):
    _host_run(tmp_path / "sched", STUBS + _sched_source() + MAIN)


@pytest.mark.parametrize(("path", "defines", "heavy"), [
    ("samples/longformer.mask", {}, 1),  # 16 global rows in tile 0
    ("samples/clear.mask", {}, 4),  # 512 text rows
    ("samples/clear.mask", {"TEXT": 0}, 0),
    ("samples/causal.mask", {}, 0),  # tile t sees t + 1 key tiles at any length
    ("samples/hstu.mask", {}, 0),  # run-time parameters: costs unseen
    ("benchmarks/generality/grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}, 3),
])
def test_heavy_tiles_are_the_leading_tiles_that_see_every_key(path, defines, heavy):
    assert heavy_tiles(front(ROOT / path, defines)) == heavy


def test_a_dense_mask_has_no_heavy_prefix(tmp_path):
    m = tmp_path / "dense.mask"
    m.write_text("mask dense\nallow true\n")
    assert heavy_tiles(front(m)) == 0  # every tile grows: nothing to take first


def test_the_tile_stage_takes_heavy_tiles_first_and_changes_only_the_units():
    from dataclasses import replace

    table = front(ROOT / "samples" / "longformer.mask")
    t = tile(table, Options(archs=("sm_90a",)))
    assert t == choose_tiling(table) and (t.units, t.heavy_tiles) == ("tiles", 1)
    pairs = replace(t, units="pairs", heavy_tiles=0)
    assert with_heavy_first(table, pairs) == t
    assert t.to_dict() == {**pairs.to_dict(), "units": "tiles", "heavy_tiles": 1}
    causal = front(ROOT / "samples" / "causal.mask")
    assert with_heavy_first(causal, choose_tiling(causal)) == choose_tiling(causal)
    assert choose_tiling(causal).units == "pairs"


def test_show_names_the_heavy_prefix_and_compile_takes_it(tmp_path):
    from click.testing import CliRunner

    from cmc.cli import cli

    def run(*args: str) -> str:
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    longformer = str(ROOT / "samples" / "longformer.mask")
    assert "work units: single tiles, the first 1 query tile(s) first" in run(
        "show", longformer, "--len", "1024")
    assert "work units" not in run("show", str(ROOT / "samples" / "causal.mask"), "--len", "1024")
    run("compile", longformer, "-o", str(tmp_path), "--arch", "sm_90a", "--emit", "cu")
    text = (tmp_path / "longformer" / "longformer.cu").read_text()
    assert "kTileUnits = 1," in text and "kHeavyTiles = 1," in text


KV_STUBS = """#include <cstdio>
#include <initializer_list>
#define CMC_DEV inline
struct D3 { int x, y, z; };
static D3 blockIdx, gridDim;
"""

# Every CTA of (nkt, heads_kv, batch) grids maps to a distinct (key tile, kv head, sequence),
# and in launch order (x fastest) the first HEAVY x heads_kv x batch CTAs take the heavy key
# tiles; exit 1 naming a grid.
KV_MAIN = """
template <int HEAVY> int check(int nkt, int hk, int batch) {
  static unsigned char seen[1 << 16];
  gridDim = {nkt, hk, batch};
  const int n = nkt * hk * batch, first = HEAVY < nkt ? HEAVY : nkt;
  for (int i = 0; i < n; ++i) seen[i] = 0;
  for (int z = 0; z < batch; ++z)
    for (int y = 0; y < hk; ++y)
      for (int x = 0; x < nkt; ++x) {
        blockIdx = {x, y, z};
        int kt = -1, h = -1, b = -1;
        ws_kv_cta<HEAVY>(kt, h, b);
        if (kt < 0 || kt >= nkt || h < 0 || h >= hk || b < 0 || b >= batch) return 1;
        const int id = x + nkt * (y + hk * z);
        if (HEAVY == 0 && (kt != x || h != y || b != z)) return 2;
        if ((id < first * hk * batch) != (kt < first)) return 3;
        if (seen[(b * hk + h) * nkt + kt]++) return 4;
      }
  return 0;
}
int main() {
  for (int nkt : {1, 2, 3, 7, 32, 128})
    for (int hk : {1, 2, 8})
      for (int batch : {1, 3, 5}) {
        const int r = check<0>(nkt, hk, batch) | check<1>(nkt, hk, batch) << 4 |
                      check<4>(nkt, hk, batch) << 8;
        if (r) { std::printf("nkt %d hk %d batch %d: %x\\n", nkt, hk, batch, r); return 1; }
      }
  std::puts("ok");
  return 0;
}
"""


@needs_gxx
def test_every_kv_cta_is_one_key_tile_and_heavy_key_tiles_launch_first(tmp_path):
    text = (ROOT / "templates" / "cmc" / "attn_bwd_sm90_ws.cuh").read_text()
    m = re.search(r"^template <int HEAVY> CMC_DEV void ws_kv_cta\(.*?^\}\n", text, re.M | re.S)
    assert m, "ws_kv_cta not found in the ws header"
    _host_run(tmp_path / "kv", KV_STUBS + m.group(0) + KV_MAIN)


def test_kv_heavy_first_names_the_heavy_key_tiles_for_the_kv_grid(tmp_path):
    from click.testing import CliRunner

    from cmc.cli import cli

    longformer = str(ROOT / "samples" / "longformer.mask")
    for flag, want in (([], True), (["--kv-heavy-from", "0"], True),
                       (["--kv-heavy-from", "off"], False)):
        out = tmp_path / ("-".join(flag) or "default")
        r = CliRunner().invoke(cli, ["compile", longformer, "-o", str(out), "--arch", "sm_90a",
                                     "--emit", "cu", *flag], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert ("#define CMC_WS_HEAVY_FIRST 1" in (out / "longformer" / "longformer.cu")
                .read_text()) is want
    for bad in ("-1", "soon", "4294967296"):
        r = CliRunner().invoke(cli, ["compile", longformer, "-o", str(tmp_path / "bad"),
                                     "--kv-heavy-from", bad])
        assert r.exit_code == 2 and "--kv-heavy-from" in r.output and "Traceback" not in r.output


def test_the_manifest_and_the_header_give_the_launcher_the_kv_order(tmp_path):
    """backward.kv_order: longformer's heavy key tile from the default length on (off: null,
    a mask without heavy key tiles: 0 and null); the runtime sets flags bit 1 from it, and the
    header names the same rule."""
    from cmc.driver import compile_file
    from cmc.kernels import KV_HEAVY_FROM
    from cmc.runtime.manifest import read_manifest

    for mask, from_len, want in (("longformer", KV_HEAVY_FROM, (1, KV_HEAVY_FROM)),
                                 ("longformer", 4096, (1, 4096)),
                                 ("longformer", None, (0, None)),
                                 ("causal", KV_HEAVY_FROM, (0, None))):
        art = compile_file(ROOT / "samples" / f"{mask}.mask", tmp_path / f"{mask}{from_len}",
                           archs=["sm_90a"], dtypes=["bf16"], head_dims=[64],
                           kv_heavy_from=from_len)
        m = json.loads((art / "manifest.json").read_text())
        assert m["backward"]["kv_order"] == {"heavy_tiles": want[0], "heavy_from_len": want[1]}
        spec = read_manifest(art).backward
        assert spec is not None
        for max_len in (1, 4095, 4096, KV_HEAVY_FROM - 1, KV_HEAVY_FROM, 1 << 20):
            for det in (False, True):
                heavy = want[1] is not None and max_len >= want[1]
                assert spec.flags(det, max_len) == int(det) | (2 if heavy else 0)
        header = (art / f"{mask}.h").read_text()
        assert (f"_BWD_KV_HEAVY_FROM_LEN {want[1] if want[1] is not None else -1}\n"
                in header), header
    # a portable-only build has no ws kv kind to read the bit: no order
    art = compile_file(ROOT / "samples" / "longformer.mask", tmp_path / "portable",
                       archs=["sm_100a"], dtypes=["bf16"], head_dims=[64])
    assert json.loads((art / "manifest.json").read_text())["backward"]["kv_order"] == {
        "heavy_tiles": 0, "heavy_from_len": None}
