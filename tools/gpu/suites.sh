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
# detached jobs run from a copy of the tree: every later call re-sends the checkout, and a
# worker (re)starting meanwhile could find a module missing (2026-12-02: a killed worker's
# replacement failed to start that way, and its soak went on with one worker)
copy() { local to=/tmp/redist-tree-$1; rm -rf "$to"; mkdir -p "$to"; tar cf - --exclude=./.gpu --exclude=./.git . | tar xf - -C "$to"; echo "$to"; }
dir=/tmp/redist-suites; mkdir -p "$dir"
running() { compgen -G "$dir/*.running" > /dev/null; }
case ${1:-} in
  start)
    shift
    tree=$(copy suites)
    for chain in "$@"; do
      touch "$dir/chain-$chain.running"
      script=""
      for pes in ${chain//,/ }; do
        steps="world gpu"; [ "$pes" = 1 ] && steps="versions doctor gpu"
        script+="OUT=$dir/pes$pes REDIST_TEST_GPUS=1 REDIST_TEST_PES=$pes bash $tree/tools/gpu/check.sh $steps; "
      done
      setsid nohup bash -c "$script rm -f $dir/chain-$chain.running" > "$dir/chain-$chain.out" 2>&1 < /dev/null &
      echo "chain $chain started"
    done ;;
  wait)
    deadline=$(( $(date +%s) + ${2:-100000} ))
    while running && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done ;;
  collect)
    out=${OUT:-/tmp/redist-check}; mkdir -p "$out"
    running && echo "(still running: $(cd "$dir" && ls *.running | tr '\n' ' '))"
    for s in "$dir"/pes*/summary.txt; do [ -f "$s" ] && { echo "== $(basename "$(dirname "$s")")"; cat "$s"; }; done
    tar czf "$out/suites.tgz" -C "$dir" . ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
