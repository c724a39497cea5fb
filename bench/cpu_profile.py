"""Where a process's CPU goes, the kernel's part included: `perf record -e cpu-clock -g`, sorted into areas.

py-spy (bench/profile.py) sees only Python frames; under 64 KB ledger appends about half of a node's CPU is
kernel time (copies into the page cache, socket copies, fsync), which only a kernel-aware sampler shows.
`cpu-clock` is a software event, so this works on VMs that expose no hardware counters. Each sample's call
chain decides its area: a kernel sample by the system call it is in (a file write by pwrite or write, an
fdatasync, a socket receive or send), a user-space sample by its top symbol (the interpreter, memmove,
crc32c). Needs `perf` (Debian's linux-perf) and the right to profile the process (root, or
kernel.perf_event_paranoid <= 1); `unavailable()` says why not.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_HZ = 499

# Areas, in the order the report lists them.
JOURNAL_WRITE = "kernel: file writes by pwrite (the bookie journal; the Zab txn log)"
ENTRY_LOG_WRITE = "kernel: file writes by write (bookie entry logs)"
FSYNC = "kernel: fdatasync / fsync"
SOCKET_RECEIVE = "kernel: socket receives"
SOCKET_SEND = "kernel: socket sends"
KERNEL_OTHER = "kernel: other (scheduling, epoll, futexes, interrupts, page faults)"
INTERPRETER = "user: the Python interpreter and objects (libpython)"
MEMMOVE = "user: memmove / memcpy (copies of buffers in Python)"
CRC = "user: crc32c"
USER_OTHER = "user: other"
AREAS = (JOURNAL_WRITE, ENTRY_LOG_WRITE, FSYNC, SOCKET_RECEIVE, SOCKET_SEND, KERNEL_OTHER, INTERPRETER, MEMMOVE,
         CRC, USER_OTHER)


@dataclass
class CpuProfile:
    what: str  # e.g. "node 1 under E=Qw=Qa=3 64 KB appends"
    seconds: float
    samples: int = 0
    areas: Counter[str] = field(default_factory=Counter)
    top: Counter[str] = field(default_factory=Counter)  # top-of-stack symbol -> samples

    def share(self, count: int) -> float:
        return 100.0 * count / self.samples if self.samples else 0.0


def unavailable() -> str | None:
    """None if `perf record -e cpu-clock` works here, else why not."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: apt-get install linux-perf)"
    try:
        done = subprocess.run(["perf", "record", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"perf record failed: {err}"
    if done.returncode != 0:
        return f"perf record failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def record(pid: int, seconds: float, out: Path) -> subprocess.CompletedProcess[str]:
    """Sample `pid` (all its threads, kernel and user stacks) for `seconds`; blocks meanwhile."""
    return subprocess.run(["perf", "record", "-e", "cpu-clock", "-F", str(SAMPLE_HZ), "-g", "-p", str(pid),
                           "-o", str(out), "--", "sleep", f"{seconds:g}"],
                          capture_output=True, text=True, timeout=seconds + 60)


def read(out: Path, what: str, seconds: float) -> CpuProfile:
    """Sort the samples of a `record` file into areas."""
    text = subprocess.run(["perf", "script", "-i", str(out), "-F", "ip,sym,dso"], capture_output=True, text=True,
                          timeout=300, check=True).stdout
    profile = CpuProfile(what, seconds)
    for block in text.split("\n\n"):
        frames = [_frame(line) for line in block.strip().splitlines() if line.strip()]
        if not frames:
            continue
        profile.samples += 1
        profile.areas[classify(frames)] += 1
        profile.top[f"{frames[0][1]} ({Path(frames[0][2]).name})"] += 1
    return profile


def _frame(line: str) -> tuple[str, str, str]:
    """(address, symbol, object file) of one `perf script -F ip,sym,dso` line."""
    address, _, rest = line.strip().partition(" ")
    symbol, _, dso = rest.rpartition(" (")
    return address, symbol or rest, dso.rstrip(")")


def classify(frames: list[tuple[str, str, str]]) -> str:
    """The area of one sample, from its call chain (innermost frame first)."""
    address, symbol, dso = frames[0]
    if address.startswith("ffffffff"):  # a kernel address: which system call is it serving?
        chain = " ".join(s for _, s, _ in frames)
        if "fdatasync" in chain or "fsync" in chain:
            return FSYNC
        if "tcp_recvmsg" in chain or "sock_recvmsg" in chain:
            return SOCKET_RECEIVE
        if "tcp_sendmsg" in chain or "sock_sendmsg" in chain or "sock_write_iter" in chain:
            return SOCKET_SEND
        if "ext4_" in chain or "generic_perform_write" in chain:
            if "pwrite64" in chain:
                return JOURNAL_WRITE
            if "sys_write" in chain:
                return ENTRY_LOG_WRITE
        return KERNEL_OTHER
    if "memmove" in symbol or "memcpy" in symbol:
        return MEMMOVE
    if "crc32c" in dso or "crc32c" in symbol:
        return CRC
    if "libpython" in dso:
        return INTERPRETER
    return USER_OTHER
