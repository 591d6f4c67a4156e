"""Assemble a backward test source until emit produces it (issue 21; replaced at integration).

The .cu is: the portable forward source of the mask (descriptor, forward header, cmc_hooks,
forward entry points) + `struct cmc_hooks_t` (the hooks of the TRANSPOSED mask: q and k
swapped in the checked ir.Mask, lowered and emitted, `cmc_hooks` and its family tables
renamed) + templates/cmc/attn_bwd_portable.cuh + the four backward entry points of the
contract (/work/notes/bwd_contract.md) under `#if defined(CMC_VARIANT_bwd_<dtype>_d<hd>)`.
No torch needed: the CPU test and the GPU check both use it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cmc import ir  # noqa: E402
from cmc.artifacts import EmittedSource  # noqa: E402
from cmc.emit import emit  # noqa: E402
from cmc.lower import lower  # noqa: E402

BWD_HEADER = ROOT / "templates" / "cmc" / "attn_bwd_portable.cuh"
HOOKS_BEGIN, HOOKS_END = "// ---- cmc hooks begin", "// ---- cmc hooks end"
KINDS = ("pre", "kv", "dq", "post")


def _swap(node: object) -> object:
    """The same tree with Var("q") and Var("k") exchanged."""
    if isinstance(node, ir.Var):
        return ir.Var({"q": "k", "k": "q"}.get(node.name, node.name))
    if isinstance(node, tuple):
        return tuple(_swap(x) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.replace(node, **{f.name: _swap(getattr(node, f.name))
                                            for f in dataclasses.fields(node)})
    return node


def transpose_mask(mask: ir.Mask) -> ir.Mask:
    """visibleT(q, k) = visible(k, q): the same mask (name, params) with q and k swapped."""
    allows = tuple(cast(ir.Pred, _swap(p)) for p in mask.allows)
    denies = tuple(cast(ir.Pred, _swap(p)) for p in mask.denies)
    return dataclasses.replace(mask, allows=allows, denies=denies)


def hooks_text(source_text: str) -> str:
    a = source_text.index(HOOKS_BEGIN)
    b = source_text.index(HOOKS_END) + len(HOOKS_END)
    return source_text[a:b]


def transposed_hooks(mask: ir.Mask) -> str:
    """`struct cmc_hooks_t` and its tables, from the transposed mask's portable emit."""
    src = emit(lower(transpose_mask(mask)), dtypes=("bf16",), head_dims=(64,), archs=("sm_80",),
               kernel="portable")
    text = hooks_text(src.text)
    text = re.sub(r"\bcmc_hooks\b", "cmc_hooks_t", text)
    text = re.sub(r"\bcmc_tab(\d+)_(\d+)\b", r"cmc_tabT\1_\2", text)
    text = re.sub(r"\bcmc_patch_mask_words\b", "cmc_patch_mask_words_t", text)
    return text.replace(HOOKS_BEGIN, "// ---- cmc transposed hooks begin").replace(
        HOOKS_END, "// ---- cmc transposed hooks end")


@dataclass(frozen=True)
class BwdVariant:
    dtype: str
    head_dim: int

    @property
    def tag(self) -> str:
        return f"bwd_{self.dtype}_d{self.head_dim}"

    @property
    def define(self) -> str:
        return f"CMC_VARIANT_{self.tag}"

    def symbol(self, mask: str, kind: str) -> str:
        return f"cmc_{mask}_bwd_{kind}_{self.dtype}_d{self.head_dim}"


def entry_points(mask: str, struct: str, v: BwdVariant) -> str:
    bf16 = "true" if v.dtype == "bf16" else "false"
    d = v.head_dim
    lines = [f"#if defined({v.define})"]
    threads = {"pre": "kThreadsPre", "kv": "kThreadsKV", "dq": "kThreadsDQ", "post": "kThreadsPost"}
    for kind in KINDS:
        targs = f"cmc_hooks, cmc_hooks_t, {bf16}, {d}" if kind == "kv" else f"cmc_hooks, {bf16}, {d}"
        lines += [
            f'extern "C" __global__ void __launch_bounds__(cmc_bwd::Cfg<{d}>::{threads[kind]}, 1)',
            f"{v.symbol(mask, kind)}(const __grid_constant__ {struct} desc, "
            "const __grid_constant__ cmc_bwd_args args) {",
            f"  cmc_bwd::{kind}<{targs}>(desc, args);",
            "}",
        ]
    lines.append("#endif")
    return "\n".join(lines)


