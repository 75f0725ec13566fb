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
    {"dask_redist.config", "dask_redist.checks", "dask_redist.errors", "dask_redist.compat"},
    {"dask_redist.planning"},
    {"dask_redist.core"},
    {"dask_redist.engines"},
    {"dask_redist.runtime"},
    {"dask_redist.graph"},
    {"dask_redist.report", "dask_redist.submissions"},
    {
        "dask_redist",
        "dask_redist.api",
        "dask_redist.cluster",
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
ENGINE_ROOMS = ("dask_redist.engines.dask", "dask_redist.engines.cufftmp", "dask_redist.engines.hybrid")
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


def _strings(node) -> list[str]:
    """The string constants of ``node``, or of the tuple, list or set it is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in _strings(e)]
    return []


def _engine_names_used(tree) -> list[tuple[int, str]]:
    """(line, string) of every string used where code names an engine: compared (``engine ==
    "x"``, ``engine in ("auto", "x")``), returned (``return "x", why``), given as an engine
    (``engine="x"``, ``engine_stats(client, "x")``, ``engine = "x"``) or looked up in an
    engine's table (``engines["x"]``). "dask" elsewhere names Dask, the package or its rechunk."""
    found = []
    for node in ast.walk(tree):
        texts = []
        if isinstance(node, ast.Compare):
            texts = [v for operand in [node.left, *node.comparators] for v in _strings(operand)]
        elif isinstance(node, ast.Return) and node.value is not None:
            texts = _strings(node.value)
        elif isinstance(node, ast.keyword) and node.arg and "engine" in node.arg:
            texts = _strings(node.value)
        elif isinstance(node, ast.Call) and "engine" in ast.unparse(node.func).lower():
            texts = [v for a in node.args for v in _strings(a)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            texts = _strings(node.value) if any("engine" in ast.unparse(t).lower() for t in targets) else []
        elif isinstance(node, ast.Subscript) and "engine" in ast.unparse(node.value).lower():
            texts = _strings(node.slice)
        found += [(node.lineno, t) for t in texts]
    return found


def engine_names_outside_their_engine() -> list[str]:
    """``module:line "name"`` wherever a built-in engine's name is used as one outside that
    engine's own modules (the registry of built-ins is redist.yaml, read by ``config``)."""
    from dask_redist.config import BUILTIN_ENGINES

    rooms = {name: path.partition(":")[0] for name, path in BUILTIN_ENGINES}
    out = []
    for module, path in sorted(_modules().items()):
        for line, text in _engine_names_used(ast.parse(path.read_text())):
            room = rooms.get(text)
            if room is not None and not (module == room or module.startswith(room + ".")):
                out.append(f'{module}:{line} "{text}"')
    return out


def test_no_engine_is_named_outside_its_own_modules():
    """Shared code asks an engine's description (what it supports, where runs recover, its
    wording) and the registry; only an engine's own modules and redist.yaml name it."""
    from dask_redist.config import BUILTIN_ENGINES

    assert set(dict(BUILTIN_ENGINES)) == {"dask", "cufftmp", "hybrid"}  # (the names the check looks for)
    named = engine_names_outside_their_engine()
    assert named == [], "engines named outside their own modules: " + ", ".join(named)


def test_the_engine_name_check_finds_a_planted_name(tmp_path, monkeypatch):
    """The check above can fail: engine names planted in a copy, as the shared layers once named
    them (a comparison, a recovery engine returned, a keyword), are found; its own engine's
    name in an engine's module is not."""
    import shutil

    copy = tmp_path / "dask_redist"
    shutil.copytree(ROOT, copy)
    with open(copy / "core" / "spec.py", "a") as f:
        f.write('\n\ndef _planted(engine, kind):\n    return engine != "cufftmp" or kind != "cupy"\n')
    with open(copy / "engines" / "cufftmp" / "description.py", "a") as f:  # another engine's name
        f.write('\n\ndef _recovers_on():\n    return "dask", "the world lost a worker"\n')
    with open(copy / "bench" / "micro.py", "a") as f:
        f.write('\n\ndef _planted(enable):\n    return enable(engine="dask") and enable(engine="cufftmp")\n')
    with open(copy / "engines" / "dask.py", "a") as f:  # its own name: allowed
        f.write('\n\ndef _planted(settings):\n    return settings.engine == "dask"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    named = engine_names_outside_their_engine()
    assert [n.split(":")[0] + " " + n.split()[-1] for n in named] == [
        'dask_redist.bench.micro "dask"',
        'dask_redist.bench.micro "cufftmp"',
        'dask_redist.core.spec "cufftmp"',
        'dask_redist.engines.cufftmp.description "dask"',
    ]
    with pytest.raises(AssertionError, match='dask_redist.core.spec:[0-9]+ "cufftmp"'):
        test_no_engine_is_named_outside_its_own_modules()


def _design_table() -> dict[str, str]:
    """docs/design.md's module table: each first-column name (relative to dask_redist) -> its row."""
    text = (ROOT.parent / "docs" / "design.md").read_text()
    table = text[text.index("| module | what it owns |") :].split("\n\n")[0].splitlines()[2:]
    return {name: row for row in table for name in re.findall(r"`([\w.*]+)`", row.split("|")[1])}


def _unmapped(table: dict[str, str]) -> list[str]:
    """Modules of the package that the table names nowhere: neither in its first column (``pkg.*``
    covers a package), nor as a `` `submodule` `` in its package's row; packages are named by
    their package row or the layer diagram."""
    out = []
    for module in sorted(_modules()):
        rel = module.removeprefix("dask_redist").removeprefix(".")
        if not rel or rel in table or (ROOT / rel.replace(".", "/") / "__init__.py").exists():
            continue
        package, _, last = rel.rpartition(".")
        if f"{package}.*" in table or (package in table and f"`{last}`" in table[package]):
            continue
        out.append(rel)
    return out


def test_design_md_maps_every_module_and_only_modules():
    """docs/design.md's table is the one index of the modules (package docstrings are one line):
    every module is in it, and everything in it is a module."""
    table = _design_table()
    assert _unmapped(table) == [], "modules docs/design.md does not map"
    real = {m.removeprefix("dask_redist").removeprefix(".") for m in _modules()} | {"__init__"}
    assert [n for n in table if n.rstrip(".*") not in real] == [], "rows of docs/design.md naming no module"
    long = [
        m
        for m, p in _modules().items()
        if p.name == "__init__.py" and len(ast.get_docstring(ast.parse(p.read_text())).splitlines()) != 1
    ]
    assert long == [], "package docstrings of more than one line (docs/design.md is the index)"
    table.pop("engines.exchange")
    assert _unmapped(table) == ["engines.exchange"]  # (the check finds a module left out)


@pytest.mark.parametrize("heavy", ["dask_redist.bench", "rich"])
def test_importing_the_package_leaves_out(heavy):
    code = f"import sys, dask_redist; sys.exit({heavy!r} in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0, (
        f"import dask_redist imports {heavy}"
    )
