#!/usr/bin/env bash
# Peer projects' own test suites, off and with dask-redist on (docs/compatibility.md):
#
#   dask-rechunk         dask's dask/array/tests/test_rechunk.py
#   dask-fft             dask's dask/array/tests/test_fft.py, dask.array.fft replaced by dask_redist.fft
#   distributed-rechunk  distributed's distributed/shuffle/tests/test_rechunk.py
#   xarray-dask          xarray's xarray/tests/test_dask.py
#
# usage: tools/peer-suites.sh [SUITE ...]        (default: all four; then the summary)
#        tools/peer-suites.sh summary            (the summary of what ran so far)
#
# The tests are the installed releases' (dask and xarray ship them), run with the pytest
# configuration (warning filters included) and root conftest.py of the same release's sdist
# (`pip download --no-binary`), but for its addopts (plugins such as pytest-cov, output options):
# only --strict-markers is kept. distributed's wheel and sdist leave its tests out: they come
# from a git clone, DISTRIBUTED_GIT, at DISTRIBUTED_REF (default: the installed version's tag).
#
# Each suite runs off and on (tools/peer_suites/redist_plugin.py: `dask_redist.enable()` with
# redist.min-bytes PEER_MIN_BYTES, default 0: every eligible rechunk is a collective; the
# collective runs counted); dask's and xarray's without a Client and on a session Client of
# in-process workers and of worker processes (WORKERS, default "none inproc processes"; off runs
# with the same Client), distributed's on the clusters its tests start. Results (JUnit XML, runs as JSON) go to
# PEER_DIR/results (default .peer-suites/results); PYTEST_ARGS are passed to every run; a test
# running longer than PEER_TIMEOUT seconds (default 120) fails (pytest-timeout).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
DIR=${PEER_DIR:-$ROOT/.peer-suites}
WORKERS=${WORKERS:-none inproc processes}
RESULTS=$DIR/results
TIMEOUT=${PEER_TIMEOUT:-120}  # seconds per test (pytest-timeout): a test that hangs fails instead
mkdir -p "$DIR/src" "$DIR/run" "$RESULTS"

version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
site() { "$PY" -c "import $1, os; print(os.path.dirname($1.__file__))"; }

sdist() { # the sdist of the installed release of $1, unpacked; prints its directory
    local name=$1 v
    v=$(version "$name")
    if [ ! -d "$DIR/src/$name-$v" ]; then
        "$PY" -m pip download -q --no-deps --no-binary :all: "$name==$v" -d "$DIR/src" >&2
        tar xzf "$DIR/src/$name-$v.tar.gz" -C "$DIR/src"
    fi
    echo "$DIR/src/$name-$v"
}

prepare() { # run directory $1: the pytest configuration and root conftest.py of source tree $2
    local run=$DIR/run/$1
    mkdir -p "$run"
    cp "$2/pyproject.toml" "$run/pyproject.toml"
    cp "$2/conftest.py" "$run/peer_conftest.py"
    echo "$run"
}

run() { # SUITE MODE(off|on) CLIENT(none|inproc|processes) RUNDIR ENV... -- PYTEST ARGS...
    local suite=$1 mode=$2 client=$3 rundir=$4 tag
    shift 4
    tag=$mode$([ "$client" = none ] || echo "-$client")
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "== $suite $tag" >&2
    (cd "$rundir" && env "${envs[@]}" PEER_REDIST="$mode" PEER_CLIENT="$client" \
        PEER_REPORT="$RESULTS/$suite.$tag.json" PYTHONPATH="$ROOT/tools/peer_suites:$rundir" \
        "$PY" -m pytest -c pyproject.toml --rootdir . -o addopts=--strict-markers -o timeout="$TIMEOUT" \
        -p redist_plugin -p peer_conftest -p no:cacheprovider -q --junitxml="$RESULTS/$suite.$tag.xml" "$@" ${PYTEST_ARGS:-} \
        | tail -n 3) || true
}

with_clients() { # SUITE RUNDIR ENV... -- PYTEST ARGS: off and on, on each WORKERS' session Client
    local suite=$1 rundir=$2 kind mode
    shift 2
    for kind in $WORKERS; do
        for mode in off on; do run "$suite" "$mode" "$kind" "$rundir" "$@"; done
    done
}

dask_rechunk() {
    local rundir
    rundir=$(prepare dask-rechunk "$(sdist dask)")
    with_clients dask-rechunk "$rundir" PEER_SUITE=dask-rechunk -- --pyargs dask.array.tests.test_rechunk
}

dask_fft() {
    local rundir
    rundir=$(prepare dask-fft "$(sdist dask)")
    # (the module under test: every dask.array.fft in the file, as `da.fft` too, is dask_redist.fft)
    sed -e 's/^import dask\.array\.fft$/import dask_redist.fft/' \
        -e 's/from dask\.array\.fft import fft_wrap/from dask_redist.fft import fft_wrap/' \
        -e 's/dask\.array\.fft/dask_redist.fft/g' -e 's/\bda\.fft\b/dask_redist.fft/g' \
        "$(site dask)/array/tests/test_fft.py" > "$rundir/test_fft_redist.py"
    grep -q "dask.array.fft\|da\.fft" "$rundir/test_fft_redist.py" && { echo "dask-fft: substitution incomplete" >&2; exit 1; }
    with_clients dask-fft "$rundir" PEER_SUITE=dask-fft -- test_fft_redist.py
}

distributed_rechunk() {
    local git=${DISTRIBUTED_GIT:-} ref=${DISTRIBUTED_REF:-$(version distributed)} src rundir
    if [ -z "$git" ]; then
        echo "distributed-rechunk: skipped, set DISTRIBUTED_GIT to a git clone of dask/distributed" >&2
        return 0
    fi
    src=$DIR/src/distributed-git-$ref
    if [ ! -d "$src" ]; then
        mkdir -p "$src"
        git -C "$git" archive "$ref" distributed/shuffle/tests | tar -x -C "$src"
    fi
    rundir=$DIR/run/distributed-rechunk
    mkdir -p "$rundir"
    cp "$(sdist distributed)/pyproject.toml" "$rundir/pyproject.toml"
    git -C "$git" show "$ref:conftest.py" > "$rundir/peer_conftest.py"
    for mode in off on; do
        run distributed-rechunk "$mode" none "$rundir" PEER_PATHS="distributed.shuffle=$src/distributed/shuffle" \
            -- --pyargs distributed.shuffle.tests.test_rechunk
    done
}

xarray_dask() {
    local rundir
    rundir=$(prepare xarray-dask "$(sdist xarray)")
    with_clients xarray-dask "$rundir" PEER_SUITE=xarray-dask -- --pyargs xarray.tests.test_dask
}

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(dask-rechunk dask-fft distributed-rechunk xarray-dask)
for suite in "${suites[@]}"; do
    case $suite in
        dask-rechunk) dask_rechunk ;;
        dask-fft) dask_fft ;;
        distributed-rechunk) distributed_rechunk ;;
        xarray-dask) xarray_dask ;;
        summary) ;;
        *) echo "unknown suite $suite (dask-rechunk, dask-fft, distributed-rechunk, xarray-dask, summary)" >&2; exit 2 ;;
    esac
done
"$PY" "$ROOT/tools/peer_suites/summary.py" "$RESULTS"
