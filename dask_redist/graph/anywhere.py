"""A collective that computes on any scheduler (`CollectiveOrDask`).

A graph holding the collective's tasks (`graph.layer.collective_tasks`) runs only on a
distributed cluster: its stage tasks keep chunks in the workers' collective state. A graph
built while a distributed Client is the default may still be computed elsewhere
(``compute(scheduler="sync")``, as dask's ``assert_eq`` does). `CollectiveOrDask` holds both
forms of one rechunk (or distributed FFT) under the same output keys and hands out the
collective's tasks where a distributed scheduler materializes the graph
(`graph.optimize.running_on_scheduler`), Dask's tasks anywhere else.
"""

from __future__ import annotations

from dask import core
from dask.base import clone_key
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import Alias
from dask_redist.graph.layer import CollectiveLayer, clone_collective
from dask_redist.graph.lazy import clone_tasks
from dask_redist.graph.optimize import running_on_scheduler


class CollectiveOrDask(CollectiveLayer):
    """The tasks of a collective rechunk (``collective``) or of Dask's rechunk (``local``: every
    step's tasks, one output layer), whichever the scheduler materializing the graph can run.
    A `CollectiveLayer`: the graph rewrite and ``explain`` take it for the collective it is."""

    def __init__(self, collective: dict, local, output_keys, collection_annotations=None):
        super().__init__(collective, collection_annotations=collection_annotations)
        self._local = local  # (Dask's tasks, or a function giving them: `LocalTasks`)
        self.output_keys = frozenset(output_keys)

    @property
    def local(self) -> dict:
        """Dask's tasks, built the first time they are read (a distributed scheduler never does)."""
        if not isinstance(self._local, dict):
            self._local = self._local()
        return self._local

    def __repr__(self) -> str:
        return f"CollectiveOrDask<{len(self.output_keys)} output chunks>"

    def is_materialized(self) -> bool:
        return False

    def get_output_keys(self):
        return self.output_keys

    @property
    def _dict(self) -> dict:
        return self.mapping if running_on_scheduler() else self.local

    def __contains__(self, key) -> bool:
        return key in self._dict

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def clone(self, keys: set, seed, bind_to=None) -> tuple[CollectiveOrDask, bool]:
        """``dask.graph_manipulation``'s clone: both forms cloned, the collective as a rechunk of
        its own (`graph.layer.clone_collective`), Dask's tasks as `graph.lazy.clone_tasks` does."""
        collective = clone_collective(self.mapping, keys, seed, bind_to)
        local, bound = clone_tasks(self.local, keys, seed, bind_to)
        outputs = {clone_key(k, seed) for k in self.output_keys}
        return CollectiveOrDask(collective, local, outputs, self.collection_annotations), bound


class LocalTasks:
    """The tasks of Dask's form of the collective ``name``, from ``build()`` (a dask array of the
    same chunks), its layers in ``known`` (the collective's graph) left out: called where they are
    first read, so a graph that only ever runs on a distributed cluster never builds them. It
    pickles as what builds them (``build``: a module's function, or a ``functools.partial`` of one)."""

    def __init__(self, name: str, chunks, known, build):
        self.name, self.chunks, self.known, self.build = name, chunks, frozenset(known), build

    def __call__(self) -> dict:
        fallback = self.build()
        if fallback.chunks != self.chunks:
            raise ValueError(f"{self.name}: Dask's form {fallback.name} has other chunks")
        theirs = fallback.dask
        own = [n for n in theirs.layers if n not in self.known or n == self.name]
        tasks = {k: v for n in own for k, v in theirs.layers[n].items()}
        if fallback.name != self.name:
            for key in core.flatten(fallback.__dask_keys__()):
                tasks[(self.name, *key[1:])] = Alias((self.name, *key[1:]), key)
        return tasks


def collective_or_dask(collective, fallback):
    """The dask array ``collective`` (a `CollectiveLayer` as output layer: ``dask_redist.rechunk``,
    a distributed FFT) with that layer a `CollectiveOrDask` whose other form is ``fallback()``'s
    tasks (built where first read: `LocalTasks`): the same result, the same chunks, from the same
    input, by Dask (under another name, its chunks are aliased to the collective's output keys)."""
    from dask.array import Array

    name = collective.name
    graph = collective.dask
    layer = graph.layers[name]
    if not isinstance(layer, CollectiveLayer):
        raise ValueError(f"{name}: not a collective")
    local = LocalTasks(name, collective.chunks, graph.layers, fallback)
    either = CollectiveOrDask(dict(layer), local, layer.get_output_keys(), layer.collection_annotations)
    layers = {**graph.layers, name: either}
    return Array(HighLevelGraph(layers, graph.dependencies), name, collective.chunks, meta=collective._meta)
