"""Dask's ``tasks`` rechunk, its steps built only when someone reads their tasks.

``x.rechunk(new)`` builds every step of Dask's plan as a layer of tasks: a split task per
piece and a merge task per new chunk, thousands of Python objects at a few thousand chunks,
which the client then packs and the scheduler unpacks. When the collective takes the
rechunk, the graph rewrite (`dask_redist.graph.optimize`) throws those layers away unread.

While dask-redist is enabled, each step is a `LazyRechunkStep` instead: the same layer name
and output keys, computed the way Dask computes them, and the tasks of Dask's own step
(``dask.array.rechunk._compute_rechunk``) built the first time anything reads them. The
rewrite reads only the names, chunks and annotations; where it keeps Dask's rechunk, or
the graph runs without the rewrite (a local scheduler, ``optimize_graph=False``), dask's
own culling reads the tasks and gets exactly Dask's. Nothing a user sees changes: keys,
chunks, dependencies and tasks are Dask's (tests/test_lazy.py compares them).
"""

from __future__ import annotations

import math

import numpy as np
from dask.array import Array
from dask.base import clone_key, tokenize
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer

from dask_redist.compat import Alias, Task, TaskRef, original_rechunk_step


class LazyRechunkStep(Layer):
    """One step of Dask's ``tasks`` rechunk of ``input_name`` from ``old`` to ``new`` chunks."""

    def __init__(
        self,
        name: str,
        input_name: str,
        old,
        new,
        dtype,
        annotations=None,
        collection_annotations=None,
        dask_name: str | None = None,
    ):
        super().__init__(annotations=annotations, collection_annotations=collection_annotations)
        self.name, self.input_name = name, input_name
        self.dask_name = dask_name or name  # (Dask's name for it: `graph.names` may give it another)
        self.old, self.new, self.dtype = old, new, np.dtype(dtype)
        self._cached: dict | None = None

    def renamed(self, name: str) -> LazyRechunkStep:
        """The same step, its output keys ``(name, ...)`` (`dask_redist.graph.names`)."""
        return LazyRechunkStep(
            name, self.input_name, self.old, self.new, self.dtype, self.annotations, dask_name=self.dask_name
        )

    def __repr__(self) -> str:
        return f"LazyRechunkStep<name='{self.name}', {len(self.old)}-d>"

    def __getstate__(self):
        return {**self.__dict__, "_cached": None}  # (the tasks are rebuilt where they are read)

    def is_materialized(self) -> bool:
        return self._cached is not None

    def get_output_keys(self):
        if self._cached is not None:
            return self._cached.keys()
        return {(self.name, *map(int, i)) for i in np.ndindex(*map(len, self.new))}

    @property
    def _dict(self) -> dict:
        if self._cached is None:
            step = dask_step(self.input_name, self.old, self.new, self.dtype)
            if step.name != self.dask_name:  # pragma: no cover - only if dask changed how it names steps
                raise RuntimeError(
                    f"dask named a rechunk step {step.name}, expected {self.dask_name}: see dask_redist.compat"
                )
            self._cached = renamed_tasks(step.dask.layers[step.name], step.name, self.name)
        return self._cached

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def clone(self, keys: set, seed, bind_to=None) -> tuple[MaterializedLayer, bool]:
        """``dask.graph_manipulation``'s clone of this step (`clone_tasks`): Dask's tasks under the
        cloned keys, its annotations kept."""
        return ClonedRechunkStep.of(self, self._dict, self.old, keys, seed, bind_to)


