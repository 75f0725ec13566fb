"""What ``explain`` says about the FFTs in a graph: the records their layers carry (`local.ANNOTATION`)."""

from __future__ import annotations

import html
from dataclasses import dataclass

from dask_redist.fft.local import ANNOTATION

PATHS = {
    "local": "the path that runs everywhere: rechunks, then numpy.fft / cupy.fft on every chunk",
    "gpu": "the GPU path: one collective step per transform (cuFFTMp over NVSHMEM)",
}


@dataclass(frozen=True)
class FFTEntry:
    """One FFT of the graph: what it computes, which path runs it, why, and its steps."""

    layer: str
    transform: str
    path: str
    reason: str
    steps: tuple[str, ...]

    def as_dict(self) -> dict:
        return {
            "fft": self.layer,
            "transform": self.transform,
            "runs as": PATHS.get(self.path, self.path),
            "why": self.reason,
            "steps": " | ".join(self.steps),
        }


def fft_entries(graph) -> list[FFTEntry]:
    """The FFTs recorded on the layers of ``graph`` (a HighLevelGraph), in layer order."""
    out = []
    for name, layer in getattr(graph, "layers", {}).items():
        record = (getattr(layer, "collection_annotations", None) or {}).get(ANNOTATION)
        if record is not None:
            out.append(FFTEntry(name, record["op"], record["path"], record["why"], tuple(record["steps"])))
    return out


def text(entries) -> list[str]:
    lines = []
    for e in entries:
        d = e.as_dict()
        lines.append(f"{d.pop('fft')}:")
        width = max(map(len, d))
        lines += [f"  {k:<{width}}  {v}" for k, v in d.items() if v]
    return lines


def table(entries) -> str:
    if not entries:
        return ""
    rows = [e.as_dict() for e in entries]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
