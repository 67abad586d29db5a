"""Runs a static AArch64 Linux program (musl) in the Unicorn CPU emulator, for checking NEON
code on an x86 machine: loads the ELF segments, builds the initial stack (argv, envp, auxv) and
answers the few system calls a static musl program makes (write/writev to stdout and stderr,
exit, memory). Not a general emulator: enough for a test program that computes and prints."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import unicorn as uc
from unicorn import arm64_const as a64

PAGE = 0x1000
STACK_TOP = 0x7FFF_0000_0000
STACK_SIZE = 8 << 20
HEAP = 0x5000_0000_0000
HEAP_SIZE = 256 << 20
ENOSYS, ENOTTY = 38, 25


@dataclass
class Result:
    exit_code: int
    stdout: str
    instructions_limit_hit: bool = False


def _align(n: int, a: int = PAGE) -> int:
    return (n + a - 1) & ~(a - 1)


def run(path: Path, argv: list[str] | None = None, timeout_s: float = 120.0) -> Result:
    elf = Path(path).read_bytes()
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or struct.unpack_from("<H", elf, 18)[0] != 183:
        raise ValueError(f"{path}: not a 64-bit AArch64 ELF")
    entry, phoff = struct.unpack_from("<QQ", elf, 24)
    phentsize, phnum = struct.unpack_from("<HH", elf, 54)
    mu = uc.Uc(uc.UC_ARCH_ARM64, uc.UC_MODE_ARM)
    mu.reg_write(a64.UC_ARM64_REG_CPACR_EL1, 0x300000)  # FP/SIMD on at EL0/EL1
    phdr_addr = 0
    loads = []
    for i in range(phnum):
        p_type, _flags, off, vaddr, _pa, filesz, memsz, _al = struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize)
        if p_type == 6:  # PT_PHDR
            phdr_addr = vaddr
        elif p_type == 1:  # PT_LOAD
            loads.append((off, vaddr, filesz, memsz))
            if off == 0 and not phdr_addr:
                phdr_addr = vaddr + phoff
    pages = sorted({p for _o, v, _f, m in loads for p in range(v & ~(PAGE - 1), _align(v + m), PAGE)})
    for p in pages:  # segments may share a page: map page by page, once
        mu.mem_map(p, PAGE)
    for off, vaddr, filesz, _memsz in loads:
        mu.mem_write(vaddr, elf[off:off + filesz])
    mu.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE)
    mu.mem_map(HEAP, HEAP_SIZE)

    # initial stack: argc, argv..., 0, envp... 0, auxv pairs, AT_NULL; strings above
    args = [str(path), *(argv or [])]
    strings = b""
    offsets = []
    for a in args:
        offsets.append(len(strings))
        strings += a.encode() + b"\0"
    random_at = len(strings)
    strings += bytes(range(16))
    str_base = STACK_TOP - _align(len(strings), 16) - 16
    mu.mem_write(str_base, strings)
    auxv = [(3, phdr_addr), (4, phentsize), (5, phnum), (6, PAGE), (9, entry), (25, str_base + random_at),
            (16, 0), (0, 0)]
    words = [len(args), *(str_base + o for o in offsets), 0, 0]
    for k, v in auxv:
        words += [k, v]
    sp = (str_base - 8 * len(words)) & ~15
    mu.mem_write(sp, struct.pack(f"<{len(words)}Q", *words))
    mu.reg_write(a64.UC_ARM64_REG_SP, sp)

    out = bytearray()
    state = {"brk": HEAP, "mmap": HEAP + HEAP_SIZE // 2, "exit": None}

    def syscall(mu: uc.Uc, _intno: int, _data) -> None:
        nr = mu.reg_read(a64.UC_ARM64_REG_X8)
        x = [mu.reg_read(getattr(a64, f"UC_ARM64_REG_X{i}")) for i in range(6)]
        ret = 0
        if nr == 64:  # write
            out.extend(mu.mem_read(x[1], x[2]))
            ret = x[2]
        elif nr == 66:  # writev
            ret = 0
            for i in range(x[2]):
                base, length = struct.unpack("<QQ", mu.mem_read(x[1] + 16 * i, 16))
                out.extend(mu.mem_read(base, length))
                ret += length
        elif nr in (93, 94):  # exit, exit_group
            state["exit"] = x[0] & 0xFF
            mu.emu_stop()
        elif nr == 96:  # set_tid_address
            ret = 1
        elif nr == 29:  # ioctl (isatty): not a terminal
            ret = -ENOTTY
        elif nr == 214:  # brk
            if HEAP <= x[0] < HEAP + HEAP_SIZE // 2:
                state["brk"] = x[0]
            ret = state["brk"]
        elif nr == 222:  # mmap (anonymous only)
            size = _align(x[1])
            if state["mmap"] + size > HEAP + HEAP_SIZE:
                ret = -12
            else:
                ret, state["mmap"] = state["mmap"], state["mmap"] + size
        elif nr in (215, 226, 135, 134, 261, 233):  # munmap, mprotect, sigprocmask, sigaction, prlimit, madvise
            ret = 0
        else:
            ret = -ENOSYS
        mu.reg_write(a64.UC_ARM64_REG_X0, ret & 0xFFFF_FFFF_FFFF_FFFF)

    mu.hook_add(uc.UC_HOOK_INTR, syscall)
    mu.emu_start(entry, 0, timeout=int(timeout_s * 1_000_000))
    code = state["exit"]
    return Result(exit_code=-1 if code is None else code, stdout=out.decode(errors="replace"),
                  instructions_limit_hit=code is None)
