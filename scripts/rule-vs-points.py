#!/usr/bin/env python3
"""How close the analytic rule comes to the tuner's best, from points the tuner timed on a GPU.

`hmoe tune --points FILE` (scripts/tune-h200.sh keeps one per table in tune-logs.tgz) writes every
timed (T, variant pair, µs). This script asks a local hmoe for the analytic rule's pair at each T
(`hmoe bench --explain` with an empty tuned directory: no GPU needed) and prints, per T, the rule's
time over the best timed pair; then the geometric mean per table. So a change to the rule in
src/dispatch/plan.cpp can be judged against measured points before any device call.

Usage: scripts/rule-vs-points.py [--hmoe build/hmoe] PRESET:DTYPE=POINTS.json [...]
A pair the tuner pruned at some T (it was > 1.x times the previous bucket's best there) has no time;
it is printed as "pruned" and left out of the mean, which then flatters the rule: say so.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile


def rule_pairs(hmoe, preset, dtype):
    """T -> 'gemm1+gemm2' as the analytic rule picks them."""
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, HMOE_TUNED_DIR=empty)
        text = subprocess.run([hmoe, "bench", "--model", preset, "--dtype", dtype, "--explain"], env=env,
                              check=True, capture_output=True, text=True).stdout
    pairs = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and re.fullmatch(r"\d+", fields[0]) and fields[-1] == "analytic":
            pairs[int(fields[0])] = fields[-3] + "+" + fields[-2]
    if not pairs:
        sys.exit(f"rule-vs-points: no analytic rows in `hmoe bench --explain` for {preset} {dtype}")
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hmoe", default="build/hmoe")
    parser.add_argument("tables", nargs="+", metavar="PRESET:DTYPE=POINTS.json")
    args = parser.parse_args()
    for table in args.tables:
        name, _, path = table.partition("=")
        preset, _, dtype = name.partition(":")
        if not path or not dtype:
            sys.exit(f"rule-vs-points: expected PRESET:DTYPE=POINTS.json, got {table!r}")
        with open(path) as file:
            points = json.load(file)["points"]
        times = {}
        for point in points:
            times.setdefault(point["T"], {})[point["variant"]] = point["us"]
        rule = rule_pairs(args.hmoe, preset, dtype)
        print(f"== {preset} {dtype} ({path})")
        print(f"{'T':>6}  {'rule us':>9}  {'best us':>9}  {'rule/best':>9}  rule pair / best pair")
        logs = []
        for num_tokens in sorted(times):
            timed = {pair: us for pair, us in times[num_tokens].items() if "+" in pair}
            if not timed or num_tokens not in rule:
                continue
            best_pair = min(timed, key=timed.get)
            pair = rule[num_tokens]
            if pair in timed:
                ratio = timed[pair] / timed[best_pair]
                logs.append(math.log(ratio))
                shown = f"{timed[pair]:9.1f}  {timed[best_pair]:9.1f}  {ratio:9.3f}"
            else:
                shown = f"{'pruned':>9}  {timed[best_pair]:9.1f}  {'-':>9}"
            print(f"{num_tokens:6d}  {shown}  {pair} / {best_pair}")
        if logs:
            print(f"geomean rule/best over {len(logs)} timed buckets: {math.exp(sum(logs) / len(logs)):.3f}")


if __name__ == "__main__":
    main()
