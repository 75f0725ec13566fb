"""The collective's own output names: never Dask's keys with another task behind them.

Dask names a rechunk's output after its input and chunks only (``rechunk-merge-<token>``,
``rechunk-p2p-<token>``), whatever runs. Were the collective to keep that name, the same rechunk
run by Dask (``method="p2p"``, or before `dask_redist.enable`) and by the collective would be one
key with two tasks: distributed warns of a different ``run_spec`` and hands the one result held
to both, so the collective never runs. So while enabled, a rechunk the collective may take gets
a name of its own when it is built (`own_name`): the same prefix with ``redist-`` and a token
of Dask's name and the ``redist.*`` settings (other settings, other keys). Everything
downstream is built on the renamed array, so it refers to the new keys; where the graph
rewrite keeps Dask's rechunk, Dask's tasks run under that name.
"""

from __future__ import annotations

from dask.array import Array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from dask_redist.compat import P2P_PREFIX, RECHUNK_PREFIXES, meta_of, p2p_layer_fields
from dask_redist.config import ConfigError, Settings
from dask_redist.graph.lazy import LazyRechunkStep, renamed_tasks
from dask_redist.graph.p2p import OwnP2PRechunkLayer

MERGE_PREFIX = "rechunk-merge-"
OWN = "redist-"


def is_own(name: str) -> bool:
    """Is ``name`` a rechunk output named by `own_name`?"""
    return isinstance(name, str) and name.startswith((P2P_PREFIX + OWN, MERGE_PREFIX + OWN))


def new_name(name: str, settings: Settings) -> str:
    prefix = P2P_PREFIX if name.startswith(P2P_PREFIX) else MERGE_PREFIX
    return f"{prefix}{OWN}{tokenize(name, settings)}"


def _renamed_layer(layer, old: str, new: str):
    if isinstance(layer, LazyRechunkStep):
        return layer.renamed(new)
    fields = p2p_layer_fields(layer, new)
    if fields is not None:
        return OwnP2PRechunkLayer(**fields)
    return MaterializedLayer(renamed_tasks(layer, old, new))


def _settings_now() -> Settings:
    """The settings of this moment; a bad one is raised where the graph is submitted, with its key
    (`dask_redist.api.snapshot`), not by ``x.rechunk``: the packaged defaults name it meanwhile."""
    try:
        return Settings.from_config()
    except ConfigError:
        return Settings()


def own_name(y: Array, settings: Settings | None = None) -> Array:
    """``y`` (a rechunk's output) under a name of the collective's own (module docstring); ``y``
    itself where it already has one, or is no rechunk of Dask's."""
    graph = y.__dask_graph__()
    if is_own(y.name) or not y.name.startswith(RECHUNK_PREFIXES) or not hasattr(graph, "layers"):
        return y
    new = new_name(y.name, settings or _settings_now())
    layer = graph.layers[y.name]
    renamed = _renamed_layer(layer, y.name, new)
    renamed.collection_annotations = dict(layer.collection_annotations or {})
    layers = {k: v for k, v in graph.layers.items() if k != y.name}
    deps = {k: set(v) for k, v in graph.dependencies.items() if k != y.name}
    layers[new], deps[new] = renamed, set(graph.dependencies[y.name])
    return Array(HighLevelGraph(layers, deps), new, y.chunks, meta=meta_of(y))
