"""The system-call filter every sandboxed child runs under (a classic-BPF seccomp program for bubblewrap).

bubblewrap's namespaces close most of what one user shares between processes; a few kernel objects
are not behind any namespace bubblewrap unshares, or can be reached again from inside one. The filter
fails those calls with EPERM, as a default container profile does:

- the **kernel keyring** (``add_key``, ``keyctl``, ``request_key``): a marker kept there by one trial was
  seen by every later trial, the confirmation and the other side (red team, round 3);
- new namespaces and joining others (``unshare``, ``setns``, ``clone`` with a namespace flag, ``clone3``,
  which answers ENOSYS so that the C library falls back to the filtered ``clone``): a side stays in the
  namespaces its sandbox gave it — a time namespace included;
- mounts of every kind (``mount``, ``umount2``, ``pivot_root``, the new mount API), file handles that
  reach outside the mounted tree (``open_by_handle_at``, ``name_to_handle_at``);
- the shared page cache (``cachestat``, ``mincore``, ``fadvise64`` DONTNEED/NOREUSE, ``madvise`` PAGEOUT/COLD,
  ``preadv2``/``pwritev2`` with RWF_NOWAIT, ``process_madvise``): no side can see or evict what is resident;
- other processes' memory and kernel-wide state (``ptrace``, ``process_vm_readv/writev``, ``kcmp``,
  ``perf_event_open``, ``bpf``, ``userfaultfd``, ``io_uring_*``, ``fanotify_init``), and what only an
  administrator does (modules, kexec, reboot, swap, quotas, accounting, clocks, ``syslog``, ``vhangup``).

Any call from a foreign ABI (i386 through ``int 0x80``, x32) is refused as a whole: the numbers above
would not match there. Architectures without a table here get no sandbox (``program()`` raises), and
the gate holds their proposals for review: fail closed.
"""

from __future__ import annotations

import atexit
import errno
import functools
import os
import platform
import struct
import tempfile

