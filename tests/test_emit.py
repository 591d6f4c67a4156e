"""emit: generated CUDA compiles with NVRTC for every arch and variant, is deterministic and
injection-safe; and the generated mask hooks, built for the host with gcc, agree with
cmc.evaluate exactly (visible) and soundly (tile plan: no visible pair in a skipped tile, no
masked pair in a full tile), on samples and on random expressions and tables.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cmc import emit as emit_mod
from cmc.abi import descriptor_layout
from cmc.evaluate import Env, eval_pred
from cmc.ir import (
    FALSE,
    TRUE,
    And,
    BinOp,
    BoolConst,
    Bound,
    Call,
    Cmp,
    Const,
    Expr,
    Family,
    IntervalTable,
    Mask,
    Neg,
    Not,
    Or,
    ParamDecl,
    ParamRef,
    Pred,
    Same,
    SegFn,
    TableRef,
    Term,
    Var,
)

from .conftest import ROOT, SMALL_DEFINES
from .conftest import emit_tiled as emit

q, k, L = Var("q"), Var("k"), Var("len")
ARCHS = ("sm_80", "sm_90a", "sm_100a")
GXX = shutil.which("g++")


def _mask(name: str, allows: tuple[Pred, ...], params: tuple[ParamDecl, ...] = (),
          denies: tuple[Pred, ...] = (), doc: str = "") -> Mask:
    return Mask(name, doc, f"mask {name}\n", f"{name}.mask", (), params, allows, denies)


CAUSAL = IntervalTable(
    _mask("causal", (Cmp("<=", k, q),), doc="causal"),
    (Term(TRUE, Bound(Const(0), "const"), Bound(BinOp("+", q, Const(1)), "nondec")),),
)


def _pipeline_table(stem: str, small: bool = False) -> IntervalTable:
    from cmc.driver import front

    return front(ROOT / "samples" / f"{stem}.mask", SMALL_DEFINES.get(stem, {}) if small else {})


# =========================================================================== NVRTC


def nvrtc_compile(text: str, name: str, options: list[str]) -> tuple[bool, str, bytes]:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], [])
    assert int(err) == 0
    try:
        opts = [o.encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        if int(res) != 0:
            return False, log.decode(errors="replace"), b""
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return True, log.decode(errors="replace"), bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_variant(src, v, arch: str) -> bytes:
    opts = [f"-arch={arch}", "-std=c++17", "-default-device", "--ptxas-options=-v",
            f"-D{v.define}"]
    ok, log, cubin = nvrtc_compile(src.text, src.filename, opts)
    assert ok, f"NVRTC failed for {v.symbol} on {arch}:\n{log}"
    assert v.symbol.encode() in cubin, f"entry {v.symbol} missing from the {arch} cubin"
    # ptxas's C75xx remarks (e.g. "wgmma.mma_async instructions are serialized") mean the
    # sm90 pipeline silently lost its overlap: a conditional wgmma wait caused one once
    loss = [ln for ln in log.splitlines() if "Performance Loss" in ln]
    assert not loss, f"{v.symbol} on {arch}: " + " | ".join(loss)
    return cubin


@pytest.mark.parametrize("arch", ARCHS)
def test_causal_all_variants_compile(arch):
    src = emit(CAUSAL, dtypes=("bf16", "fp16"), head_dims=(64, 128), archs=ARCHS,
               kernel="portable")
    assert [v.symbol for v in src.variants] == [
        "cmc_causal_fwd_bf16_d64", "cmc_causal_fwd_bf16_d128",
        "cmc_causal_fwd_fp16_d64", "cmc_causal_fwd_fp16_d128",
    ]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda v: _compile_variant(src, v, arch), src.variants))


SAMPLE_STEMS = sorted(p.stem for p in (ROOT / "samples").glob("*.mask"))


def test_sm90_variants_for_sm90a_only():
    src = emit(CAUSAL, dtypes=("bf16", "fp16"), head_dims=(64, 128), archs=("sm_90a", "sm_100a"))
    fast = [v for v in src.variants if v.kernel == "sm90"]
    assert [v.symbol for v in fast] == [
        "cmc_causal_fwd_sm90_bf16_d64", "cmc_causal_fwd_sm90_bf16_d128",
        "cmc_causal_fwd_sm90_fp16_d64", "cmc_causal_fwd_sm90_fp16_d128",
    ]
    assert all(v.archs == ("sm_90a",) and v.threads == 384 and v.block_n == 128 for v in fast)
    assert all(v.archs == ("sm_100a",) for v in src.variants if v.kernel == "portable")
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda v: _compile_variant(src, v, "sm_90a"), fast))
    assert all(b"wgmma" not in c for c in cubins)  # SASS, not PTX, is shipped


@pytest.mark.parametrize("stem", SAMPLE_STEMS)
def test_samples_compile(stem):
    src = emit(_pipeline_table(stem), dtypes=("bf16", "fp16"), head_dims=(64, 128))
    # sm90 bf16 d128 on sm_90a and one portable variant on sm_100a per sample keep CI time
    # down; causal covers the full matrix
    by = {(v.kernel, v.dtype, v.head_dim): v for v in src.variants}
    _compile_variant(src, by[("sm90", "bf16", 128)], "sm_90a")
    _compile_variant(src, by[("portable", "fp16" if stem == "clear" else "bf16", 64)], "sm_100a")


def test_variant_records():
    src = emit(_pipeline_table("clear"), dtypes=("fp16",), head_dims=(128,), archs=("sm_90a",),
               kernel="portable")
    (v,) = src.variants
    assert (v.block_m, v.block_n, v.threads, v.kernel) == (128, 64, 256, "portable")
    assert v.archs == ("sm_90a",)
    n_terms = src.table.max_intervals_per_row()
    assert v.smem_bytes == emit_mod.smem_bytes(128, n_terms)
    assert src.filename == "clear.cu"
    assert src.layout == descriptor_layout(src.table.mask)
    assert "generated by cmc from clear.mask, do not edit" in src.text.splitlines()[0]
    assert "#include" not in src.text
    assert "#if defined(CMC_VARIANT_fp16_d128)" in src.text


def test_bad_arguments():
    with pytest.raises(ValueError):
        emit(CAUSAL, dtypes=("fp8",))
    with pytest.raises(ValueError):
        emit(CAUSAL, head_dims=(96,))
    with pytest.raises(ValueError):
        emit(CAUSAL, archs=("sm_70",))


def test_deterministic():
    t = _pipeline_table("shared_prefix")
    a = emit(t, dtypes=("bf16", "fp16"))
    b = emit(_pipeline_table("shared_prefix"), dtypes=("bf16", "fp16"))
    assert a.text == b.text and a.variants == b.variants


def test_injection_safe():
    evil = 'x */ #include "/etc/passwd"\n#define q 1 // \\\n  asm("trap;"); /*'
    m = Mask("causal", evil, "mask causal\ndoc \"" + evil + "\"\n" + evil, "evil */.mask", (),
             (), (Cmp("<=", k, q),), ())
    src = emit(IntervalTable(m, CAUSAL.terms), archs=("sm_90a",))
    doc = _doc_line(src.text)
    assert doc.startswith("// ")
    for bad in ("*/", "/*", "\\", '"', "#", "\n"):
        assert bad not in doc[3:]
    assert "#include" not in src.text and "#define q" not in src.text
    assert 'asm("trap' not in src.text and "evil" not in src.text
    _compile_variant(src, src.variants[0], "sm_90a")
    with pytest.raises(ValueError):  # names go through abi.check_identifier
        emit(IntervalTable(Mask("bad name", "", "", "", (), (), (TRUE,), ()), ()))
    with pytest.raises(ValueError):
        bad = Mask("m", "", "", "", (), (ParamDecl("x;y", "scalar"),), (TRUE,), ())
        emit(IntervalTable(bad, ()))


def _doc_line(text: str) -> str:
    return text.split("\n")[1]


def test_sanitize_doc():
    assert emit_mod.sanitize_doc("a */ b /* c \\ d\ne") == "a  b  c  d e"
    assert "*/" not in emit_mod.sanitize_doc("*" * 10 + "/" * 10)


# =========================================================================== host harness

HARNESS_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  for (int off = 0; off < 8; off += 2)  // cmc_colmask32 against the column formula
    for (int lo = -3; lo <= 131; ++lo)
      for (int hi = -3; hi <= 131; ++hi) {
        unsigned want = 0;
        for (int n = 0; n < 16; ++n)
          for (int e = 0; e < 2; ++e) {
            const int col = 8 * n + off + e;
            if (lo <= col && col < hi) want |= 1u << (e * 16 + n);
          }
        if (cmc_colmask32(lo, hi, off) != want) { printf("bad colmask %d %d %d\n", lo, hi, off); return 2; }
      }
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    const int len = rd();
    // sequence 1 of a batch of 2 (sequence 0 is a dummy) so per-sequence indexing is exercised
    int cu[3] = {0, 7, 7 + len};
    {{DECLS}}
    DESC d;
    memset(&d, 0, sizeof d);
    d.cu_seqlens = (uint64_t)(uintptr_t)cu;
    {{FILLS}}
    const cmc_hooks::seq_t s = cmc_hooks::seq(d, 1);
    if (s.len != len || s.tok0 != 7) { printf("bad seq\n"); return 2; }
    for (int qq = 0; qq < len; ++qq) {
      const cmc_hooks::row_t r = cmc_hooks::row(s, qq);
      for (int kk = 0; kk < len; ++kk) putchar(cmc_hooks::visible(s, r, kk) ? '1' : '0');
      putchar('\n');
    }
    for (int qq = 0; qq < len; ++qq) {  // union of the exact spans, or R (a residual term)
      const cmc_hooks::row_t r = cmc_hooks::row(s, qq);
      std::vector<char> row(len, '0');
      bool exact = true;
      for (int i = 0; i < cmc_hooks::kTerms; ++i) {
        int lo = -1, hi = -1;
        exact = cmc_hooks::span(s, r, i, lo, hi) && exact;
        if (lo < 0 || hi < 0 || lo > len || hi > len) { printf("bad span bounds\n"); return 2; }
        for (int kk = lo; kk < hi; ++kk) row[kk] = '1';
      }
      if (!exact) putchar('R');
      else for (int kk = 0; kk < len; ++kk) putchar(row[kk]);
      putchar('\n');
    }
    const int nq = rd();
    const int nt = cmc_hooks::kTerms;
    std::vector<int> plan(8 * nt + 2);
    for (int t = 0; t < nq; ++t) {
      const int qa = rd(), qb = rd(), bn = rd();
      for (int i = 0; i < nt; ++i) cmc_hooks::term(s, qa, qb, i, plan.data() + 4 * i);
      for (int qq = qa; qq <= qb; ++qq) {  // every row's span lies in its term's touched range
        const cmc_hooks::row_t r = cmc_hooks::row(s, qq);
        for (int i = 0; i < nt; ++i) {
          int lo, hi;
          if (cmc_hooks::span(s, r, i, lo, hi) && hi > lo &&
              (lo < plan[4 * i] || hi > plan[4 * i + 1])) {
            printf("span outside touched: q %d term %d\n", qq, i); return 2;
          }
        }
      }
      for (int i = 0; i < nt; ++i) cmc_plan_place(plan.data(), nt, i, bn);
      cmc_plan_merge(plan.data(), nt, bn);
      const int* run = plan.data() + 4 * nt;
      const int* full = plan.data() + 6 * nt;
      const int nrun = plan[8 * nt], nfull = plan[8 * nt + 1];
      const int ntiles = len / bn + (len % bn != 0);
      int prev = -1;
      for (int r = 0; r < nrun; ++r) {  // runs sorted, disjoint, inside [0, ntiles)
        if (run[2 * r] < prev || run[2 * r] >= run[2 * r + 1] || run[2 * r + 1] > ntiles) {
          printf("bad runs\n"); return 2;
        }
        prev = run[2 * r + 1];
      }
      for (int j = 0; j < ntiles; ++j) {
        bool touched = false, isfull = false;
        for (int r = 0; r < nrun; ++r) touched |= run[2 * r] <= j && j < run[2 * r + 1];
        for (int r = 0; r < nfull; ++r) isfull |= full[2 * r] <= j && j < full[2 * r + 1];
        putchar(isfull ? (touched ? 'f' : 'X') : (touched ? 'p' : '.'));
      }
      putchar('\n');
    }
  }
  return 0;
}
"""


