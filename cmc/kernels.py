"""The kernel kinds and one frozen spec per kind: the one home of each hand-written kernel's facts.

emit (threads, tile shape, shared memory, symbols), package (grid rule, work counter, tensor
maps, persistence), the templates (header file, launch parameters) and the runtime
(persistent-launch rule) read them here. This module imports nothing from cmc, so the
runtime may import it without pulling in the compiler; what a runtime needs of a kind at
launch time it reads from the manifest, which package writes from these specs.

Adding a kind: a KernelKind member and a KernelSpec in SPECS with its own threads, tile
shape, shared-memory and grid rules, launch `params` and `role`. Every kind is its own
variant with its own cubin (one entry point per cubin). A kind whose `archs` names some
archs replaces the portable kind of the same pass and role there (`kinds_for`): FWD_SM90
replaces FWD_PORTABLE on sm_90a, and BWD_KV_SM90 (role "kv", archs ("sm_90a",)) and
BWD_DQ_SM90 (role "dq") replace BWD_KV and BWD_DQ the same way. Which of them claim an arch
follows the build's choice (`choices`): the forward's "auto" (the default) takes FWD_SM90;
the backward's "ws" takes the warp-specialised BWD_KV_SM90_WS for the kv role and BWD_DQ_SM90,
"lockstep" BWD_KV_SM90 and BWD_DQ_SM90, and its "auto" (the default) is "ws"
(`backward_kinds`); "portable" takes none. Backward kinds carry their entry
point (`entry`, `threads_expr`, `smem_expr`), so emit renders them without a template
change; the forward's entry points are in templates/kernel.cu.j2. A new launch parameter
also needs its packing in the runtime. docs/architecture.md, "Where to change what".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum


class Pass(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"

    def __str__(self) -> str:
        return self.value


class KernelKind(str, Enum):
    """The value is the manifest's and header's `kernel` string."""

    FWD_PORTABLE = "portable"  # mma.sync, sm_80 and later
    FWD_SM90 = "sm90"  # wgmma + TMA, producer and two consumer warpgroups, sm_90a only
    BWD_PRE = "bwd_pre"  # Dsum = rowsum(dO * O); zeroes the dQ workspace
    BWD_KV = "bwd_kv"  # one key tile: dK, dV; dQ atomically into the workspace
    BWD_KV_SM90 = "bwd_kv_sm90"  # BWD_KV by wgmma, 128-key tiles, sm_90a only
    BWD_KV_SM90_WS = "bwd_kv_sm90_ws"  # BWD_KV_SM90 warp-specialised (loader, dQ writers)
    BWD_DQ = "bwd_dq"  # deterministic mode: one query tile's dQ
    BWD_DQ_SM90 = "bwd_dq_sm90"  # BWD_DQ by wgmma, 128-row tiles, sm_90a only
    BWD_POST = "bwd_post"  # dQ workspace * scale -> dtype

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KernelSpec:
    """Everything fixed about one kind; per-mask facts (terms, tiling) enter through the rules."""

    kind: KernelKind
    pass_: Pass
    headers: tuple[str, ...]  # the hand-written kernel, under templates/: parts, inlined in order
    archs: tuple[str, ...] | None  # archs it is built for; None: every arch no other kind claims
    threads: Mapping[int, int]  # per head dim
    block_m: int  # query rows per CTA
    block_n: int  # keys per inner tile
    stages: Mapping[int, int]  # K/V ring depth per head dim (1: double buffer, no ring)
    tiled: bool  # follows the tile stage's tiling (else always linear 128-token tiles)
    plan_ints: Callable[[int, int | None], int]  # (term instances, patch key tiles or None)
    smem: Callable[[int, int], int]  # (head dim, plan ints) -> dynamic shared memory bytes
    grid: tuple[str, str, str]  # manifest grid expressions; {query_tiles} and {block_m} filled
    work_counter: bool  # takes its work units from desc.sched
    persistent: bool  # any grid.x is correct; the launcher picks max_ctas (persistent_ctas)
    tensor_maps: tuple[str, ...]  # tensors whose CUtensorMaps follow the descriptor
    params: tuple[str, ...]  # launch parameters in order: "desc", "maps", ("bwd_args")
    cubin_group: str  # kernels of one group share a cubin per (dtype, head dim): "forward"
    symbol: str  # extern "C" name: {mask}, {dtype}, {head_dim}
    tag: str  # names the variant in cubin files and header macros: {dtype}, {head_dim}
    role: str = "fwd"  # manifest "role": "fwd" | "pre" | "kv" | "dq" | "post"
    walks: str = "forward"  # whose term count sizes the plan: "forward" | "transposed" table
    # Backward kinds: the C++ of the generated entry point ({head_dim}, {bf16} filled).
    entry: str = ""  # the device template call
    threads_expr: str = ""  # launch bounds (static_assert'ed == threads)
    smem_expr: str = ""  # dynamic shared memory (static_assert'ed == smem); "" for none
    # setmaxnreg kinds: the register splits the build tries per tiling kind, in order
    reg_splits: Mapping[str, tuple[RegSplit, ...]] | None = None
    # the build choices (Options.kernel / bwd_kernel) under which an arch-specific kind
    # claims its archs (kinds_for); portable kinds (archs None) take what is left
    choices: tuple[str, ...] = ("auto",)
    # tokens per map box at most (None: the tiling's, Tiling.box_rows, whatever it is)
    map_box_cap: int | None = None
    # NVRTC defines the build tries, in order, when the default build uses local memory: a
    # faster default that spills on some masks has a slower way back (build.py); the cubin's
    # options in the manifest name the one kept
    spill_fallbacks: tuple[tuple[str, ...], ...] = ()

    def variant_tag(self, dtype: str, head_dim: int, short: bool = False) -> str:
        """The tag of a variant (SHORT_SUFFIX for a kernel for short sequences)."""
        tag = self.tag.format(dtype=dtype, head_dim=head_dim)
        return f"{tag}{SHORT_SUFFIX}" if short else tag

    def variant_symbol(self, mask: str, dtype: str, head_dim: int, short: bool = False) -> str:
        """The entry point of a variant (SHORT_SUFFIX for a kernel for short sequences)."""
        symbol = self.symbol.format(mask=mask, dtype=dtype, head_dim=head_dim)
        return f"{symbol}{SHORT_SUFFIX}" if short else symbol

    def reg_split_candidates(self, tiling_kind: str) -> tuple[RegSplit, ...]:
        """The splits the build tries for a kernel of this tiling kind (() for kinds without
        setmaxnreg); the first is the header's default and needs no option."""
        return self.reg_splits[tiling_kind] if self.reg_splits else ()

    def grid_rule(self, tiling: TileShape, block_m: int) -> list[str]:
        """Grid dimensions as expressions over descriptor fields and max_ctas (the header's
        grid function), for a variant of `block_m` query rows and this tiling. A persistent
        kind's launcher picks max_ctas (persistent_ctas)."""
        query_tiles = tiling.query_tiles_expr(block_m)
        return [g.format(query_tiles=query_tiles, block_m=block_m) for g in self.grid]


