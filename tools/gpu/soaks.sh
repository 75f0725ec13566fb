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
source tools/gpu/detached.sh
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
    tree=$(copy_tree soaks); cd "$tree"; export PYTHONPATH=$tree
    for spec in "$@"; do
      pes=${spec%%:*}; seed=${spec##*:}; log=$dir/soak-pes$pes-seed$seed.log
      date -u +"start %H:%M:%S UTC" > "$log"
      setsid nohup python3 -m dask_redist.cli soak --gpu --workers "$pes" --pes-per-gpu "$pes" \
        --engine cufftmp --minutes "$minutes" --max-bytes 64MiB --seed "$seed" >> "$log" 2>&1 < /dev/null &
      echo "soak at $pes PEs, seed $seed, $minutes min: $log"
    done ;;
  wait) wait_while "${2:-}" ;;
  collect)
    running && echo "(soaks still running)"
    for log in "$dir"/*.log; do
      steps=$(grep -cE '^step +[0-9]+ +[a-z]' "$log"); stalls=$(grep -c 'still running after' "$log")
      printf '%-22s %5s steps  %s stalls  %s\n' "$(basename "$log" .log)" "$steps" "$stalls" \
        "$(grep -E '^[0-9]+ problems' "$log" | tail -1)"
    done
    pack soaks "$dir" ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
