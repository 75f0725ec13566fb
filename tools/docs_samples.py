"""The sample outputs in the docs, printed by the code itself.

A sample is the ```text block that follows a line ``<!-- sample: NAME -->`` in a page of
docs/. ``python tools/docs_samples.py`` starts a local CPU cluster of three workers and
writes every sample anew; tests/test_docs.py checks that the pages hold what the code
prints now (rechunk tokens and worker addresses, which vary, are compared as placeholders).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quickstart_explain(client) -> str:
    """docs/quickstart.md's CPU example: what ``explain`` prints (its cluster has 4 workers)."""
    import dask.array as da

    import dask_redist

    with dask_redist.enable():
        x = da.random.random((1024, 1024, 64), chunks=(64, 1024, 64))
        return str(dask_redist.explain(x.rechunk((1024, 64, 64)), nworkers=4))


def cpu_doctor(client) -> str:
    """``dask-redist doctor`` on a cluster of CPU workers."""
    import dask_redist

    return str(dask_redist.doctor(client))


#: sample name -> (page, the function that prints it)
SAMPLES = {
    "quickstart-explain": ("docs/quickstart.md", quickstart_explain),
    "cpu-doctor": ("docs/troubleshooting.md", cpu_doctor),
}


def normalized(text: str) -> str:
    """``text`` with what varies from run to run replaced: rechunk tokens, worker addresses."""
    text = re.sub(r"\b[0-9a-f]{32}\b", "<token>", text)
    return re.sub(r"tcp://[0-9.]+:\d+", "tcp://<address>", text)


def _block(page: str, name: str) -> re.Match:
    text = (ROOT / page).read_text()
    match = re.search(rf"<!-- sample: {re.escape(name)} -->\n+```text\n(.*?)```\n", text, re.S)
    if match is None:
        raise LookupError(f"{page} has no ```text block after <!-- sample: {name} -->")
    return match


def in_docs(name: str) -> str:
    """The sample ``name`` as the docs show it."""
    page, _ = SAMPLES[name]
    return _block(page, name).group(1)


def printed(client) -> dict[str, str]:
    """Every sample as the code prints it on ``client``'s cluster, with the packaged settings (what a
    user gets; the test suite sets some of its own, such as ``redist.min-bytes``)."""
    import dask

    from dask_redist.config import DEFAULTS

    with dask.config.set({"redist": DEFAULTS["redist"]}):
        return {name: make(client).rstrip("\n") + "\n" for name, (_, make) in SAMPLES.items()}


def write(client) -> None:
    for name, text in printed(client).items():
        page, _ = SAMPLES[name]
        match = _block(page, name)
        old = (ROOT / page).read_text()
        (ROOT / page).write_text(old[: match.start(1)] + text + old[match.end(1) :])
        print(f"{page}: {name}")


if __name__ == "__main__":  # pragma: no cover - run by hand
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, dashboard_address=None, worker_dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        c.wait_for_workers(3)
        write(c)
    sys.exit(0)
