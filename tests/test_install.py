"""Every install command in the docs is one the project can run (issue 26, item 1).

dask-redist is not published, so every ``pip install`` of it names the clone or a wheel built
from it, with extras that pyproject declares; the install block reads the same in README.md,
docs/index.md, docs/quickstart.md and docs/deployment.md; the documented wheel builds and
installs. The README's CPU commands themselves are run by CI (``.ci/run``, test_docs.py).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import InvalidRequirement, Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK_FILES = ("README.md", "docs/index.md", "docs/quickstart.md", "docs/deployment.md")
DOC_FILES = ["README.md", "examples/README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
OURS = {"dask-redist", "dask_redist"}
#: What each [gpu] comment in the docs promises, as package names of pyproject's extra.
GPU_STACK = ("cupy-cuda13x", "dask-cuda", "nvmath-python", "nvidia-cufftmp-cu13", "nvidia-nvshmem-cu13")


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _extras() -> dict[str, list[str]]:
    """pyproject's optional dependencies: extra -> package names."""
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    return {k: [Requirement(r).name for r in v] for k, v in project["optional-dependencies"].items()}


def _block(path: str) -> str:
    text = _read(path)
    start, end = text.find("<!-- install:"), text.find("<!-- /install -->")
    assert 0 <= start < end, f"{path}: no install block (<!-- install: ... --> ... <!-- /install -->)"
    return text[start:end]


def _pip_installs() -> list[tuple[str, list[str]]]:
    """(file, arguments) of every ``pip install`` in the docs, in code blocks and inline code."""
    found = []
    for path in DOC_FILES:
        for line in _read(path).splitlines():
            for command in re.findall(r"pip install ([^`#&\n]*)", line):
                found.append((os.path.relpath(os.path.join(ROOT, path), ROOT), shlex.split(command)))
    return found


def _requirements(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("-")]


def test_the_install_block_reads_the_same_everywhere():
    blocks = {path: _block(path) for path in BLOCK_FILES}
    assert len(set(blocks.values())) == 1, "install blocks differ: " + ", ".join(blocks)
    assert "not on PyPI" in blocks["README.md"]


def test_every_pip_install_of_this_project_names_a_path_and_extras_it_has():
    extras = _extras()
    ours = 0
    for path, args in _pip_installs():
        for req in _requirements(args):
            if req == "...":  # (prose: "pip install ..." itself)
                continue
            target, _, wanted = req.partition("[")
            wanted = [e for e in wanted.rstrip("]").split(",") if e]
            if target in (".", "./") or target.endswith(".whl"):
                ours += 1
                unknown = [e for e in wanted if e not in extras and e != "EXTRAS"]
                assert not unknown, f"{path}: pip install {req}: pyproject has no extra {unknown}"
                if target.endswith(".whl"):
                    assert os.path.basename(target) == _documented_wheel(), f"{path}: {req}"
                continue
            try:
                name = Requirement(req).name
            except InvalidRequirement:
                pytest.fail(
                    f"{path}: pip install {' '.join(args)}: {req!r} is neither a path nor a requirement"
                )
            assert name.lower().replace("_", "-") not in OURS, (
                f"{path}: pip install {req}: dask-redist is not published; install the clone ('.[gpu]') or a wheel"
            )
    assert ours >= 10


def test_the_gpu_extra_holds_what_the_docs_say():
    extras = _extras()
    assert set(GPU_STACK) <= set(extras["gpu"]), extras["gpu"]
    assert "distributed-ucxx-cu13" in extras["ucx"]
    for path in BLOCK_FILES:
        assert "CuPy, dask-cuda, nvmath-python, cuFFTMp, NVSHMEM" in _block(path)


def _wheel_commands() -> tuple[list[str], list[str]]:
    """The block's two wheel commands: (build, install), as arguments."""
    lines = [line.split("#")[0].strip() for line in _block("README.md").splitlines()]
    (build,) = [shlex.split(line) for line in lines if line.startswith("pip wheel")]
    (install,) = [shlex.split(line) for line in lines if line.startswith("pip install") and ".whl" in line]
    return build, install


def _documented_wheel() -> str:
    _, install = _wheel_commands()
    return os.path.basename(_requirements(install[2:])[0].partition("[")[0])


@pytest.mark.slow
def test_the_documented_wheel_builds_and_installs_with_its_extras(tmp_path):
    """The block's commands, run as written in a copy of the project (what a wheel needs)."""
    src = tmp_path / "clone"
    shutil.copytree(
        os.path.join(ROOT, "dask_redist"), src / "dask_redist", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    build, install = _wheel_commands()
    out = subprocess.run([sys.executable, "-m", *build], cwd=src, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheel = src / "dist" / _documented_wheel()
    assert wheel.is_file(), os.listdir(src / "dist")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    assert "dask_redist/redist.yaml" in names and "dask_redist/__init__.py" in names
    assert "Name: dask-redist" in metadata
    assert {"gpu", "ucx"} <= set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    dry = [sys.executable, "-m", *install[:2], "--dry-run", "--no-deps", "--no-index", *install[2:]]
    out = subprocess.run(dry, cwd=src, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Would install dask-redist-0.1.0" in out.stdout, (
        out.stdout + out.stderr[-2000:]
    )
    assert "does not provide the extra" not in out.stderr, out.stderr
