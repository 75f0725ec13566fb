"""The command line as a new user meets it: help for everything, tables that fit or are Markdown,
a quiet demo (issue 26, item 7)."""

from __future__ import annotations

import argparse
import io
import os
import socket
import subprocess
import sys
import time

import pytest
from rich.console import Console

from dask_redist import cli
from dask_redist.cli import output

COMMANDS = ("demo", "bench", "soak", "doctor")


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0 and set(_commands()) == set(COMMANDS)
    description = out.split("positional arguments:")[0]
    assert all(f"{command} (" in description for command in COMMANDS), description
    assert "Markdown" in description


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help(command):
    p = _commands()[command]
    assert p.description or p.format_help()
    missing = [a.option_strings for a in p._actions if not a.help]
    assert missing == [], f"dask-redist {command}: options without help: {missing}"


ROWS = [
    {
        "case": "slab 2.00 GiB 16->16 float64",
        "method": "redist-dask",
        "median": "2.31 s",
        "note": "",
        "GPU mem +": "",
        "of ceiling": "-",
        "checked": "equal",
    },
    {
        "case": "slab 2.00 GiB 16->16 float64",
        "method": "p2p",
        "median": "4.05 s",
        "note": "a | b",
        "GPU mem +": "",
        "of ceiling": "-",
        "checked": "equal",
    },
]


def _shown(console: Console, monkeypatch) -> str:
    monkeypatch.setattr(output, "console", console)
    output.show(ROWS, "all cases")
    return console.file.getvalue()


def test_tables_are_markdown_where_the_output_is_not_a_terminal(monkeypatch):
    out = _shown(Console(file=io.StringIO(), force_terminal=False), monkeypatch)
    assert out.splitlines()[:4] == [
        "**all cases**",
        "",
        "| case | method | median | note | checked |",
        "|---|---|---|---|---|",
    ]  # (the columns empty in every row are left out)
    assert "| slab 2.00 GiB 16->16 float64 | p2p | 4.05 s | a \\| b | equal |" in out


def test_tables_fit_the_terminal(monkeypatch):
    out = _shown(Console(file=io.StringIO(), force_terminal=True, width=60, color_system=None), monkeypatch)
    assert max(map(len, out.splitlines())) <= 60 and "redist-dask" in out and "GPU mem" not in out


