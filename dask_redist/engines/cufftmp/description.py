"""The cufftmp engine as the scheduler sees it: CuPy chunks, and large NumPy ones, where every
worker can run cuFFTMp over NVSHMEM; a world (NVSHMEM's) over one set of workers.

``auto`` takes it first (`CufftMpDescription.preference`): for CuPy chunks when every worker
can run it, for NumPy chunks from ``redist.numpy-via-gpus`` bytes on (numeric dtypes only:
`host_dtype_problem`). Its reasons are written for the person reading them: on workers
without GPUs they say so ("NumPy chunks on CPU workers"), and the GPU-only threshold is
named only where GPUs are; where the workers were not asked (a small NumPy rechunk does not
ask them) the reason is "NumPy chunks", true on any cluster (`declines_unasked`).
"""

from __future__ import annotations

import numpy as np
from dask.utils import format_bytes

from dask_redist.engines.cufftmp.host import host_dtype_problem
from dask_redist.errors import EngineUnavailableError
from dask_redist.engines.cufftmp.settings import CufftMpSettings
from dask_redist.engines.description import EngineDescription, Request

#: The small rechunk `CufftMpDescription.bootstrap_input` runs: shape, old and new chunks.
_TINY_SHAPE, _TINY_OLD, _TINY_NEW = (64, 64), (8, 64), (64, 8)


def _cpu_only(answer: dict) -> bool:
    """A worker that answered, and has no GPU it can use (no CuPy, or none visible)."""
    return bool(answer) and not answer.get("ok") and not answer.get("gpus")


