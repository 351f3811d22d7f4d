"""A seccomp filter that refuses Unix domain sockets, for sessions started without a network.

A new network namespace cuts off every IP address and every abstract Unix socket, but a Unix
socket bound to a path in the filesystem (a database, a Docker daemon, a model server's
socket) is reached through the filesystem, which the namespace does not change. Hiding the
sockets would need a private mount namespace that knows every path that could hold one; a
filter on `socket(AF_UNIX, ...)` covers all of them at once. `socketpair` stays allowed (a
pair connects only to itself; `multiprocessing` and `asyncio` use it), and `io_uring_setup`
is refused because an io_uring can create and connect sockets without the `socket` call.
Syscalls of another ABI (x32, 32-bit) are refused, so that their socket numbers need no rules.

The filter is built here as bytes and installed by the child itself (LIMITS_PRELUDE), which
needs nothing but ctypes.
"""

from __future__ import annotations

import platform
import struct

AF_UNIX = 1
EACCES = 13
# (AUDIT_ARCH_*, socket, io_uring_setup, whether syscall numbers with bit 30 belong to x32)
ARCHES = {
    "x86_64": (0xC000003E, 41, 425, True),
    "aarch64": (0xC00000B7, 198, 425, False),
}

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low word: little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def no_unix_sockets_filter(machine: str | None = None) -> bytes | None:
    """The BPF program as bytes (8 per instruction), or None on an architecture not covered."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr_socket, nr_io_uring_setup, x32 = arch
    deny = _insn(_RET_K, _ERRNO | EACCES)
    allow = _insn(_RET_K, _ALLOW)
    # jump offsets count from the next instruction; DENY is at index 8, ALLOW at 9
    program = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, 0, 6),
        _insn(_LD_W_ABS, _NR),
        _insn(_JGE_K, 0x40000000, 4, 0) if x32 else _insn(_JEQ_K, 0xFFFFFFFF, 4, 0),
        _insn(_JEQ_K, nr_io_uring_setup, 3, 0),
        _insn(_JEQ_K, nr_socket, 0, 3),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JEQ_K, AF_UNIX, 0, 1),
        deny,
        allow,
    ]
    return b"".join(program)
