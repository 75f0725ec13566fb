"""The collective inside a running Dask cluster: the scheduler plugin, the worker plugin, the tasks."""
