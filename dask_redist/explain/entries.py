"""What `explain` returns: one `Entry` per rechunk, and the `Explanation` that prints them (text,
and a table in notebooks)."""

from __future__ import annotations

import html
from dataclasses import dataclass

from dask_redist.fft import describe as fft_describe


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    from dask.utils import format_bytes

    return format_bytes(int(n))


def grid(chunks) -> str:
    return " x ".join(str(len(c)) for c in chunks)


#: `Entry.runs` of a rechunk whose output the scheduler holds in memory: nothing runs
IN_MEMORY = "nothing (output in memory)"


@dataclass(frozen=True)
class Entry:
    """One rechunk of the graph."""

    output: str
    method: str  # what dask planned
    runs: str  # "collective", "dask-rechunk" (Dask's own: `DASK_RECHUNK`), `IN_MEMORY` or "refused ..."
    reason: str
    chunks: str = ""
    engine: str = "-"  # the engine's name
    engine_reason: str = ""  # why that engine
    mapping: str = "-"
    nbytes: int | None = None
    moved: int | None = None
    padding: int | None = None
    rounds: int | None = None
    imbalance: float | None = None
    placement: str = ""
    fused: str = ""  # the neighbouring steps the collective's tasks compute (graph.fuse)
    explicit: bool = False  # asked for by dask_redist.rechunk: runs whether or not enabled
    variables: str = ""  # the xarray variables whose data comes through it (`found.variables`)

    def headline(self) -> str:
        """What runs, first: the collective (on which engine), Dask's rechunk, or a refusal."""
        if self.runs == "collective":
            return f"the collective on {self.engine}, in place of Dask's {self.method} rechunk: {self.output}"
        if self.runs == IN_MEMORY:
            return f"nothing runs, the output is in memory: {self.output}"
        if self.runs.startswith("refused"):
            return f"refused at submission, {self.engine} cannot run it: {self.output}"
        return f"Dask's {self.method} rechunk: {self.output}"

    def as_dict(self) -> dict:
        return {
            "rechunk": self.output,
            "variables": self.variables,
            "runs as": self.runs,
            "Dask's method": self.method,
            "why": self.reason,
            "chunks": self.chunks,
            "engine": f"{self.engine} ({self.engine_reason})" if self.engine_reason else self.engine,
            "mapping": self.mapping,
            "bytes": _size(self.nbytes),
            "moved between workers": _size(self.moved),
            "padding": _size(self.padding),
            "rounds": "-" if self.rounds is None else str(self.rounds),
            "output imbalance": "-" if self.imbalance is None else f"{self.imbalance:.2f}",
            "placement": self.placement,
            "fused": self.fused,
        }


@dataclass(frozen=True)
class Explanation:
    entries: tuple[Entry, ...]
    enabled: bool
    nworkers: int
    ffts: tuple = ()  # dask_redist.fft's transforms in the graph (`dask_redist.fft.describe`)
    note: str = ""  # why there is nothing to explain (not a dask collection)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i) -> Entry:
        return self.entries[i]

    def __str__(self) -> str:
        if self.note:
            return self.note
        if not self.entries:
            return "\n".join(fft_describe.text(self.ffts) or ["no rechunk in this graph"])
        lines = []
        if not self.enabled and not all(e.explicit for e in self.entries):
            lines.append("dask_redist is not enabled: this is what enable() would do")
        for e in self.entries:
            d = e.as_dict()
            del d["rechunk"], d["Dask's method"]  # (in the headline)
            lines.append(e.headline())
            width = max(map(len, d))
            lines += [f"  {k:<{width}}  {v}" for k, v in d.items() if v not in ("", "-")]
        return "\n".join(lines + fft_describe.text(self.ffts))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.note:
            return f"<p>{html.escape(self.note)}</p>"
        if not self.entries:
            return fft_describe.table(self.ffts) or "<p>no rechunk in this graph</p>"
        rows = [e.as_dict() for e in self.entries]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
        )
        note = (
            ""
            if self.enabled or all(e.explicit for e in self.entries)
            else "<p><i>dask_redist is not enabled: this is what enable() would do</i></p>"
        )
        table = f"{note}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return table + fft_describe.table(self.ffts)
