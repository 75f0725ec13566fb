#!/usr/bin/env bash
# On the GPU node, after install.sh: several hosts on ONE GPU (issue 44). 4 `dask cuda worker`
# processes, all with CUDA_VISIBLE_DEVICES=0 and NVSHMEM_SYMMETRIC_SIZE=8G, two started with
# DASK_REDIST__HOST=hostA and two with hostB, then checks against them; logs under $OUT.
#   bash tools/gpu/pseudo-hosts.sh [steps...]        default: facts cluster tests   (each < 10 min; also: ucx hybrid soak)
#   facts:   what the node has for NVSHMEM's remote transports (its transport plugins, libucx, libfabric);
#            where libucx is missing and .whl/libucx_cu13-*.whl was carried (the [ucx] extra's UCX, 42 MB;
#            tools/gpu/make-bundle.sh leaves it out without WITH_UCX=1), it is pip-installed first
#   cluster: no remote transport set: `dask-redist doctor` against it (expect "hosts: 2", the warning
#            and remedy), then a CuPy rechunk against NumPy with engine auto (expect: hybrid, cufftmp's reason)
#            and cufftmp forced (expect: refused before the run, the same reason)
#   tests:   the multi-rank GPU tests at 2 pseudo-hosts x 2 PEs (REDIST_TEST_PES=4 REDIST_TEST_HOSTS=2),
#            their workers with NVSHMEM_REMOTE_TRANSPORT=$REDIST_PSEUDO_TRANSPORT (default ucx; set and empty: none, auto then takes hybrid) so that
#            cufftmp may form across the pseudo-hosts (NVSHMEM itself sees one node: P2P); the files
#            are $REDIST_PSEUDO_TESTS (default tests/test_gpu.py tests/test_gpu_world.py)
#   ucx:     the cluster again with NVSHMEM_REMOTE_TRANSPORT=ucx UCX_TLS=tcp,cuda_copy,cuda_ipc and
#            NVSHMEM_DEBUG=INFO: doctor, auto and cufftmp; then the same with NVSHMEM_DISABLE_P2P=1, which
#            makes NVSHMEM send between the PEs of one GPU through the remote transport (UCX over TCP);
#            without GDRCopy or DMA-BUF (this node) auto takes hybrid there and cufftmp is refused before
#            the run (since fba250b; before, NVSHMEM stopped at its first atomic and the run timed out)
#   hybrid:  the hybrid engine (CUDA IPC within a pseudo-host, Dask's comms between them) with no remote
#            transport: its GPU tests at 2 pseudo-hosts x 2 PEs (tests/test_gpu_hybrid.py, < 5 min), then
#            `dask-redist bench --gpu --workers 4 --pes-per-gpu 4 --pseudo-hosts 2` timing redist-hybrid,
#            redist-dask and tasks in one run (1 GiB, 16 and 64 slabs; $out/hybrid-bench.md and .json)
#   soak:    `dask-redist soak --gpu --workers 4 --pes-per-gpu 4 --pseudo-hosts 2 --engine auto`, with
#            kills, for $REDIST_SOAK_MINUTES (default 5; the call's limit is 10 minutes), the workers'
#            transport as for tests (auto then takes cufftmp where its world may form, else dask)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
out=${OUT:-/tmp/redist-pseudo-hosts}; mkdir -p "$out"
export DASK_REDIST__TIMEOUTS__COLLECTIVE=${DASK_REDIST__TIMEOUTS__COLLECTIVE:-30s}
export DASK_REDIST__TIMEOUTS__BOOTSTRAP=${DASK_REDIST__TIMEOUTS__BOOTSTRAP:-60s}
summary=$out/summary.txt
note() { echo "$*" | tee -a "$summary"; }
step() {  # name seconds command...: run under a time limit, log to $out/name.log, one summary line
  local name=$1 limit=$2 start rc; shift 2; start=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1; rc=$?
  note "$(printf '%-16s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - start ))" \
    "$(grep -E 'passed|failed|error|problems|RESULT|auto. picks' "$out/$name.log" | tail -1 | cut -c1-160)")"
  grep -E '^RESULT|^hosts:|^warning:|auto. picks|^engine cufftmp' "$out/$name.log" | sed 's/^/    /' >> "$summary"
}

