# Sourced by soaks.sh, suites.sh and benches.sh: what their detached jobs share.
#
# launch DIR NAME SCRIPT: run the shell SCRIPT detached (its own session: it outlives the call),
#   output in DIR/NAME.out, DIR/NAME.running present until it ends; launched DIR: any still running
# copy_tree NAME: a copy of the checkout in /tmp/redist-tree-NAME (echoed), for a detached job to
#   run from: every later call re-sends the checkout, and a worker (re)starting meanwhile could
#   find a module missing (2026-12-02: a killed worker's replacement failed to start that way,
#   and its soak went on with one worker)
# wait_while SECONDS: until `running` (the sourcing script's) is false, or SECONDS have passed
# pack NAME DIR: DIR as $OUT/NAME.tgz (a call brings back at most 8 files)
launch() {
  touch "$1/$2.running"
  setsid nohup bash -c "$3 rm -f $1/$2.running" > "$1/$2.out" 2>&1 < /dev/null &
}
launched() { compgen -G "$1/*.running" > /dev/null; }
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