def _harness(table: IntervalTable) -> str:
    src = emit(table, archs=("sm_90a",))
    layout = src.layout
    decls, fills = [], []
    for p in table.mask.params:
        n = p.name
        if p.kind == "scalar":
            decls.append(f"const int v_{n} = rd();")  # reads stay in declaration order
            fills.append(f"d.p_{n} = v_{n};")
        elif p.kind == "batch":
            decls.append(f"int a_{n}[2] = {{-5, 0}}; a_{n}[1] = rd();")
            fills.append(f"d.p_{n} = (uint64_t)(uintptr_t)a_{n};")
        else:
            decls.append(
                f"std::vector<int> st_{n} = {{1, 3}}; int off_{n}[3] = {{0, 2, 2}};"
                f" {{ const int m = rd(); for (int i = 0; i < m; ++i) st_{n}.push_back(rd());"
                f" off_{n}[2] = 2 + m; }}"
            )
            fills.append(f"d.p_{n}_offsets = (uint64_t)(uintptr_t)off_{n};")
            fills.append(f"d.p_{n}_starts = (uint64_t)(uintptr_t)st_{n}.data();")
    main = (HARNESS_MAIN.replace("{{DECLS}}", "\n    ".join(decls))
            .replace("{{FILLS}}", "\n    ".join(fills))
            .replace("DESC", layout.struct_name))
    head = ("#include <cstdio>\n#include <cstdint>\n#include <cstdlib>\n#include <cstring>\n"
            "#include <vector>\n#define CMC_HOST 1\n")
    return head + src.text + main


