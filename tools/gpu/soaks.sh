#!/usr/bin/env bash
# On the GPU node, after install.sh: soaks with kills that outlive the call starting them (a call
# runs at most 10 minutes; the machine keeps detached processes while it stays warm).
#   bash tools/gpu/soaks.sh start MINUTES PES:SEED...   e.g. start 10 2:11 2:12 4:13
#     one `dask-redist soak --gpu --engine cufftmp` per PES:SEED, each on its own cluster of PES
#     worker processes sharing GPU 0, every step kind, logs in /tmp/redist-soaks
#   bash tools/gpu/soaks.sh wait [SECONDS]   until every soak has ended (or SECONDS have passed)
#   bash tools/gpu/soaks.sh collect   one summary line per soak, the logs as $OUT/soaks.tgz
set -uo pipefail
cd "$(dirname "$0")/../.."
# detached jobs run from a copy of the tree: every later call re-sends the checkout, and a
# worker (re)starting meanwhile could find a module missing (2026-12-02: a killed worker's
# replacement failed to start that way, and its soak went on with one worker)
copy() { local to=/tmp/redist-tree-$1; rm -rf "$to"; mkdir -p "$to"; tar cf - --exclude=./.gpu --exclude=./.git . | tar xf - -C "$to"; echo "$to"; }
source tools/gpu/env.sh
dir=/tmp/redist-soaks; mkdir -p "$dir"
export DASK_REDIST__TIMEOUTS__COLLECTIVE=${DASK_REDIST__TIMEOUTS__COLLECTIVE:-30s}
export DASK_REDIST__TIMEOUTS__BOOTSTRAP=${DASK_REDIST__TIMEOUTS__BOOTSTRAP:-60s}
# 64 MiB arrays at most: a small heap per PE leaves the GPU to whatever runs beside the soaks
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-2G}
running() { pgrep -f "dask_redist.cli soak" > /dev/null; }
case ${1:-} in
  start)
    minutes=$2; shift 2
    tree=$(copy soaks); cd "$tree"; export PYTHONPATH=$tree
    for spec in "$@"; do
      pes=${spec%%:*}; seed=${spec##*:}; log=$dir/soak-pes$pes-seed$seed.log
      date -u +"start %H:%M:%S UTC" > "$log"
      setsid nohup python3 -m dask_redist.cli soak --gpu --workers "$pes" --pes-per-gpu "$pes" \
        --engine cufftmp --minutes "$minutes" --max-bytes 64MiB --seed "$seed" >> "$log" 2>&1 < /dev/null &
      echo "soak at $pes PEs, seed $seed, $minutes min: $log"
    done ;;
  wait)
    deadline=$(( $(date +%s) + ${2:-100000} ))
    while running && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done ;;
  collect)
    out=${OUT:-/tmp/redist-check}; mkdir -p "$out"
    running && echo "(soaks still running)"
    for log in "$dir"/*.log; do
      steps=$(grep -cE '^step +[0-9]+ +[a-z]' "$log"); stalls=$(grep -c 'still running after' "$log")
      printf '%-22s %5s steps  %s stalls  %s\n' "$(basename "$log" .log)" "$steps" "$stalls" \
        "$(grep -E '^[0-9]+ problems' "$log" | tail -1)"
    done
    tar czf "$out/soaks.tgz" -C "$dir" . ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
