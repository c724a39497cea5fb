"""One generated section of docs/benchmarks.md, between its start and end markers: read the one there,
or write a new one in its place (else before "## Analysis"). The TLS and large-tree parts each own one;
a run of the other parts keeps them as they were."""

from __future__ import annotations

from pathlib import Path


def existing_section(path: Path, start: str, end: str) -> str | None:
    """The section between `start` and `end` (markers included) in the file, None if it has none."""
    text = path.read_text() if path.exists() else ""
    if start not in text or end not in text:
        return None
    return start + text.split(start, 1)[1].split(end, 1)[0] + end + "\n"


def splice(path: Path, section: str, start: str, end: str) -> None:
    """Write `section` into the file at `path`: in place of the old one, else before "## Analysis"."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    elif "\n## Analysis\n" in text:
        head, rest = text.split("\n## Analysis\n", 1)
        text = head.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n\n## Analysis\n" + rest
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text if text.endswith("\n") else text + "\n")
