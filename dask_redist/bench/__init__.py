"""``dask-redist bench``: every rechunk method, timed on the same placed input, every result checked."""

from dask_redist.bench.cases import (
    FAST,
    HEADLINE,
    METHODS,
    Case,
    check,
    contiguous,
    expected_block,
    four_d_case,
    gpu_suite,
    line_case,
    pencil_case,
    placed_array,
    slab_case,
    uneven_case,
)
from dask_redist.bench.harness import (
    Result,
    crossing_bytes,
    engine_stats,
    environment,
    run_case,
    timeline,
)
from dask_redist.bench.floor import relate_to_floor
from dask_redist.bench.results import load_json, markdown, to_json
from dask_redist.bench.micro import fixed_cost, rewrite_time

__all__ = [
    "FAST",
    "HEADLINE",
    "METHODS",
    "Case",
    "Result",
    "check",
    "contiguous",
    "crossing_bytes",
    "engine_stats",
    "environment",
    "expected_block",
    "fixed_cost",
    "four_d_case",
    "gpu_suite",
    "line_case",
    "load_json",
    "markdown",
    "pencil_case",
    "placed_array",
    "relate_to_floor",
    "rewrite_time",
    "run_case",
    "slab_case",
    "timeline",
    "to_json",
    "uneven_case",
]
