#!/usr/bin/env python3
"""Renders docs/BENCHMARKS.md from the JSON files bench/report.sh collects.

usage: python3 bench/report.py RESULTS_DIR OUT_MD

RESULTS_DIR holds: ceilings.json (`hmoe bench --ceilings --json`), <preset>.json (`hmoe bench
--model <preset> --peers cublas --e2e --json`), optionally <preset>.peers.json (bench/peers.py),
<preset>.repeat.json (a second hmoe run of the same sweep), <preset>@<dtype>.json for FP8
sweeps (compared with the FP8 peer rows of <preset>.peers.json), env.json (card, driver, CUDA, torch,
date, the report command, FP8 status) written by report.sh. Plots are referenced as
img/<preset>.png next to the page. Every number printed comes from those files.
"""
from __future__ import annotations

import collections
import json
import os
import sys

LARGEST_DECODE_BATCH = 256  # as `hmoe bench --e2e`: T <= 256 is a decode step at batch B = T
REPEAT_TOLERANCE = 0.03


def read_json(path):
    with open(path) as f:
        return json.load(f)


def fmt(value, digits=1):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}".replace(",", " ")


def presets_in(results):
    names = []
    for file in sorted(os.listdir(results)):
        if file.endswith(".json") and file.count(".") == 1 and file not in ("ceilings.json", "env.json"):
            names.append(file[:-5])
    return names


def rows_by_impl(reports):
    table = collections.OrderedDict()
    for report in reports:
        for row in report["rows"]:
            table.setdefault(row["impl"], {})[row["T"]] = row
    return table


