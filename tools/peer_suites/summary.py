"""The summary of tools/peer-suites.sh: outcomes and collective runs per suite and mode, and every
test whose outcome with dask-redist on differs from the same run off.

usage: python summary.py RESULTS_DIR   (files SUITE.MODE.xml, JUnit, and SUITE.MODE.json, runs)
A mode is ``off``/``on``, with ``-inproc``/``-processes`` where a session Client ran the suite;
each ``on...`` mode is compared with its ``off...`` twin.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(xml: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (passed / failed / error / skipped / xfailed, the first line of the message)."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                if child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""
                break
        out[test] = (outcome, message)
    return out


def counts(results: dict) -> str:
    kinds = [o for o, _ in results.values()]
    return ", ".join(
        f"{kinds.count(k)} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed") if kinds.count(k)
    )


def main(directory: str) -> int:
    root = Path(directory)
    runs = sorted(root.glob("*.xml"))
    if not runs:
        print(f"no results in {root}")
        return 1
    table = {}
    for xml in runs:
        suite, mode = xml.stem.split(".", 1)
        report = xml.with_suffix(".json")
        collective = json.loads(report.read_text()) if report.exists() else {"runs": "?", "tests": {}}
        table[(suite, mode)] = (outcomes(xml), collective)
    print(f"{'suite':22} {'mode':14} {'collective runs':>16} {'tests with runs':>16}  outcomes")
    for (suite, mode), (results, collective) in table.items():
        print(
            f"{suite:22} {mode:14} {collective['runs']!s:>16} {len(collective['tests'])!s:>16}  {counts(results)}"
        )
    print()
    for (suite, mode), (results, _) in table.items():
        if not mode.startswith("on"):
            continue
        twin = table.get((suite, "off" + mode[2:]))
        if twin is None:
            continue
        differ = {
            t: (twin[0].get(t, ("absent", "")), r)
            for t, r in results.items()
            if twin[0].get(t, ("absent",))[0] != r[0]
        }
        print(f"{suite} {mode} against off{mode[2:]}: {len(differ)} tests differ")
        for test, (before, after) in sorted(differ.items()):
            print(f"  {test}: {before[0]} -> {after[0]}  {after[1] or before[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
