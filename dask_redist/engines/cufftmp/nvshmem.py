"""This process's NVSHMEM: can it run, which version it is, whether its heap fits, the arena.

* `capabilities`: whether CuPy, nvmath-python, cuFFTMp and NVSHMEM load here (the
  scheduler asks every worker once; ``engine: auto`` picks cufftmp only where all can);
* `nvshmem_library` / `nvshmem_problem`: the NVSHMEM host library actually loaded, and
  whether cuFFTMp 12.1.3 works with it (``dask-redist doctor`` reports both);
* `heap_problem`: whether the symmetric heap fits the GPU's free memory, checked by every
  rank *before* NVSHMEM starts (a failed start leaves a process unable to start it again);
* `Arena`: the one symmetric allocation a worker's runs stage through.
"""

from __future__ import annotations

from dask_redist.engines.cufftmp import remote
from dask_redist.planning.layout import size_class


def capabilities() -> dict:
    """Can this process run the cufftmp engine? ``{"ok": bool, "reason": str, ...}``, with what a
    world across hosts needs of it (`remote.facts`; the registry adds its host)."""
    info: dict = {"ok": False, **remote.facts()}
    try:
        import cupy

        info["gpus"] = cupy.cuda.runtime.getDeviceCount()
        if not info["gpus"]:
            info["reason"] = "no GPU visible"
            return info
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception as e:
        info["reason"] = f"CuPy unusable: {type(e).__name__}: {e}"
        return info
    try:
        import nvmath

        info["nvmath"] = nvmath.__version__
        from nvmath.bindings import cufftMp, nvshmem  # noqa: F401 - loads libcufftMp and libnvshmem
    except Exception as e:
        info["reason"] = f"nvmath-python / cuFFTMp / NVSHMEM unusable: {type(e).__name__}: {e}"
        return info
    info["ok"] = True
    info["reason"] = "CuPy, nvmath-python, cuFFTMp and NVSHMEM load"
    return info


#: NVSHMEM host libraries cuFFTMp 12.1.3 (nvidia-cufftmp-cu13) works with: 3.3.24 or later (its
#: release notes) within major version 3 (NVSHMEM keeps its host/device ABI within a major
#: version since 3.0), except 3.5.19, which broke that ABI (fixed in 3.5.21). pyproject's
#: ``[gpu]`` pin says the same: ``nvidia-nvshmem-cu13>=3.3.24,!=3.5.19,<4``.
NVSHMEM_SUPPORTED = ((3, 3, 24), (4, 0, 0))
NVSHMEM_EXCLUDED = {(3, 5, 19): "its host library broke the ABI of the team structure (fixed in 3.5.21)"}
#: From 3.5.19 the layout of RC queue pairs changed, which NVSHMEM's release notes say breaks the
#: ABI with earlier device code when IBGDA is on; cuFFTMp 12.1.3's device code is built for 3.3.24.
NVSHMEM_IBGDA_BREAK = (3, 5, 19)


def nvshmem_problem(version: tuple[int, int, int], ibgda: bool = False) -> str | None:
    """Why the NVSHMEM host library ``version`` will not work with cuFFTMp 12.1.3, or None."""
    text = ".".join(map(str, version))
    low, high = NVSHMEM_SUPPORTED
    if not low <= tuple(version) < high:
        return (
            f"NVSHMEM {text} is outside what cuFFTMp 12.1.3 supports (>= {'.'.join(map(str, low))}, < 4); "
            "pip install 'nvidia-nvshmem-cu13>=3.3.24,!=3.5.19,<4'"
        )
    if tuple(version) in NVSHMEM_EXCLUDED:
        return f"NVSHMEM {text}: {NVSHMEM_EXCLUDED[tuple(version)]}; use another release"
    if ibgda and tuple(version) >= NVSHMEM_IBGDA_BREAK:
        return (
            f"NVSHMEM {text} with NVSHMEM_IB_ENABLE_IBGDA set: from 3.5.19 IBGDA breaks the ABI with device code "
            "built for earlier releases (cuFFTMp 12.1.3's is built for 3.3.24); unset it or use NVSHMEM < 3.5.19"
        )
    return None


