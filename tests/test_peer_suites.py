"""tools/peer-suites.sh's summary and plugin (issue 41, item 5): the summary names every test whose
outcome with dask-redist on differs from the same run off, and the plugin counts collective runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def junit(cases: dict[str, str]) -> str:
    body = "".join(
        f'<testcase classname="t" name="{name}">'
        + {
            "passed": "",
            "failed": '<failure message="boom">x</failure>',
            "skipped": '<skipped message="s"/>',
        }[outcome]
        + "</testcase>"
        for name, outcome in cases.items()
    )
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'


def test_the_summary_lists_the_tests_that_differ(tmp_path):
    (tmp_path / "peer.off-inproc.xml").write_text(junit({"a": "passed", "b": "passed", "c": "skipped"}))
    (tmp_path / "peer.on-inproc.xml").write_text(junit({"a": "passed", "b": "failed", "c": "skipped"}))
    (tmp_path / "peer.on-inproc.json").write_text(json.dumps({"runs": 3, "tests": {"t::a": 2, "t::b": 1}}))
    out = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "peer_suites", "summary.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "peer on-inproc against off-inproc: 1 tests differ" in out, out
    assert "t::b: passed -> failed  boom" in out and "t::a:" not in out, out
    (row,) = [
        line
        for line in out.splitlines()
        if line.split()[:2] == ["peer", "on-inproc"] and "against" not in line
    ]
    assert row.split()[2:4] == ["3", "2"] and "1 failed" in row, row


def test_the_plugin_enables_and_counts_collective_runs(tmp_path):
    (tmp_path / "test_peer.py").write_text(
        textwrap.dedent(
            """
            import dask.array as da, numpy as np

            def test_a_rechunk():
                a = np.arange(64 * 64.0).reshape(64, 64)
                np.testing.assert_array_equal(da.from_array(a, chunks=(8, 64)).rechunk((64, 8)).compute(), a)
            """
        )
    )
    report = tmp_path / "runs.json"
    env = {
        **os.environ,
        "PEER_REDIST": "on",
        "PEER_CLIENT": "inproc",
        "PEER_REPORT": str(report),
        "PYTHONPATH": os.path.join(TOOLS, "peer_suites"),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "redist_plugin",
            "-p",
            "no:cacheprovider",
            "test_peer.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads(report.read_text()) == {"runs": 1, "tests": {"test_peer.py::test_a_rechunk": 1}}
