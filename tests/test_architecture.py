"""The package's shape, checked: no import cycle, layers import downward only, small modules.

Layers, bottom up (docs/design.md): ``config``/``errors``/``compat`` < ``planning`` < ``core``
< ``engines`` < ``runtime`` < ``graph`` < ``report``/``submissions`` < the API (``api``, ``explain``, ``doctor``, the
package itself) < ``bench`` < ``cli``. Every import counts, those inside functions too
(only ``if TYPE_CHECKING:`` blocks are left out), and so do the modules named by strings:
``importlib.import_module("dask_redist.x")``, ``__import__("dask_redist.x")`` and an
engine path ``"dask_redist.x:Class"``; a package's implicit import of its own ``__init__``
is not an edge.

Inside the engines layer, each engine is a room of its own: a specific engine (`ENGINE_ROOMS`)
imports only its own modules and the engines' shared ones, the shared ones import no specific
engine, and nothing outside the engines layer does either: the runtime, the API and the
bench ask the registry (docs/design.md, "Add an engine").
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "dask_redist"
LAYERS = [
    {"dask_redist.config", "dask_redist.errors", "dask_redist.compat"},
    {"dask_redist.planning"},
    {"dask_redist.core"},
    {"dask_redist.engines"},
    {"dask_redist.runtime"},
    {"dask_redist.graph"},
    {"dask_redist.report", "dask_redist.submissions"},
    {
        "dask_redist",
        "dask_redist.api",
        "dask_redist.explain",
        "dask_redist.doctor",
        "dask_redist.preload",
        "dask_redist.fft",
    },
    {"dask_redist.bench"},
    {"dask_redist.cli"},
]
MAX_LINES = 400
#: The specific engines: each imports only itself and the engines' shared modules (the others).
ENGINE_ROOMS = ("dask_redist.engines.dask", "dask_redist.engines.cufftmp")
#: Names of a module in a string: an engine path ("package.module:Class") or a whole module name
#: given to importlib.import_module / __import__.
_PATH = re.compile(r"(dask_redist(?:\.\w+)*)(?::\w+)?")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(node, parents) -> bool:
    return any(
        isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test) and node in ast.walk(p)
        for p in parents
    )


def _named_by_strings(tree, modules) -> set[str]:
    """Modules named by ``import_module("...")`` / ``__import__("...")`` or an engine path "...:Class"."""
    out = set()
    for node in ast.walk(tree):
        texts = []
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = ast.unparse(node.func)
            if func.endswith("import_module") or func == "__import__":
                texts.append(node.args[0].value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
            texts.append(node.value)  # an engine path, as redist.engines holds them
        for text in texts:
            match = _PATH.fullmatch(text) if isinstance(text, str) else None
            if match is not None:
                parts = match.group(1).split(".")
                out |= {m for m in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if m in modules}
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        guards = [
            n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
        ]
        deps = _named_by_strings(tree, modules) - {name}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, guards):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
                    package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{package}.{base}" if base else package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _layer(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if module in layer or any(module.startswith(p + ".") for p in layer if p != "dask_redist"):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/design.md")


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_layers_import_downward_only():
    upward = [(m, d) for m, deps in import_graph().items() for d in deps if _layer(d) > _layer(m)]
    assert upward == [], "imports that go up a layer: " + ", ".join(f"{m} -> {d}" for m, d in upward)


def _room(module: str) -> str | None:
    """The specific engine ``module`` belongs to, or None (shared engine modules, other layers)."""
    return next((r for r in ENGINE_ROOMS if module == r or module.startswith(r + ".")), None)


def test_engines_do_not_import_each_other_and_nothing_else_imports_a_specific_engine():
    """Inside the engines layer each engine keeps to itself; the runtime, graph, API and bench
    ask the registry, never a named engine."""
    crossing = [
        (m, d) for m, deps in import_graph().items() for d in deps if _room(d) and _room(m) != _room(d)
    ]
    assert crossing == [], "imports of another engine's modules: " + ", ".join(
        f"{m} -> {d}" for m, d in crossing
    )


def test_the_plugins_do_not_import_each_other():
    graph = import_graph()
    assert "dask_redist.runtime.worker" not in graph["dask_redist.runtime.scheduler"]
    assert "dask_redist.runtime.scheduler" not in graph["dask_redist.runtime.worker"]


def test_modules_stay_small():
    big = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_the_invariant_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """The checks above can fail: a cycle and an upward import planted in a copy are found."""
    import shutil

    copy = tmp_path / "dask_redist"
    shutil.copytree(ROOT, copy)
    with open(copy / "planning" / "geometry.py", "a") as f:
        f.write("\n\ndef _planted():\n    from dask_redist.graph.optimize import rewrite  # noqa\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    with pytest.raises(AssertionError, match="dask_redist.planning.geometry -> dask_redist.graph.optimize"):
        test_layers_import_downward_only()
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycle()
    (copy / "planning" / "geometry.py").write_text((ROOT / "planning" / "geometry.py").read_text())
    with open(copy / "core" / "wire.py", "a") as f:  # upward, through strings only
        f.write('\n\nimport importlib\n_X = importlib.import_module("dask_redist.runtime.worker")\n')
    with pytest.raises(AssertionError, match="dask_redist.core.wire -> dask_redist.runtime.worker"):
        test_layers_import_downward_only()
    with open(copy / "engines" / "dask.py", "a") as f:  # another engine's internals
        f.write("\n\ndef _planted():\n    from dask_redist.engines.cufftmp.host import HostLink  # noqa\n")
    with open(copy / "runtime" / "staging.py", "a") as f:  # a specific engine, by its path
        f.write('\n\nENGINE = "dask_redist.engines.dask:DaskEngine"\n')
    with pytest.raises(AssertionError, match="engines.dask -> dask_redist.engines.cufftmp.host") as info:
        test_engines_do_not_import_each_other_and_nothing_else_imports_a_specific_engine()
    assert "dask_redist.runtime.staging -> dask_redist.engines.dask" in str(info.value)


@pytest.mark.parametrize("heavy", ["dask_redist.bench", "rich"])
def test_importing_the_package_leaves_out(heavy):
    code = f"import sys, dask_redist; sys.exit({heavy!r} in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0, (
        f"import dask_redist imports {heavy}"
    )