# -- a cluster of 2 pseudo-hosts x 2 workers on GPU 0 ----------------------------------------
pids=()
start_cluster() {  # tag [VAR=value...]: scheduler + 4 workers, the extra environment on every worker
  local tag=$1; shift
  sched=$out/$tag-scheduler.json; rm -f "$sched"
  setsid dask scheduler --scheduler-file "$sched" --no-dashboard > "$out/$tag-scheduler.log" 2>&1 &
  pids+=($!)
  for i in 0 1 2 3; do
    local h=hostA; [ "$i" -ge 2 ] && h=hostB
    setsid env CUDA_VISIBLE_DEVICES=0 NVSHMEM_SYMMETRIC_SIZE=8G DASK_REDIST__HOST=$h "$@" \
      dask cuda worker --scheduler-file "$sched" --nthreads 1 --no-dashboard --death-timeout 60 \
      > "$out/$tag-worker$i-$h.log" 2>&1 &
    pids+=($!)
  done
  timeout 200 python3 -c "
from distributed import Client
import sys, time
for _ in range(60):
    try:
        c = Client(scheduler_file=sys.argv[1], timeout=10); break
    except Exception: time.sleep(2)
c.wait_for_workers(4, timeout=180); print('4 workers up'); c.close()" "$sched" >> "$out/$tag-scheduler.log" 2>&1 \
    || note "$tag: the 4 workers did not come up (see $tag-*.log)"
}
stop_cluster() {  # the processes this script started, by their process groups
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  sleep 5
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
  pids=()
}
trap stop_cluster EXIT
checks() {  # tag: doctor and the rechunks against the running cluster
  step "$1-doctor" 300 python3 -m dask_redist.cli doctor --scheduler "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$sched")"
  step "$1-rechunk" 400 python3 tools/gpu/pseudo_hosts.py "$sched"
  grep -hiE 'transport|ucx|p2p|nvshmem.*(error|warn)' "$out/$1"-worker*.log 2>/dev/null | sort | uniq -c | sort -rn | head -40 \
    > "$out/$1-nvshmem-lines.txt"
}
ucx_env() {  # UCX's libraries where the [ucx] extra (libucx-cu13) put them, for NVSHMEM's ucx plugin
  local lib; lib=$(python3 -c "import libucx, os; print(os.path.join(os.path.dirname(libucx.__file__), 'lib'))" 2>/dev/null)
  echo "NVSHMEM_REMOTE_TRANSPORT=ucx" "UCX_TLS=tcp,cuda_copy,cuda_ipc" "NVSHMEM_DEBUG=INFO" \
    ${lib:+"LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}"}
}