def _build_harness(table: IntervalTable, workdir: Path) -> Path:
    cpp = workdir / f"{table.mask.name}.cpp"
    exe = workdir / table.mask.name
    cpp.write_text(_harness(table))
    r = subprocess.run(
        [GXX, "-std=c++17", "-O1", "-Wall", "-Wno-unused-function", "-Wno-unused-variable",
         "-fsanitize=undefined", "-fno-sanitize-recover=all", "-o", str(exe), str(cpp)],
        capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-6000:]
    return exe


def _random_params(mask: Mask, length: int, rng: random.Random) -> dict:
    out: dict = {}
    for p in mask.params:
        if p.kind == "segments":
            n = rng.randint(0, 5)
            out[p.name] = sorted(rng.randint(0, length) for _ in range(n))
        elif p.kind == "batch":
            out[p.name] = rng.choice([0, length, rng.randint(0, length), rng.randint(-3, 3)])
        else:
            out[p.name] = rng.choice([0, 1, -1, rng.randint(-4, length + 2)])
    return out


def _cases(mask: Mask, rng: random.Random, n: int, max_len: int = 40):
    cases = []
    for _ in range(n):
        length = rng.choice([1, 2, rng.randint(1, max_len), rng.randint(1, max_len)])
        params = _random_params(mask, length, rng)
        queries = []
        for _ in range(6):
            qa = rng.randint(0, length - 1)
            qb = rng.randint(qa, min(length - 1, qa + rng.choice([0, 3, 8, 40])))
            queries.append((qa, qb, rng.choice([1, 2, 3, 4, 8, 64])))
        cases.append((length, params, queries))
    return cases


