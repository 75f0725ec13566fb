"""distributed's p2p rechunk under a name of the collective's own (`graph.names`), which clones.

``P2PRechunkLayer`` has no ``clone`` of its own: dask's generic ``Layer.clone`` builds its
transfer, barrier and unpack tasks and substitutes keys in tuple tasks only, so the clone's
``Task`` objects still point at the original's keys (``dask.graph_manipulation``'s ``clone`` and
``bind`` then fail with "lost dependencies", or "Cannot fuse tasks with multiple outputs" where
a consumer is fused with it; in Dask alone too, dask#12455), and its shuffle's token, which names
the run, would be the original's. `OwnP2PRechunkLayer.clone` is Dask's ``tasks`` rechunk of the
cloned input (`graph.lazy.dask_step`) under the cloned keys, its references cloned too
(`graph.lazy.clone_tasks`): the original's values, computed alone or beside it. ``clone_key``
names it ``rechunk-<token>``, no name of Dask's rechunk layers: as a `graph.lazy.ClonedRechunkStep`
with the input's chunks the rewrite knows it for one, and the collective takes it like any other.
"""

from __future__ import annotations

import numpy as np

from dask_redist.compat import P2PRechunkLayer, p2p_layer_fields
from dask_redist.graph.lazy import ClonedRechunkStep, dask_step, renamed_tasks


class OwnP2PRechunkLayer(P2PRechunkLayer):
    """distributed's ``P2PRechunkLayer``, named by `graph.names`, that culls into its own kind and
    clones into Dask's ``tasks`` rechunk (module docstring)."""

    def _cull(self, keepmap: np.ndarray) -> OwnP2PRechunkLayer:
        return OwnP2PRechunkLayer(**{**p2p_layer_fields(self, self.name), "keepmap": keepmap})

    def clone(self, keys: set, seed, bind_to=None) -> tuple[ClonedRechunkStep, bool]:
        # (any dtype: none of the step's tasks holds it)
        step = dask_step(self.name_input, self.chunks_input, self.chunks, np.float64)
        tasks = renamed_tasks(step.dask.layers[step.name], step.name, self.name)
        return ClonedRechunkStep.of(self, tasks, self.chunks_input, keys, seed, bind_to)