date -u +"%Y-%m-%d %H:%M UTC pseudo-hosts" >> "$summary"
for s in ${*:-facts cluster tests}; do case $s in
  facts)
    if ! python3 -c "import libucx" 2>/dev/null && ls .whl/libucx_cu13-*.whl > /dev/null 2>&1; then
      python3 -m pip install --no-deps .whl/libucx_cu13-*.whl > "$out/install-libucx.log" 2>&1; rc=$?
      note "libucx: pip install --no-deps .whl/libucx_cu13-*.whl: rc=$rc (install-libucx.log)"
    fi
    { python3 -m pip list 2>/dev/null | grep -iE 'nvshmem|ucx|cufftmp|nvmath|cupy|dask'
      lib=$(python3 -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])" 2>/dev/null)
      echo "nvshmem package: ${lib:-not found}"; ls -la "$lib"/lib 2>/dev/null | grep -iE 'transport|host'
      for t in "$lib"/lib/nvshmem_transport_*.so*; do
        [ -e "$t" ] && { echo "== ldd $t"; ldd "$t" | grep -iE 'not found|ucp|ucs|fabric'; }
      done
      python3 -c "import libucx, os; d=os.path.dirname(libucx.__file__); print('libucx', d); print(os.listdir(os.path.join(d, 'lib')))" \
        || echo "libucx: not installed (the [ucx] extra brings libucx-cu13)"
      ldconfig -p | grep -iE 'libfabric|libucp' || echo "system: no libfabric, no libucp"
      for t in "$lib"/lib/nvshmem_transport_ucx.so*; do  # (as the workers of the ucx step will load it)
        [ -e "$t" ] && { echo "== with $(ucx_env): ldd $t"; env $(ucx_env) ldd "$t" | grep -iE 'not found|ucp|ucs'; }
      done
      ls /sys/class/infiniband 2>&1; nvidia-smi -L
    } > "$out/facts.log" 2>&1
    note "facts: $(grep -cE 'transport_' "$out/facts.log") transport lines, $(grep -c 'not found' "$out/facts.log") libraries not found; facts.log" ;;
  cluster) start_cluster plain; checks plain; stop_cluster ;;
  tests)  # (the workers inherit this environment: SharedGPUCluster starts them with it)
    ( [ "${REDIST_PSEUDO_TRANSPORT-ucx}" = ucx ] && export $(ucx_env | sed 's/NVSHMEM_DEBUG=INFO//')
      export NVSHMEM_REMOTE_TRANSPORT=${REDIST_PSEUDO_TRANSPORT-ucx} NVSHMEM_SYMMETRIC_SIZE=8G
      export REDIST_TEST_GPUS=1 REDIST_TEST_PES=4 REDIST_TEST_HOSTS=2
      step tests-hosts2 590 python3 -m pytest ${REDIST_PSEUDO_TESTS:-tests/test_gpu.py tests/test_gpu_world.py} \
        -m gpu -v -s --timeout 120 --maxfail 5 ) ;;
  ucx)
    start_cluster ucx $(ucx_env); checks ucx; stop_cluster
    start_cluster ucx-nop2p $(ucx_env) NVSHMEM_DISABLE_P2P=1; checks ucx-nop2p; stop_cluster ;;
  hybrid)  # (no remote transport: a world across the pseudo-hosts cannot form, as without InfiniBand)
    ( export NVSHMEM_REMOTE_TRANSPORT= NVSHMEM_SYMMETRIC_SIZE=8G
      export REDIST_TEST_GPUS=1 REDIST_TEST_PES=4 REDIST_TEST_HOSTS=2
      step hybrid-tests 290 python3 -m pytest tests/test_gpu_hybrid.py -m gpu -v -s --timeout 150 --maxfail 5
      step hybrid-bench 290 python3 -m dask_redist.cli bench --gpu --workers 4 --pes-per-gpu 4 --pseudo-hosts 2 \
        --methods redist-hybrid redist-dask tasks --size "${REDIST_HYBRID_SIZE:-1GiB}" --chunks 16 64 --reps 3 \
        --out "$out" --name hybrid-bench ) ;;
  soak)  # (as tests: the workers inherit the transport; auto takes cufftmp where it may form)
    ( [ "${REDIST_PSEUDO_TRANSPORT-ucx}" = ucx ] && export $(ucx_env | sed 's/NVSHMEM_DEBUG=INFO//')
      export NVSHMEM_REMOTE_TRANSPORT=${REDIST_PSEUDO_TRANSPORT-ucx} NVSHMEM_SYMMETRIC_SIZE=8G
      step soak-hosts2 590 python3 -m dask_redist.cli soak --gpu --workers 4 --pes-per-gpu 4 --pseudo-hosts 2 \
        --engine auto --minutes "${REDIST_SOAK_MINUTES:-5}" --max-bytes 64MiB --seed "${REDIST_SOAK_SEED:-44}" \
        --kinds rechunk cancel again clients kill pipeline ) ;;
esac; done
cat "$summary"
