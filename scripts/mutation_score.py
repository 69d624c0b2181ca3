"""The mutation score of `make mutation`, per module, from mutmut's results under mutants/.

A mutant counts as detected when a test failed on it (killed) or it ran past its time limit (an
endless loop). The equivalent mutants that docs/testing.md lists, one reason each, leave the
denominator. Exits 1 when a module's score is below 90%, or when a listed mutant is not a surviving one
(the list went stale after a change to a module or a test), so the list and the run stay in step.

    python scripts/mutation_score.py          # after `mutmut run`, from the repository root
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

MODULES = ("tree", "advantage", "loss", "budget", "reward", "packing")
GOAL = 0.90
DOC = Path("docs/testing.md")
# mutmut's exit codes (mutmut.stats.status_by_exit_code): 1 and 3 a failing test, 24, 36, 152 and 255 a time limit.
KILLED, TIMEOUT, SURVIVED = {1, 3}, {24, -24, 36, 152, 255}, {0}


def excluded_in_doc(doc: Path = DOC) -> set[str]:
    """The mutants listed under the doc's "Excluded mutants" heading, one "- `NAME`: change. reason" item each."""
    section = doc.read_text(encoding="utf-8").split("### Excluded mutants", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^- `(tg\.[^`]+)`:", section, flags=re.M))


def statuses(root: Path = Path("mutants")) -> dict[str, dict[str, int]]:
    """Module -> {mutant name: mutmut exit code}."""
    return {m: json.loads((root / "tg" / f"{m}.py.meta").read_text(encoding="utf-8"))["exit_code_by_key"]
            for m in MODULES}


def main() -> int:
    excluded, by_module = excluded_in_doc(), statuses()
    print("| module | mutants | killed | timed out | excluded (equivalent) | surviving | score |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    total, surviving, stale, scores = Counter(), [], [], []
    for module, codes in by_module.items():
        c = Counter()
        for name, code in codes.items():
            kind = ("killed" if code in KILLED else "timeout" if code in TIMEOUT else
                    "excluded" if name in excluded and code in SURVIVED else "surviving")
            c[kind] += 1
            if kind == "surviving":
                surviving.append(f"{name} (exit code {code})")
        stale += [n for n in excluded if n.startswith(f"tg.{module}.") and codes.get(n) not in SURVIVED]
        total.update(c)
        scores.append(_score(c))
        _row(f"tg/{module}.py", c)
    _row("**all**", total)
    print("\nsurviving, not excluded:" if surviving else "\nno surviving mutant outside the exclusions")
    for name in surviving:
        print(f"  {name}   (see: mutmut show NAME)")
    for name in stale:
        print(f"  stale exclusion in {DOC}: {name} is not a surviving mutant")
    return 1 if stale or min(scores) < GOAL else 0


def _score(c: Counter) -> float:
    return (c["killed"] + c["timeout"]) / max(c.total() - c["excluded"], 1)


def _row(label: str, c: Counter) -> None:
    print(f"| {label} | {c.total()} | {c['killed']} | {c['timeout']} | {c['excluded']} | {c['surviving']} "
          f"| {100 * _score(c):.1f}% |")


if __name__ == "__main__":
    sys.exit(main())
