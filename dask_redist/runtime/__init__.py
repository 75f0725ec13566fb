"""The collective inside a running Dask cluster: the scheduler plugin, the worker plugin, the tasks.

Scheduler side: `scheduler` (the plugin's handlers and hooks), `rechunks` (each rechunk's
state across its runs, and the restarts it decides), `rendezvous` (the all-gather NVSHMEM
bootstraps through), `ordering` (task priorities in linear time). Worker side: `worker`
(the plugin and the worker's runs), `staging` (staged chunks), `collective` (the collective
thread, failure reports, the watchdog), `transport` (Dask comms and the scheduler, as an
engine's `Transport`). `tasks`: what the graph's tasks run. The plugins share only
`dask_redist.core`; neither imports the other (`tasks` brings them together).
"""
