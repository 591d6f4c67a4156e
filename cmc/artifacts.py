"""Frozen values of the back half: emitted source, built kernels, and the manifest's shape."""

from __future__ import annotations

from dataclasses import dataclass

from .abi import SCHEMA_VERSION, DescriptorLayout  # noqa: F401  (SCHEMA_VERSION: re-exported)
from .ir import LINEAR, IntervalTable, Tiling
from .kernels import KernelKind, RegSplit, spec

DEFAULT_ARCHS = ("sm_90a", "sm_100a")
SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a")
DTYPES = ("bf16", "fp16")
KERNELS = ("auto", "portable")  # kernels.forward_kinds: auto, each arch's own kind; portable everywhere
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class KernelVariant:
    """One entry point of the generated source."""

    symbol: str  # extern "C" name, e.g. cmc_causal_fwd_bf16_d128
    dtype: str  # "bf16" | "fp16"
    head_dim: int
    block_m: int  # query rows per CTA
    block_n: int  # keys per inner tile
    threads: int
    smem_bytes: int  # dynamic shared memory the launch must request
    kernel: KernelKind  # which hand-written kernel (its spec: cmc/kernels.py)
    archs: tuple[str, ...]  # archs this variant is built for
    tiling: Tiling = LINEAR  # which tokens share a tile (sm90; the portable is linear)
    # > 0: a kernel for short sequences, launched instead of its role's kernel (whose patch
    # tiling is all linear tiles below this length) when every sequence is shorter
    below_len: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel", KernelKind(self.kernel))  # also from its string

    @property
    def tag(self) -> str:
        """Names the variant in cubin files and header macros (unique per artifact)."""
        return spec(self.kernel).variant_tag(self.dtype, self.head_dim, self.below_len > 0)

    @property
    def define(self) -> str:
        """The macro that selects this variant's entry point in NAME.cu."""
        return f"CMC_VARIANT_{self.tag}"


@dataclass(frozen=True)
class KvOrder:
    """The sm90 ws kv kinds' launch order: the first `heavy_tiles` key tiles of every
    (sequence, kv head), which every query sees, go first when the launcher sets
    cmc_bwd_args.flags bit 1, which it does from max_len >= `from_len` (shorter ones keep
    the grid's order: docs/kernel-notes.md "Run 52", "The kv order by length")."""

    heavy_tiles: int
    from_len: int


@dataclass(frozen=True)
class EmittedSource:
    table: IntervalTable
    layout: DescriptorLayout
    filename: str  # NAME.cu
    text: str  # the exact source handed to NVRTC (headers inlined: self-contained)
    variants: tuple[KernelVariant, ...]
    transposed: IntervalTable | None = None  # the backward's table; None: forward only
    dq_layout: str = "token"  # dq_accum's layout (abi.DQ_LAYOUTS) the backward kinds share
    kv_order: KvOrder | None = None  # the ws kv's heavy key tiles (None: grid order only)

    @property
    def backward(self) -> bool:
        return self.transposed is not None


@dataclass(frozen=True)
class KernelResources:
    registers: int
    shared_static: int
    local_bytes: int  # stack frame / spill area per thread
    spill_stores: int
    spill_loads: int


@dataclass(frozen=True)
class BuiltCubin:
    """One cubin: one kernel variant for one arch (built with -DCMC_VARIANT_<dtype>_d<hd>)."""

    arch: str
    symbol: str  # the variant's entry point
    filename: str  # NAME.ARCH.DTYPE_dHD.cubin
    data: bytes
    sha256: str
    nvrtc_version: str
    options: tuple[str, ...]
    build_seconds: float
    resources: KernelResources
    log: str = ""
    reg_split: RegSplit | None = None  # setmaxnreg kinds: the split the build chose
    reg_split_reason: str = ""  # "default", or each split tried and what it gave
    # kinds with spill fallbacks (KernelSpec.spill_fallbacks): "" when the default build was
    # clean, else each build tried and what it gave
    fallback_reason: str = ""


@dataclass(frozen=True)
class BuiltKernels:
    source: EmittedSource
    cubins: tuple[BuiltCubin, ...]
