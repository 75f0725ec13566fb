#!/usr/bin/env bash
# On the GPU node, after install.sh: the checks docs/gpu-testing.md records, logs under $OUT.
#   bash tools/gpu/check.sh [steps...]     steps: versions doctor world gpu bench (default), numpy soak multirank
#   numpy: NumPy chunks through the GPUs against the dask engine, with the host link measured;
#   soak: `dask-redist soak` on CuPy chunks with the cufftmp engine for $REDIST_SOAK_MINUTES (20)
#   multirank: on ONE GPU, for each K in $REDIST_MULTIRANK_PES (2 4): the GPU suite with K worker
#     processes sharing the GPU (REDIST_TEST_PES=K), then a soak with kills of $REDIST_SOAK_MINUTES
#     on K such workers (several NVSHMEM PEs per GPU: values and faults as on separate GPUs, not speed)
#   REDIST_TEST_PES=K (with REDIST_TEST_GPUS=G) makes doctor, world, gpu and soak use G*K workers too.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
out=${OUT:-/tmp/redist-check}; mkdir -p "$out"
export DASK_REDIST__TIMEOUTS__COLLECTIVE=${DASK_REDIST__TIMEOUTS__COLLECTIVE:-30s}
export DASK_REDIST__TIMEOUTS__BOOTSTRAP=${DASK_REDIST__TIMEOUTS__BOOTSTRAP:-60s}
step() {  # name command...: run, log to $out/name.log, one summary line
  local name=$1 start rc; shift; start=$(date +%s)
  "$@" > "$out/$name.log" 2>&1; rc=$?
  printf '%-9s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(( $(date +%s) - start ))" \
    "$(grep -E 'passed|failed|error|problems' "$out/$name.log" | tail -1 | cut -c1-110)" >> "$out/summary.txt"
}
steps=${*:-versions doctor world gpu bench}
gpus=${REDIST_TEST_GPUS:-2}; pes=${REDIST_TEST_PES:-1}
shared() { [ "$1" -gt 1 ] && echo "--pes-per-gpu $1"; }  # workers sharing each GPU, for the CLI
soak() {  # name workers pes minutes: a soak with kills where there are peers
  local kinds="rechunk cancel again clients pipeline"; [ "$2" -gt 1 ] && kinds="$kinds kill"
  step "$1" python3 -m dask_redist.cli soak --gpu --workers "$2" $(shared "$3") --engine cufftmp \
    --minutes "$4" --max-bytes 64MiB --seed "${REDIST_SOAK_SEED:-1}" --kinds $kinds
}
# the node's git metadata may lag the tree it was sent: name the tree by its content instead
# (the same command on the development machine, in the commit to compare, gives the same hash)
tree=$(find dask_redist tests tools -type f \( -name '*.py' -o -name '*.sh' -o -name '*.yaml' \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum | cut -c1-10)
date -u +"%Y-%m-%d %H:%M UTC, tree $tree" >> "$out/summary.txt"
for s in $steps; do case $s in
  versions) step versions python3 -m pip list --format=freeze ;;
  doctor) step doctor python3 -m dask_redist.cli doctor --gpu --workers $((gpus * pes)) $(shared "$pes") ;;
  world) step world python3 -m pytest tests/test_gpu_world.py -v -s --timeout 150 ;;
  gpu) step gpu python3 -m pytest tests/test_gpu.py tests/test_gpu_local.py tests/test_gpu_peers.py tests/test_gpu_spill.py tests/test_fft_gpu.py tests/test_examples.py tests/test_bench.py -m gpu -v -s --timeout 150 ;;
  bench) step bench python3 -m dask_redist.cli bench --gpu --size 8GiB --chunks 16 \
           --methods redist-cufftmp nvmath ceiling --reps 3 --out "$out" --name gpu-8gib-16-resolved ;;
  numpy) step numpy python3 -m dask_redist.cli bench --gpu --numpy --workers "${REDIST_TEST_GPUS:-2}" --size 2GiB 8GiB \
           --chunks 16 64 --methods redist-cufftmp redist-dask --reps 3 --out "$out" --name gpu-numpy ;;
  soak) soak soak $((gpus * pes)) "$pes" "${REDIST_SOAK_MINUTES:-20}" ;;
  multirank) for k in ${REDIST_MULTIRANK_PES:-2 4}; do
        REDIST_TEST_GPUS=1 REDIST_TEST_PES=$k step "gpu-pes$k" python3 -m pytest tests/test_gpu.py tests/test_fft_gpu.py \
           tests/test_gpu_world.py tests/test_examples.py -m gpu -v -s --timeout 300
        soak "soak-pes$k" "$k" "$k" "${REDIST_SOAK_MINUTES:-20}"
      done ;;
esac; done
cat "$out/summary.txt"
