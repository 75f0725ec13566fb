#!/usr/bin/env bash
# Build .gpu/ in the project checkout: what `pip install -e '.[gpu]'` resolves to for the
# GPU node (Python 3.12, x86_64), split into parts that each fit one transfer (64 MiB with the
# working tree). Run here, where the package index is reachable; the node has no network.
#
#   bash tools/gpu/make-bundle.sh            # [gpu] plus rmm (for the RMM-pool test)
#   WITH_UCX=1 bash tools/gpu/make-bundle.sh # [gpu,ucx]: also distributed-ucxx and libucx
#   SKIP="numpy pandas" XZ_OPTS=-9e PART_MB=61 bash tools/gpu/make-bundle.sh
#     fewer parts (each a call, and device time): leave out packages the node has at another
#     version (install.sh says MISSING for them: the node's own version is used), compress harder
#
# 1. resolve '.[gpu,ucx]' in a fresh Python 3.12 venv (pip's report: the exact set users get);
# 2. download those wheels (cached in $REDIST_GPU_CACHE), except those node-image.txt lists;
# 3. wheels over 20 MB are unpacked and xz-compressed (libcufftMp and NVSHMEM's bitcode shrink
#    to a third); everything goes into one tar, split into parts of $PART_MB MB: .gpu/p1 .. pN.
# On the node, tools/gpu/install.sh puts the parts together and pip-installs every wheel whose
# version the node's Python does not already have (docs/gpu-testing.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel); cd "$root"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
cache=${REDIST_GPU_CACHE:-/tmp/redist-gpu-cache}
py=${PYTHON312:-python3.12}
if ! "$py" --version > /dev/null 2>&1; then  # (a pyenv shim of a version not selected here fails)
  py=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)
  [ -n "$py" ] || { echo "no Python 3.12 found: set PYTHON312 to one" >&2; exit 1; }
fi
part_mb=${PART_MB:-56}
xzopts=${XZ_OPTS:--6}; xzdir=$cache/xz${XZ_OPTS:+-${XZ_OPTS//[^0-9a-z]/}}
mkdir -p "$cache/wheels" "$xzdir"

venv=$(mktemp -d)/venv
"$py" -m venv "$venv" && "$venv/bin/pip" install -q -U pip
start=$(date +%s.%N)
"$venv/bin/pip" install -q --dry-run --ignore-installed --report "$cache/report.json" '.[gpu,ucx]'
echo "resolved '.[gpu,ucx]' on $("$py" --version) in $(python3 -c "import time;print(round(time.time()-$start,1))") s"
"$venv/bin/python" - "$cache/report.json" > "$cache/resolved.txt" <<'PY'
import json, sys
for i in json.load(open(sys.argv[1]))["install"]:
    if i["metadata"]["name"] != "dask-redist":
        print(f"{i['metadata']['name']}=={i['metadata']['version']}")
PY
ucx='^(distributed-ucxx|ucxx|libucxx|libucx)-cu13=='
# what the node image already has at the resolved version travels not (install.sh checks it there)
skip=$(grep -Eo '^[^ #]+' "$here/node-image.txt" | paste -sd'|' | sed 's/[.]/[.]/g')
if [ "${WITH_UCX:-0}" = 1 ]; then cp "$cache/resolved.txt" "$cache/wanted.txt"
else grep -Ev "$ucx" "$cache/resolved.txt" > "$cache/wanted.txt"; fi
[ -z "${SKIP:-}" ] || skip="${skip:+$skip|}$(for n in $SKIP; do printf '%s==.*|' "$n"; done | sed 's/|$//')"
[ -z "$skip" ] || { grep -Eivx "$skip" "$cache/wanted.txt" > "$cache/wanted.tmp" || true; mv "$cache/wanted.tmp" "$cache/wanted.txt"; }
"$venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$cache/wheels" -r "$cache/wanted.txt"

stage=$(mktemp -d); mkdir -p "$stage/wheels" "$stage/xz"
while read -r pin; do
  name=${pin%%==*}; version=${pin##*==}
  whl=$(ls "$cache/wheels/$(echo "$name" | tr - _)-$version-"*.whl 2>/dev/null | head -1 || true)
  [ -n "$whl" ] || whl=$(ls "$cache/wheels/"*"-$version-"*.whl | grep -i "/$(echo "$name" | tr - _)-" | head -1)
  if [ "$(stat -c %s "$whl")" -gt 20000000 ]; then
    xz="$xzdir/$(basename "$whl").tar.xz"
    if [ ! -f "$xz" ]; then
      tmp=$(mktemp -d); (cd "$tmp" && unzip -q "$whl" && tar cf - . | xz -T0 "$xzopts" > "$xz.tmp" && mv "$xz.tmp" "$xz"); rm -rf "$tmp"
    fi
    cp "$xz" "$stage/xz/"
  else
    cp "$whl" "$stage/wheels/"
  fi
done < "$cache/wanted.txt"
cp "$cache/resolved.txt" "$stage/resolved.txt"

rm -rf .gpu && mkdir -p .gpu
(cd "$stage" && tar cf - resolved.txt wheels xz) | split -b "${part_mb}M" -d -a 2 - .gpu/part.
n=$(ls .gpu/part.* | wc -l)
i=1; for f in .gpu/part.*; do mkdir -p ".gpu/p$i"; mv "$f" ".gpu/p$i/"; i=$((i + 1)); done
echo "$n" > .gpu/p1/parts
rm -rf "$stage" "$(dirname "$venv")"
du -sh .gpu/p* | tr '\n' ' '; echo
echo "$n parts: carry .gpu/p1 .. .gpu/p$n, one per run, each running: bash tools/gpu/install.sh"
