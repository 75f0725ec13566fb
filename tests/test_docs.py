"""The documentation site builds with ``mkdocs build --strict`` (skipped without mkdocs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("index.html", "api/index.html", "benchmarks/index.html", "configuration/index.html"):
        assert (site / page).is_file(), page
    # the public API's numpy-style sections, rendered: enable, disable, rechunk, the four FFTs,
    # status, explain, bootstrap (in the page's order)
    api = (site / "api" / "index.html").read_text()
    assert api.count("Parameters:") == 10 and api.count("Returns:") == 9, api.count("Parameters:")
    for name in ("**options", "block_size_limit", "restart_broken", "nworkers", "norm"):
        assert f"<code>{name}</code>" in api, name


def test_ci_runs_exactly_the_readme_test_command():
    """`.ci/run` runs the README's test command, line for line (both dask versions)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = f.read().split("```bash\n")[1:]
    (readme,) = [b.split("```")[0] for b in blocks if "pytest" in b]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line for line in f.read().splitlines() if line.startswith("python3 ")]
    assert ci == readme.strip().splitlines()
    assert len(ci) == 2 and "rapids-dask-dependency" in ci[1]


def test_the_sample_outputs_in_the_docs_are_what_the_code_prints(client):
    """docs/quickstart.md's explain and troubleshooting.md's doctor outputs come from the code
    (tools/docs_samples.py writes them); a change of what explain or doctor print shows here.
    The samples are of CPU workers: skipped where the workers may have GPUs."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the workers may have GPUs, the samples are of CPU workers")
    spec = importlib.util.spec_from_file_location(
        "docs_samples", os.path.join(ROOT, "tools", "docs_samples.py")
    )
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    for name, text in samples.printed(client).items():
        page, _ = samples.SAMPLES[name]
        assert samples.normalized(samples.in_docs(name)) == samples.normalized(text), (
            f"{page}'s sample {name!r} is not what the code prints; `python tools/docs_samples.py` rewrites it"
        )
