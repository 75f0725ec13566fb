"""The types every process of a collective shares, below the engines and both plugins.

* `spec`: one collective rechunk (`CollectiveSpec`), one run of it (`RunSpec`), the
  stage markers, the task classes and key prefixes;
* `run`: one rank's state in one run (`WorkerRun`), what an engine executes;
* `wire`: the packed buffers pieces travel in between ranks;
* `assemble`: cutting pieces out of chunks and building output chunks from pieces.

Nothing here knows of the cluster: the runtime (dask_redist.runtime) injects the
transport, so engines and runs are tested in one process with a fake one.
"""
