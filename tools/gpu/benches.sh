#!/usr/bin/env bash
# On the GPU node, after install.sh: the benchmarks of issues 25 and 28, one after another and
# alone on the GPU, detached (together they take longer than a call may).
#   bash tools/gpu/benches.sh start [fft] [rechunk] [many] [fft-gpu] [budget] [peers]   (default fft rechunk; logs, .md, .json in /tmp/redist-benches)
#     fft: `bench --fft --gpu --size 8GiB --chunks 8 64 256 1024` at 1 PE, then 2 PEs sharing the GPU
#     rechunk: `bench --gpu --size 8GiB` at 2-256 chunks with Dask's tasks, 1024 and 4096 without
#       (tasks takes minutes there), at 1 PE, then at 2 PEs (about 11 minutes in all)
#     many: `bench --gpu --size 8GiB` at 256, 1024 and 4096 chunks, the collective and the floor
#       only, at 1 PE, then 2 PEs (the arena's rounds: a few minutes)
#     fft-gpu: `bench --fft` at 8-1024 pencils, the GPU path, cupy-whole and the floor only (the
#       four steps run once each, untimed, as the reference), at 1 PE, then 2 PEs
#     budget: 2 PEs at 16-256 chunks, the collective and the floor, with the default
#       redist.memory-budget (1 GiB: 8 rounds) and with 8 GiB and a 20 GiB heap (one round)
#     peers: 2 PEs at 2-1024 chunks chunk to chunk through CUDA IPC (Dask's tasks at 2-256), then
#       with redist.nvshmem.shared-gpu-copies off (the heap's rounds), then 4 PEs
#     targets: issue 25's table: 1 PE, then 2 PEs, at 16-1024 chunks, the collective and the floor
#       (5 reps), and at 2 chunks against Dask's tasks and against what enable()'s cost model runs
#     peers-max: 2 PEs at 128 and 256 chunks, the collective and the floor, with
#       redist.nvshmem.shared-gpu-max-chunks at its default (64: the heap's rounds) and at 128
#     calibrate: `bench --calibrate --gpu` with 1 PE: the cost model of this tree on this machine
#     pipelines: issue 40's table: `bench --pipeline --gpu --size 8GiB` at 16-1024 chunks (Dask's
#       tasks up to 256), 4 reps, at 1 PE, then 2 PEs
#     issue40: the `fft` rows at 2 PEs at 256 and 1024 chunks (9 runs each), then the 3-D FFT call
#       at 1 PE (`--fft --fft-slabs`, 16 slabs)
#     fft3d: the 3-D FFT call alone
#     weather: the `weather` pipeline at 8760 daily chunks, one run each, at its users' size (36 GB) on an
#       H200, 16 GB elsewhere (on CPU at 128 MiB its `without` took 47 s a run; its workers' log in $dir)
#     room: what decides the branch fft-room (docs/gpu-testing.md): the 2-PE `fftn` row at 8 GiB,
#       then `elementwise` in the same cluster; three FFT geometries at 2 PEs in one cluster
#   bash tools/gpu/benches.sh run WHAT...      the same, in this call, its logs, .md and .json
#     straight into $OUT: a call cut off at its limit or at the session's last device second
#     still brings back the rows done (each log has them as they end)
#   bash tools/gpu/benches.sh wait [SECONDS]   until they have ended (or SECONDS have passed)
#   bash tools/gpu/benches.sh collect          the last lines of each log, everything as $OUT/benches.tgz
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/detached.sh
source tools/gpu/env.sh
dir=/tmp/redist-benches
[ "${1:-}" = run ] && dir=${OUT:?run writes into \$OUT}
mkdir -p "$dir"
running() { launched "$dir"; }
bench() {  # name args...: one bench, its log in $dir/name.log
  local name=$1; shift
  echo "python3 -m dask_redist.cli bench --reps 3 $* --out $dir --name $name >> $dir/$name.log 2>&1; "
}
fft3d() {  # issue 40's 3-D FFT call at 1 PE, against its target
  bench gpu-fft3d --fft --fft-slabs --gpu --workers 1 --size 8GiB --chunks 16 --reps 5
}
pes() {  # the workers of K PEs on the GPU: one LocalCUDACluster worker, else K sharing it
  if [ "$1" = 1 ]; then echo "--workers 1"; else echo "--workers $1 --pes-per-gpu $1"; fi
}
case ${1:-} in
  start|run)
    mode=$1; shift; what=${*:-fft rechunk}
    tree=$PWD; [ "$mode" = start ] && tree=$(copy_tree benches)  # (run: in this call, from here)
    script="cd $tree; export PYTHONPATH=$tree; "
    for w in $what; do case $w in
      fft) for k in 1 2; do
          script+="NVSHMEM_SYMMETRIC_SIZE=40G $(bench gpu-fft-pes$k --fft --gpu $(pes $k) --size 8GiB --chunks 8 64 256 1024)"
        done ;;
      rechunk) for k in 1 2; do
          script+="$(bench gpu-floor-pes$k --gpu $(pes $k) --size 8GiB --chunks 2 16 64 256 --methods redist-cufftmp floor tasks)"
          script+="$(bench gpu-floor-pes$k --gpu $(pes $k) --size 8GiB --chunks 1024 4096 --methods redist-cufftmp floor --append)"
        done ;;
      fft-gpu) for k in 1 2; do  # the GPU path against its target only (the four steps once, as the reference)
          script+="NVSHMEM_SYMMETRIC_SIZE=40G $(bench gpu-fft-gpu-pes$k --fft --gpu $(pes $k) --size 8GiB --chunks 8 64 256 1024 --methods redist-fft-gpu cupy-whole floor)"
        done ;;
      many) for k in 1 2; do  # the arena's rounds, where the copy kernel's rows are short
          script+="$(bench gpu-many-pes$k --gpu $(pes $k) --size 8GiB --chunks 256 1024 4096 --methods redist-cufftmp floor)"
        done ;;
      budget) for b in default 8GiB; do  # what the arena's rounds cost with 2 PEs on one GPU
          env=""; [ "$b" = default ] || env="DASK_REDIST__MEMORY_BUDGET=$b NVSHMEM_SYMMETRIC_SIZE=20G "
          script+="$env$(bench gpu-budget-$b --gpu $(pes 2) --size 8GiB --chunks 16 64 256 --methods redist-cufftmp floor)"
        done ;;
      peers) script+="$(bench gpu-peers-2pe --gpu $(pes 2) --size 8GiB --chunks 2 16 64 256 --methods redist-cufftmp floor tasks)"
        script+="$(bench gpu-peers-2pe --gpu $(pes 2) --size 8GiB --chunks 1024 --methods redist-cufftmp floor --append)"
        script+="DASK_REDIST__NVSHMEM__SHARED_GPU_COPIES=false $(bench gpu-peers-off-2pe --gpu $(pes 2) --size 8GiB --chunks 16 64 256 --methods redist-cufftmp floor)"
        script+="$(bench gpu-peers-4pe --gpu $(pes 4) --size 8GiB --chunks 16 64 256 --methods redist-cufftmp floor)" ;;
      targets) for k in 1 2; do
          script+="$(bench gpu-targets-pes$k --gpu $(pes $k) --size 8GiB --chunks 16 64 256 1024 --methods redist-cufftmp floor --reps 5)"
          script+="$(bench gpu-targets-pes$k --gpu $(pes $k) --size 8GiB --chunks 2 --methods redist-cufftmp enabled tasks --append)"
        done ;;
      peers-max) for m in 64 128; do
          script+="DASK_REDIST__NVSHMEM__SHARED_GPU_MAX_CHUNKS=$m $(bench gpu-peers-max$m --gpu $(pes 2) --size 8GiB --chunks 128 256 --methods redist-cufftmp floor --reps 5)"
        done ;;
      calibrate) script+="$(bench gpu-calibration-cupy-1 --gpu --workers 1 --calibrate)" ;;
      fft3d)  # the 3-D FFT call alone (a minute or two)
        script+="$(fft3d)" ;;
      issue40)  # what issue 40's "Done when" still lacks (2026-12-06 03:50): the 2-PE fft rows with
        # 9 runs (minutes), then the 3-D FFT call again (about a minute: on an H100 it was 0.6-1.1 ms over)
        script+="$(bench gpu-fft-pes2 --pipeline --gpu $(pes 2) --size 8GiB --chunks 256 1024 --tasks-up-to 0 --pipelines fft --reps 9)"
        script+="$(fft3d)"
        ;;
      weather)  # users' size (dask#11162) on an H200, 16 GB elsewhere: 8760 daily chunks (minutes: run it
        # last). On an H100 at 16 GB (2026-12-06) the worker closed after the first run: the log file
        # (--log-file, in $dir) now has the workers' own records
        script+="size=16GB; nvidia-smi -L | grep -q H200 && size=36.4GB; "
        script+="$(bench gpu-weather --pipeline --gpu --workers 1 --pipelines weather --size \$size --chunks 8760 --tasks-up-to 0 --reps 1 --log-file $dir/gpu-weather-logs.txt)" ;;
      room)  # the branch fft-room against main (run it on each): a 2-PE fftn of 8 GiB on one GPU, then
        # elementwise rows in the same cluster; then three FFT geometries in one cluster (FFTS_KEPT: 2)
        script+="$(bench gpu-room-fftn --pipeline --gpu $(pes 2) --size 8GiB --chunks 16 64 --pipelines fftn elementwise --tasks-up-to 0)"
        script+="$(bench gpu-room-geometries --fft --gpu $(pes 2) --size 1GiB 2GiB 4GiB --chunks 16 --methods redist-fft floor)" ;;
      pipelines) for k in 1 2; do
          script+="$(bench gpu-pipelines-pes$k --pipeline --gpu $(pes $k) --size 8GiB --chunks 16 64 256 1024 --tasks-up-to 256 --reps 4)"
        done ;;
      *) echo "unknown: $w"; exit 2 ;;
    esac; done
    if [ "$mode" = run ]; then bash -c "$script"; exit; fi
    launch "$dir" benches "$script"
    echo "benches started: $what" ;;
  wait) wait_while "${2:-}" ;;
  collect)
    running && echo "(still running)"
    for log in "$dir"/*.log; do [ -f "$log" ] && { echo "== $(basename "$log")"; grep -vE '^[0-9-]+ [0-9:,]+ - |^\s*$|[Ww]arn' "$log" | tail -15; }; done
    pack benches "$dir" ;;
  *) sed -n 2,33p "$0"; exit 2 ;;
esac
