"""Plot benchmark JSON files (from `dask-redist bench --out`): time vs chunk count, per method, log scale.

    python benchmarks/plot.py docs/benchmarks/gpu-8gib.json docs/benchmarks/gpu-8gib-v2.json -o docs/benchmarks/gpu-8gib.png
    python benchmarks/plot.py docs/benchmarks/gpu-suite.json --match "slab 8.00 GiB" float64 -o docs/benchmarks/gpu-suite.png

Each input file becomes its own line style; unsupported methods (no timings) are listed in the legend.
Needs matplotlib (not a dependency of dask-redist).
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--title", default="")
    parser.add_argument(
        "--match", nargs="+", default=[], help="plot only cases whose name contains all of these"
    )
    args = parser.parse_args()

    fig, ax = plt.subplots(figsize=(9, 4.5))
    styles = ["-o", "--s", ":^", "-.d"]
    notes = []
    for n, path in enumerate(args.files):
        doc = json.load(open(path))
        label = os.path.splitext(os.path.basename(path))[0]
        series: dict[str, list] = {}
        for r in doc["results"]:
            if not all(m in r["case"] for m in args.match):
                continue
            if r["times"]:
                series.setdefault(r["method"], []).append((r["nchunks_in"], r["median"]))
            elif r.get("error"):
                notes.append(f"{r['method']}: unsupported ({r['error'].split(':')[0]}, see the table)")
        for method, points in sorted(series.items()):
            points.sort()
            ax.plot(*zip(*points), styles[n % len(styles)], label=f"{method} [{label}]")
        env = doc["environment"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("chunks (slabs before = slabs after)")
    ax.set_ylabel("seconds, median end to end")
    title = args.title or f"{env.get('date', '')}, {env.get('workers')} workers"
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(
        fontsize=7,
        title="\n".join(sorted(set(notes))) or None,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
    )
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