# the calls refused with EPERM, by name; the numbers per architecture are below
DENIED = (
    "add_key",
    "request_key",
    "keyctl",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "name_to_handle_at",
    "open_by_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "quotactl",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "lookup_dcookie",
    "syslog",
    "vhangup",
    "ioperm",
    "iopl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    # the page cache is shared by every process of the machine: what is resident must not be readable or
    # evictable from a side (red team, round 3: a bit kept in whether a system file's page was cached)
    "cachestat",
    "mincore",
    "process_madvise",
)
POSIX_FADV_DONTNEED, POSIX_FADV_NOREUSE = 4, 5
MADV_COLD, MADV_PAGEOUT = 20, 21
RWF_NOWAIT = 0x8
# calls refused only for some arguments: (name, argument index, "eq" value | "set" bits)
ARG_RULES = (
    ("fadvise64", 3, "eq", POSIX_FADV_DONTNEED),  # evicts a file's pages from the shared cache
    ("fadvise64", 3, "eq", POSIX_FADV_NOREUSE),
    ("madvise", 2, "eq", MADV_PAGEOUT),  # reclaims a mapped file's pages
    ("madvise", 2, "eq", MADV_COLD),
    ("preadv2", 5, "set", RWF_NOWAIT),  # a read that fails when the page is not cached: a cache probe
    ("pwritev2", 5, "set", RWF_NOWAIT),
)
# from the kernel's uapi headers (asm/unistd_64.h; asm-generic/unistd.h for arm64); None: no such call there
_NUMBERS: dict[str, dict[str, int | None]] = {
    "x86_64": {
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "move_mount": 429,
        "open_tree": 428,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "perf_event_open": 298,
        "bpf": 321,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "fanotify_init": 300,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "quotactl": 179,
        "acct": 163,
        "settimeofday": 164,
        "clock_settime": 227,
        "clock_adjtime": 305,
        "lookup_dcookie": 212,
        "syslog": 103,
        "vhangup": 153,
        "ioperm": 173,
        "iopl": 172,
        "uselib": 134,
        "ustat": 136,
        "sysfs": 139,
        "_sysctl": 156,
        "clone": 56,
        "clone3": 435,
        "cachestat": 451,
        "mincore": 27,
        "process_madvise": 440,
        "fadvise64": 221,
        "preadv2": 327,
        "pwritev2": 328,
        "madvise": 28,
    },
    "aarch64": {
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "move_mount": 429,
        "open_tree": 428,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "perf_event_open": 241,
        "bpf": 280,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "fanotify_init": 262,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "quotactl": 60,
        "acct": 89,
        "settimeofday": 170,
        "clock_settime": 112,
        "clock_adjtime": 266,
        "lookup_dcookie": 18,
        "syslog": 116,
        "vhangup": 58,
        "ioperm": None,
        "iopl": None,
        "uselib": None,
        "ustat": None,
        "sysfs": None,
        "_sysctl": None,
        "clone": 220,
        "clone3": 435,
        "cachestat": 451,
        "mincore": 232,
        "process_madvise": 440,
        "fadvise64": 223,
        "preadv2": 286,
        "pwritev2": 287,
        "madvise": 233,
    },
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# clone flags that make a namespace (CLONE_NEWTIME exists only for unshare/clone3, both refused)
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_NR, _ARCH, _ARG0_LO = 0, 4, 16  # offsets in struct seccomp_data (little-endian: the low half of args[0] first)


class UnsupportedArchitecture(RuntimeError):
    """No system-call table for this machine: nothing can be filtered, so nothing is sandboxed."""


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def program(arch: str | None = None) -> bytes:
    """The filter for ``arch`` (default: this machine) as bytes of ``struct sock_filter``."""
    arch = arch or machine()
    if arch not in _NUMBERS:
        raise UnsupportedArchitecture(
            f"no seccomp table for the {arch} architecture (known: {', '.join(sorted(_NUMBERS))})"
        )
    nrs = _NUMBERS[arch]
    denied = sorted({n for name in DENIED if (n := nrs[name]) is not None})
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved to relative offsets below
    ins: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ_K, None, "foreign", _AUDIT_ARCH[arch]),
        (_LD_W_ABS, None, None, _NR),
    ]
    if arch == "x86_64":
        ins.append((_JGE_K, "foreign", None, X32_SYSCALL_BIT))
    ins += [(_JEQ_K, "eperm", None, nr) for nr in denied]
    ins += [(_JEQ_K, "enosys", None, nrs["clone3"] or 0), (_JEQ_K, "clone", None, nrs["clone"] or 0)]
    by_call: dict[str, list[tuple[int, str, int]]] = {}
    for name, arg, op, value in ARG_RULES:
        by_call.setdefault(name, []).append((arg, op, value))
    ins += [(_JEQ_K, f"args:{name}", None, nrs[name] or 0) for name in by_call]
    ins.append((_RET_K, None, None, _RET_ALLOW))
    labels = {"clone": len(ins)}
    ins += [
        (_LD_W_ABS, None, None, _ARG0_LO),
        (_JSET_K, "eperm", None, CLONE_NS_FLAGS),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    for name, rules in by_call.items():  # the low 32 bits of the argument (little-endian seccomp_data)
        labels[f"args:{name}"] = len(ins)
        for arg, op, value in rules:
            ins += [
                (_LD_W_ABS, None, None, _ARG0_LO + 8 * arg),
                (_JEQ_K if op == "eq" else _JSET_K, "eperm", None, value),
            ]
        ins.append((_RET_K, None, None, _RET_ALLOW))
    labels["eperm"] = len(ins)
    ins.append((_RET_K, None, None, eperm))
    labels["enosys"] = labels["foreign"] = len(ins)
    ins.append((_RET_K, None, None, enosys))
    out = b""
    for i, (code, jt, jf, k) in enumerate(ins):
        t = labels[jt] - i - 1 if jt else 0
        f = labels[jf] - i - 1 if jf else 0
        assert 0 <= t < 256 and 0 <= f < 256, "a BPF jump is 8 bits"
        out += struct.pack("<HBBI", code, t, f, k)
    return out


@functools.cache
def _filter_file(pid: int) -> str:
    fd, path = tempfile.mkstemp(prefix="agentsearch-seccomp-", suffix=".bpf")
    with os.fdopen(fd, "wb") as fh:
        fh.write(program())
    os.chmod(path, 0o444)
    atexit.register(_unlink, path, pid)  # one file per process, gone with it (they piled up in /tmp)
    return path


def _unlink(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the registration
        try:
            os.unlink(path)
        except OSError:
            pass


def filter_file() -> str:
    """A file holding this machine's filter (written once per process, read-only)."""
    path = _filter_file(os.getpid())
    if not os.path.isfile(path):  # removed by a /tmp cleaner: write it again
        _filter_file.cache_clear()
        path = _filter_file(os.getpid())
    return path


def launcher(bwrap_argv: list[str], fd: int = 9) -> list[str]:
    """``bwrap_argv`` (which names ``--seccomp FD``) started with the filter open on ``fd``: a shell opens the
    file and execs bubblewrap in its place (same pid), so the callers' Popen needs no extra descriptor."""
    return ["/bin/sh", "-c", f'exec {fd}<"$0" && exec "$@"', filter_file(), *bwrap_argv]
