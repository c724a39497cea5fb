"""Results of the verifiers: one CheckResult per named check, a table for people, JSON for machines."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

MAX_EXAMPLES = 5


@dataclass
class CheckResult:
    """One check: how much it examined, how many violations it found, the first few of them.

    `notes` carry what is worth knowing but is not a violation (a torn tail the node
    will truncate on restart, an uncommitted tail of an old epoch).
    """

    name: str
    checked: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.violations == 0

    def add(self, count: int, examples: list[str]) -> None:
        """Count `count` violations, keeping examples up to MAX_EXAMPLES in all."""
        self.violations += count
        room = MAX_EXAMPLES - len(self.examples)
        if room > 0:
            self.examples.extend(examples[:room])


@dataclass
class Verdict:
    """Every check of one verification, and facts about the input (nodes, records, commit point)."""

    kind: str
    checks: list[CheckResult]
    facts: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> str:
        checks = [{**asdict(c), "passed": c.passed} for c in self.checks]
        return json.dumps({"kind": self.kind, "passed": self.passed, "seconds": round(self.seconds, 3),
                           "facts": self.facts, "checks": checks}, indent=2, default=str)


def render_table(verdict: Verdict) -> str:
    """The readable summary: facts, one row per check, then the examples and notes of each."""
    lines = [f"{k}: {v}" for k, v in verdict.facts.items()]
    width = max(len(c.name) for c in verdict.checks) if verdict.checks else 5
    lines.append("")
    lines.append(f"{'check':<{width}}  {'result':<6}  {'checked':>12}  {'violations':>10}")
    for c in verdict.checks:
        lines.append(f"{c.name:<{width}}  {'ok' if c.passed else 'FAIL':<6}  {c.checked:>12}  {c.violations:>10}")
    for c in verdict.checks:
        if c.examples or c.notes:
            lines.append("")
            lines.append(f"{c.name}:")
            lines += [f"  ! {e}" for e in c.examples]
            lines += [f"  - {n}" for n in c.notes]
    lines.append("")
    verdict_word = "OK: every check passed" if verdict.passed else (
        "FAIL: " + ", ".join(c.name for c in verdict.checks if not c.passed))
    lines.append(f"verdict: {verdict_word} ({verdict.seconds:.1f} s)")
    return "\n".join(lines)
