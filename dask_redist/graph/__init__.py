"""The collective in dask graphs: find ``x.rechunk(...)``, build its tasks instead.

* `optimize`: the ``array_optimize`` hook (`CollectiveOptimizer`) and the rewrite of
  rechunk layer chains, with the reason an array keeps dask's rechunk;
* `expr`: the same for dask's expression mode, at lowering time;
* `layer`: the stage, barrier and unpack tasks of one collective rechunk.
"""