class ClonedRechunkStep(MaterializedLayer):
    """A clone of a rechunk step (`LazyRechunkStep.clone`, `graph.p2p.OwnP2PRechunkLayer.clone`):
    Dask's tasks under the cloned keys, and the step's input chunks, ``chunks_input`` (read as a
    p2p layer's are, `graph.optimize.input_chunks`): the cloned input layer has lost its
    annotations, so the graph rewrite learns them here and the collective can take the clone too."""

    chunks_input: tuple = ()

    @classmethod
    def of(cls, layer, tasks: dict, chunks_input, keys, seed, bind_to=None) -> tuple[ClonedRechunkStep, bool]:
        """The clone of ``layer``, a rechunk step from ``chunks_input`` whose tasks are ``tasks``
        (`clone_tasks`), its annotations kept; and whether any task was bound to ``bind_to``."""
        cloned, bound = clone_tasks(tasks, keys, seed, bind_to)
        step = cls(cloned, layer.annotations, layer.collection_annotations)
        step.chunks_input = chunks_input
        return step, bound


def dask_step(input_name: str, old, new, dtype) -> Array:
    """Dask's own step of its ``tasks`` rechunk from ``old`` to ``new`` chunks of the array named
    ``input_name`` (built on a stand-in of it: its tasks refer to the input's keys only)."""
    meta = np.empty((0,) * len(old), dtype=dtype)
    stand_in = Array(HighLevelGraph.from_collections(input_name, {}, ()), input_name, old, meta=meta)
    return original_rechunk_step(stand_in, new)


def clone_tasks(tasks: dict, keys, seed, bind_to=None) -> tuple[dict, bool]:
    """A layer's ``tasks`` as ``dask.graph_manipulation`` clones them (``Layer.clone``): every
    task of the layer under ``clone_key(key, seed)``, its references to ``keys`` and to the
    layer's own keys (the split steps, which ``keys`` does not list) cloned too, and the tasks
    that reference none of them (leaves) bound to ``bind_to`` (``bind``, ``wait_on``).

    Dask's generic ``Layer.clone`` substitutes keys in tuple tasks only: a clone of a layer of
    ``Task`` objects, such as Dask's rechunk, keeps pointing at the original's keys, which no
    longer exist once the original's rechunk is rewritten into the collective (or were never
    computed). Returns the tasks and whether any was bound."""
    from dask.graph_manipulation import chunks

    subs = {key: clone_key(key, seed) for key in tasks}
    for task in tasks.values():
        subs.update(
            {dep: clone_key(dep, seed) for dep in task.dependencies if dep not in subs and dep in keys}
        )
    cloned, bound = {}, False
    for key, task in tasks.items():
        new = task.substitute(subs, key=subs[key])
        if bind_to is not None and not task.dependencies & subs.keys():
            new, bound = Task(subs[key], chunks.bind, new, TaskRef(bind_to)), True
        cloned[subs[key]] = new
    return cloned, bound


def renamed_tasks(tasks, old: str, new: str) -> dict:
    """``tasks``, those keyed ``(old, ...)`` keyed ``(new, ...)`` (nothing in a rechunk step refers
    to its own output keys)."""
    if old == new:
        return dict(tasks)
    out = {}
    for key, task in dict(tasks).items():
        if isinstance(key, tuple) and key[0] == old:
            key = (new, *key[1:])
            # (dask's `Alias.substitute` keeps its key where nothing is substituted: an output
            # chunk that is one input chunk as it is, an alias of it)
            task = Alias(key, task.target) if isinstance(task, Alias) else task.substitute({}, key=key)
        out[key] = task
    return out


def lazy_rechunk_step(x: Array, chunks) -> Array:
    """What ``dask.array.rechunk._compute_rechunk(x, chunks)`` returns, its layer a `LazyRechunkStep`
    (Dask's own where the layer could not be named the same way: empty or unknown-size chunks)."""
    if x.size == 0 or any(math.isnan(c) for axis in (*x.chunks, *chunks) for c in axis):
        return original_rechunk_step(x, chunks)
    name = f"rechunk-merge-{tokenize(x, chunks)}"  # (as _compute_rechunk names it)
    layer = LazyRechunkStep(name, x.name, x.chunks, chunks, x.dtype)
    return Array(HighLevelGraph.from_collections(name, layer, dependencies=[x]), name, chunks, meta=x)
