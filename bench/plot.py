#!/usr/bin/env python3
"""Latency vs token count (log-log), one PNG per layer: hmoe, every peer, and the floor.

usage: python3 bench/plot.py OUT_DIR RESULT.json [RESULT.json ...]

Reads JSON in the hmoe-bench/1 format (`hmoe bench --json`, bench/peers.py); rows of the same
layer and dtype merge into one plot, OUT_DIR/<layer>.png (<layer>-<dtype>.png when not bf16). The floor line is DESIGN.md §4's
max(bytes / bandwidth, FLOPs / peak) from hmoe's rows (same routing as every peer).
"""
from __future__ import annotations

import collections
import json
import os
import sys

STYLE = {  # impl -> (colour, marker); unknown peers get matplotlib's cycle
    "hmoe": ("#d62728", "o"),
    "cublas-loop": ("#1f77b4", "s"),
    "torch-grouped-mm-bf16": ("#2ca02c", "^"),
    "torch-eager-loop-bf16": ("#9467bd", "v"),
    "torch-scaled-grouped-mm-fp8-rowwise": ("#8c564b", "D"),
}


def plot_name(layer):
    """The file stem of a layer's plot: the layer name, plus the dtype when it is not bf16."""
    return layer["name"] if layer.get("dtype", "bf16") == "bf16" else f"{layer['name']}-{layer['dtype']}"


def load_rows(paths):
    """{layer name: {"layer": ..., "device": ..., "rows": [...]}} merged over the files."""
    merged = collections.OrderedDict()
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if report.get("schema") != "hmoe-bench/1" or not report.get("layer"):
            continue  # ceilings-only files have no layer
        entry = merged.setdefault(plot_name(report["layer"]),
                                  {"layer": report["layer"], "device": report.get("device", ""), "rows": []})
        entry["rows"].extend(report["rows"])
    return merged


def plot_layer(name, entry, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    by_impl = collections.OrderedDict()
    for row in entry["rows"]:
        by_impl.setdefault(row["impl"], {})[row["T"]] = row  # a repeated T keeps the last run
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    hmoe = by_impl.get("hmoe", {})
    if hmoe:
        tokens = sorted(t for t in hmoe if hmoe[t].get("floor_us"))
        if tokens:
            ax.plot(tokens, [hmoe[t]["floor_us"] for t in tokens], color="black", linestyle="--", linewidth=1.2,
                    label="floor (measured ceilings)")
    for impl, rows in by_impl.items():
        tokens = sorted(rows)
        colour, marker = STYLE.get(impl, (None, "x"))
        medians = [rows[t]["median_us"] for t in tokens]
        lower = [max(m - rows[t]["p10_us"], 0.0) for t, m in zip(tokens, medians)]
        upper = [max(rows[t]["p90_us"] - m, 0.0) for t, m in zip(tokens, medians)]
        ax.errorbar(tokens, medians, yerr=[lower, upper], color=colour, marker=marker, markersize=4, linewidth=1.4,
                    capsize=2, label=impl)
    layer = entry["layer"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("tokens per call T")
    ax.set_ylabel("latency per layer (µs, median; bars p10-p90)")
    ax.set_title(f"{name}: E={layer['E']} k={layer['k']} H={layer['H']} I={layer['I']}, {layer['dtype']}, "
                 f"{layer['routing']} routing\n{entry['device']}", fontsize=9)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2 if not argv or argv[0] not in ("-h", "--help") else 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install matplotlib); no plots written", file=sys.stderr)
        return 1
    out_dir, paths = argv[0], argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    merged = load_rows(paths)
    if not merged:
        print("plot.py: no layer rows in " + " ".join(paths), file=sys.stderr)
        return 1
    for name, entry in merged.items():
        out_path = os.path.join(out_dir, f"{name}.png")
        plot_layer(name, entry, out_path)
        print(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
