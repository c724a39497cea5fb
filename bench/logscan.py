"""What the servers' own logs said during a benchmark: warnings, errors, tracebacks, grouped.

Quire nodes log one `key=value` line per event to `<data_dir>/clusterd.log`;
ZooKeeper servers log to `zk<N>/zookeeper.log`. Lines are grouped by their
message with numbers, addresses and ids blanked, so a thousand identical
warnings become one row with a count and a first example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Expected lifecycle lines: not problems.
_QUIRE_BENIGN = ('msg="node started"', "msg=stopping")
_NUMBERS = re.compile(r"0x[0-9a-f]+|\d+")


@dataclass
class Finding:
    pattern: str
    count: int = 0
    sources: list[str] = field(default_factory=list)  # e.g. "election/node2", one per log file
    example: str = ""

    def add(self, source: str, example: str) -> None:
        self.count += 1
        if source not in self.sources:
            self.sources.append(source)
        self.example = self.example or f"[{source}] {example}"


@dataclass
class Scan:
    label: str
    files: int = 0
    _by_pattern: dict[str, Finding] = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        return sorted(self._by_pattern.values(), key=lambda f: -f.count)

    def add(self, pattern: str, source: str, example: str) -> None:
        self._by_pattern.setdefault(pattern, Finding(pattern)).add(source, example)


def scan_quire(folder: Path, label: str) -> Scan:
    scan = Scan(label)
    for log in sorted(folder.rglob("clusterd.log")):
        scan.files += 1
        source = f"{log.parent.parent.parent.name}/{log.parent.name}"  # e.g. election/node2
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            problem = ("level=warning" in line or "level=error" in line or "level=critical" in line
                       or line.startswith("Traceback"))
            if not problem or any(b in line for b in _QUIRE_BENIGN):
                continue
            example = "\n".join(lines[i:i + 12]) if line.startswith("Traceback") else line
            scan.add(_pattern(_quire_message(line)), source, example)
    return scan


def scan_zk(folder: Path, label: str) -> Scan:
    scan = Scan(label)
    for log in sorted(folder.rglob("zookeeper.log")):
        scan.files += 1
        source = f"{log.parent.parent.name}/{log.parent.name}"  # e.g. election/zk2
        for line in log.read_text(errors="replace").splitlines():
            if " ERROR " not in line and " WARN " not in line:
                continue
            level = "ERROR" if " ERROR " in line else "WARN"
            scan.add(f"{level} " + _pattern(line.split("] - ", 1)[-1])[:120], source, line)
    return scan


def _quire_message(line: str) -> str:
    """The msg= field (and the level) of a clusterd log line; the whole line if it has none."""
    level = re.search(r"level=(\w+)", line)
    msg = re.search(r'msg=("(?:[^"\\]|\\.)*"|\S+)', line)
    text = msg.group(1).strip('"') if msg else line
    text = re.sub(r"\bpeer=\d+", "peer=N", text)
    return f"{level.group(1) if level else ''} {text}".strip()


def _pattern(text: str) -> str:
    return _NUMBERS.sub("#", text)


def scan_clients(folder: Path, label: str) -> Scan:
    """The kazoo worker processes' stderr (`client<N>.log`): kazoo's warnings and errors, tracebacks."""
    scan = Scan(label)
    for log in sorted(folder.rglob("client*.log")):
        scan.files += 1
        source = f"{log.parent.parent.parent.name}/{log.parent.name}/{log.stem}"  # e.g. quire/write-100-128/client1
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            level = next((w for w in (" WARNING ", " ERROR ", " CRITICAL ") if w in line), None)
            if level is None and not line.startswith("Traceback"):
                continue
            example = "\n".join(lines[i:i + 12]) if line.startswith("Traceback") else line
            text = line.split(level, 1)[1] if level else line
            scan.add(f"{level.strip() + ' ' if level else ''}{_pattern(text)[:120]}", source, example)
    return scan
