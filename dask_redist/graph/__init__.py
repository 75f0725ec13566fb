"""The collective in dask graphs: find ``x.rechunk(...)``, build its tasks instead."""