def _run_harness(exe: Path, mask: Mask, cases) -> list[tuple[np.ndarray, list[str], list[str]]]:
    toks: list[int] = [len(cases)]
    for length, params, queries in cases:
        toks.append(length)
        for p in mask.params:
            v = params[p.name]
            toks += [len(v), *v] if p.kind == "segments" else [v]
        toks.append(len(queries))
        for qq in queries:
            toks += list(qq)
    r = subprocess.run([str(exe)], input=" ".join(map(str, toks)), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    lines = r.stdout.split("\n")
    out, pos = [], 0
    for length, _, queries in cases:
        vis = np.array([[c == "1" for c in lines[pos + i]] for i in range(length)], dtype=bool)
        pos += length
        spans = lines[pos:pos + length]
        pos += length
        out.append((vis, spans, lines[pos:pos + len(queries)]))
        pos += len(queries)
    return out


def _dense(mask: Mask, length: int, params: dict) -> np.ndarray:
    qq = np.arange(length, dtype=np.int64)[:, None]
    kk = np.arange(length, dtype=np.int64)[None, :]
    v = eval_pred(mask.predicate, Env(length, params, {"q": qq, "k": kk}))
    return np.broadcast_to(np.asarray(v, dtype=bool), (length, length))


def _check_table(table: IntervalTable, exe: Path, rng: random.Random, n: int = 25,
                 max_len: int = 40) -> dict[str, int]:
    mask = table.mask
    cases = _cases(mask, rng, n, max_len)
    seen = {"f": 0, "p": 0, ".": 0, "s": 0}
    for (length, params, queries), (vis, spans, tiles) in zip(
            cases, _run_harness(exe, mask, cases), strict=True):
        ref = _dense(mask, length, params)
        bad = np.argwhere(vis != ref)
        assert bad.size == 0, (
            f"{mask.name}: visible differs at (q, k) = {bad[0].tolist()} for len={length}, "
            f"params={params}: kernel {vis[tuple(bad[0])]}, evaluate {ref[tuple(bad[0])]}")
        for qq, line in enumerate(spans):
            if line == "R":
                assert not table.exact, f"{mask.name}: span refused on an exact table"
                continue
            seen["s"] += 1
            got = np.array([c == "1" for c in line], dtype=bool)
            assert (got == ref[qq]).all(), (
                f"{mask.name}: spans of row {qq} differ from the predicate for len={length}, "
                f"params={params}: spans {line}, evaluate {''.join('01'[x] for x in ref[qq])}")
        for (qa, qb, bn), line in zip(queries, tiles, strict=True):
            assert len(line) == -(-length // bn)
            for j, c in enumerate(line):
                blk = ref[qa:qb + 1, j * bn:min(length, (j + 1) * bn)]
                where = f"{mask.name}: rows [{qa}, {qb}], tile {j} of {bn}, len={length}, {params}"
                assert c != "X", f"full but not touched: {where}"
                seen[c] += 1
                if c == ".":
                    assert not blk.any(), f"skipped tile holds a visible pair: {where}"
                if c == "f":
                    assert (j + 1) * bn <= length, f"full tile crosses len: {where}"
                    assert blk.all(), f"full tile holds a masked pair: {where}"
    return seen


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="cmc-emit-") as d:
        yield Path(d)


needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++ for the host cross-check")


@needs_gxx
@pytest.mark.parametrize("stem", SAMPLE_STEMS)
def test_host_hooks_match_evaluate_samples(stem, workdir):
    table = _pipeline_table(stem, small=True)
    exe = _build_harness(table, workdir)
    seen = _check_table(table, exe, random.Random(hash(stem) % 1000), n=30)
    assert seen["p"] + seen["f"] > 0
    assert seen["s"] > 0 or not table.exact


@needs_gxx
@pytest.mark.parametrize("stem", SAMPLE_STEMS)
def test_host_transposed_hooks_match_evaluate_samples(stem, workdir):
    """The backward's hooks (cmc_hooks_t: the transposed table through the same emitter)
    against the transposed oracle; natten2d's bottom-border families included."""
    from dataclasses import replace

    from cmc.transpose import transpose

    tt = transpose(_pipeline_table(stem, small=True))
    tt = replace(tt, mask=replace(tt.mask, name=f"{stem}_t"))
    exe = _build_harness(tt, workdir)
    seen = _check_table(tt, exe, random.Random(hash(stem) % 1000 + 1), n=30)
    assert seen["p"] + seen["f"] > 0
    assert seen["s"] > 0 or not tt.exact


@needs_gxx
def test_host_plan_is_tight_for_causal(workdir):
    """Precision, not only soundness: causal tiles wholly below the diagonal are full, wholly
    above are skipped."""
    exe = _build_harness(CAUSAL, workdir)
    length = 300
    queries = [(qa, min(length - 1, qa + 127), bn) for qa in range(0, length, 128)
               for bn in (64, 16)]
    ((vis, _, tiles),) = _run_harness(exe, CAUSAL.mask, [(length, {}, queries)])
    for (qa, qb, bn), line in zip(queries, tiles, strict=True):
        for j, c in enumerate(line):
            lo, hi = j * bn, min(length, (j + 1) * bn) - 1
            want = "f" if hi <= qa and (j + 1) * bn <= length else ("." if lo > qb else "p")
            assert c == want, (qa, qb, bn, j, c, want)


def test_hoisting_and_same_rewrite():
    src = emit(_pipeline_table("shared_prefix"), archs=("sm_90a",))
    vis = src.text.split("static CMC_DEV bool visible")[1].split("}")[0]
    assert "cmc_seg(" not in vis  # same(responses, q, k) became a hoisted interval test
    row = src.text.split("static CMC_DEV row_t row")[1].split("return r;")[0]
    assert "cmc_seg(" in row
    clear = emit(_pipeline_table("clear"), archs=("sm_90a",)).text
    vis = clear.split("static CMC_DEV bool visible")[1].split("}")[0]
    assert ">> 7" in vis and "& 127" in vis  # power-of-two floor div / mod as shift / mask
    assert "r.h" in vis  # (q - TEXT) / W etc. come from the row context


# =========================================================================== random tables


class _Gen:
    """Random k-free expressions and predicates over q, len, params and segments."""

    def __init__(self, rng: random.Random, index: str | None = None):
        self.rng = rng
        self.index = index

    def leaf(self, allow_k: bool) -> Expr:
        r = self.rng
        opts: list[Expr] = [Const(r.randint(-6, 24)), q, q, L, ParamRef("a"), ParamRef("bb")]
        if allow_k:
            opts += [k, k, k]
        if self.index:
            opts += [Var(self.index), TableRef("tab", BinOp("-", Var(self.index), Const(-2)))]
        return r.choice(opts)

    def expr(self, depth: int, allow_k: bool = False) -> Expr:
        r = self.rng
        if depth <= 0 or r.random() < 0.25:
            return self.leaf(allow_k)
        kind = r.random()
        if kind < 0.45:
            op = r.choice("+-*/%%//")
            if op in "/%":
                div = r.choice([Const(r.choice([1, 2, 3, 4, 5, 8, -3, -4, 16])),
                                self.expr(depth - 1, allow_k), ParamRef("a")])
                return BinOp(op, self.expr(depth - 1, allow_k), div)  # type: ignore[arg-type]
            if op == "*":
                return BinOp("*", self.expr(depth - 1, allow_k), Const(r.randint(-3, 3)))
            return BinOp(op, self.expr(depth - 1, allow_k), self.expr(depth - 1, allow_k))  # type: ignore[arg-type]
        if kind < 0.55:
            return BinOp("*", self.expr(depth - 1, allow_k), self.expr(depth - 1, allow_k))
        if kind < 0.62:
            return Neg(self.expr(depth - 1, allow_k))
        if kind < 0.8:
            fn = r.choice(["min", "max", "abs"])
            n = 1 if fn == "abs" else r.randint(2, 3)
            return Call(fn, tuple(self.expr(depth - 1, allow_k) for _ in range(n)))  # type: ignore[arg-type]
        fn = r.choice(["seg", "seg_start", "seg_end"])
        return SegFn(fn, "S", self.expr(depth - 1, allow_k))  # type: ignore[arg-type]

    def pred(self, depth: int, allow_k: bool = False) -> Pred:
        r = self.rng
        x = r.random()
        if depth <= 0 or x < 0.45:
            if r.random() < 0.15:
                a = self.expr(1, allow_k)
                b = k if allow_k and r.random() < 0.6 else self.expr(1, allow_k)
                return Same("S", a, b) if r.random() < 0.5 else Same("S", b, a)
            if r.random() < 0.05:
                return BoolConst(r.random() < 0.7)
            op = r.choice(["<", "<=", ">", ">=", "==", "!="])
            return Cmp(op, self.expr(2, allow_k), self.expr(2, allow_k))  # type: ignore[arg-type]
        if x < 0.65:
            return And(tuple(self.pred(depth - 1, allow_k) for _ in range(r.randint(1, 3))))
        if x < 0.85:
            return Or(tuple(self.pred(depth - 1, allow_k) for _ in range(r.randint(1, 3))))
        return Not(self.pred(depth - 1, allow_k))


PARAMS = (ParamDecl("a", "scalar"), ParamDecl("bb", "batch"), ParamDecl("S", "segments"))


def _subst_index(e, index: str, t: int, tab: tuple[int, ...], start: int):
    """Instantiate a family expression for index value t (tables become constants)."""
    from dataclasses import fields, is_dataclass, replace

    if isinstance(e, Var) and e.name == index:
        return Const(t)
    if isinstance(e, TableRef):
        i = _const_eval(_subst_index(e.index, index, t, tab, start))
        return Const(tab[i])
    if isinstance(e, tuple):
        return tuple(_subst_index(x, index, t, tab, start) for x in e)
    if is_dataclass(e) and not isinstance(e, type):
        kw = {f.name: _subst_index(getattr(e, f.name), index, t, tab, start) for f in fields(e)}
        return replace(e, **kw)
    return e


def _const_eval(e: Expr) -> int:
    from cmc.evaluate import eval_expr

    return int(eval_expr(e, Env(1, {}, {})))


def _random_table(seed: int) -> IntervalTable:
    rng = random.Random(seed)
    g = _Gen(rng)
    terms: list[Term] = []
    allows: list[Pred] = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:  # a family over index t in [start, stop)
            start = rng.randint(-2, 1)
            count = rng.randint(1, 4)
            tab = tuple(rng.randint(-5, 12) for _ in range(count + 4))
            fg = _Gen(rng, "t")
            guard = fg.pred(1)
            lo, hi = fg.expr(2), fg.expr(2)
            fam = Family("t", start, start + count, (("tab", tab),))
            terms.append(Term(guard, Bound(lo, "none"), Bound(hi, "none"), family=fam))
            for t in range(start, start + count):
                # TableRef index is t + 2 (t - (-2)); tab has count + 4 entries
                sub = And((guard, Cmp("<=", lo, k), Cmp("<", k, hi)))
                allows.append(_subst_index(sub, "t", t, tab, start))
            continue
        guard = g.pred(2)
        lo, hi = g.expr(3), g.expr(3)
        residual = g.pred(2, allow_k=True) if rng.random() < 0.4 else None
        terms.append(Term(guard, Bound(lo, "none"), Bound(hi, "none"), residual))
        parts = [guard, Cmp("<=", lo, k), Cmp("<", k, hi)] + ([residual] if residual else [])
        allows.append(And(tuple(parts)))
    mask = _mask(f"rnd{seed}", tuple(allows), PARAMS)
    return IntervalTable(mask, tuple(terms))


@needs_gxx
@pytest.mark.parametrize("chunk", range(4))
def test_host_random_tables(chunk, workdir):
    seeds = range(chunk * 10, chunk * 10 + 10)
    tables = [_random_table(s) for s in seeds]
    with ThreadPoolExecutor(2) as pool:
        exes = list(pool.map(lambda t: _build_harness(t, workdir), tables))
    for seed, table, exe in zip(seeds, tables, exes, strict=True):
        _check_table(table, exe, random.Random(seed), n=20, max_len=30)


@needs_gxx
def test_host_random_predicates_exact(workdir):
    """visible() on k-heavy random predicates (with denies), one conservative term."""
    rng = random.Random(7)
    tables = []
    for i in range(8):
        g = _Gen(rng)
        allows = tuple(g.pred(3, allow_k=True) for _ in range(rng.randint(1, 3)))
        denies = tuple(g.pred(2, allow_k=True) for _ in range(rng.randint(0, 2)))
        m = _mask(f"pred{i}", allows, PARAMS, denies)
        whole = Term(TRUE, Bound(Const(0), "const"), Bound(L, "const"), m.predicate)
        tables.append(IntervalTable(m, (whole,)))
    with ThreadPoolExecutor(2) as pool:
        exes = list(pool.map(lambda t: _build_harness(t, workdir), tables))
    for t, exe in zip(tables, exes, strict=True):
        _check_table(t, exe, random.Random(1), n=20, max_len=30)


def _guarded_division_masks() -> list[IntervalTable]:
    """k compared with a constant, then floor division / remainder of k - c by non-powers of
    two behind it (&&: the guard held; ||: the items before it failed), where k - c < 0 is
    possible without the guard; each guard form and its flip, and a guard that does not
    make the numerator non-negative (k >= 2 before (k - 5) / 3). First the && of k >= 5;
    third from last the weak guard."""
    def c(v: int) -> Const:
        return Const(v)

    ky, kx = BinOp("/", BinOp("-", k, c(5)), c(3)), BinOp("%", BinOp("-", k, c(5)), c(5))
    dy, dx = BinOp("-", BinOp("/", q, c(3)), ky), BinOp("-", BinOp("%", q, c(5)), kx)
    near = Cmp("<", BinOp("+", BinOp("*", dy, dy), BinOp("*", dx, dx)), c(7))
    cycle = Cmp("==", BinOp("%", BinOp("-", k, c(5)), c(6)), BinOp("%", q, c(5)))
    preds: list[Pred] = []
    for guard, negation in ((Cmp(">=", k, c(5)), Cmp("<", k, c(5))),
                            (Cmp("<", c(4), k), Cmp(">=", c(4), k)),
                            (Cmp(">", k, c(4)), Cmp("<=", k, c(4))),
                            (Cmp("<=", c(5), k), Cmp(">", c(5), k))):
        preds.append(And((guard, near)))
        preds.append(Or((negation, cycle)))  # the right side runs when the negation failed
    preds.append(And((Cmp(">=", k, c(2)), Cmp("==", ky, BinOp("/", q, c(7))))))  # not enough
    preds.append(Or((Not(Cmp(">=", k, c(6))), Cmp("<", BinOp("%", BinOp("-", k, c(6)), c(7)), c(3)))))
    preds.append(And((Cmp("==", k, c(9)), Cmp("==", BinOp("/", BinOp("-", k, c(10)), c(3)), c(-1)))))
    tables = []
    for i, pr in enumerate(preds):
        m = _mask(f"guarded{i}", (pr,))
        whole = Term(TRUE, Bound(Const(0), "const"), Bound(L, "const"), m.predicate)
        tables.append(IntervalTable(m, (whole,)))
    return tables


def test_guarded_division_is_unsigned_only_where_the_guard_proves_it():
    """emit's range narrowing: (k - 5) / 3 behind k >= 5 becomes an unsigned division; behind
    k >= 2 it stays cmc_fdiv."""
    tables = _guarded_division_masks()
    first = emit(tables[0], archs=("sm_80",), dtypes=("bf16",), head_dims=(64,)).text
    assert "(unsigned)((k - 5)) / 3u" in first and "(unsigned)((k - 5)) % 5u" in first
    weak = emit(tables[-3], archs=("sm_80",), dtypes=("bf16",), head_dims=(64,)).text
    assert "cmc_fdiv((k - 5), 3)" in weak and "(unsigned)((k - 5))" not in weak


@needs_gxx
def test_host_guarded_division_exact(workdir):
    """The narrowed code against evaluate(), on every (q, k) of lengths up to 30 (the guards'
    constants 4-10 sit inside)."""
    tables = _guarded_division_masks()
    with ThreadPoolExecutor(2) as pool:
        exes = list(pool.map(lambda t: _build_harness(t, workdir), tables))
    for t, exe in zip(tables, exes, strict=True):
        _check_table(t, exe, random.Random(3), n=12, max_len=30)


@needs_gxx
def test_host_edge_tables(workdir):
    """No terms, an always-false guard, huge products (saturating interval arithmetic)."""
    c = Const(2**31 - 1)
    big = BinOp("*", BinOp("*", BinOp("+", q, c), c), c)  # ~2^93: saturates, never evaluated
    tables = [
        IntervalTable(_mask("none", ()), ()),
        IntervalTable(_mask("never", (And((FALSE, Cmp("<", k, q))),)),
                      (Term(FALSE, Bound(Const(0), "const"), Bound(q, "nondec")),)),
        IntervalTable(_mask("huge", (Cmp("<", k, q),)),
                      (Term(TRUE, Bound(BinOp("-", big, big), "none"), Bound(q, "nondec")),)),
    ]
    for t in tables:
        exe = _build_harness(t, workdir)
        _check_table(t, exe, random.Random(3), n=10)


# =========================================================================== expression level

EXPR_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    seq_t s;
    s.len = rd(); s.tok0 = 0; s.p_a = rd(); s.p_bb = rd();
    std::vector<int> st(rd());
    for (int& x : st) x = rd();
    s.sg_S = st.data(); s.sn_S = (int)st.size();
    const int nq = rd();
    std::vector<int> qa(nq), qb(nq);
    for (int i = 0; i < nq; ++i) { qa[i] = rd(); qb[i] = rd(); }
    for (int e = 0; e < NEXPR; ++e) {
      for (int q = 0; q < s.len; ++q) printf("%lld ", (long long)ex(e, s, q));
      for (int i = 0; i < nq; ++i) { const cmc_iv v = iv(e, s, qa[i], qb[i]); printf("%lld %lld ", v.lo, v.hi); }
      printf("\n");
    }
    for (int p = 0; p < NPRED; ++p) {
      for (int q = 0; q < s.len; ++q) putchar(pr(p, s, q) ? '1' : '0');
      for (int i = 0; i < nq; ++i) { const cmc_tv v = tv(p, s, qa[i], qb[i]); printf(" %d%d", v.may, v.must); }
      printf("\n");
    }
  }
  return 0;
}
"""


def _expr_harness(exprs: list[Expr], preds: list[Pred]) -> str:
    scope = emit_mod._Scope({"a": "scalar", "bb": "batch", "S": "segments"})
    out = ["#include <cstdio>", "#include <cstdint>", "#include <cstdlib>", "#include <vector>",
           "#define CMC_HOST 1", emit_mod.header_text(emit_mod.PORTABLE),
           "struct seq_t { int len; cmc_i64 tok0; int p_a; int p_bb; const int* sg_S; int sn_S; };",
           f"#define NEXPR {len(exprs)}", f"#define NPRED {len(preds)}"]
    ex_cases, iv_cases, pr_cases, tv_cases = [], [], [], []
    for i, e in enumerate(exprs):
        g = emit_mod._ExactGen(scope)
        c = g.expr(e, "row")
        out.append(f"static cmc_i64 ex{i}(const seq_t& s, int q) {{ (void)s; (void)q; "
                   f"return (cmc_i64)({c.code}); }}")
        v = emit_mod._IvGen(scope, {})
        name = v.iv(e)
        out.append(f"static cmc_iv iv{i}(const seq_t& s, int qa, int qb) {{ (void)s; (void)qa;"
                   f" (void)qb;\n  " + "\n  ".join(v.lines) + f"\n  return {name}; }}")
        ex_cases.append(f"case {i}: return ex{i}(s, q);")
        iv_cases.append(f"case {i}: return iv{i}(s, qa, qb);")
    for i, p in enumerate(preds):
        g = emit_mod._ExactGen(scope)
        out.append(f"static bool pr{i}(const seq_t& s, int q) {{ (void)s; (void)q; "
                   f"return {g.pred(p, 'row')}; }}")
        v = emit_mod._IvGen(scope, {})
        name = v.tv(p)
        out.append(f"static cmc_tv tv{i}(const seq_t& s, int qa, int qb) {{ (void)s; (void)qa;"
                   f" (void)qb;\n  " + "\n  ".join(v.lines) + f"\n  return {name}; }}")
        pr_cases.append(f"case {i}: return pr{i}(s, q);")
        tv_cases.append(f"case {i}: return tv{i}(s, qa, qb);")
    out.append("static cmc_i64 ex(int e, const seq_t& s, int q) { switch (e) { "
               + " ".join(ex_cases) + " } return 0; }")
    out.append("static cmc_iv iv(int e, const seq_t& s, int qa, int qb) { switch (e) { "
               + " ".join(iv_cases) + " } return cmc_iv_top(); }")
    out.append("static bool pr(int p, const seq_t& s, int q) { switch (p) { "
               + " ".join(pr_cases) + " } return false; }")
    out.append("static cmc_tv tv(int p, const seq_t& s, int qa, int qb) { switch (p) { "
               + " ".join(tv_cases) + " } return cmc_tv_const(false); }")
    return "\n".join(out) + EXPR_MAIN


BIG = 1 << 61


@needs_gxx
def test_host_expressions_and_intervals(workdir):
    """Every random expression: the exact C equals evaluate's value on every row, and its
    interval over rows [qa, qb] contains every row's value; every random k-free predicate:
    exact C equals evaluate, may/must are sound."""
    rng = random.Random(11)
    g = _Gen(rng)
    exprs = [g.expr(rng.randint(1, 4)) for _ in range(400)]
    exprs += [SegFn(fn, "S", e) for fn in ("seg", "seg_start", "seg_end")  # type: ignore[arg-type]
              for e in (q, BinOp("-", q, Const(3)), BinOp("+", q, Const(5)))]
    exprs += [BinOp(op, e, d) for op in "/%" for e in (q, BinOp("-", q, Const(9)), Neg(q))  # type: ignore[arg-type]
              for d in (BinOp("-", q, Const(4)), BinOp("-", Const(3), q), ParamRef("a"),
                        Const(-3), Const(4), Const(7))]
    preds = [g.pred(3) for _ in range(250)]
    cpp = workdir / "exprs.cpp"
    exe = workdir / "exprs"
    cpp.write_text(_expr_harness(exprs, preds))
    r = subprocess.run([GXX, "-std=c++17", "-O0", "-fsanitize=undefined",
                        "-fno-sanitize-recover=all", "-o", str(exe), str(cpp)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-6000:]
    cases = []
    crng = random.Random(5)
    for _ in range(12):
        length = crng.randint(1, 30)
        params = _random_params(Mask("x", "", "", "", (), PARAMS, (), ()), length, crng)
        tiles = []
        for _ in range(5):
            qa = crng.randint(0, length - 1)
            tiles.append((qa, crng.randint(qa, min(length - 1, qa + crng.choice([0, 2, 9, 30])))))
        cases.append((length, params, tiles))
    toks: list[int] = [len(cases)]
    for length, params, tiles in cases:
        toks += [length, params["a"], params["bb"], len(params["S"]), *params["S"], len(tiles)]
        for t in tiles:
            toks += list(t)
    r = subprocess.run([str(exe)], input=" ".join(map(str, toks)), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.split("\n")
    from cmc.evaluate import eval_expr

    pos = 0
    for length, params, tiles in cases:
        qs = np.arange(length, dtype=np.int64)
        env = Env(length, params, {"q": qs})
        for e in exprs:
            nums = [int(x) for x in lines[pos].split()]
            pos += 1
            ref = np.broadcast_to(eval_expr(e, env), (length,))
            got = nums[:length]
            assert got == [int(x) for x in ref], (e, params, length, got, ref.tolist())
            for i, (qa, qb) in enumerate(tiles):
                lo, hi = nums[length + 2 * i], nums[length + 2 * i + 1]
                vals = ref[qa:qb + 1]
                assert lo <= -BIG or lo <= vals.min(), (e, params, length, qa, qb, lo, hi)
                assert hi >= BIG or vals.max() <= hi, (e, params, length, qa, qb, lo, hi)
        for p in preds:
            line = lines[pos]
            pos += 1
            bits, flags = line[:length], line[length:].split()
            ref = np.broadcast_to(eval_pred(p, env), (length,))
            assert bits == "".join("1" if x else "0" for x in ref), (p, params, length)
            for (qa, qb), fl in zip(tiles, flags, strict=True):
                may, must = fl[0] == "1", fl[1] == "1"
                vals = ref[qa:qb + 1]
                assert may or not vals.any(), (p, params, length, qa, qb)
                assert not must or vals.all(), (p, params, length, qa, qb)


@needs_gxx
def test_host_hooks_match_evaluate_natten_clamped(workdir):
    """A clamped 2D window and its transposed table, whose visible() evaluates the swapped
    predicate (one window test) while its terms come from the case split: both agree with
    evaluate, borders included."""
    from cmc.driver import front
    from cmc.transpose import transpose

    table = front(ROOT / "benchmarks" / "generality" / "natten_clamped.mask", {"W": 8, "K": 3})
    tt = transpose(table)
    vis = emit(tt, archs=("sm_90a",)).text.split("static CMC_DEV bool visible(")[1].split("}")[0]
    assert "cmc_min" in vis and vis.count("&&") < 10, vis  # the window, not 16 cases
    for t in (table, tt):
        exe = _build_harness(t, workdir)
        seen = _check_table(t, exe, random.Random(23), n=30, max_len=80)
        assert seen["p"] > 0


@needs_gxx
def test_host_hooks_match_evaluate_video3d(workdir):
    """A 3D neighbourhood (product families over frame and row offsets) and its transposed
    table: the generated hooks agree with evaluate at lengths spanning several frames."""
    from cmc.driver import front
    from cmc.transpose import transpose

    table = front(ROOT / "benchmarks" / "generality" / "video3d.mask",
                  {"FH": 3, "FW": 4, "RT": 1, "RY": 1, "RX": 1})
    for t in (table, transpose(table)):
        assert t.exact and t.max_intervals_per_row() == 9
        exe = _build_harness(t, workdir)
        seen = _check_table(t, exe, random.Random(22), n=30, max_len=60)
        assert seen["p"] > 0 and seen["s"] > 0


@needs_gxx
def test_host_unchecked_intervals_equal_the_checked(workdir, monkeypatch):
    """cmc_ivu (emit._fits_unchecked: every value proved inside cmc_iv's saturation bound)
    gives the same term ranges as cmc_iv's saturating arithmetic: tables built both ways
    print the same tile classes on the same rows (samples' tables and transposed tables at
    small constants, random tables)."""
    from dataclasses import replace

    import cmc.emit as emit_mod
    from cmc.transpose import transpose

    tables = []
    for stem in ("natten2d", "clear", "block_causal_video", "hstu", "shared_prefix",
                 "sliding_window_rt"):
        t = _pipeline_table(stem, small=True)
        tt = transpose(t)
        tables += [t, replace(tt, mask=replace(tt.mask, name=f"{stem}_t"))]
    tables += [_random_table(s) for s in range(10)]
    fast_op = re.compile(r"const cmc_iv v\d+ = cmc_ivu_")  # a term's own line
    assert fast_op.search(_harness(tables[0])) and fast_op.search(_harness(tables[1]))
    (workdir / "unchecked").mkdir(exist_ok=True)
    (workdir / "checked").mkdir(exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        fast = list(pool.map(lambda t: _build_harness(t, workdir / "unchecked"), tables))
    monkeypatch.setattr(emit_mod, "_fits_unchecked", lambda term, scope: False)
    assert not fast_op.search(_harness(tables[0]))
    with ThreadPoolExecutor(2) as pool:
        slow = list(pool.map(lambda t: _build_harness(t, workdir / "checked"), tables))
    for i, (table, a, b) in enumerate(zip(tables, fast, slow, strict=True)):
        cases = _cases(table.mask, random.Random(i), 12, max_len=40)
        got, want = _run_harness(a, table.mask, cases), _run_harness(b, table.mask, cases)
        for (_, _, tiles_a), (_, _, tiles_b) in zip(got, want, strict=True):
            assert tiles_a == tiles_b, table.mask.name


def test_unchecked_bound_is_the_kernels_saturation_bound():
    """emit.IV_BIG, the bound _fits_unchecked proves values inside, is CMC_IV_BIG of the
    hand-written interval code: a larger Python bound would emit cmc_ivu where cmc_iv
    saturates."""
    import re

    from cmc.emit import IV_BIG

    text = (ROOT / "templates" / "cmc" / "attn_fwd_portable.cuh").read_text()
    m = re.search(r"#define CMC_IV_BIG \(1LL << (\d+)\)", text)
    assert m is not None and 1 << int(m.group(1)) == IV_BIG


def test_unchecked_needs_every_evaluated_value_in_range():
    """A table's index is evaluated by term() although its value is the table's: an index
    past cmc_iv's saturation bound keeps the term checked (the range of the table alone
    would not)."""
    from cmc.emit import _fits_unchecked, _Scope

    fam = Family("t", 0, 2, (("tab", (1, 2)),))
    scope = _Scope({}, "t", (0, 1), {"tab": ("arr", (1, 2))}, {})

    def term(index: Expr) -> Term:
        return Term(Cmp("<=", Const(0), TableRef("tab", index)), Bound(Const(0), "const"),
                    Bound(L, "const"), family=fam)

    assert _fits_unchecked(term(Var("t")), scope)
    assert not _fits_unchecked(term(BinOp("*", Var("t"), Const(1 << 62))), scope)
