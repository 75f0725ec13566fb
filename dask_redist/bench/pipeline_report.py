"""The results of ``bench --pipeline`` (`dask_redist.bench.pipeline`): one summary row per pipeline
and chunk count, Markdown and JSON with the command, the machine and the date."""

from __future__ import annotations


def _ms(t: float | None) -> str:
    return "" if t is None else f"{t * 1e3:,.1f} ms"


def _gpu_added(rows: list) -> str:
    """The GPU memory each row's warm-up added on its busiest worker (``bench --gpu``), or "" without."""
    from dask_redist.bench.gpu_state import added_text

    added = [added_text(r.peak_gpu_bytes, None) if r is not None else "" for r in rows]
    return " / ".join(a or "-" for a in added) if any(added) else ""


def summary(results: list) -> list[dict]:
    """One row per pipeline and chunk count: without, with, what the rechunk adds, the bare
    rechunk, Dask's floor and ``tasks``, ``fftn``'s transform in one call (``whole``), the GPU
    memory the warm-ups added (CuPy chunks), the tasks each put on the scheduler."""
    by = {(r.case, r.method): r for r in results}
    rows = []
    for r in results:
        if r.method != "with":
            continue
        pipeline, case = r.case.split(": ", 1)

        def get(method, case_name=r.case):
            got = by.get((case_name, method))
            return got.median if got is not None and got.times and not got.error else None

        without, with_ = get("without"), get("with")
        tasks = by.get((r.case, "tasks"))
        parts = [by.get((r.case, m)) for m in ("without", "with", "tasks")] + [by.get((case, "bare"))]
        checked = [p.correct for p in parts if p is not None and p.times]
        errors = [f"{p.method}: {p.error}" for p in parts if p is not None and p.error]
        rows.append(
            {
                "pipeline": pipeline,
                "input": case,
                "chunks": r.nchunks_in,
                "without": _ms(without),
                "with": _ms(with_),
                "adds": _ms(with_ - without) if None not in (without, with_) else "",
                "bare": _ms(get("bare", case)),
                "floor": _ms(get("floor", case)),
                "tasks": _ms(get("tasks")) if tasks is not None else "skipped",
                "tasks / with": f"{get('tasks') / with_:.1f}" if get("tasks") and with_ else "",
                "whole": _ms(get("whole", case)),
                "GPU ms (with / bare)": " / ".join(
                    "-" if g is None else f"{g:.1f}"
                    for g in (r.gpu_ms, by[(case, "bare")].gpu_ms if (case, "bare") in by else None)
                )
                if r.gpu_ms is not None
                else "",
                "GPU mem + (without / with / bare)": _gpu_added(
                    [by.get((r.case, "without")), r, by.get((case, "bare"))]
                ),
                "task count (without / with / tasks)": " / ".join(
                    str(by[(r.case, m)].tasks)
                    if (r.case, m) in by and by[(r.case, m)].tasks is not None
                    else "-"
                    for m in ("without", "with", "tasks")
                ),
                "checked": "WRONG" if False in checked else "equal" if checked and all(checked) else "-",
                "note": "; ".join(errors) or (r.note or ""),
            }
        )
    return rows


def markdown(results: list, env: dict, command: str) -> str:
    """The summary table, then every row in full (`results.markdown`: header, per-chunk costs, phases)."""
    from dask_redist.bench.results import markdown as full
    from dask_redist.report import fitted_table

    page = full(results, env, command)
    head, rest = page.split("\n\n", 1)
    table = fitted_table(summary(results), "", terminal=False)  # (columns empty everywhere left out)
    return f"{head}\n\n{table}\nEvery row:\n\n{rest}"


def to_json(results: list, env: dict, command: str) -> str:
    import json

    from dask_redist.bench.results import to_json as rows_json

    data = json.loads(rows_json(results, env, command))
    data["pipelines"] = summary(results)
    return json.dumps(data, indent=1, default=str)


def write(stem: str, results: list, env: dict, command: str) -> None:
    import os

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(markdown(results, env, command))
    with open(stem + ".json", "w") as f:
        f.write(to_json(results, env, command))