@dataclass(frozen=True)
class BwdSource:
    mask: ir.Mask
    filename: str
    text: str
    struct: str  # the descriptor struct's name
    variants: tuple[BwdVariant, ...]
    fwd: EmittedSource  # the forward source (its variants, layout)


def assemble(table: ir.IntervalTable, dtypes=("bf16", "fp16"), head_dims=(64, 128),
             archs=("sm_80", "sm_90a", "sm_100a")) -> BwdSource:
    """Forward source (portable kernel) + transposed hooks + backward header + entry points."""
    fwd = emit(table, dtypes=dtypes, head_dims=head_dims, archs=archs, kernel="portable")
    mask = table.mask
    struct = fwd.layout.struct_name
    variants = tuple(BwdVariant(dt, hd) for dt in dtypes for hd in head_dims)
    parts = [fwd.text, transposed_hooks(mask), BWD_HEADER.read_text().rstrip("\n")]
    parts += [entry_points(mask.name, struct, v) for v in variants]
    return BwdSource(mask, fwd.filename, "\n\n".join(parts) + "\n", struct, variants, fwd)


def smem_kv(head_dim: int, n_terms_t: int) -> int:
    """cmc_bwd::smem_kv<D, NT, NTT>() (kept in step by a static_assert in the CPU test)."""
    per_tile = 64 * head_dim * 2
    plan = 2 * per_tile + 4 * per_tile + 4 * 64 * 4 + 64 * 64 * 2
    return (plan + (8 * n_terms_t + 2) * 4 + 15) // 16 * 16


def smem_dq(head_dim: int, n_terms: int) -> int:
    per_tile = 64 * head_dim * 2
    plan = 2 * per_tile + 4 * per_tile
    return (plan + (8 * n_terms + 2) * 4 + 15) // 16 * 16


def n_terms(text: str, struct: str = "cmc_hooks") -> int:
    m = re.search(rf"struct {struct} \{{.*?kTerms = (\d+)", text, re.S)
    assert m, struct
    return int(m.group(1))


def build(src: BwdSource, v: BwdVariant, arch: str):
    """NVRTC (cmc.build's compile and options) -> (cubin bytes, {symbol: (regs, spill st, ld)})."""
    from cmc.build import BASE_OPTIONS, BuildError, nvrtc_compile
    from cmc.cubin import parse_ptxas_log, read_cubin

    nt, ntt = n_terms(src.text), n_terms(src.text, "cmc_hooks_t")
    check = (f"\n#if defined({v.define})\n"
             f"static_assert(cmc_bwd::smem_kv<{v.head_dim}, {nt}, {ntt}>() == "
             f"{smem_kv(v.head_dim, ntt)}, \"smem_kv\");\n"
             f"static_assert(cmc_bwd::smem_dq<{v.head_dim}, {nt}>() == "
             f"{smem_dq(v.head_dim, nt)}, \"smem_dq\");\n#endif\n")
    res = nvrtc_compile(src.text + check, src.filename,
                        [f"-arch={arch}", *BASE_OPTIONS, f"-D{v.define}"])
    if not res.ok:
        raise BuildError(f"NVRTC failed: {src.filename} [{arch}, {v.tag}]", log=res.log)
    cub = read_cubin(res.cubin)
    logs = parse_ptxas_log(res.log)
    out = {}
    for kind in KINDS:
        sym = v.symbol(src.mask.name, kind)
        k = cub.kernel(sym)
        sp = logs.get(sym)
        out[sym] = (k.registers, sp.spill_stores if sp else 0, sp.spill_loads if sp else 0)
    return res.cubin, out


def main(argv: list[str]) -> int:
    """python3 tools/bwd_source.py MASK.mask [ARCH ...]: build and print registers/spills."""
    from cmc.driver import front

    path = argv[0]
    archs = argv[1:] or ["sm_80", "sm_90a", "sm_100a"]
    defines = {"TEXT": 64, "W": 32, "R": 5} if Path(path).stem == "clear" else {}
    src = assemble(front(path, defines))
    bad = 0
    for v in src.variants:
        for a in archs:
            _, res = build(src, v, a)
            for sym, (regs, st, ld) in res.items():
                print(f"{a:8s} {sym:44s} regs {regs:3d} spill st {st} ld {ld}", flush=True)
                bad += (st + ld) > 0
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
