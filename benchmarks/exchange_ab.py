"""The dask engine's exchange before and after issue 40's fix, alternating in one cluster (A B A B).

A: every message up to ``redist.memory-budget`` (one 67 MiB message per peer at 256 MiB, 16
slabs), packed into fresh memory; B: messages at most the TCP shard size, packed into kept
buffers (`dask_redist.core.wire.SendBuffers`). Each run gets an input of its own (no key is
reused), and reports its wall time, "start sent" to the last "executed", the CPU time of both
worker processes over the run (robust to other work on the machine: a slow first touch of
memory shows as CPU time, waiting for a core does not), and per worker the wall and thread CPU
time of packing, sending and cutting the output chunks.

    python benchmarks/exchange_ab.py --size 256MiB --chunks 16 --reps 16 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

PHASES = ("pack", "transport.send", "_cut_outputs")


def install(dask_worker=None):
    """Wrap the engine's phases to record (phase, wall s, thread CPU s) in this worker process."""
    import dask_redist.engines.dask as de
    import dask_redist.engines.exchange as ex
    from dask_redist.runtime import transport

    if hasattr(de, "_ab_events"):
        return
    de._ab_events = []

    def timed(f, name):
        def g(*args, **kwargs):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return f(*args, **kwargs)
            finally:
                de._ab_events.append((name, time.perf_counter() - t, time.thread_time() - c))

        return g

    ex.pack = timed(ex.pack, "pack")  # (the packing of `exchange.send_pieces`)
    de.DaskEngine._cut_outputs = staticmethod(timed(de.DaskEngine._cut_outputs, "_cut_outputs"))
    transport.CommsTransport.send = timed(transport.CommsTransport.send, "transport.send")
    ex._real = (ex.wire_limit, ex._send_buffers)


def mode(which, dask_worker=None):
    import dask_redist.engines.exchange as ex

    if which == "A":  # as before: no limit but the budget, fresh buffers
        ex.wire_limit, ex._send_buffers = (lambda transport, dst: None), ex.SendBuffers(0)
    else:
        ex.wire_limit, ex._send_buffers = ex._real


def take(dask_worker=None):
    import dask_redist.engines.dask as de

    out = {}
    for name, wall, cpu in de._ab_events:
        w, c = out.get(name, (0.0, 0.0))
        out[name] = (w + wall * 1e3, c + cpu * 1e3)
    de._ab_events.clear()
    return out


def main():
    from distributed import Client, LocalCluster, wait

    import dask_redist
    from dask_redist.bench.cases import placed_array, slab_case
    from dask_redist.bench.harness import timeline

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="256MiB")
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--reps", type=int, default=16)
    p.add_argument("--out")
    args = p.parse_args()
    cluster = LocalCluster(n_workers=2, processes=True, dashboard_address=":0", silence_logs=logging.CRITICAL)
    client = Client(cluster)
    client.wait_for_workers(2)
    client.run(install)
    case = slab_case(args.size, args.chunks)
    res = {"A": [], "B": []}
    dask_redist.enable(engine="dask")
    for rep in range(args.reps + 1):  # (rep 0: warm-up)
        for side in "AB":
            client.run(mode, side)
            x = placed_array(client, case, 1000 * (rep + 1) + ord(side))
            cpu0 = client.run(time.process_time)
            client.run(take)
            start = time.perf_counter()
            y = x.rechunk(case.new).persist()
            wait(y)
            wall = (time.perf_counter() - start) * 1e3
            cpu = sum(client.run(time.process_time).values()) * 1e3 - sum(cpu0.values()) * 1e3
            marks = {e: t for t, e in timeline(client, start)}
            executed = max(t for e, t in marks.items() if e.endswith(": executed"))
            phases = list(client.run(take).values())
            if rep:
                res[side].append((wall, executed - marks["scheduler: start sent"], cpu, phases))
                print(
                    f"{rep:3d} {side} wall {wall:6.0f} exec {res[side][-1][1]:6.0f} cpu {cpu:6.0f}",
                    flush=True,
                )
            del x, y
    for side, runs in res.items():
        print(
            f"{side}: medians wall {statistics.median(r[0] for r in runs):.0f} ms, start sent -> executed "
            f"{statistics.median(r[1] for r in runs):.0f} ms, CPU of both workers {statistics.median(r[2] for r in runs):.0f} ms"
        )
        for name in PHASES:
            walls = [w[name][0] for r in runs for w in r[3] if name in w]
            cpus = [w[name][1] for r in runs for w in r[3] if name in w]
            print(
                f"  {name:15} per worker: wall median {statistics.median(walls):.0f} max {max(walls):.0f} ms, "
                f"CPU median {statistics.median(cpus):.0f} max {max(cpus):.0f} ms, CPU > 150 ms in "
                f"{sum(c > 150 for c in cpus)} of {len(cpus)}"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f)
    client.close()
    cluster.close()


if __name__ == "__main__":
    main()
