"""A small reader for NVIDIA cubins (ELF64): target arch and per-kernel resources.

build reads resources from the cubin itself, not from compiler chatter, and inspect and the
runtime confirm a cubin's arch from its bytes before trusting a manifest. Layout facts used
here (checked against ptxas -v and readelf on NVRTC 13.0 output, see tests/test_build.py):

- ELF header: e_machine == 190 (EM_CUDA); e_ident[EI_OSABI] == 0x41 with ABI version 8 puts
  the SM number in e_flags bits 8..15 (older toolchains, ABI version 7: bits 0..7).
- The arch-specific suffix ("a" in sm_90a) is not in e_flags: sm_90 and sm_90a give the same
  word. It is attribute 9 of `.nv.compat` (EICOMPAT_ATTR_ISA_CLASS): 1 for an "a" target,
  0 for the baseline and family ("f") targets.
- `.nv.info` (whole image) holds records keyed by symbol index: EIATTR_REGCOUNT,
  EIATTR_FRAME_SIZE (per-thread stack frame: local arrays and spills), EIATTR_MIN_STACK_SIZE,
  EIATTR_MAX_STACK_SIZE. `.nv.info.<kernel>` holds per-kernel records: EIATTR_CBANK_PARAM_SIZE
  (bytes of kernel parameters), EIATTR_MAX_THREADS (__launch_bounds__), EIATTR_NUM_BARRIERS,
  EIATTR_MAXREG_COUNT.
- `.nv.shared.<kernel>` (NOBITS) sizes the kernel's shared window. From sm_90 on, ptxas puts
  the 1 KiB the driver reserves per block at its start (the image has a
  `.nv.shared.reserved.0` section), so the kernel's own static shared memory is the section
  size minus that 1 KiB.
- Spill counts are not in the image; build takes them from the ptxas -v log
  (`parse_ptxas_log`).

This module imports nothing from cmc but errors, so the runtime's load reads the cubins it
is about to launch with it (tests/test_structure.py allows it): the launch bounds and the
parameter block are checked against the manifest before any GPU is touched.

Every record is 4-byte aligned: format byte, attribute byte, then a 16-bit value
(EIFMT_HVAL, EIFMT_BVAL in its low byte, EIFMT_NVAL unused) or a 16-bit size followed by
that many bytes (EIFMT_SVAL).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from .errors import ArtifactError

EM_CUDA = 190
ELFOSABI_CUDA = 0x41
SHT_NOBITS = 8
SHT_SYMTAB = 2

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2F
EIATTR_CUDA_API_VERSION = 0x37
EIATTR_NUM_BARRIERS = 0x4C
EICOMPAT_ATTR_ISA_CLASS = 0x09

# Shared memory the driver reserves per block on sm_90 and later, laid out by ptxas at the
# start of each kernel's .nv.shared section (cudaDevAttrReservedSharedMemoryPerBlock).
RESERVED_SMEM_SM90 = 1024


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


@dataclass(frozen=True)
class Symbol:
    name: str
    info: int
    shndx: int
    value: int
    size: int

    @property
    def is_function(self) -> bool:
        return self.info & 0xF == 2  # STT_FUNC


@dataclass(frozen=True)
class KernelInfo:
    """What the image says about one entry point."""

    name: str
    registers: int
    frame_size: int  # bytes of per-thread local memory (stack frame, spills included)
    min_stack_size: int
    max_stack_size: int
    shared_static: int  # the kernel's own static shared bytes (reserved 1 KiB removed)
    shared_section: int  # raw .nv.shared.<kernel> size
    param_bytes: int  # EIATTR_CBANK_PARAM_SIZE: size of the kernel's parameter block
    max_threads: tuple[int, int, int] | None  # from __launch_bounds__, if any
    barriers: int
    maxreg: int | None


@dataclass(frozen=True)
class Cubin:
    sm: int  # 90 for sm_90 and sm_90a
    arch_specific: bool  # an "a" target
    abi_version: int
    toolkit: str  # e.g. "13.0.88", from .note.nv.tkinfo ("" if absent)
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    kernels: dict[str, KernelInfo]

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}{'a' if self.arch_specific else ''}"

    def kernel(self, name: str) -> KernelInfo:
        try:
            return self.kernels[name]
        except KeyError:
            have = ", ".join(sorted(self.kernels)) or "none"
            raise ArtifactError(f"cubin has no kernel {name!r} (kernels: {have})") from None


def _bad(msg: str) -> ArtifactError:
    return ArtifactError(f"not a valid cubin: {msg}")


def _unpack(fmt: str, data: bytes, off: int) -> tuple[int, ...]:
    if off < 0 or off + struct.calcsize(fmt) > len(data):
        raise _bad(f"truncated at byte {off}")
    return struct.unpack_from(fmt, data, off)


def _cstr(table: bytes, off: int) -> str:
    if off >= len(table):
        raise _bad("string offset out of range")
    end = table.find(b"\0", off)
    return table[off : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _records(data: bytes) -> list[tuple[int, int, bytes]]:
    """(format, attribute, payload) for each record of an .nv.info or .nv.compat section."""
    out = []
    off = 0
    while off + 4 <= len(data):
        fmt, attr, val = struct.unpack_from("<BBH", data, off)
        off += 4
        if fmt == EIFMT_SVAL:
            if off + val > len(data):
                raise _bad("attribute record runs past its section")
            out.append((fmt, attr, data[off : off + val]))
            off += val
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            out.append((fmt, attr, struct.pack("<H", val)))
        else:
            raise _bad(f"unknown attribute format {fmt}")
    return out


def _u32s(payload: bytes) -> tuple[int, ...]:
    return struct.unpack_from(f"<{len(payload) // 4}I", payload)


def _scalar(payload: bytes) -> int:
    return int.from_bytes(payload[:4], "little")


_TKINFO_VERSION = re.compile(rb"V(\d+\.\d+\.\d+)")


def read_cubin(data: bytes) -> Cubin:
    """Parse a cubin; raise ArtifactError for anything that is not a well-formed CUDA ELF."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise _bad("no ELF magic")
    if data[4] != 2 or data[5] != 1:
        raise _bad("not a 64-bit little-endian ELF")
    osabi, abiver = data[7], data[8]
    (e_machine,) = _unpack("<H", data, 18)
    if e_machine != EM_CUDA:
        raise _bad(f"e_machine is {e_machine}, not EM_CUDA ({EM_CUDA})")
    (e_flags,) = _unpack("<I", data, 48)
    (e_shoff,) = _unpack("<Q", data, 40)
    e_shentsize, e_shnum, e_shstrndx = _unpack("<HHH", data, 58)
    if e_shentsize != 64 or e_shnum == 0 or e_shstrndx >= e_shnum:
        raise _bad("bad section header table")
    sm = (e_flags >> 8) & 0xFF if osabi == ELFOSABI_CUDA and abiver >= 8 else e_flags & 0xFF

    raw = []
    for i in range(e_shnum):
        name, typ, _flags, _addr, off, size, link, info, _align, _ent = _unpack(
            "<IIQQQQIIQQ", data, e_shoff + 64 * i
        )
        if typ != SHT_NOBITS and off + size > len(data):
            raise _bad(f"section {i} runs past the end of the file")
        raw.append((name, typ, off, size, link, info))
    _, _, stroff, strsize, _, _ = raw[e_shstrndx]
    shstr = data[stroff : stroff + strsize]
    sections = tuple(Section(_cstr(shstr, n), t, o, s, lk, inf) for n, t, o, s, lk, inf in raw)

    def body(sec: Section) -> bytes:
        return b"" if sec.type == SHT_NOBITS else data[sec.offset : sec.offset + sec.size]

    symbols: list[Symbol] = []
    for sec in sections:
        if sec.type == SHT_SYMTAB:
            if sec.link >= len(sections):
                raise _bad("symbol table links to no string table")
            strtab = body(sections[sec.link])
            blob = body(sec)
            for j in range(len(blob) // 24):
                st_name, st_info, _other, shndx, value, size = struct.unpack_from(
                    "<IBBHQQ", blob, 24 * j
                )
                symbols.append(Symbol(_cstr(strtab, st_name), st_info, shndx, value, size))
            break
    by_name = {s.name: s for s in sections}

    # Whole-image attributes, keyed by symbol index.
    per_sym: dict[int, dict[int, int]] = {}
    if ".nv.info" in by_name:
        for fmt, attr, payload in _records(body(by_name[".nv.info"])):
            if fmt == EIFMT_SVAL and len(payload) >= 8:
                idx, val = _u32s(payload[:8])
                per_sym.setdefault(idx, {})[attr] = val

    arch_specific = False
    if ".nv.compat" in by_name:
        for _fmt, attr, payload in _records(body(by_name[".nv.compat"])):
            if attr == EICOMPAT_ATTR_ISA_CLASS:
                arch_specific = payload[0] == 1

    toolkit = ""
    if ".note.nv.tkinfo" in by_name:
        m = _TKINFO_VERSION.search(body(by_name[".note.nv.tkinfo"]))
        toolkit = m.group(1).decode() if m else ""

    reserved = RESERVED_SMEM_SM90 if ".nv.shared.reserved.0" in by_name else 0
    kernels: dict[str, KernelInfo] = {}
    for idx, sym in enumerate(symbols):
        if not sym.is_function or (sym.info >> 4) != 1:  # global functions only
            continue
        if f".text.{sym.name}" not in by_name:
            continue
        g = per_sym.get(idx, {})
        local: dict[int, bytes] = {}
        info_sec = by_name.get(f".nv.info.{sym.name}")
        if info_sec is not None:
            for _fmt, attr, payload in _records(body(info_sec)):
                local[attr] = payload
        shared_sec = by_name.get(f".nv.shared.{sym.name}")
        shared_raw = shared_sec.size if shared_sec else 0
        mt = local.get(EIATTR_MAX_THREADS)
        max_threads = _u32s(mt)[:3] if mt is not None and len(mt) >= 12 else None
        maxreg = local.get(EIATTR_MAXREG_COUNT)
        kernels[sym.name] = KernelInfo(
            name=sym.name,
            registers=g.get(EIATTR_REGCOUNT, 0),
            frame_size=g.get(EIATTR_FRAME_SIZE, 0),
            min_stack_size=g.get(EIATTR_MIN_STACK_SIZE, 0),
            max_stack_size=g.get(EIATTR_MAX_STACK_SIZE, 0),
            shared_static=max(0, shared_raw - reserved) if shared_raw else 0,
            shared_section=shared_raw,
            param_bytes=_scalar(local[EIATTR_CBANK_PARAM_SIZE]) & 0xFFFF
            if EIATTR_CBANK_PARAM_SIZE in local
            else 0,
            max_threads=(max_threads[0], max_threads[1], max_threads[2]) if max_threads else None,
            barriers=local[EIATTR_NUM_BARRIERS][0] if EIATTR_NUM_BARRIERS in local else 0,
            maxreg=_scalar(maxreg) & 0xFFFF if maxreg is not None else None,
        )
    return Cubin(
        sm=sm,
        arch_specific=arch_specific,
        abi_version=abiver,
        toolkit=toolkit,
        sections=sections,
        symbols=tuple(symbols),
        kernels=kernels,
    )


@dataclass(frozen=True)
class PtxasFunction:
    """One `Function properties` block of a ptxas -v log."""

    name: str
    arch: str
    stack_frame: int
    spill_stores: int
    spill_loads: int
    registers: int
    shared: int


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


# ptxas notes that it gave up the asynchronous wgmma pipeline (C7515, C7520: every wgmma waits
# for the one before) or injected a warpgroup.arrive / wait of its own (C7517, C7519: a wait
# at a place the kernel did not choose). The kernel then still computes the right result.
_WGMMA_NOTE = re.compile(r"\((C751[0-9]|C752[0-9])\)\s*(.*)")


def wgmma_pipeline_notes(log: str) -> list[str]:
    """ptxas's notes that a kernel's wgmma pipeline is not what its source asked for."""
    return [f"{m.group(1)}: {m.group(2).strip()}" for m in map(_WGMMA_NOTE.search, log.splitlines())
            if m]


def parse_ptxas_log(log: str) -> dict[str, PtxasFunction]:
    """Per-entry facts from `--ptxas-options=-v` output (spills live only here)."""
    out: dict[str, PtxasFunction] = {}
    name = arch = ""
    props: tuple[int, int, int] | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name, arch, props = m.group(1), m.group(2), None
        elif (m := _PROPS.search(line)) and name:
            props = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name:
            s = _SMEM.search(line)
            frame, st, ld = props or (0, 0, 0)
            out[name] = PtxasFunction(
                name, arch, frame, st, ld, int(m.group(1)), int(s.group(1)) if s else 0
            )
            name = ""
    return out