class CufftMpDescription(EngineDescription):
    preference = 20
    probes = True  # CuPy, nvmath-python, cuFFTMp and NVSHMEM must load on every worker
    world = True
    world_name = "NVSHMEM"
    fft_chunk_types = ("cupy",)  # distributed FFTs through cuFFTMp (`.fft`)
    settings_section = "nvshmem"

    def read_settings(self, section: dict) -> CufftMpSettings:
        return CufftMpSettings.read(section)

    def declines(self, request: Request) -> str | None:
        if request.chunk_type == "cupy":
            return None
        limit = request.settings.numpy_via_gpus
        if limit is None:
            return "NumPy chunks (redist.numpy-via-gpus is false)"
        if request.nbytes is not None and request.nbytes < limit:
            return f"NumPy chunks, {format_bytes(request.nbytes)} is below redist.numpy-via-gpus ({format_bytes(limit)})"
        if request.dtype is not None and host_dtype_problem(request.dtype):
            return f"NumPy chunks of {request.dtype}, which cufftmp does not move"
        return None

    def declines_unasked(self, request: Request) -> str | None:
        """A NumPy rechunk it declines is "NumPy chunks" until the workers answered whether they
        have GPUs: the GPU-only threshold named on a CPU cluster read as if it had GPUs."""
        why = self.declines(request)
        return request.chunks if why is not None and request.chunk_type != "cupy" else why

    def refuses(self, request: Request) -> str | None:
        return (
            host_dtype_problem(request.dtype)
            if request.chunk_type != "cupy" and request.dtype is not None
            else None
        )

    def unable(self, answers: dict[str, dict], request: Request) -> str | None:
        bad = [w for w, a in answers.items() if not a.get("ok")]
        if not bad:
            return self.cannot_form(answers)
        cpu = [w for w in bad if _cpu_only(answers[w])]
        if len(cpu) == len(answers):
            return f"{request.chunks} on CPU workers"
        if cpu:
            return f"{request.chunks}; {cpu[0]} has no GPU (cufftmp needs one on every worker)"
        why = answers[bad[0]].get("reason", "no answer")
        return f"cufftmp cannot run on {bad[0]}: {why}; see dask-redist doctor"

    def cannot_form(self, answers: dict[str, dict]) -> str | None:
        """Workers on several hosts (``redist.host``, pseudo-hosts included) where one has no
        remote transport NVSHMEM can use: its world would never form (`remote.across_hosts_problem`)."""
        from dask_redist.engines.cufftmp.remote import across_hosts_problem

        return across_hosts_problem(answers)

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        if request.chunk_type != "cupy":
            return "NumPy chunks of at least redist.numpy-via-gpus, and every worker can run cuFFTMp: through the GPUs"
        return "CuPy chunks, and every worker can run cuFFTMp over NVSHMEM"

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        from dask_redist.planning.layout import choose_layout

        layout, why = choose_layout(plan, settings.memory_budget, size_class_bits=settings.size_class_bits)
        return f"{layout.mapping} ({why})", layout.padding, layout.rounds

    # -- doctor -----------------------------------------------------------------------

    def worker_report(self) -> dict:
        from dask_redist.engines.cufftmp.checks import worker_report

        return worker_report()

    def doctor_columns(self, report: dict) -> dict:
        able = report.get("capabilities", {})
        if _cpu_only(able):
            return {"GPU": "none", "cufftmp": "needs a GPU"}
        return {
            "GPU": able.get("gpu", "-"),
            "CuPy": report.get("cupy", "-"),
            "nvmath": report.get("nvmath", "-"),
            "cuFFTMp": report.get("cuFFTMp", "-"),
            "NVSHMEM": report.get("NVSHMEM", "-"),
            "symmetric heap": report.get("NVSHMEM_SYMMETRIC_SIZE", "-"),
            "GPU memory": report.get("gpu memory free", "-"),
            "cufftmp": "ok" if able.get("ok") else able.get("reason", "-"),
        }

    def doctor_line(self, reports: dict[str, dict]) -> str:
        from dask_redist.engines.cufftmp.checks import _peer_access, remote_transport_line

        answers = {w: r.get("capabilities", {}) for w, r in reports.items()}
        if answers and all(_cpu_only(a) for a in answers.values()):
            return "no GPU on any worker (GPU workers need the [gpu] extra, docs/deployment.md#install)"
        bad = sorted(w for w, a in answers.items() if not a.get("ok"))
        peers = f"; peer access between GPUs: {_peer_access()}; {remote_transport_line(reports)}"
        if not bad:
            return "runs on every worker" + peers
        return (
            f"not on {len(bad)} of {len(reports)} workers ({bad[0]}: {answers[bad[0]].get('reason')})" + peers
        )

    def doctor_notes(self, reports: dict[str, dict]) -> tuple[list[str], list[str]]:
        from dask_redist.engines.cufftmp.checks import FIXES, _peer_access, cluster_warnings, version_warnings

        answers = {w: r.get("capabilities", {}) for w, r in reports.items()}
        if answers and all(_cpu_only(a) for a in answers.values()):
            return [], []  # a CPU cluster: nothing to fix for the engines it runs
        fixes = []
        for a in answers.values():
            if a.get("ok"):
                continue
            reason = a.get("reason", "")
            fix = FIXES["cupy" if "CuPy" in reason else "gpu" if "no GPU" in reason else "nvmath"]
            if fix not in fixes:
                fixes.append(fix)
        if _peer_access().startswith("missing"):
            fixes.append(
                "GPUs without peer access: NVSHMEM needs NVLink or PCIe P2P between the GPUs of a node"
            )
        return version_warnings(reports) + cluster_warnings(reports), fixes

    # -- bootstrap --------------------------------------------------------------------

    def bootstrap_input(self, client):
        """A small CuPy array with fresh keys (an earlier failed bootstrap's results may still be
        held), one chunk per task: every worker is a rank of the run wherever the chunks land."""
        import uuid

        import dask.array as da

        try:
            import cupy
        except ImportError as e:
            raise EngineUnavailableError(
                f"dask_redist.bootstrap starts the {self.name} engine's NVSHMEM world with a small CuPy "
                f"rechunk, and CuPy cannot be imported here ({type(e).__name__}: {e}): it is for GPU workers, "
                "with the [gpu] extra where the client and the workers run (docs/deployment.md#install); "
                "`dask-redist doctor` shows what each worker can run"
            ) from e

        def block(block_info=None):
            import cupy

            (lo0, hi0), (lo1, hi1) = block_info[None]["array-location"]
            return cupy.asarray(_tiny_expected()[lo0:hi0, lo1:hi1])

        chunks = tuple((size,) * (total // size) for size, total in zip(_TINY_OLD, _TINY_SHAPE))
        meta = cupy.empty((0, 0), dtype=np.float64)
        name = f"redist-bootstrap-{uuid.uuid4().hex}"
        x = da.map_blocks(block, chunks=chunks, dtype=np.float64, meta=meta, name=name)
        return x, _TINY_NEW, _tiny_expected()


def _tiny_expected() -> np.ndarray:
    return np.arange(np.prod(_TINY_SHAPE), dtype=np.float64).reshape(_TINY_SHAPE)
