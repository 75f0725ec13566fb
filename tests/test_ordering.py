"""The linear-time ordering of graphs that hold a collective barrier."""

import dask.order
from dask._task_spec import Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.runtime import ordering
from dask_redist.core.spec import BarrierTask


def _f(*args):
    return None


def collective_graph(n: int) -> dict:
    """n input chunks on 2 workers -> 2 stage tasks -> barrier -> n unpacks -> n downstream tasks."""
    dsk = {
        ("stage", w): Task(("stage", w), _f, *[TaskRef(("in", i)) for i in range(w, n, 2)]) for w in range(2)
    }
    dsk["barrier"] = BarrierTask("barrier", _f, TaskRef(("stage", 0)), TaskRef(("stage", 1)), spec=None)
    for j in range(n):
        dsk[("out", j)] = Task(("out", j), _f, TaskRef("barrier"))
        dsk[("fft", j)] = Task(("fft", j), _f, TaskRef(("out", j)))
    return dsk


def test_cut_order_covers_the_same_keys_and_keeps_downstream_depth_first():
    dsk = collective_graph(64)
    got = ordering.wrap(dask.order.order)(dsk)
    assert set(got) == set(dask.order.order(dsk))
    # each output chunk's consumer runs right after it, as dask orders it without the barrier
    assert all(got[("fft", j)] == got[("out", j)] + 1 for j in range(64))
    assert dsk["barrier"].dependencies == {("stage", 0), ("stage", 1)}  # the real graph is untouched


def test_walks_once_per_root_not_once_per_root_and_leaf(monkeypatch):
    """dask.order visits each (root, reachable leaf) pair; with the barrier cut, no root reaches an output."""
    dsk = collective_graph(200)
    seen = {}

    def spy(graph, dependencies=None, **kwargs):
        seen["barrier deps"] = graph["barrier"].dependencies
        return {k: i for i, k in enumerate(graph)}

    ordering.wrap(spy)(dsk)
    assert seen["barrier deps"] == set()


def test_graphs_without_a_barrier_go_to_dask_unchanged():
    dsk = {"a": Task("a", _f), "b": Task("b", _f, TaskRef("a"))}
    calls = []
    ordering.wrap(lambda g, d=None, **k: calls.append(g) or {})(dsk)
    assert calls == [dsk]


def test_install_is_idempotent(monkeypatch):
    monkeypatch.setattr(dask.order, "order", dask.order.order)
    ordering.install()
    first = dask.order.order
    ordering.install()
    assert dask.order.order is first and hasattr(first, "redist_wrapped")


@given(
    n_in=st.integers(1, 40),
    n_workers=st.integers(1, 4),
    n_out=st.integers(1, 40),
    downstream=st.lists(st.integers(0, 39), max_size=20),
    collectives=st.integers(1, 3),
)
@settings(max_examples=60, deadline=None)
def test_any_graph_with_barriers_gets_a_priority_for_every_task(
    n_in, n_workers, n_out, downstream, collectives
):
    """Chains of collectives (each one's outputs feed the next one's stages), with extra consumers."""
    dsk: dict = {}
    previous = [("in", i) for i in range(n_in)]  # external keys, as for a persisted input
    for c in range(collectives):
        stages = []
        for w in range(n_workers):
            refs = [TaskRef(k) for k in previous[w::n_workers]]
            if refs:
                dsk[(f"stage{c}", w)] = Task((f"stage{c}", w), _f, *refs)
                stages.append(TaskRef((f"stage{c}", w)))
        dsk[f"barrier{c}"] = BarrierTask(f"barrier{c}", _f, *stages, spec=None)
        previous = [(f"out{c}", j) for j in range(n_out)]
        for key in previous:
            dsk[key] = Task(key, _f, TaskRef(f"barrier{c}"))
    for i, j in enumerate(downstream):
        dsk[("sum", i)] = Task(("sum", i), _f, TaskRef(previous[j % n_out]), TaskRef(previous[0]))
    got = ordering.wrap(dask.order.order)(dsk)
    assert set(got) == set(dsk)
    assert sorted(got.values()) == list(range(len(dsk)))


@given(
    n_in=st.integers(1, 30), n_out=st.integers(1, 30), collectives=st.integers(1, 3), grouped=st.booleans()
)
@settings(max_examples=40, deadline=None)
def test_a_graph_of_collective_tasks_only_is_ordered_without_dask(n_in, n_out, collectives, grouped):
    """Stage, barrier and unpack tasks only (a persisted input's rechunks): priorities in one pass,
    every task after its dependencies, dask's order not called."""
    from dask_redist.core.spec import CollectiveTask

    dsk: dict = {}
    previous = [("in", i) for i in range(n_in)]
    for c in range(collectives):
        parts = [previous[w::2] for w in range(2)] if grouped else [[k] for k in previous]
        stages = []
        for w, part in enumerate(p for p in parts if p):
            dsk[(f"stage{c}", w)] = CollectiveTask((f"stage{c}", w), _f, *map(TaskRef, part))
            stages.append(TaskRef((f"stage{c}", w)))
        dsk[f"barrier{c}"] = BarrierTask(f"barrier{c}", _f, *stages, spec=None)
        previous = [(f"out{c}", j) for j in range(n_out)]
        for key in previous:
            dsk[key] = CollectiveTask(key, _f, TaskRef(f"barrier{c}"))

    def dask_order(*args, **kwargs):
        raise AssertionError("dask's order was called")

    got = ordering.wrap(dask_order)(dsk)
    assert sorted(got.values()) == list(range(len(dsk)))
    for key, task in dsk.items():
        assert all(got[d] < got[key] for d in task.dependencies if d in dsk), key
    assert [k for k in sorted(got, key=got.get) if isinstance(k, tuple) and k[0] == "out0"] == [
        ("out0", j) for j in range(n_out)
    ]  # outputs in their own order
    dsk["extra"] = Task("extra", _f, TaskRef(previous[0]))  # another task: dask orders it
    calls = []
    ordering.wrap(lambda g, d=None, **k: calls.append(g) or {})(dsk)
    assert len(calls) == 1
