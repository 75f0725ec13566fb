"""``dask-redist doctor``: can this cluster run the collective, and with which engine?"""

from __future__ import annotations

import html
from dataclasses import dataclass

from dask_redist.engines.cufftmp.checks import FIXES, _peer_access, cluster_warnings, version_warnings, worker_report

@dataclass(frozen=True)
class Diagnosis:
    workers: dict
    engine: str
    reason: str
    peer_access: str
    fixes: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def rows(self) -> list[dict]:
        out = []
        for address, r in sorted(self.workers.items()):
            cap = r.get("cufftmp engine", {})
            out.append(
                {
                    "worker": address,
                    "GPU": cap.get("gpu", "-"),
                    "CuPy": r.get("cupy", "-"),
                    "nvmath": r.get("nvmath", "-"),
                    "cuFFTMp": r.get("cuFFTMp", "-"),
                    "NVSHMEM": r.get("NVSHMEM", "-"),
                    "symmetric heap": r.get("NVSHMEM_SYMMETRIC_SIZE", "-"),
                    "GPU memory": r.get("gpu memory free", "-"),
                    "cufftmp": "ok" if cap.get("ok") else cap.get("reason", "-"),
                }
            )
        return out

    def __str__(self) -> str:
        lines = []
        for row in self.rows():
            lines.append(row.pop("worker") + ":")
            lines += [f"  {k:<15} {v}" for k, v in row.items()]
        lines.append(f"peer access between GPUs: {self.peer_access}")
        lines.append(f"engine `auto` picks for CuPy chunks: {self.engine} ({self.reason})")
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"fix: {f}" for f in self.fixes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = self.rows()
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0]) if rows else ""
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
        fixes = "".join(f"<li>{html.escape(f)}</li>" for f in (*self.warnings, *self.fixes))
        return (
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>peer access: {html.escape(self.peer_access)}; <b>auto</b> picks <b>{self.engine}</b>"
            f" ({html.escape(self.reason)})</p><ul>{fixes}</ul>"
        )


def doctor(client) -> Diagnosis:
    """Check every worker of ``client``'s cluster (blocks each worker for a moment)."""
    reports = client.run(worker_report)
    fixes = []
    bad = {w: r for w, r in reports.items() if not r.get("cufftmp engine", {}).get("ok")}
    for r in bad.values():
        reason = r.get("cufftmp engine", {}).get("reason", "")
        key = "cupy" if "CuPy" in reason else "gpu" if "no GPU" in reason else "nvmath"
        if FIXES[key] not in fixes:
            fixes.append(FIXES[key])
    if bad:
        w = sorted(bad)[0]
        engine, reason = "dask", f"cufftmp unusable on {w}: {bad[w]['cufftmp engine'].get('reason')}"
    else:
        engine, reason = "cufftmp", "every worker can run cuFFTMp over NVSHMEM"
    peers = _peer_access()
    if peers.startswith("missing"):
        fixes.append("GPUs without peer access: NVSHMEM needs NVLink or PCIe P2P between the GPUs of a node")
    warnings = version_warnings(reports) + cluster_warnings(reports)
    return Diagnosis(reports, engine, reason, peers, tuple(fixes), tuple(warnings))
