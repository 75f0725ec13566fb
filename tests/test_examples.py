"""The examples run: examples/quickstart.py and examples/fft_pipeline.py as scripts, examples/notebook.ipynb
through nbclient (skipped where nbclient is not installed). GPU variants carry the ``gpu`` marker."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(script: str, *args: str, timeout: float = 120) -> str:
    """Run an example with this Python; its stdout. Fails on a non-zero exit, naming stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=EXAMPLES.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout also ends the worker processes it started
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"{script} {' '.join(args)} ran past {timeout} s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
        )
    assert proc.returncode == 0, (
        f"{script} {' '.join(args)} exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    )
    return out


def test_quickstart():
    out = run_example("quickstart.py", "--size", "4MiB", "--slabs", "4")
    assert "runs as                collective" in out
    assert "collective run: engine dask" in out
    assert "dask-redist collective" in out


def test_fft_pipeline():
    out = run_example("fft_pipeline.py", "--n", "32", "--slabs", "4")
    assert "fftn over axes [0, 1, 2]" in out and "the path that runs everywhere" in out  # explain()
    assert "collective run: engine dask" in out
    assert "dask_redist.fft.fftn" in out and "equals numpy.fft.fftn" in out
    assert "the four steps by hand" in out


@contextlib.contextmanager
def gpu_workers():
    """``--workers 2`` on 2 GPUs, or ``--scheduler`` of 2 `dask cuda worker` processes sharing GPUs
    (``REDIST_TEST_PES`` > 1): the command-line arguments that give an example two GPU workers."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    from conftest import gpu_layout

    _, pes = gpu_layout()
    if pes > 1:
        from dask_redist.bench.gpu_cluster import SharedGPUCluster

        with SharedGPUCluster(2, pes) as cluster:
            yield ["--scheduler", cluster.scheduler_address]
        return
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs, or REDIST_TEST_PES=2 to share one")
    yield ["--workers", "2"]


@pytest.mark.gpu
def test_quickstart_gpu():
    with gpu_workers() as where:
        out = run_example("quickstart.py", "--gpu", *where, "--size", "16MiB", "--slabs", "4")
    assert "collective run: engine" in out


@pytest.mark.gpu
def test_fft_pipeline_gpu():
    with gpu_workers() as where:
        out = run_example("fft_pipeline.py", "--gpu", *where, "--n", "64", "--slabs", "4")
    assert "collective run: engine cufftmp" in out
    assert "equals cupy.fft.fftn" in out


@pytest.mark.gpu
def test_fft_pipeline_gpu_path():
    with gpu_workers() as where:
        out = run_example("fft_pipeline.py", "--gpu", "--fft-gpu", *where, "--n", "64", "--slabs", "4")
    assert "the GPU path: one collective step per transform" in out
    assert "collective run: engine cufftmp" in out
    assert "equals cupy.fft.fftn" in out


def test_notebook(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    path = tmp_path / "notebook.ipynb"
    shutil.copy(EXAMPLES / "notebook.ipynb", path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # run it from scratch: the outputs kept in the file must not count
        if cell.cell_type == "code":
            cell.outputs = []
    # kernel "python3" with argv "python": jupyter_client starts it with sys.executable, this Python
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError at the first cell that fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    tables = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("<th>runs as</th>" in t and "<td>collective</td>" in t for t in tables), "no explain() table"


@pytest.mark.gpu
def test_doctor_cli_gpu():
    """`dask-redist doctor --gpu` on two GPU workers: every piece found, auto picks cufftmp."""
    with gpu_workers() as where:
        out = subprocess.run(
            [sys.executable, "-m", "dask_redist.cli", "doctor", "--gpu", *where],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    assert "engine `auto` picks for CuPy chunks: cufftmp" in out, out
