"""Just enough eBPF to load a cgroup socket-address program and attach it: an assembler for the
few instructions :mod:`.egress` needs, and the ``bpf(2)`` calls, through ``ctypes``.

sandrl ships no compiled BPF object (no clang, no libbpf at run time): the one program it needs is a
chain of compares, assembled here and checked by the kernel's verifier when it loads.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CONNECT4",
    "CONNECT6",
    "SENDMSG4",
    "SENDMSG6",
    "BpfError",
    "Program",
    "attach",
    "load",
]

_SYSCALL_NR = {"x86_64": 321, "aarch64": 280, "arm64": 280}
_PROG_LOAD = 5
_PROG_ATTACH = 8
_PROG_TYPE_CGROUP_SOCK_ADDR = 18
CONNECT4, CONNECT6, SENDMSG4, SENDMSG6 = 10, 11, 14, 15
"""``enum bpf_attach_type``: connect(2) of IPv4 and IPv6 sockets, sendmsg(2) of unconnected UDP ones."""

# struct bpf_sock_addr (uapi/linux/bpf.h): the fields the programs read.
USER_IP4 = 4
USER_IP6 = 8
USER_PORT = 24
GET_NETNS_COOKIE = 122
"""``bpf_get_netns_cookie(ctx)``: the cookie of the socket's network namespace."""

_LOG_SIZE = 1 << 16


class BpfError(OSError):
    """The kernel refused a program (the verifier's log says why) or an attach."""


@dataclass
class Program:
    """A straight-line program with forward jumps to labels; :meth:`code` resolves them."""

    insns: list[tuple[int, int, int, int | str, int]] = field(default_factory=list)
    """(opcode, dst, src, offset or label, imm); an ``lddw`` takes two slots."""
    labels: dict[str, int] = field(default_factory=dict)

    def emit(self, op: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> None:
        self.insns.append((op, dst, src, off, imm))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.insns)  # an lddw's two slots are two entries

    # The instructions, by name.
    def mov(self, dst: int, src: int) -> None:
        self.emit(0xBF, dst, src)  # ALU64 | MOV | X

    def mov_imm(self, dst: int, imm: int) -> None:
        self.emit(0xB7, dst, imm=imm)  # ALU64 | MOV | K

    def mov32(self, dst: int, src: int) -> None:
        self.emit(0xBC, dst, src)  # ALU | MOV | X

    def and32_imm(self, dst: int, imm: int) -> None:
        self.emit(0x54, dst, imm=imm)  # ALU | AND | K

    def load_u32(self, dst: int, src: int, off: int) -> None:
        self.emit(0x61, dst, src, off)  # LDX | MEM | W

    def load_u64_imm(self, dst: int, value: int) -> None:
        self.emit(0x18, dst, imm=value & 0xFFFFFFFF)  # LD | IMM | DW, then the high half
        self.emit(0x00, imm=(value >> 32) & 0xFFFFFFFF)

    def call(self, helper: int) -> None:
        self.emit(0x85, imm=helper)

    def jeq32_imm(self, dst: int, imm: int, to: str) -> None:
        self.emit(0x16, dst, off=to, imm=imm)  # JMP32 | JEQ | K

    def jne32_imm(self, dst: int, imm: int, to: str) -> None:
        self.emit(0x56, dst, off=to, imm=imm)  # JMP32 | JNE | K

    def jne(self, dst: int, src: int, to: str) -> None:
        self.emit(0x5D, dst, src, off=to)  # JMP | JNE | X

    def ja(self, to: str) -> None:
        self.emit(0x05, off=to)  # JMP | JA

    def exit(self) -> None:
        self.emit(0x95)

    def code(self) -> bytes:
        out = bytearray()
        for slot, (op, dst, src, off, imm) in enumerate(self.insns):
            if isinstance(off, str):
                off = self.labels[off] - slot - 1
                if off < 0:
                    raise ValueError("only forward jumps")
            out += struct.pack("<BBhI", op, (src << 4) | dst, off, imm & 0xFFFFFFFF)
        return bytes(out)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise BpfError(0, f"no bpf(2) syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    ret = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr))))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, os.strerror(err))
    return ret


def load(program: Program, attach_type: int, name: str) -> int:
    """Load ``program`` as a cgroup socket-address program for ``attach_type``; its fd."""
    code = program.code()
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    log = ctypes.create_string_buffer(_LOG_SIZE)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<II", attr, 0, _PROG_TYPE_CGROUP_SOCK_ADDR, len(code) // 8)
    struct.pack_into("<QQ", attr, 8, ctypes.addressof(insns), ctypes.addressof(license_))
    struct.pack_into("<IIQ", attr, 24, 1, _LOG_SIZE, ctypes.addressof(log))
    struct.pack_into("<16s", attr, 48, name.encode()[:15])
    struct.pack_into("<I", attr, 68, attach_type)
    try:
        return _bpf(_PROG_LOAD, attr)
    except BpfError as exc:
        detail = log.value.decode(errors="replace").strip().splitlines()[-3:]
        raise BpfError(
            exc.errno or 0, f"the kernel refused the {name} program: {exc.strerror}; {' / '.join(detail)}"
        ) from None


def attach(prog_fd: int, cgroup_dir: Path, attach_type: int) -> None:
    """Attach a loaded program to a cgroup v2 group (it then runs for every process in it and below)."""
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(32)
        struct.pack_into("<IIII", attr, 0, fd, prog_fd, attach_type, 0)
        _bpf(_PROG_ATTACH, attr)
    finally:
        os.close(fd)
