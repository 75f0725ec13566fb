# Sourced by soaks.sh and suites.sh: what their detached jobs share.
#
# copy_tree NAME: a copy of the checkout in /tmp/redist-tree-NAME (echoed), for a detached job to
#   run from: every later call re-sends the checkout, and a worker (re)starting meanwhile could
#   find a module missing (2026-12-02: a killed worker's replacement failed to start that way,
#   and its soak went on with one worker)
# wait_while SECONDS: until `running` (the sourcing script's) is false, or SECONDS have passed
# pack NAME DIR: DIR as $OUT/NAME.tgz (a call brings back at most 8 files)
copy_tree() {
  local to=/tmp/redist-tree-$1
  rm -rf "$to"; mkdir -p "$to"
  tar cf - --exclude=./.gpu --exclude=./.git . | tar xf - -C "$to"
  echo "$to"
}
wait_while() {
  local deadline=$(( $(date +%s) + ${1:-100000} ))
  while running && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
}
pack() {
  local out=${OUT:-/tmp/redist-check}
  mkdir -p "$out" && tar czf "$out/$1.tgz" -C "$2" .
}
