"""Merge the GPU benchmark JSON files into one results file, a markdown table and a PNG plot.

    python3 bench/gpu/report.py part1 --out DIR  part1-*.json
    python3 bench/gpu/report.py loop  --out DIR  loop.json

Table building is pure (`part1_table`, `loop_table`); only `main` reads and writes files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _fmt(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


LOOP_PARTS = ("part2_saturated", "part2_steady", "part3")
LOOP_TITLES = {"part2_saturated": "Part 2, IPC handle cache, above capacity",
               "part2_steady": "Part 2, IPC handle cache, below capacity",
               "part3": "Part 3, profiler sidecar, below capacity"}


def part1_table(results: list[dict]) -> str:
    """Markdown table: one row per implementation, resolution and image count."""
    lines = [
        "| transport | res | images | feature MiB | per-feature median off / on (us) | per-feature p99 off / on (us)"
        " | per-request median off / on (us) | per-request p99 off / on (us) | median speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for c in res["cells"]:
            off, on = c["off"], c["on"]
            lines.append(
                f"| {res['name']} | {c['resolution']} | {c['n_images']} | {c['feature_bytes'] / 2**20:.2f}"
                f" | {_fmt(off['per_feature_us']['median'])} / {_fmt(on['per_feature_us']['median'])}"
                f" | {_fmt(off['per_feature_us']['p99'])} / {_fmt(on['per_feature_us']['p99'])}"
                f" | {_fmt(off['per_request_us']['median'])} / {_fmt(on['per_request_us']['median'])}"
                f" | {_fmt(off['per_request_us']['p99'])} / {_fmt(on['per_request_us']['p99'])}"
                f" | {c['speedup_feature_median']:.1f}x |")
    return "\n".join(lines)


def loop_table(result: dict) -> str:
    """Markdown tables for the GPU loop: cache off/on (part 2) and profiler modes (part 3)."""
    out = []
    for part in LOOP_PARTS:
        rows = result.get(part)
        if not rows:
            continue
        summary = rows["summary"]
        base = next(iter(summary.values()))
        out.append(f"{LOOP_TITLES[part]}, {rows['rate']:g} req/s offered:\n")
        out.append("| mode | loop it/s (median of windows) | vs first row | tokens/s | vs first row | mean iteration (ms)"
                   " | ITL mean / p99 (ms) | TTFT mean / p50 / p99 (ms) | windows |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for name, s in summary.items():
            out.append(f"| {name} | {_fmt(s['iter_per_s_median'])}"
                       f" | {100 * (s['iter_per_s_median'] / base['iter_per_s_median'] - 1):+.1f}%"
                       f" | {s['tokens_per_s_median']:.0f}"
                       f" | {100 * (s['tokens_per_s_median'] / base['tokens_per_s_median'] - 1):+.1f}%"
                       f" | {s['iter_ms_median']:.2f} | {_fmt(s['itl_ms_mean'])} / {_fmt(s['itl_ms_p99'])}"
                       f" | {_fmt(s['ttft_ms_mean'])} / {_fmt(s['ttft_ms_p50'])} / {_fmt(s['ttft_ms_p99'])}"
                       f" | {s['windows']} |")
        out.append("")
    return "\n".join(out)


def plot_part1(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels, width = [], 0.38
    x = 0
    for res in results:
        for c in [c for c in res["cells"] if c["n_images"] == 3]:
            for i, key in enumerate(("off", "on")):
                s = c[key]["per_feature_us"]
                ax1.bar(x + (i - 0.5) * width, s["median"], width, color=("tab:red", "tab:green")[i],
                        label=f"cache {key}" if x == 0 else None)
                ax1.plot([x + (i - 0.5) * width] * 2, [s["median"], s["p99"]], color="black", lw=1)
                ax1.plot(x + (i - 0.5) * width, s["p99"], marker="_", color="black", ms=10)
            labels.append(f"{res['name']}\n{c['resolution']}")
            x += 1
    ax1.set_xticks(range(len(labels)), labels, fontsize=7)
    ax1.set_yscale("log")
    ax1.set_ylabel("reconstruct per feature (us), bar=median, tick=p99")
    ax1.set_title("Per-feature reconstruct (3-image requests)")
    ax1.legend()
    for res in results:
        for key, style in (("off", "--"), ("on", "-")):
            cells = [c for c in res["cells"] if c["resolution"] == "1080p"]
            ax2.plot([c["n_images"] for c in cells], [c[key]["per_request_us"]["median"] for c in cells],
                     style, marker="o", label=f"{res['name']} cache {key}")
    ax2.set_xlabel("images per request (1080p)")
    ax2.set_ylabel("reconstruct per request, median (us)")
    ax2.set_yscale("log")
    ax2.set_title("Per-request reconstruct")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_loop(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in LOOP_PARTS if result.get(p)]
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.5), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        windows = result[part]["windows"]
        names = list(result[part]["summary"])
        for i, name in enumerate(names):
            ys = [w["iter_per_s"] for w in windows if w["mode"] == name]
            ax.scatter([i] * len(ys), ys, alpha=0.6)
            ax.plot([i - 0.25, i + 0.25], [result[part]["summary"][name]["iter_per_s_median"]] * 2, color="black")
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("loop iterations per second (dots: windows, bar: median)")
        ax.set_title(f"{LOOP_TITLES[part]}\n{result[part]['rate']:g} req/s offered", fontsize=9)
    fig.suptitle(result.get("loop", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("part1", "loop"))
    ap.add_argument("--out", required=True, help="directory for the merged JSON, table and plot")
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    loaded = []
    for p in args.inputs:
        with open(p) as f:
            loaded.append(json.load(f))
    if args.kind == "part1":
        table = part1_table(loaded)
        with open(os.path.join(args.out, "part1.json"), "w") as f:
            json.dump(loaded, f)
        plot = os.path.join(args.out, "part1.png")
        draw = lambda: plot_part1(loaded, plot)  # noqa: E731
    else:
        table = loop_table(loaded[0])
        plot = os.path.join(args.out, "loop.png")
        draw = lambda: plot_loop(loaded[0], plot)  # noqa: E731
    print(table)
    try:
        draw()
    except ImportError as e:  # no matplotlib: plot later from the JSON on another machine
        print(f"no plot: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