@pytest.mark.slow
def test_the_demo_is_quiet():
    """No "Port 8787 is already in use" (its dashboard takes a free port) and none of the warnings
    Dask's p2p rechunk logs for every shuffle (the demo times it): stderr stays empty."""
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 8787))  # (taken already, or by this test: the demo must not want it)
        held.listen()
    except OSError:
        pass
    try:
        cmd = [sys.executable, *"-m dask_redist.cli demo --size 1MiB --chunks 4 --reps 1".split()]
        env = {**os.environ, "COLUMNS": "200"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    finally:
        held.close()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr == "", out.stderr[-3000:]
    assert "| slab 1.00 MiB 4->4 float64 | p2p |" in out.stdout and "dashboard: http://" in out.stdout, (
        out.stdout
    )


def test_long_work_shows_a_progress_bar_on_a_terminal_only(monkeypatch):
    for terminal in (True, False):
        file = io.StringIO()
        monkeypatch.setattr(output, "console", Console(file=file, force_terminal=terminal, width=80))
        with output.progress("soak, seed 3", 4) as update:
            output.console.print("step 0 ok", highlight=False)
            update(completed=2)
        shown = file.getvalue()
        assert "step 0 ok" in shown and ("soak, seed 3" in shown) == terminal, shown


@pytest.mark.slow
def test_the_soaks_kill_steps_log_to_the_file_it_names_not_the_terminal(tmp_path):
    """A kill step makes distributed log (the scheduler lists the lost task keys, the nanny restarts
    its worker): those records go to the log file the command names first; stderr stays empty."""
    log = tmp_path / "soak.log"
    cmd = [
        sys.executable,
        "-m",
        "dask_redist.cli",
        "soak",
        "--steps",
        "2",
        "--kinds",
        "kill",
        "--max-bytes",
        "1MiB",
    ]
    out = subprocess.run([*cmd, "--log-file", str(log)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr == "", out.stderr[-3000:]
    assert out.stdout.splitlines()[0] == f"logs of distributed and dask-redist: {log}"
    assert "distributed" not in out.stdout.split("\n", 1)[1] and "0 problems" in out.stdout, out.stdout
    records = log.read_text()
    assert "distributed.scheduler - WARNING - Removing worker" in records, records[-3000:]
    assert "distributed.nanny - WARNING - Restarting worker" in records, records[-3000:]


def _warn_on_the_worker(text):
    import logging

    logging.getLogger("dask_redist.runtime").warning(text)


async def _stall_on_the_worker():
    """The worker's event loop blocked for 0.5 s (a coroutine that sleeps without awaiting:
    distributed notes it past ``admin.tick.limit``), and an INFO record that is not such a note."""
    import logging
    import time

    logging.getLogger("distributed.worker").info("an ordinary record")
    time.sleep(0.5)


def test_a_local_clusters_workers_write_their_warnings_to_the_log_file_themselves(tmp_path):
    """Records forwarded to the scheduler are lost with a worker's broken stream: the workers of a
    cluster started here append theirs to the command's log file themselves, once each."""
    from dask_redist.cli import clusters, output, parser

    log = tmp_path / "bench.log"
    args = parser().parse_args(["bench", "--workers", "2"])
    with output.logs_to_file(str(log)), clusters.client_for(args) as client:
        client.run(_warn_on_the_worker, "a worker's own warning")
        names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
    records = [r for r in log.read_text().splitlines() if "a worker's own warning" in r]
    writers = sorted(r.split(" - ")[1].split(" (")[0] for r in records)  # ("worker 0 (pid) dask_redist...")
    assert writers == [f"worker {name}" for name in names], records
    assert all("dask_redist.runtime - WARNING - a worker's own warning" in r for r in records), records


def test_a_local_clusters_workers_log_their_event_loops_stalls(tmp_path, monkeypatch):
    """A worker's loop that does not answer loses its connection (2026-12-06, one H200: a worker's
    connection closed with nothing in the log): its own "Event loop was unresponsive" notes
    (INFO) go to the log file, its other INFO records do not."""
    from dask_redist.cli import clusters, output, parser

    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__TICK__LIMIT", "200ms")  # (read by the worker processes)
    log = tmp_path / "bench.log"
    args = parser().parse_args(["bench", "--workers", "1"])
    with output.logs_to_file(str(log)), clusters.client_for(args) as client:
        client.run(_stall_on_the_worker)
        time.sleep(1)  # (the next tick notes it)
    mine = [r for r in log.read_text().splitlines() if r.split(" - ")[1].startswith("worker 0 (")]
    assert any("Event loop was unresponsive in Worker" in r for r in mine), mine
    assert not any("an ordinary record" in r for r in mine), mine


def test_more_gpu_workers_than_gpus_is_refused_with_what_to_do(monkeypatch):
    """LocalCUDACluster starts one worker per GPU; asking for more says how to get them."""
    from dask_redist.cli.clusters import too_many_workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    too_many_workers(1)
    with pytest.raises(
        SystemExit, match=r"--workers 2 with --gpu .* 1 GPU\(s\) .* --workers 1, or --pes-per-gpu 2"
    ):
        too_many_workers(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(SystemExit, match="--pes-per-gpu 3"):
        too_many_workers(5)


def test_the_local_cluster_has_one_worker_per_visible_gpu_unless_told(monkeypatch):
    from dask_redist.cli.clusters import local_workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    bench = _commands()["bench"]
    assert local_workers(bench.parse_args(["--gpu"])) == 1
    assert local_workers(bench.parse_args(["--gpu", "--pes-per-gpu", "4"])) == 4
    assert local_workers(bench.parse_args(["--gpu", "--workers", "2", "--pes-per-gpu", "2"])) == 2
    assert local_workers(bench.parse_args([])) == 2
    assert local_workers(_commands()["soak"].parse_args([])) == 3


def test_gpu_without_the_gpu_packages_says_how_to_get_them(monkeypatch):
    """How to get them as the docs install it: dask-redist is not on PyPI, so the message named
    `pip install 'dask-redist[gpu]'`, which finds nothing; the clone's `pip install -e '.[gpu]'`."""
    import importlib.util

    from dask_redist.cli.clusters import gpu_packages

    installed = {"cupy"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: object() if m in installed else None)
    with pytest.raises(
        SystemExit, match=r"and dask_cuda is not installed here: pip install -e '\.\[gpu\]' in the clone"
    ):
        gpu_packages()
    installed.clear()
    with pytest.raises(SystemExit, match="cupy and dask_cuda are not installed"):
        gpu_packages()
    installed.update({"cupy", "dask_cuda"})
    gpu_packages()


def test_workers_sharing_gpus_that_do_not_fit_are_refused_by_the_same_rule(monkeypatch):
    from dask_redist.bench.gpu_cluster import SharedGPUCluster

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    SharedGPUCluster(4, 2)  # (nothing starts before __enter__)
    with pytest.raises(
        ValueError, match="--workers 5 with --gpu start 2 per GPU.* --workers 4, or --pes-per-gpu 3"
    ):
        SharedGPUCluster(5, 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--size", "abc"], "argument --size: 'abc' is not a size"),
        (["demo", "--size", "0"], "argument --size: '0' is not above 0 bytes"),
        (["demo", "--chunks", "0"], "argument --chunks: must be 1 or more, got 0"),
        (["demo", "--chunks", "-3"], "argument --chunks: must be 1 or more, got -3"),
        (["demo", "--reps", "x"], "argument --reps: 'x' is not a whole number"),
        (
            ["demo", "--scheduler", "notanaddress"],
            "argument --scheduler: 'notanaddress' is not a scheduler address",
        ),
        (
            ["doctor", "--scheduler", "/nonexistent/sched.json"],
            "argument --scheduler: no scheduler file at '/nonexistent/sched.json' (no such file)",
        ),
        (["doctor", "--wait-workers", "-1"], "argument --wait-workers: -1 is not above 0"),
        (["doctor", "--workers", "0"], "argument --workers: must be 1 or more"),
        (["doctor", "--protocol", "nope"], "argument --protocol: unknown address scheme 'nope'"),
        (["bench", "--dtype", "notadtype"], "argument --dtype: 'notadtype' is not a NumPy dtype"),
        (["bench", "--dtype", "float64", "object"], "argument --dtype: 'object' is not a numeric dtype"),
        (["bench", "--size", "1MiB", "abc"], "argument --size: 'abc' is not a size"),
        (["bench", "--chunks", "4", "0"], "argument --chunks: must be 1 or more, got 0"),
        (["bench", "--methods", "nope", "tasks"], "argument --methods: 'nope': bench runs redist-dask"),
        (["bench", "--fft", "--methods", "p2p"], "argument --methods: 'p2p': bench --fft runs redist-fft"),
        (["bench", "--scale", "--budget", "0"], "argument --budget: 0 is not above 0"),
        (["soak", "--max-bytes", "lots"], "argument --max-bytes: 'lots' is not a size"),
        (["soak", "--steps", "0"], "argument --steps: must be 1 or more, got 0"),
    ],
)
def test_bad_arguments_are_usage_errors_not_tracebacks_or_runs(capsys, argv, message):
    """A bad value is argparse's one-line usage error (exit 2): it was a traceback (--size abc,
    --dtype notadtype, --scheduler notanaddress) or ran anyway (--chunks 0, --methods nope)."""
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.startswith("usage: dask-redist " + argv[0]), err
    assert (
        err.strip().splitlines()[-1] == f"dask-redist {argv[0]}: error: " + err.split("error: ")[-1].strip()
    )
    assert message in err and "Traceback" not in err, err


def test_good_arguments_still_parse():
    args = cli.parser().parse_args(
        ["bench", "--size", "1MiB", "2e6", "--dtype", "float32", "complex64", "--chunks", "4"]
        + ["--methods", "redist-dask", "tasks-ucx", "enabled", "floor", "--scheduler", "tcp://127.0.0.1:8786"]
    )
    args.check(args)  # (no usage error)
    assert args.size == ["1MiB", "2e6"] and args.dtype == ["float32", "complex64"] and args.chunks == [4]
    args = cli.parser().parse_args(["bench", "--fft", "--methods", "redist-fft", "four-step"])
    args.check(args)


def test_an_unreachable_scheduler_is_one_line_and_a_nonzero_exit(tmp_path):
    with socket.socket() as s:  # (a port nothing listens on)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["doctor", "--scheduler", f"tcp://127.0.0.1:{port}", "--wait-workers", "1"]
    with pytest.raises(SystemExit) as exit:
        cli.main(argv + ["--log-file", str(tmp_path / "log")])
    message = str(exit.value.code)
    assert message.startswith(f"dask-redist: could not reach a scheduler at tcp://127.0.0.1:{port} within 1s")
    assert "\n" not in message and "check the address" in message


def test_scheduler_takes_a_scheduler_file(tmp_path):
    """``--scheduler`` takes the file ``dask scheduler --scheduler-file`` writes (shared nodes, batch
    jobs: the address is in it); it was refused as 'missing port number'."""
    path = tmp_path / "sched.json"
    path.write_text('{"type": "Scheduler", "address": "tcp://10.0.0.1:8786"}')
    args = cli.parser().parse_args(["doctor", "--scheduler", str(path)])
    assert args.scheduler == "tcp://10.0.0.1:8786"
    path.write_text("{not json")
    with pytest.raises(SystemExit) as exit:
        cli.parser().parse_args(["doctor", "--scheduler", str(path)])
    assert exit.value.code == 2
