"""The launch descriptor: the one struct every kernel takes, shared by emit, package and runtime.

A kernel is launched with a by-value parameter `const __grid_constant__ DESC desc` (sm90
kernels add the tensor maps below as a second one), whose layout is fixed here (natural C alignment, x86-64 / CUDA ABI). emit writes the struct,
package writes it into NAME.h and manifest.json, runtime packs its bytes. Tensors are
token-major: element (token t, head h, dim d) of Q lives at q + t*q_stride_tok +
h*q_stride_head + d, where t is the packed token index cu_seqlens[b] + i; the batch layout
[B, L, H, D] is the packed one with cu_seqlens = [0, L, 2L, ...]. LSE is float32 [H, T]:
lse + h*lse_stride_head + t (not written when lse is 0).

sm90 kernels take a second by-value parameter, `const __grid_constant__ TensorMaps maps`:
three CUtensorMaps (128 bytes each, 64-byte aligned) for Q, K and V, in that order
(tensor_maps(); the manifest lists them per kernel). Each is a 3-D tiled map made with cuTensorMapEncodeTiled over the
tensor seen as packed [T, H, D]: element type the kernel's dtype, dims (D, H, T) innermost
first, byte strides (head stride, token stride) (for H == 1 the head stride is any multiple
of 16; the runtime uses D * 2), box (64, 1, R) with R = 128 tokens, or one patch row for a
patch-tiled kernel (the manifest's box), element strides 1, interleave none,
swizzle 128B, L2 promotion 128B, out-of-bounds fill zeros (FLOAT_OOB_FILL_NONE), global
address the tensor's base pointer. The batch layout is the packed one with T = B * L.

The warp-specialised dK/dV kernel (bwd_kv_sm90_ws) takes three by-value parameters: the
descriptor, three maps, then cmc_bwd_args. The maps: Q, then dO (cmc_bwd_args.dout with its
strides, heads_q heads), as above with boxes of R tokens, the tiling's box capped at one
64-row item (KernelSpec.map_box_cap: 64 on a linear tiling, one patch row of PW tokens on a
patch tiling); then dq_accum (cmc_bwd_args.dq_accum, the fp32 workspace [T, heads_q, D],
contiguous): element type FLOAT32, dims (D, heads_q, T), byte strides (4 D, 4 heads_q D), box
(32, 1, R) (F32_MAP_COLS = 32: 128 bytes of columns, the swizzle's limit), the same swizzle,
promotion and fill. The kernel loads an item's Q and dO rows and adds its dQ partial as boxes
of R consecutive tokens (64 / R boxes per item) where they are, by TMA.

Kernel grid: the manifest's per-kernel rule (cmc/kernels.py). Portable kernel: (ceil(max_len / block_m),
heads_q, batch). sm90 kernel (persistent-capable): (min(units, max_ctas), 1, 1) with units =
ceil(ceil(max_len / block_m) / 2) * heads_q * batch pairs of query tiles, any max_ctas >= 1
(the launcher's choice: cmc.kernels.persistent_ctas). Block: (threads, 1, 1).
An sm90 kernel's CTAs take their next work units from the work counter at desc.sched, so a
persistent grid balances unequal units; the last CTA to finish resets the counter to zero,
so one counter serves every launch on one stream (two launches in flight at once must not
share one). With sched = 0 they stride statically (CTA c: units c, c + grid, ...).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kernels import spec

if TYPE_CHECKING:  # the runtime imports this module: no compiler module at run time
    from .ir import Mask

# The manifest's format (cmc/package.py writes it, cmc/runtime/manifest.py reads it).
SCHEMA_VERSION = 7  # 7: dq_accum's workspace names its layout (token or block64; DQ_LAYOUTS); 6: the dsum workspace holds the LSE offsets too ([2, heads_q, T]); 5: kernels for short sequences (below_len); 4: params carry their declared range, kernels their pass, role, params; the backward section

CTYPES = {
    "uint64_t": (8, "Q"),
    "int64_t": (8, "q"),
    "int32_t": (4, "i"),
    "float": (4, "f"),
}

# (name, C type, meaning) of the fixed part, in order.
HEADER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("q", "uint64_t", "device pointer to Q, dtype elements"),
    ("k", "uint64_t", "device pointer to K"),
    ("v", "uint64_t", "device pointer to V"),
    ("o", "uint64_t", "device pointer to O (written)"),
    ("lse", "uint64_t", "device pointer to float32 LSE [H, T] (written), or 0"),
    ("cu_seqlens", "uint64_t", "device pointer to int32[batch+1] token offsets"),
    ("sched", "uint64_t", "sm90: device pointer to a zeroed uint32[2] work counter, one per "
     "stream (the kernel leaves it zero), or 0 for a static schedule; portable: unused"),
    ("q_stride_tok", "int64_t", "elements between tokens of Q"),
    ("q_stride_head", "int64_t", "elements between heads of Q"),
    ("k_stride_tok", "int64_t", ""),
    ("k_stride_head", "int64_t", ""),
    ("v_stride_tok", "int64_t", ""),
    ("v_stride_head", "int64_t", ""),
    ("o_stride_tok", "int64_t", ""),
    ("o_stride_head", "int64_t", ""),
    ("lse_stride_head", "int64_t", "elements between heads of LSE (= T)"),
    ("batch", "int32_t", "number of sequences"),
    ("heads_q", "int32_t", "query heads"),
    ("heads_kv", "int32_t", "key/value heads; heads_q % heads_kv == 0"),
    ("max_len", "int32_t", "longest sequence (sets grid.x)"),
    ("scale_log2", "float", "softmax scale times log2(e)"),
)

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
TENSOR_MAP_BOX = (64, 1, 128)  # head-dim elements, heads, tokens (innermost first)
# Tokens per box: 128 for linear tiles; a patch tiling loads a tile as boxes of one patch
# row (cmc.ir.Tiling.box_rows).
TENSOR_MAP_BOX_ROWS = (8, 16, 32, 64, 128)
TENSOR_MAP_SWIZZLE = "128B"
# dq_accum's layouts (the manifest's backward.workspace.dq_accum.layout; attn_bwd_portable.cuh
# CMC_DQ_BLOCK64, dq_acc_at): "token", fp32 [T, heads_q, D]; "block64", 64-row blocks, each
# sequence's rows starting a block (sequence b's from (tok0 + 64 b) / 64 on), block-major then
# head, each [64 x 64] column half in the sm90 wgmma accumulator order, so that the ws kv adds a
# warpgroup's dQ partial of an item as one 16 KiB bulk copy (FA3 / FA4's dQaccum). Their shapes
# and byte rules over T, batch, heads_q and head_dim:
DQ_LAYOUTS = {
    "token": (("T", "heads_q", "head_dim"), "4 * T * heads_q * head_dim"),
    "block64": (("ceil_div(T, 64) + batch", "heads_q", "64", "head_dim"),
                "256 * (ceil_div(T, 64) + batch) * heads_q * head_dim"),
}


def dq_accum_bytes(layout: str, tokens: int, batch: int, heads_q: int, head_dim: int) -> int:
    """What the kernels write of dq_accum in `layout`: the floor the runtime holds a manifest's
    rule to."""
    if layout == "block64":
        return 256 * (-(-tokens // 64) + batch) * heads_q * head_dim
    return 4 * tokens * heads_q * head_dim


# Maps of fp32 tensors (the rest are of the kernel's 16-bit dtype) and their box's columns.
F32_MAP_TENSORS = ("dq_accum",)
F32_MAP_COLS = 32


def map_box(tensor: str, box_rows: int) -> tuple[int, int, int]:
    """The box of `tensor`'s map: (64, 1, box_rows) for the 16-bit tensors, (F32_MAP_COLS,
    1, box_rows) for an fp32 one: 128 bytes of columns either way."""
    return (F32_MAP_COLS if tensor in F32_MAP_TENSORS else 64, 1, box_rows)


@dataclass(frozen=True)
class TensorMapSpec:
    """One tensor map of a kernel's second parameter (see the module docstring)."""

    tensor: str  # "q" | "k" | "v" | "do" (the backward's dO) | "dq_accum" (fp32)
    box: tuple[int, int, int] = TENSOR_MAP_BOX
    swizzle: str = TENSOR_MAP_SWIZZLE