def nvshmem_library() -> dict:
    """The NVSHMEM host library nvmath-python loaded in this process: version (asked of the library
    itself, ``nvshmemx_vendor_get_version_info``) and path; the pip distributions' versions next to it."""
    import ctypes
    from importlib import metadata

    from nvmath.bindings import nvshmem

    nvshmem.init_status()  # nvmath loads libnvshmem_host on its first call
    info: dict = {}
    for dist in ("nvidia-nvshmem-cu13", "nvidia-cufftmp-cu13"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libnvshmem_host" in line}
    info["path"] = min(paths) if paths else None
    lib = ctypes.CDLL(info["path"] or "libnvshmem_host.so.3")
    parts = [ctypes.c_int() for _ in range(3)]
    lib.nvshmemx_vendor_get_version_info(*(ctypes.byref(p) for p in parts))
    info["version"] = tuple(p.value for p in parts)
    return info


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_symmetric_size(text: str) -> int:
    """``NVSHMEM_SYMMETRIC_SIZE`` as NVSHMEM reads it: bytes, or K/M/G/T in powers of 1024."""
    value = str(text).strip().upper().removesuffix("B")
    unit = value[-1] if value and value[-1] in _UNITS else ""
    try:
        return int(float(value[: len(value) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise ValueError(
            f"NVSHMEM_SYMMETRIC_SIZE={text!r} is not a size NVSHMEM reads (bytes, or a number with K, M, G or T); "
            "set redist.nvshmem.symmetric-size instead"
        ) from None


def heap_problem(symmetric_size: int, free: int, total: int, pool: str | None = None) -> str | None:
    """Why NVSHMEM's symmetric heap cannot fit this GPU's free memory, or None.

    NVSHMEM asks the driver for the heap when it starts; memory held by an RMM
    pool (dask-cuda's ``rmm_pool_size``) or by CuPy's cache is not free to it, and
    a failed start leaves the process unable to start NVSHMEM again.
    """
    if symmetric_size <= free:
        return None
    from dask.utils import format_bytes

    held = f"; {pool} holds most of the rest" if pool else ""
    return (
        f"NVSHMEM's symmetric heap needs {format_bytes(symmetric_size)} of GPU memory, but only {format_bytes(free)} "
        f"of {format_bytes(total)} is free{held}. Lower redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE; "
        "by default 1.25 x redist.memory-budget + 256 MiB) or make the RMM pool smaller (dask-cuda rmm_pool_size)"
    )


def gpu_memory() -> tuple[int, int, str | None]:
    """Free and total bytes of this process's GPU, and the RMM pool holding it if any."""
    import sys

    import cupy

    cupy.get_default_memory_pool().free_all_blocks()  # CuPy's cache would count as taken
    free, total = cupy.cuda.runtime.memGetInfo()
    pool = None
    if "rmm" in sys.modules:  # only where the user set RMM up: never import it for this
        try:
            resource = sys.modules["rmm"].mr.get_current_device_resource()
            upstream = [resource, getattr(resource, "upstream_mr", None)]
            names = [type(r).__name__ for r in upstream if r is not None]
            pool = next((f"an RMM {n}" for n in names if "Pool" in n or "Arena" in n), None)
        except Exception:  # noqa: S110 - the pool name only decorates the message
            pass
    return int(free), int(total), pool


class Arena:
    """One symmetric allocation, grown collectively (every rank asks for the same size)."""

    def __init__(self):
        self.ptr = 0
        self.size = 0

    def ensure(self, nbytes: int) -> None:
        from nvmath.bindings import nvshmem

        if nbytes <= self.size:
            return
        nbytes = max(
            2**20, size_class(int(nbytes), 3)
        )  # 8 size classes per octave: few regrowths, <13% slack
        import cupy

        cupy.cuda.Device().synchronize()  # nvshmem_free is not stream-ordered
        self.release()
        ptr = nvshmem.malloc(nbytes)
        if not ptr:
            raise MemoryError(
                f"nvshmem_malloc of {nbytes} bytes failed: the symmetric heap is too small. Raise "
                "redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE) or lower redist.memory-budget; "
                "an RMM pool holding most of the GPU also leaves NVSHMEM too little"
            )
        self.ptr, self.size = ptr, nbytes

    def view(self, offset: int, shape, dtype):
        import cupy

        mem = cupy.cuda.UnownedMemory(self.ptr, self.size, self)
        return cupy.ndarray(tuple(shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, offset))

    def release(self) -> None:
        from nvmath.bindings import nvshmem

        if self.ptr:
            nvshmem.free(self.ptr)
        self.ptr, self.size = 0, 0
