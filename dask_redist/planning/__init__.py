"""Planning a collective rechunk: which bytes go where, and how a transport lays them out."""

from dask_redist.planning.geometry import Chunks, PlanError, RechunkSpec, flat_index
from dask_redist.planning.plan import Plan, Transfers, make_plan

__all__ = ["Chunks", "Plan", "PlanError", "RechunkSpec", "Transfers", "flat_index", "make_plan"]
