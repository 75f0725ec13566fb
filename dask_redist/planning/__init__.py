"""Pure planning of a collective rechunk: which bytes go where, and how a transport lays them out.

Nothing here imports dask, distributed, the runtime or a GPU library: it is NumPy on
chunk tuples, property-tested on its own (tests/test_plan.py, tests/test_layout.py,
against byte-level simulators), and runs the same on the client (``explain``), the
scheduler (choosing owners) and every worker (each rank derives its share locally).

* `geometry`: chunk grids, chunk boxes, flat <-> N-D chunk indices;
* `plan`: pieces, owners of the output chunks, the traffic (`make_plan`);
* `layout`: a plan as cuFFTMp reshape boxes (direct or packed) in rounds.
"""

from dask_redist.planning.geometry import Chunks, PlanError, RechunkSpec, flat_index
from dask_redist.planning.plan import Plan, Transfers, make_plan

__all__ = ["Chunks", "Plan", "PlanError", "RechunkSpec", "Transfers", "flat_index", "make_plan"]
