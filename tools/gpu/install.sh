#!/usr/bin/env bash
# On the GPU node, once per run that carries a part of .gpu/ (made by make-bundle.sh): keep the
# part in /tmp/stash; once every part has arrived, unpack them and pip-install, into the node's own
# Python, every wheel of the resolved set whose version it does not already have. Then
# `source tools/gpu/env.sh`. /tmp lasts while the machine stays warm.
set -euo pipefail
stash=/tmp/stash
mkdir -p "$stash"
for d in .gpu/p*; do [ -d "$d" ] && cp -n "$d"/* "$stash"/ 2>/dev/null || true; done
[ -f "$stash/parts" ] || { echo "no part 1 yet: carry .gpu/p1"; exit 0; }
want=$(cat "$stash/parts"); have=$(ls "$stash"/part.* 2>/dev/null | wc -l)
if [ "$have" -lt "$want" ]; then echo "have $have of $want parts"; exit 0; fi
[ -f "$stash/.installed" ] && { echo "installed already"; exit 0; }
work=$stash/unpacked; rm -rf "$work"; mkdir -p "$work"
cat "$stash"/part.* | tar xf - -C "$work"
for xz in "$work"/xz/*.tar.xz; do  # big wheels travel unpacked and xz-compressed: zip them again
  [ -e "$xz" ] || continue
  name=$(basename "$xz" .tar.xz); tree=$(mktemp -d)
  xz -dc "$xz" | tar xf - -C "$tree"
  python3 - "$tree" "$work/wheels/$name" <<'PY'
import os, sys, zipfile
tree, out = sys.argv[1:]
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
    for folder, _, files in os.walk(tree):
        for f in files:
            path = os.path.join(folder, f)
            z.write(path, os.path.relpath(path, tree))
PY
  rm -rf "$tree"
done
python3 -m pip list --format=freeze 2>/dev/null | tr 'A-Z_' 'a-z-' | sort > "$stash/node-before.txt"
python3 - "$work/resolved.txt" "$stash/node-before.txt" "$work/wheels" > "$stash/to-install.txt" <<'PY'
import os, sys
resolved, before, wheels = sys.argv[1:]
norm = lambda s: s.strip().lower().replace("_", "-")
have = {norm(l) for l in open(before)}
files = {norm(f.split("-")[0]): f for f in os.listdir(wheels)}
for pin in map(norm, open(resolved)):
    name = pin.split("==")[0]
    if pin in have:
        continue
    if name not in files:
        print(f"# MISSING {pin}: not in the bundle (node has {[h for h in have if h.startswith(name + '==')]})", file=sys.stderr)
        continue
    print(os.path.join(wheels, files[name]))
PY
echo "installing $(wc -l < "$stash/to-install.txt") wheels the node lacks or has at another version"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade $(cat "$stash/to-install.txt")
python3 -m pip list --format=freeze 2>/dev/null | tr 'A-Z_' 'a-z-' | sort > "$stash/node-after.txt"
touch "$stash/.installed"
python3 -c "import dask, distributed, dask_cuda, nvmath, cupy, numpy; print('dask', dask.__version__, 'distributed', distributed.__version__, 'dask-cuda', dask_cuda.__version__, 'nvmath', nvmath.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__, 'gpus', cupy.cuda.runtime.getDeviceCount())"