def layer_section(name, main, peers, lines):
    layer = main["layer"]
    lines.append(f"## {name} — E={layer['E']}, k={layer['k']}, H={layer['H']}, I={layer['I']}, "
                 f"{layer['dtype']}, {layer['routing']} routing")
    lines.append("")
    lines.append("Commands:")
    lines.append("")
    lines.append("```sh")
    lines.append(main["command"])
    if peers:
        lines.append(peers["command"])
    lines.append("```")
    lines.append("")
    image = layer["name"] if layer.get("dtype", "bf16") == "bf16" else f"{layer['name']}-{layer['dtype']}"
    lines.append(f"![{name}: latency vs T](img/{image}.png)")
    lines.append("")
    table = rows_by_impl([main] + ([peers] if peers else []))
    hmoe = table.get("hmoe", {})
    others = [impl for impl in table if impl != "hmoe"]
    header = ["T", "hmoe µs", "p10–p90 µs", "TFLOP/s", "GB/s", "floor µs", "% of floor", "variant [source]"]
    for impl in others:
        header += [f"{impl} µs", f"hmoe/{impl}"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for tokens in sorted(hmoe):
        row = hmoe[tokens]
        source = (row.get("variant_source") or "").split(":")[0]
        cells = [str(tokens), fmt(row["median_us"]), f"{fmt(row['p10_us'])}–{fmt(row['p90_us'])}",
                 fmt(row["tflop_per_s"]), fmt(row["gb_per_s"], 0), fmt(row["floor_us"]),
                 f"{fmt(row['percent_of_floor'], 0)}%", f"{row['variant']} [{source}]"]
        for impl in others:
            peer = table[impl].get(tokens)
            cells += [fmt(peer["median_us"]) if peer else "–",
                      fmt(peer["hmoe_over_peer"], 2) if peer and peer.get("hmoe_over_peer") else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if layer.get("dtype", "bf16") == "bf16":
        lines.append("hmoe/peer < 1 means hmoe is faster. The FP8 peer (if present) runs e4m3 against hmoe's bf16: "
                     "no ratio is given for it here; the FP8 section of this preset compares it with hmoe's FP8.")
    else:
        lines.append(f"hmoe/peer < 1 means hmoe is faster. Both sides run e4m3 here: hmoe its whole {layer['dtype']} "
                     "layer, the peer its GEMMs and activation only, with row-wise scales, on the same per-expert "
                     "token counts (timed in the bf16 run of bench/peers.py).")
    lines.append("")
    return table


def fp8_peers_for(name, main, results):
    """The FP8 peer rows of the preset's bf16 peers file, with their ratios to hmoe's FP8 rows."""
    if "@" not in name:
        return None
    path = os.path.join(results, f"{name.split('@')[0]}.peers.json")
    if not os.path.exists(path):
        return None
    peers = read_json(path)
    hmoe = rows_by_impl([main]).get("hmoe", {})
    rows = []
    for row in peers["rows"]:
        if "fp8" not in row["impl"] or row["T"] not in hmoe:
            continue
        row = dict(row)
        row["hmoe_over_peer"] = hmoe[row["T"]]["median_us"] / row["median_us"]
        rows.append(row)
    return {"command": peers["command"], "rows": rows} if rows else None


def model_section(name, main, table, lines):
    layers = main["layer"].get("moe_layers")
    if not layers:
        return
    hmoe = table.get("hmoe", {})
    peers = [impl for impl in table if impl != "hmoe"]
    lines.append(f"### {name}: MoE share of a forward pass ({layers} MoE layers)")
    lines.append("")
    header = ["phase", "tokens", "hmoe ms", "floor ms"]
    for impl in peers:
        header += [f"{impl} ms", f"speed-up vs {impl}"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for tokens in sorted(hmoe):
        row = hmoe[tokens]
        phase = "decode B" if tokens <= LARGEST_DECODE_BATCH else "prefill P"
        cells = [phase, str(tokens), fmt(layers * row["median_us"] * 1e-3, 3), fmt(layers * row["floor_us"] * 1e-3, 3)]
        for impl in peers:
            peer = table[impl].get(tokens)
            if peer:
                cells += [fmt(layers * peer["median_us"] * 1e-3, 3), f"{100.0 * (peer['median_us'] / row['median_us'] - 1):+.1f}%"]
            else:
                cells += ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")


def repeat_section(results, names, lines):
    lines.append("## Repeatability")
    lines.append("")
    found = False
    for name in names:
        path = os.path.join(results, f"{name}.repeat.json")
        if not os.path.exists(path):
            continue
        found = True
        first = rows_by_impl([read_json(os.path.join(results, f"{name}.json"))]).get("hmoe", {})
        second_report = read_json(path)
        second = rows_by_impl([second_report]).get("hmoe", {})
        lines.append(f"{name}, two runs of the same sweep (second: `{second_report['command']}`):")
        lines.append("")
        lines.append("| T | run 1 µs | run 2 µs | difference |")
        lines.append("|---|---|---|---|")
        worst = 0.0
        for tokens in sorted(set(first) & set(second)):
            a, b = first[tokens]["median_us"], second[tokens]["median_us"]
            difference = abs(b - a) / a
            worst = max(worst, difference)
            lines.append(f"| {tokens} | {fmt(a)} | {fmt(b)} | {100 * difference:.1f}% |")
        verdict = "within" if worst <= REPEAT_TOLERANCE else "NOT within"
        lines.append("")
        lines.append(f"Largest difference {100 * worst:.1f}%: {verdict} the {100 * REPEAT_TOLERANCE:.0f}% target.")
        lines.append("")
    if not found:
        lines.append("No repeated run in this report.")
        lines.append("")


def _statistic(env) -> str:
    """How a row's time was formed: results from before 2026-12-02's change used the median of all replays."""
    if env.get("statistic") == "mean-of-set-medians":
        warmup = f" after {env['warmup_s']} s of untimed warm-up replays" if "warmup_s" in env else ""
        return ("per input set the median of its replays, averaged over the sets (p10–p90 over all replays; "
                "the median of all replays together jumped between the sets' modes)" + warmup)
    return "median of many (p10–p90 shown)"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python3 bench/report.py RESULTS_DIR OUT_MD", file=sys.stderr)
        return 2
    results, out_md = argv
    env = read_json(os.path.join(results, "env.json")) if os.path.exists(os.path.join(results, "env.json")) else {}
    names = presets_in(results)
    lines = [
        "<!-- GENERATED by bench/report.sh: do not edit by hand; rerun `bench/report.sh` on an H200. -->",
        "# hmoe benchmarks",
        "",
        f"Card: {env.get('gpu', '?')}; driver {env.get('driver', '?')}; CUDA toolkit {env.get('cuda_toolkit', '?')}; "
        f"PyTorch {env.get('torch', 'not installed')}; generated {env.get('date_utc', '?')} by `{env.get('command', 'bench/report.sh')}`"
        f" at commit {env.get('commit', '?')}.",
        "",
        "What is timed: one MoE layer per call, CUDA-graph replays, " + _statistic(env) + ", 4 input sets "
        "rotating (each routes to different experts, so weights are not served from L2), fresh random inputs. "
        "hmoe runs its whole layer (routing from logits, permute, GEMM1 + SwiGLU, GEMM2, combine). The cuBLAS "
        "loop and the torch grouped-GEMM peers run GEMM1 + activation + GEMM2 only on rows already in expert "
        "order (as the Triton peer of DESIGN.md §4 is timed); the eager PyTorch layer adds the gather and the "
        "weighted index_add. Every peer sees exactly the per-expert token counts hmoe's routing produced. "
        "Floor = max(bytes / bandwidth, FLOPs / bf16 peak) with the ceilings below, measured on this card "
        "(DESIGN.md §4).",
        "",
    ]
    if os.path.exists(os.path.join(results, "ceilings.json")):
        ceilings_report = read_json(os.path.join(results, "ceilings.json"))
        c = ceilings_report["ceilings"]
        lines += ["## Ceilings", "", f"`{ceilings_report['command']}` on {ceilings_report['device']}:", "",
                  "| ceiling | value |", "|---|---|",
                  f"| device-to-device copy (read + write bytes) | {fmt(c['copy_gb_per_s'], 0)} GB/s |",
                  f"| read-only stream | {fmt(c['read_gb_per_s'], 0)} GB/s |",
                  f"| bandwidth the floor uses (the higher) | {fmt(c['bandwidth_gb_per_s'], 0)} GB/s |",
                  f"| bf16 GEMM 8192³ (cuBLAS) | {fmt(c['bf16_gemm_tflop_per_s'])} TFLOP/s |",
                  f"| fp8 e4m3 GEMM 8192³ (cuBLASLt, per-tensor scales, fast accumulation) | "
                  f"{fmt(c.get('fp8_gemm_tflop_per_s'))} TFLOP/s |", ""]
    lines += ["## FP8", "", env.get("fp8_status", "FP8 layers: status not recorded."), ""]
    tables = {}
    for name in names:
        main_report = read_json(os.path.join(results, f"{name}.json"))
        peers_path = os.path.join(results, f"{name}.peers.json")
        peers_report = read_json(peers_path) if os.path.exists(peers_path) else fp8_peers_for(name, main_report, results)
        tables[name] = (main_report, layer_section(name, main_report, peers_report, lines))
    lines += ["## Model level: MoE part of time to first token and of a decode step", "",
              "All of the model's MoE layers at one layer's measured median (attention, norms and dense layers "
              "excluded): prefill P = all P prompt tokens in one pass; decode B = one step for a batch of B "
              "sequences. speed-up = peer time / hmoe time − 1.", ""]
    for name, (main_report, table) in tables.items():
        model_section(name, main_report, table, lines)
    repeat_section(results, names, lines)
    skipped = env.get("skipped")
    if skipped:
        lines += ["## Skipped", "", "```", skipped.rstrip(), "```", ""]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    print(out_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
