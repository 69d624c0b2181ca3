"""The mutation score of `make mutation`, per module, from mutmut's results under mutants/.

A mutant counts as detected when a test failed on it (killed) or it ran past its time limit (an
endless loop). A surviving mutant leaves the denominator when it is equivalent: its change, the source
lines `mutmut show` prints before and after, matches an entry of scripts/mutation_equivalent.toml, which
names the function and says why the change alters no behaviour. Entries are matched by content, not by
mutmut's mutant numbers, which shift whenever a module changes. Exits 1 when a module's score is below 90%,
or when an entry matches no surviving mutant (its line changed, or a test now kills it), so the list and the
code stay in step.

    python scripts/mutation_score.py          # after `mutmut run`, from the repository root
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant

MODULES = ("tree", "advantage", "loss", "budget", "reward", "packing")
GOAL = 0.90
EQUIVALENT = Path("scripts/mutation_equivalent.toml")
FIELDS = ("function", "before", "after", "why")
# mutmut's exit codes (mutmut.stats.status_by_exit_code): 1 and 3 a failing test, 24, 36, 152 and 255 a time limit.
KILLED, TIMEOUT, SURVIVED = {1, 3}, {24, -24, 36, 152, 255}, {0}

Change = tuple[str, str, str]
"""(function, lines before, lines after): a mutant by content, e.g. ("tg.packing.pack_rows", "prev = -1", "prev = -2")."""


def equivalent_changes(path: Path = EQUIVALENT) -> list[Change]:
    """The [[equivalent]] entries of `path`, each as a Change with its lines' whitespace normalised."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    for k, entry in enumerate(entries, 1):
        if sorted(entry) != sorted(FIELDS) or not all(isinstance(v, str) and v.strip() for v in entry.values()):
            raise SystemExit(f"{path}: entry {k} ({entry.get('function', '?')}) needs exactly the text fields "
                             f"{', '.join(FIELDS)}, each non-empty")
    return [(e["function"], _lines(e["before"]), _lines(e["after"])) for e in entries]


def mutant_change(name: str, module: str) -> Change:
    """The Change of mutant `name` (e.g. tg.packing.x_pack_rows__mutmut_20) of tg/`module`.py."""
    diff = get_diff_for_mutant(name, path=f"tg/{module}.py").split("\n")[2:]  # past the ---/+++ header
    before = "\n".join(line[1:] for line in diff if line.startswith("-"))
    after = "\n".join(line[1:] for line in diff if line.startswith("+"))
    mangled = name.partition("__mutmut_")[0].rpartition(".")[2]       # x_FUNCTION or xǁCLASSǁMETHOD
    return f"tg.{module}.{mangled[2:].replace('ǁ', '.')}", _lines(before), _lines(after)


def _lines(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.strip().split("\n"))


def statuses(root: Path = Path("mutants")) -> dict[str, dict[str, int]]:
    """Module -> {mutant name: mutmut exit code}."""
    return {m: json.loads((root / "tg" / f"{m}.py.meta").read_text(encoding="utf-8"))["exit_code_by_key"]
            for m in MODULES}


def main() -> int:
    equivalent, by_module = equivalent_changes(), statuses()
    print("| module | mutants | killed | timed out | excluded (equivalent) | surviving | score |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    total, surviving, matched, scores = Counter(), [], set(), []
    for module, codes in by_module.items():
        c = Counter()
        for name, code in codes.items():
            change = mutant_change(name, module) if code in SURVIVED else None
            kind = ("killed" if code in KILLED else "timeout" if code in TIMEOUT else
                    "excluded" if change in equivalent else "surviving")
            c[kind] += 1
            matched.add(change)
            if kind == "surviving":
                surviving.append((name, code, change))
        total.update(c)
        scores.append(_score(c))
        _row(f"tg/{module}.py", c)
    _row("**all**", total)
    print("\nsurviving, not excluded:" if surviving else "\nno surviving mutant outside the exclusions")
    for name, code, change in surviving:
        print(f"  {name} (exit code {code}; mutmut show {name})")
        if change:
            print("\n".join(f"      - {line}" for line in change[1].split("\n")) + "\n"
                  + "\n".join(f"      + {line}" for line in change[2].split("\n")))
    stale = [e for e in equivalent if e not in matched]
    for function, before, after in stale:
        print(f"  stale entry in {EQUIVALENT}: no surviving mutant of {function} changes {before!r} to {after!r}")
    return 1 if stale or min(scores) < GOAL else 0


def _score(c: Counter) -> float:
    return (c["killed"] + c["timeout"]) / max(c.total() - c["excluded"], 1)


def _row(label: str, c: Counter) -> None:
    print(f"| {label} | {c.total()} | {c['killed']} | {c['timeout']} | {c['excluded']} | {c['surviving']} "
          f"| {100 * _score(c):.1f}% |")


if __name__ == "__main__":
    sys.exit(main())