# --------------------------------------------------------------------------- tile shapes

# The tag and symbol suffix of a kernel for short sequences: a tiled kind built again on
# linear tiles, launched instead of its role's patch-tiled kernel when every sequence is
# shorter than that tiling's min_len (where the patch kernel cuts them into linear tiles too,
# with the patch path's costs; the manifest's kernel "below_len").
SHORT_SUFFIX = "_short"

# The max_len from which the launcher sets the ws kv's heavy order (cmc_bwd_args.flags bit 1,
# the manifest's backward.kv_order): runs 52 and 53 measured it 1-9 % slower at 4K on three of
# four text masks, -2 to +15 % at 8K and -2 to +62 % at 16K and 32K (docs/kernel-notes.md "The
# kv order by length")
KV_HEAVY_FROM = 8192
TILE = 128  # query rows and keys per tile of the sm90 kernel
# Key tiles one query tile can see in a patch-tiled kernel: its plan holds a bit per key
# tile in shared memory (cmc_sm90::kMaxKeyTiles), so this bounds the sequence length.
MAX_KEY_TILES = 4096


@dataclass(frozen=True)
class TileShape:
    """The launch facts of a tiling (ir.Tiling without its reason and masks; the manifest's
    kernel "tiling"): what the grid rule and the longest sequence follow from. The tile stage
    (cmc/tiling.py) chooses it; package writes the rules, and inspect and the runtime's load
    re-derive them from it (cmc/runtime/launch_check.py)."""

    kind: str  # "linear" | "patch"
    origin: int = 0  # first grid token
    width: int = 0  # grid width in tokens
    patch_rows: int = 1
    patch_cols: int = TILE
    min_len: int = 0  # shorter sequences are cut into linear tiles only

    def query_tiles_expr(self, block_m: int) -> str:
        """The query tiles of the longest sequence, as an expression over max_len."""
        if self.kind != "patch":
            return f"ceil_div(max_len, {block_m})"
        rows = f"ceil_div(max(max_len - {self.origin}, 0), {self.width})"
        patch = (f"ceil_div(min(max_len, {self.origin}), {block_m}) + "
                 f"ceil_div({rows}, {self.patch_rows}) * {self.width // self.patch_cols}")
        if self.min_len <= 0:
            return patch
        # below min_len the kernel cuts the sequence into linear tiles (Tiling.origin_for)
        use = f"min(1, max_len / {self.min_len})"
        return f"ceil_div(max_len, {block_m}) * (1 - {use}) + ({patch}) * {use}"

    def max_len(self) -> int | None:
        """The longest sequence the kernel's plan can hold (None: no limit)."""
        if self.kind != "patch":
            return None
        per_row = self.width // self.patch_cols
        patch_rows = (MAX_KEY_TILES - -(-self.origin // TILE)) // per_row
        return self.origin + patch_rows * self.patch_rows * self.width


# --------------------------------------------------------------------------- portable

PORTABLE_BLOCK_M = 128
PORTABLE_BLOCK_N = 64
# 16 rows per warp (8 warps) for both head dims: no spills on any mask or arch (measured with
# ptxas -v, NVRTC 13.0, sm_80/90a/100a). 32 rows per warp (two m16 tiles, 4 warps, as in
# FlashAttention-2) halves shared-memory reads of K/V per mma but hits 255 registers and
# spills for d128 and for mask-heavy d64; tools/kernel_check.py times both (-DCMC_PORTABLE_MT).
ROWS_PER_WARP = {64: 16, 128: 16}


def _portable_plan_ints(n_terms: int, patch_key_tiles: int | None) -> int:
    """Term ranges, touched and full runs, two counts (the portable tiling is linear)."""
    return 8 * n_terms + 2


def _portable_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_portable::smem_bytes: Q, K x2, V x2, the plan."""
    tiles = PORTABLE_BLOCK_M * head_dim * 2 + 4 * PORTABLE_BLOCK_N * head_dim * 2
    return (tiles + plan_ints * 4 + 15) // 16 * 16


# --------------------------------------------------------------------------- sm90

SM90_STAGES = {64: 4, 128: 2}
SM90_THREADS = 384
SM90_PRODUCER_THREADS = 128
SM90_LAUNCH_REGS = 168  # per thread under __launch_bounds__(384, 1): 65536 / 384, rounded to 8


@dataclass(frozen=True)
class RegSplit:
    """Registers per thread of the sm90 forward's producer and consumer warpgroups after
    setmaxnreg (cmc_sm90::Regs). ptxas allocates each region within its budget, so the split
    decides where a kernel spills; the build picks one per kernel (build.py)."""

    producer: int
    consumer: int

    def __post_init__(self) -> None:
        if self.problem():
            raise ValueError(f"register split {self}: {self.problem()}")

    def problem(self) -> str:
        """Why the device would refuse or hang on this split ("" when it is sound)."""
        for n in (self.producer, self.consumer):
            if n % 8 or not 24 <= n <= 256:
                return f"{n} is not a setmaxnreg count (a multiple of 8 in [24, 256])"
        used = (SM90_PRODUCER_THREADS * self.producer
                + (SM90_THREADS - SM90_PRODUCER_THREADS) * self.consumer)
        if used > SM90_THREADS * SM90_LAUNCH_REGS:
            return (f"needs {used} registers, more than the CTA's {SM90_THREADS} x "
                    f"{SM90_LAUNCH_REGS} (setmaxnreg.inc would wait forever)")
        return ""

    def options(self) -> tuple[str, ...]:
        """The NVRTC defines that select it in cmc_sm90::Regs."""
        return (f"-DCMC_SM90_REGS_PRODUCER={self.producer}",
                f"-DCMC_SM90_REGS_CONSUMER={self.consumer}")

    def __str__(self) -> str:
        return f"{self.producer}/{self.consumer}"


# Tried in order until one builds without local memory and with ptxas's wgmma pipeline kept;
# the first of each tiling is the header's default (byte-identical cubins where it is clean).
# Each step moves 16 registers per thread from the consumers (256 threads) to the producer
# (128): P + 2 C = 504 = 3 x 168. Measured on the samples and generality masks (NVRTC 13.0,
# 2026-12-05, docs/kernel-notes.md "Spills as built"): 56/224 removes the producer spills of
# most linear kernels, 72/216 clear d64's, 88/208 video3d d128's; 24/240 and 40/232 spill
# more on the kernels that spill at every split here, so they are not tried there.
SM90_REG_SPLITS: Mapping[str, tuple[RegSplit, ...]] = {
    "linear": (RegSplit(40, 232), RegSplit(56, 224), RegSplit(72, 216), RegSplit(88, 208)),
    "patch": (RegSplit(56, 224), RegSplit(72, 216)),
}


def _sm90_plan_ints(n_terms: int, patch_key_tiles: int | None) -> int:
    """cmc_sm90::plan_ints: linear, the term ranges, touched runs, full runs and two counts;
    patch, the term ranges and two bit sets of key tiles; both then the item header (query
    tile, head, sequence, the builders' unit word)."""
    item = 4
    if patch_key_tiles is not None:
        return 4 * n_terms + 2 * (patch_key_tiles // 32) + item
    return 8 * n_terms + 2 + item


def _sm90_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_sm90::smem_bytes (static_assert'ed): two Q tiles, the K/V ring, barriers, two plans."""
    stages = SM90_STAGES[head_dim]
    tile = 128 * head_dim * 2
    plan_off = 2 * tile + 2 * stages * tile + (6 + 4 * stages) * 8
    return (plan_off + 2 * plan_ints * 4 + 15) // 16 * 16 + 1024


SPECS: Mapping[KernelKind, KernelSpec] = {
    KernelKind.FWD_PORTABLE: KernelSpec(
        kind=KernelKind.FWD_PORTABLE,
        pass_=Pass.FORWARD,
        headers=("cmc/attn_fwd_portable.cuh",),
        archs=None,
        threads={hd: 32 * PORTABLE_BLOCK_M // rows for hd, rows in ROWS_PER_WARP.items()},
        block_m=PORTABLE_BLOCK_M,
        block_n=PORTABLE_BLOCK_N,
        stages={64: 1, 128: 1},
        tiled=False,
        plan_ints=_portable_plan_ints,
        smem=_portable_smem,
        grid=("ceil_div(max_len, {block_m})", "heads_q", "batch"),
        work_counter=False,
        persistent=False,
        tensor_maps=(),
        params=("desc",),
        cubin_group="forward",
        symbol="cmc_{mask}_fwd_{dtype}_d{head_dim}",
        tag="{dtype}_d{head_dim}",
    ),
    # Work units are pairs of query tiles (ceil(query_tiles / 2) * heads_q * batch), taken
    # from the counter or strided by gridDim.x, so any grid.x is correct.
    KernelKind.FWD_SM90: KernelSpec(
        kind=KernelKind.FWD_SM90,
        pass_=Pass.FORWARD,
        # design notes and layout, PTX wrappers and tile GEMMs, schedule and plans, the forward
        headers=("cmc/attn_fwd_sm90.cuh", "cmc/wgmma.cuh", "cmc/attn_fwd_sm90_ptx.cuh",
                 "cmc/attn_fwd_sm90_schedule.cuh", "cmc/attn_fwd_sm90_fwd.cuh"),
        archs=("sm_90a",),
        threads={64: 384, 128: 384},
        block_m=128,
        block_n=128,
        stages=SM90_STAGES,
        tiled=True,
        plan_ints=_sm90_plan_ints,
        smem=_sm90_smem,
        grid=("min(ceil_div({query_tiles}, 2) * heads_q * batch, max_ctas)", "1", "1"),
        work_counter=True,
        persistent=True,
        tensor_maps=("q", "k", "v"),
        params=("desc", "maps"),
        cubin_group="forward",
        symbol="cmc_{mask}_fwd_sm90_{dtype}_d{head_dim}",
        tag="sm90_{dtype}_d{head_dim}",
        reg_splits=SM90_REG_SPLITS,
    ),
}


def spec(kind: KernelKind | str) -> KernelSpec:
    """The spec of a kind, also by its manifest string."""
    return SPECS[KernelKind(kind)]


# --------------------------------------------------------------------------- backward

# cmc_bwd (templates/cmc/attn_bwd_portable.cuh): kPreRows, kBM, kBN; 4 warps in kv and dq.
BWD_PRE_ROWS = 64
BWD_BM = 64
BWD_BN = 64
BWD_THREADS = {"pre": 256, "kv": 128, "dq": 128, "post": 256}  # cmc_bwd::Cfg<D>::kThreads*


def _no_smem(head_dim: int, plan_ints: int) -> int:
    return 0


def _bwd_kv_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_bwd::smem_kv: K, V, Q x2, dO x2, LSE x2, Dsum x2, dS^T, the transposed plan."""
    tile = 64 * head_dim * 2
    fixed = 2 * tile + 4 * tile + 4 * BWD_BM * 4 + BWD_BN * BWD_BM * 2
    return (fixed + plan_ints * 4 + 15) // 16 * 16


def _bwd_dq_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_bwd::smem_dq: Q, dO, K x2, V x2, the forward plan."""
    tile = 64 * head_dim * 2
    return (6 * tile + plan_ints * 4 + 15) // 16 * 16


def _bwd_spec(kind: KernelKind, role: str, block_m: int, smem: Callable[[int, int], int],
              heads: str, walks: str, targs: str, smem_expr: str) -> KernelSpec:
    cfg = {"pre": "kThreadsPre", "kv": "kThreadsKV", "dq": "kThreadsDQ", "post": "kThreadsPost"}
    return KernelSpec(
        kind=kind,
        pass_=Pass.BACKWARD,
        headers=("cmc/attn_bwd_portable.cuh",),
        archs=None,
        threads={64: BWD_THREADS[role], 128: BWD_THREADS[role]},
        block_m=block_m,
        block_n=BWD_BN,
        stages={64: 1, 128: 1},
        tiled=False,
        plan_ints=_portable_plan_ints,  # the same linear plan
        smem=smem,
        grid=("ceil_div(max_len, {block_m})", heads, "batch"),
        work_counter=False,
        persistent=False,
        tensor_maps=(),
        params=("desc", "bwd_args"),
        cubin_group=kind.value,
        symbol=f"cmc_{{mask}}_bwd_{role}_{{dtype}}_d{{head_dim}}",
        tag=f"bwd_{role}_{{dtype}}_d{{head_dim}}",
        role=role,
        walks=walks,
        entry=f"cmc_bwd::{role}<{targs}, {{bf16}}, {{head_dim}}>(desc, args)",
        threads_expr=f"cmc_bwd::Cfg<{{head_dim}}>::{cfg[role]}",
        smem_expr=smem_expr,
    )


BWD_SPECS: Mapping[KernelKind, KernelSpec] = {
    KernelKind.BWD_PRE: _bwd_spec(KernelKind.BWD_PRE, "pre", BWD_PRE_ROWS, _no_smem, "heads_q",
                                  "forward", "cmc_hooks_b", ""),
    KernelKind.BWD_KV: _bwd_spec(
        KernelKind.BWD_KV, "kv", BWD_BN, _bwd_kv_smem, "heads_kv", "transposed",
        "cmc_hooks_b, cmc_hooks_t",
        "cmc_bwd::smem_kv<{head_dim}, cmc_hooks_b::kTerms, cmc_hooks_t::kTerms>()"),
    KernelKind.BWD_DQ: _bwd_spec(KernelKind.BWD_DQ, "dq", BWD_BM, _bwd_dq_smem, "heads_q",
                                 "forward", "cmc_hooks_b",
                                 "cmc_bwd::smem_dq<{head_dim}, cmc_hooks_b::kTerms>()"),
    KernelKind.BWD_POST: _bwd_spec(KernelKind.BWD_POST, "post", BWD_PRE_ROWS, _no_smem,
                                   "heads_q", "forward", "cmc_hooks_b", ""),
}


# cmc_bwd_sm90 (templates/cmc/attn_bwd_sm90.cuh): kBN keys per CTA (64 per warpgroup), kBM
# query rows per item, Cfg<D>::kThreadsKV = 2 warpgroups.
BWD_SM90_BN = 128
BWD_SM90_BM = 64
BWD_SM90_THREADS = 256


def _bwd_kv_sm90_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_bwd_sm90::smem_kv: K, V [128 x D], Q x2, dO x2 [64 x D], dS^T [128 x 64], LSE x2,
    Dsum x2, the transposed plan; + 1024 (the kernel aligns its base up to 1 KiB)."""
    fixed = (2 * BWD_SM90_BN * head_dim * 2 + 4 * BWD_SM90_BM * head_dim * 2
             + BWD_SM90_BN * BWD_SM90_BM * 2 + 4 * BWD_SM90_BM * 4)
    return (fixed + plan_ints * 4 + 15) // 16 * 16 + 1024


def _bwd_sm90_plan_ints(n_terms: int, patch_tiles: int | None) -> int:
    """The linear plan (cmc_bwd::build_plan), or with a patch tiling cmc_bwd_patch_plan_ints:
    the term ranges and two bit sets of the other side's tiles (touched, full). n_terms: the
    table the kind walks (kv: the transposed one)."""
    if patch_tiles is not None:
        return 4 * n_terms + 2 * (patch_tiles // 32)
    return _portable_plan_ints(n_terms, None)


# Replaces BWD_KV on sm_90a under "lockstep" (backward_kinds); checked on the H200 on
# 2026-12-05 (tests/gpu, tools/bwd_kernel_check.py). It follows the tile stage's tiling: with
# a patch tiling its CTA is one forward tile of keys (linear or patch) and its grid counts the
# forward's tiles (attn_bwd_sm90.cuh kv_patch).
BWD_SPECS = {**BWD_SPECS, KernelKind.BWD_KV_SM90: dataclasses.replace(
    BWD_SPECS[KernelKind.BWD_KV],
    kind=KernelKind.BWD_KV_SM90,
    tiled=True,
    plan_ints=_bwd_sm90_plan_ints,
    grid=("{query_tiles}", "heads_kv", "batch"),
    headers=("cmc/attn_bwd_portable.cuh", "cmc/wgmma.cuh", "cmc/attn_bwd_sm90.cuh",
             "cmc/attn_bwd_sm90_ws.cuh"),  # reuses cmc_bwd's helpers; _ws: BWD_KV_SM90_WS's
    archs=("sm_90a",),
    threads={64: BWD_SM90_THREADS, 128: BWD_SM90_THREADS},
    block_m=BWD_SM90_BN,  # keys per CTA: the grid's x counts key tiles
    block_n=BWD_SM90_BM,  # query rows per inner item
    smem=_bwd_kv_sm90_smem,
    cubin_group=KernelKind.BWD_KV_SM90.value,
    symbol="cmc_{mask}_bwd_kv_sm90_{dtype}_d{head_dim}",
    tag="bwd_kv_sm90_{dtype}_d{head_dim}",
    entry="cmc_bwd_sm90::kv<cmc_hooks_b, cmc_hooks_t, {bf16}, {head_dim}>(desc, args)",
    threads_expr="cmc_bwd_sm90::Cfg<{head_dim}>::kThreadsKV",
    smem_expr=("cmc_bwd_sm90::smem_kv<{head_dim}, cmc_hooks_b::kTerms, cmc_hooks_t::kTerms, "
               "cmc_hooks_b::kTiling>()"),
    choices=("lockstep",),
)}

# cmc_bwd_sm90 (templates/cmc/attn_bwd_sm90_dq.cuh): kDqRows query rows per CTA (64 per
# warpgroup), kDqKeys keys per tile of the forward plan, DqCfg<D>::kThreads = 2 warpgroups.
BWD_SM90_DQ_ROWS = 128
BWD_SM90_DQ_KEYS = 64


def _bwd_dq_sm90_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_bwd_sm90::smem_dq: Q, dO [128 x D], K x2, V x2 [64 x D], the forward plan; + 1024
    (the kernel aligns its base up to 1 KiB)."""
    fixed = 2 * BWD_SM90_DQ_ROWS * head_dim * 2 + 4 * BWD_SM90_DQ_KEYS * head_dim * 2
    return (fixed + plan_ints * 4 + 15) // 16 * 16 + 1024


# Replaces BWD_DQ (the deterministic sequence's dq role) on sm_90a with BWD_KV_SM90, on the
# same terms. It follows the tile
# stage's tiling: with a patch tiling its CTA is one forward tile (linear or patch) and its
# grid counts the forward's query tiles (attn_bwd_sm90_dq.cuh dq_patch).
BWD_SPECS = {**BWD_SPECS, KernelKind.BWD_DQ_SM90: dataclasses.replace(
    BWD_SPECS[KernelKind.BWD_DQ],
    kind=KernelKind.BWD_DQ_SM90,
    tiled=True,
    plan_ints=_bwd_sm90_plan_ints,
    grid=("{query_tiles}", "heads_q", "batch"),
    headers=("cmc/attn_bwd_portable.cuh", "cmc/wgmma.cuh", "cmc/attn_bwd_sm90.cuh",
             "cmc/attn_bwd_sm90_ws.cuh", "cmc/attn_bwd_sm90_dq.cuh"),  # reuses cmc_bwd's and cmc_bwd_sm90's helpers
    archs=("sm_90a",),
    threads={64: BWD_SM90_THREADS, 128: BWD_SM90_THREADS},
    block_m=BWD_SM90_DQ_ROWS,  # query rows per CTA: the grid's x counts 128-row tiles
    block_n=BWD_SM90_DQ_KEYS,
    smem=_bwd_dq_sm90_smem,
    cubin_group=KernelKind.BWD_DQ_SM90.value,
    symbol="cmc_{mask}_bwd_dq_sm90_{dtype}_d{head_dim}",
    tag="bwd_dq_sm90_{dtype}_d{head_dim}",
    entry="cmc_bwd_sm90::dq<cmc_hooks_b, {bf16}, {head_dim}>(desc, args)",
    threads_expr="cmc_bwd_sm90::DqCfg<{head_dim}>::kThreads",
    smem_expr="cmc_bwd_sm90::smem_dq<{head_dim}, cmc_hooks_b::kTerms, cmc_hooks_b::kTiling>()",
    choices=("lockstep", "ws"),
)}

# cmc_bwd_sm90 (templates/cmc/attn_bwd_sm90_ws.cuh): kThreadsWS, a producer warpgroup (its
# loader warp's 64-row TMA boxes of Q and dO, two dQ writer warps) beside kv's two.
BWD_SM90_WS_THREADS = 384
BWD_SM90_WS_STG_ROW = 64 * 4 + 32  # SmemWS kStgRow: 64 fp32 of a dQ partial's row + pad


def _bwd_kv_sm90_ws_smem(head_dim: int, plan_ints: int) -> int:
    """cmc_bwd_sm90::smem_kv_ws (SmemWS): K, V [128 x D], Q x2, dO x2 [64 x D], dS^T x2
    [128 x 64], two dQ stagings [64 x kStgRow], LSE x2, Dsum x2, two items (int4), four
    mbarriers, the stagings' rows (2 x (16 + 64 x 4)), the transposed plan; + 1024."""
    fixed = (2 * BWD_SM90_BN * head_dim * 2 + 4 * BWD_SM90_BM * head_dim * 2
             + 2 * BWD_SM90_BN * BWD_SM90_BM * 2 + 2 * 64 * BWD_SM90_WS_STG_ROW
             + 4 * BWD_SM90_BM * 4 + 2 * 16 + 4 * 8 + 2 * (16 + 64 * 4))
    return (fixed + plan_ints * 4 + 15) // 16 * 16 + 1024


# BWD_KV_SM90 warp-specialised (docs/kernel-notes.md, "The warp-specialised kv"): the default
# kv (backward_kinds' "auto"; on the H200, 2026-12-05, 1.22-1.32x the lockstep kind's
# backward on the dense and jagged masks; on CLEAR's patch tiling 1.28-1.41x since its patch
# loaders issue TMA boxes, H100, 2026-12-06, kernel notes "Run 21"). Its second parameter is the
# Q and dO tensor maps and dq_accum's (fp32, abi.F32_MAP_COLS columns), boxes of the tiling's
# box rows capped at kBM = 64 tokens (map_box_cap: 64 on a linear tiling, a patch row on a
# patch tiling): an item's rows are loaded and its dQ partial added as boxes of consecutive
# tokens by TMA where they are (attn_bwd_sm90_ws.cuh); the dq role stays BWD_DQ_SM90.
BWD_SPECS = {**BWD_SPECS, KernelKind.BWD_KV_SM90_WS: dataclasses.replace(
    BWD_SPECS[KernelKind.BWD_KV_SM90],
    kind=KernelKind.BWD_KV_SM90_WS,
    threads={64: BWD_SM90_WS_THREADS, 128: BWD_SM90_WS_THREADS},
    smem=_bwd_kv_sm90_ws_smem,
    tensor_maps=("q", "do", "dq_accum"),
    map_box_cap=BWD_SM90_BM,
    params=("desc", "maps", "bwd_args"),
    cubin_group=KernelKind.BWD_KV_SM90_WS.value,
    symbol="cmc_{mask}_bwd_kv_sm90ws_{dtype}_d{head_dim}",
    tag="bwd_kv_sm90ws_{dtype}_d{head_dim}",
    entry="cmc_bwd_sm90::kv_ws_entry<cmc_hooks_b, cmc_hooks_t, {bf16}, {head_dim}>(desc, maps, args)",
    threads_expr="cmc_bwd_sm90::kThreadsWS",
    smem_expr=("cmc_bwd_sm90::smem_kv_ws<{head_dim}, cmc_hooks_b::kTerms, cmc_hooks_t::kTerms, "
               "cmc_hooks_b::kTiling>()"),
    choices=("ws",),
    # a linear item's LSE offsets read under its S^T / dP^T instead of before them: run 50's
    # 7-8 % on causal, but natten2d's d128 kv spills with the LSE read first (2026-12-07);
    # then the partial items by the transposed predicate instead of span words: the raster
    # window's d128 kv (band tile masks beside span words) spills 56 bytes in both LSE
    # orders and none without the span words (2026-12-08)
    spill_fallbacks=(("-DCMC_WS_LSE_FIRST=0",), ("-DCMC_BWD_KV_SPANS=0",),
                     ("-DCMC_WS_LSE_FIRST=0", "-DCMC_BWD_KV_SPANS=0")),
)}
SPECS = {**SPECS, **BWD_SPECS}

# The manifest's backward "sequence": kernel roles in launch order per mode.
BWD_SEQUENCE = {"atomic": ("pre", "kv", "post"), "deterministic": ("pre", "kv", "dq")}
BWD_ROLES = ("pre", "kv", "dq", "post")


def kinds_for(pass_: Pass, archs: tuple[str, ...], choice: str = "auto"
              ) -> list[tuple[KernelKind, tuple[str, ...]]]:
    """(kind, archs it is built for) of one pass, in variant order: per role, the portable
    kind (archs None) gets every arch that no arch-specific kind of that role claims; an
    arch-specific kind claims its archs when `choice` is one of its `choices` ("portable"
    is none's)."""
    out: list[tuple[KernelKind, tuple[str, ...]]] = []
    roles = list(dict.fromkeys(s.role for s in SPECS.values() if s.pass_ is pass_))
    for role in roles:
        mine = [s for s in SPECS.values() if s.pass_ is pass_ and s.role == role]
        claimed: dict[KernelKind, tuple[str, ...]] = {}
        taken: set[str] = set()
        for s in mine:
            if s.archs is not None and choice in s.choices:
                got = tuple(a for a in archs if a in s.archs and a not in taken)
                if got:
                    claimed[s.kind] = got
                    taken.update(got)
        rest = tuple(a for a in archs if a not in taken)
        portable = [s.kind for s in mine if s.archs is None]
        if rest and portable:
            out.append((portable[0], rest))
        out += list(claimed.items())
    return out


def forward_kinds(archs: tuple[str, ...], choice: str) -> list[tuple[KernelKind, tuple[str, ...]]]:
    """(kind, archs it is built for) of the forward pass, in variant order: choice "auto"
    gives each arch the kind that claims it (the sm90 kernel on sm_90a) and the portable
    kernel the rest; "portable" gives the portable kernel every arch."""
    return kinds_for(Pass.FORWARD, archs, choice)


# Options.bwd_kernel. On sm_90a the wgmma kinds (1.8-2.3x the portable kinds' backward on the
# dense and jagged masks, 4.4-4.6x on CLEAR; H200, 2026-12-05, docs/benchmarks.md run 12):
# "lockstep" takes BWD_KV_SM90 for the kv role, "ws" the warp-specialised BWD_KV_SM90_WS
# (1.22-1.32x lockstep's backward on the dense and jagged masks, H200, 2026-12-05,
# docs/benchmarks.md; 1.28-1.41x on CLEAR's patch tiling, H100, 2026-12-06, kernel notes
# "Run 21"), both with BWD_DQ_SM90; "auto" is "ws". "portable" gives cmc_bwd every arch.
BWD_KERNELS = ("auto", "portable", "lockstep", "ws")


def backward_kinds(archs: tuple[str, ...], choice: str = "auto"
                   ) -> list[tuple[KernelKind, tuple[str, ...]]]:
    """(kind, archs) of the backward pass, roles in launch order (pre, kv, dq, post): "auto"
    resolves to "ws" (the faster kv on every tiling measured), then each arch-specific kind
    whose `choices` hold the choice claims its archs; "portable" gives the portable kinds
    every arch."""
    if choice not in BWD_KERNELS:
        raise ValueError(f"unsupported backward kernel {choice!r} (supported: {BWD_KERNELS})")
    if choice == "auto":
        choice = "ws"
    return kinds_for(Pass.BACKWARD, archs, choice)


# --------------------------------------------------------------------------- launch policy

# Persistent launches (one CTA per SM) pay off when the CTAs take their units from the work
# counter (desc.sched). With a static stride (artifacts without the field, or no counter)
# they pay off only for short sequences of equal length: measured on H200
# (docs/kernel-notes.md, 2026-12-02) +6-21 % at L <= 4K, but -5-10 % for jagged batches and
# up to -11 % at 32K (uneven unit costs), where one CTA per unit lets the hardware balance.
PERSISTENT_MAX_LEN = 4096


def persistent_ctas(num_sms: int, packed: bool, max_len: int, dynamic: bool = False) -> int:
    """max_ctas of a persistent kind's grid rule: the SM count with a work counter, or for an
    equal-length batch (batch layout) of sequences up to PERSISTENT_MAX_LEN; otherwise
    unbounded (one CTA per work unit)."""
    if dynamic or (not packed and max_len <= PERSISTENT_MAX_LEN):
        return num_sms
    return 2**31 - 1
