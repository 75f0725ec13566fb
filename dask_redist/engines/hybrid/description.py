"""The hybrid engine as the scheduler sees it: CuPy chunks on GPU workers of several hosts.

``auto`` tries it after the engines with one world over every worker and before the engine that
runs wherever Dask does (`HybridDescription.preference`): where the workers span several hosts
(``redist.host``, pseudo-hosts included) and a world over all of them cannot form (no remote
transport between the hosts, no InfiniBand), the ranks of each host still copy GPU to GPU. On one
host it steps aside (the engines with a world do better there). NumPy chunks it refuses. It has
no world of its own and needs no bootstrap; a run whose copies fail on a rank fails on every rank
as unavailable: ``auto`` passes it over from then on (`cannot_start`; ``dask_redist.bootstrap``
forgets that) and the rechunk restarts on the engine it prefers next. A run that loses a worker
restarts as any other (``redist.retries``).
"""

from __future__ import annotations

from dask_redist.engines.description import EngineDescription, Request


class HybridDescription(EngineDescription):
    preference = 10
    probes = True  # CuPy, a GPU and CUDA's driver API (for IPC) on every worker
    chunk_types = ("cupy",)

    def refuses(self, request: Request) -> str | None:
        if request.chunk_type != "cupy":
            return (
                f"{request.chunks}: the {self.name} engine copies CuPy chunks only (GPU memory, "
                "through CUDA IPC within a host)"
            )
        return None

    def unable(self, answers: dict[str, dict], request: Request) -> str | None:
        if why := self.refuses(request):
            return why
        bad = [w for w, a in answers.items() if not a.get("ok")]
        if bad:
            return f"{self.name} cannot run on {bad[0]}: {answers[bad[0]].get('reason', 'no answer')}"
        hosts = sorted({str(a.get("host")) for a in answers.values()})
        if len(hosts) < 2:
            return f"every worker is on host {hosts[0] if hosts else '?'}: the {self.name} engine is for several hosts"
        return None

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        why = f"{request.chunks} on workers of several hosts: CUDA IPC within a host, Dask's comms between hosts"
        return f"{passed_over[0]}; {why}" if passed_over else why

    def doctor_columns(self, report: dict) -> dict:
        able = report.get("capabilities", {})
        if able.get("ok"):
            return {self.name: "ok"}
        return {self.name: "needs a GPU" if not able.get("gpus") else able.get("reason", "-")}

    def doctor_line(self, reports: dict[str, dict]) -> str:
        answers = [r.get("capabilities", {}) for r in reports.values()]
        if answers and not any(a.get("gpus") for a in answers):
            return "no GPU on any worker (it moves CuPy chunks)"
        return super().doctor_line(reports)

    def cannot_start(self, broken: str) -> str:
        return f"a {self.name} run failed on these workers ({broken}); dask_redist.bootstrap(client) lets auto try it again"

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        return (
            "pieces GPU to GPU through CUDA IPC between workers of one host, packed over dask comms "
            "between hosts (decided per pair of workers as the run starts)",
            0,
            1,
        )
