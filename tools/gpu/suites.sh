#!/usr/bin/env bash
# On the GPU node, after install.sh: the GPU suite at several PE counts on one GPU, detached (a
# call runs at most 10 minutes; the machine keeps detached processes while it stays warm).
#   bash tools/gpu/suites.sh start CHAIN...   e.g. start 1,4 2
#     one detached chain per argument, its PE counts one after another, the chains side by side:
#     1 PE runs `check.sh versions doctor gpu`, K > 1 PEs `check.sh world gpu` with
#     REDIST_TEST_PES=K, all with REDIST_TEST_GPUS=1; logs in /tmp/redist-suites/pesK
#   bash tools/gpu/suites.sh wait [SECONDS]   until every chain has ended (or SECONDS have passed)
#   bash tools/gpu/suites.sh collect          every summary line, and the logs as $OUT/suites.tgz
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/detached.sh
dir=/tmp/redist-suites; mkdir -p "$dir"
running() { launched "$dir"; }
case ${1:-} in
  start)
    shift
    tree=$(copy_tree suites)
    for chain in "$@"; do
      script=""
      for pes in ${chain//,/ }; do
        steps="world gpu"; [ "$pes" = 1 ] && steps="versions doctor gpu"
        script+="OUT=$dir/pes$pes REDIST_TEST_GPUS=1 REDIST_TEST_PES=$pes bash $tree/tools/gpu/check.sh $steps; "
      done
      launch "$dir" "chain-$chain" "$script"
      echo "chain $chain started"
    done ;;
  wait) wait_while "${2:-}" ;;
  collect)
    running && echo "(still running: $(cd "$dir" && ls *.running | tr '\n' ' '))"
    for s in "$dir"/pes*/summary.txt; do [ -f "$s" ] && { echo "== $(basename "$(dirname "$s")")"; cat "$s"; }; done
    pack suites "$dir" ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