def tensor_maps(kernel: str, box_rows: int = 128) -> tuple[TensorMapSpec, ...]:
    """The tensor maps a kernel takes after its descriptor (its spec's, e.g. sm90 Q, K, V),
    boxes of `box_rows` tokens (the tiling's), at most the spec's map_box_cap."""
    s = spec(kernel)
    tensors = s.tensor_maps
    if not tensors:
        return ()
    box_rows = min(box_rows, s.map_box_cap or box_rows)
    if box_rows not in TENSOR_MAP_BOX_ROWS:
        raise ValueError(f"tensor map box of {box_rows} tokens (supported: {TENSOR_MAP_BOX_ROWS})")
    return tuple(TensorMapSpec(t, map_box(t, box_rows)) for t in tensors)


# sm_90 places the parameter block at byte 0x210 of constant bank 0, and alignment is of the
# absolute address: the maps start at the first 64-byte boundary after the descriptor.
PARAM_CBANK_BASE = 0x210


def tensor_maps_offset(desc_size: int) -> int:
    """Offset of the first map in the parameter block (launches through kernelParams do
    not need it; the driver places each parameter itself)."""
    end = PARAM_CBANK_BASE + desc_size
    return -(-end // TENSOR_MAP_ALIGN) * TENSOR_MAP_ALIGN - PARAM_CBANK_BASE


def param_bytes(desc_size: int, n_maps: int, bwd_args: bool = False) -> int:
    """Bytes of the kernel's parameter block: the descriptor, then the maps (if any, at
    tensor_maps_offset), then the backward's cmc_bwd_args (if any, 8-byte aligned)."""
    end = tensor_maps_offset(desc_size) + TENSOR_MAP_BYTES * n_maps if n_maps else desc_size
    if bwd_args:
        return (end + BWD_ARGS_ALIGN - 1) // BWD_ARGS_ALIGN * BWD_ARGS_ALIGN + BWD_ARGS_SIZE
    return end


def kernel_param_bytes(desc_size: int, kernel: str) -> int:
    """param_bytes of a kind, from its launch parameters (kernels.KernelSpec.params)."""
    s = spec(kernel)
    return param_bytes(desc_size, len(tensor_maps(kernel)), "bwd_args" in s.params)


# The backward's second launch parameter, `struct cmc_bwd_args` of
# templates/cmc/attn_bwd_portable.cuh (the same for every mask): gradient outputs, the fp32
# workspaces and their strides. docs/architecture.md, "The backward"; emit and the header assert it.
BWD_ARGS_STRUCT = "cmc_bwd_args"
BWD_ARGS_FIELDS: tuple[tuple[str, str], ...] = (
    ("dout", "uint64_t"), ("dq", "uint64_t"), ("dk", "uint64_t"), ("dv", "uint64_t"),
    ("dq_accum", "uint64_t"), ("dsum", "uint64_t"),
    ("dout_stride_tok", "int64_t"), ("dout_stride_head", "int64_t"),
    ("dq_stride_tok", "int64_t"), ("dq_stride_head", "int64_t"),
    ("dk_stride_tok", "int64_t"), ("dk_stride_head", "int64_t"),
    ("dv_stride_tok", "int64_t"), ("dv_stride_head", "int64_t"),
    ("total_tokens", "int32_t"), ("flags", "int32_t"),
)
BWD_ARGS_ALIGN = 8
BWD_ARGS_SIZE = 120
BWD_FLAG_DETERMINISTIC = 1
BWD_FLAG_KV_HEAVY = 2  # the ws kv's heavy key tiles first (manifest backward.kv_order)


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str
    offset: int
    size: int
    param: str | None = None  # the mask parameter it carries, if any
    role: str = ""  # "value" | "per_sequence" | "segment_offsets" | "segment_starts" | header doc


@dataclass(frozen=True)
class DescriptorLayout:
    struct_name: str
    fields: tuple[Field, ...]
    size: int
    align: int

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def pack(self, values: dict[str, int | float]) -> bytes:
        """Pack values by field name; missing fields are a programming error (KeyError)."""
        buf = bytearray(self.size)
        for f in self.fields:
            struct.pack_into("<" + CTYPES[f.ctype][1], buf, f.offset, values[f.name])
        return bytes(buf)

    def c_struct(self) -> str:
        lines = [f"struct {self.struct_name} {{"]
        for f in self.fields:
            lines.append(f"  {f.ctype} {f.name};")
        lines.append("};")
        return "\n".join(lines)


def bwd_args_layout() -> DescriptorLayout:
    """cmc_bwd_args as a layout (natural alignment, the order above): 120 bytes, align 8."""
    fields, off = [], 0
    for name, ctype in BWD_ARGS_FIELDS:
        size = CTYPES[ctype][0]
        off = (off + size - 1) // size * size
        fields.append(Field(name, ctype, off, size))
        off += size
    total = (off + BWD_ARGS_ALIGN - 1) // BWD_ARGS_ALIGN * BWD_ARGS_ALIGN
    assert total == BWD_ARGS_SIZE, total
    return DescriptorLayout(BWD_ARGS_STRUCT, tuple(fields), total, BWD_ARGS_ALIGN)


def check_identifier(name: str) -> str:
    """Names reach generated C only through here (the checker already enforces this)."""
    if not _IDENT.match(name):
        raise ValueError(f"not a safe identifier: {name!r}")
    return name


def param_fields(params: Sequence[tuple[str, str]]) -> list[tuple[str, str, str | None, str]]:
    """(field, C type, parameter, role) of each declared (name, kind) parameter."""
    out: list[tuple[str, str, str | None, str]] = []
    for name, kind in params:
        n = check_identifier(name)
        if kind == "scalar":
            out.append((f"p_{n}", "int32_t", name, "value"))
        elif kind == "batch":
            out.append((f"p_{n}", "uint64_t", name, "per_sequence"))
        else:
            out.append((f"p_{n}_offsets", "uint64_t", name, "segment_offsets"))
            out.append((f"p_{n}_starts", "uint64_t", name, "segment_starts"))
    return out


def descriptor_layout(mask: Mask) -> DescriptorLayout:
    """The checked mask's descriptor (descriptor_layout_of its name and parameters)."""
    return descriptor_layout_of(mask.name, [(p.name, p.kind) for p in mask.params])


def descriptor_layout_of(mask_name: str, params: Sequence[tuple[str, str]]) -> DescriptorLayout:
    """Natural alignment, declaration order: header fields, then one or two per parameter.
    scalar int  -> int32_t p_NAME
    int[batch]  -> uint64_t p_NAME            (device int32[batch])
    segments    -> uint64_t p_NAME_offsets    (device int32[batch+1], into starts)
                   uint64_t p_NAME_starts     (device int32[], sorted within each sequence,
                                               positions relative to the sequence start)
    """
    entries = [(n, t, None, doc) for n, t, doc in HEADER_FIELDS] + param_fields(params)
    fields: list[Field] = []
    off = 0
    align = 1
    for name, ctype, param, role in entries:
        size = CTYPES[ctype][0]
        off = (off + size - 1) // size * size
        fields.append(Field(name, ctype, off, size, param, role))
        off += size
        align = max(align, size)
    total = (off + align - 1) // align * align
    return DescriptorLayout(f"cmc_{check_identifier(mask_name)}_desc", tuple(fields), total,
                            align)
