#!/usr/bin/env python3
"""A/B two hmoe builds (or two kernel pairs of one build) with `hmoe bench`, in alternating rounds.

Usage: scripts/ab-bench.py --a DIR [--b DIR] [--a-env K=V]... [--b-env K=V]... [--rounds N] [--dry-run]
                           LAYER [LAYER ...]
  DIR    a build folder holding `hmoe` (B defaults to A: then the layers name two variants, or the
         sides differ in their environment, e.g. --b-env HMOE_GEMM2_STORE=copy)
  LAYER  PRESET:DTYPE:T[,T...] or PRESET:DTYPE:T[,T...]:VARIANT_A[/VARIANT_B]
         (VARIANT: GEMM1+GEMM2 kernel names, `hmoe info --kernels`; `-` for the plan's own choice;
         DTYPE fp8-tensor+static: `--dtype fp8-tensor --static-scales`)

Each round times A then B, the next B then A (ABBA...), so a drift of the card's clocks over the
call weighs on both alike; the table gives every round's median and the ratio of the means, B/A,
and under each layer the GEMM pair each side ran (one pair, or each T's in the layer's T order).
Every invocation is one `hmoe bench ... --json`, whose rows are read back. For the device, where
each minute counts: one call, both binaries carried (docs/PERF.md says how the sessions use it).
First each side's build is printed (`hmoe info`'s first line: the commit, and the diff's hash when the
tree was dirty); two folders that report the same build get a warning, since B/A then compares a
binary with itself (a build that did not relink, a copy of the wrong folder).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_layer(text):
    fields = text.split(":")
    if len(fields) not in (3, 4) or not fields[0] or not fields[1] or not fields[2]:
        raise ValueError(f"layer '{text}': expected PRESET:DTYPE:T[,T...][:VARIANT_A[/VARIANT_B]]")
    tokens = [int(t) for t in fields[2].split(",")]
    if any(t < 1 for t in tokens):
        raise ValueError(f"layer '{text}': token counts must be positive")
    variants = (None, None)
    if len(fields) == 4:
        names = fields[3].split("/")
        if len(names) > 2:
            raise ValueError(f"layer '{text}': at most two variants, VARIANT_A/VARIANT_B")
        names = [None if n in ("", "-") else n for n in names]
        variants = (names[0], names[1] if len(names) == 2 else names[0])
    return {"preset": fields[0], "dtype": fields[1], "tokens": tokens, "variants": variants, "name": text}


def bench_command(build, layer, variant, json_path):
    dtype, static = layer["dtype"], layer["dtype"].endswith("+static")
    command = [os.path.join(build, "hmoe"), "bench", "--model", layer["preset"],
               "--dtype", dtype[:-len("+static")] if static else dtype,
               "--tokens", ",".join(str(t) for t in layer["tokens"]), "--json", json_path]
    if static:
        command.append("--static-scales")
    if variant:
        command += ["--variant", variant]
    return command


def build_of(folder):
    """`hmoe info`'s first line ("hmoe 0.1.0 (build <commit>[-dirty.<hash>])"), or why there is none."""
    try:
        done = subprocess.run([os.path.join(folder, "hmoe"), "info"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"unknown ({error})"
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines or "(build " not in lines[0]:
        return None, f"unknown (hmoe info exited {done.returncode})"
    return lines[0], lines[0]


def run_bench(command, json_path, env):
    completed = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **env})
    if completed.returncode != 0:
        sys.stdout.write(completed.stdout)
        raise RuntimeError(f"{' '.join(command)} exited {completed.returncode}")
    with open(json_path) as file:
        report = json.load(file)
    rows = report["rows"] if isinstance(report, dict) else report
    return {row["T"]: (row["median_us"], f"{row['gemm1']}+{row['gemm2']}" if row.get("gemm1") else row.get("variant", ""))
            for row in rows if row.get("impl", "hmoe") == "hmoe"}


def plan_text(plans):
    """A side's plans: the one pair when every T ran it, else each T's pair in the order the layer gave T."""
    if len(set(plans.values())) == 1:
        return next(iter(plans.values()))
    return ", ".join(f"T={t} {plan}" for t, plan in plans.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="build folder A")
    parser.add_argument("--b", help="build folder B (default: A)")
    parser.add_argument("--a-env", action="append", default=[], metavar="K=V", help="environment of A's runs")
    parser.add_argument("--b-env", action="append", default=[], metavar="K=V", help="environment of B's runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("layers", nargs="+")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    builds = {"A": args.a, "B": args.b or args.a}
    envs = {}
    for side, pairs in (("A", args.a_env), ("B", args.b_env)):
        envs[side] = {}
        for pair in pairs:
            if "=" not in pair or pair.startswith("="):
                parser.error(f"--{side.lower()}-env '{pair}': expected NAME=VALUE")
            name, value = pair.split("=", 1)
            envs[side][name] = value
    try:
        layers = [parse_layer(text) for text in args.layers]
    except ValueError as error:
        parser.error(str(error))
    if builds["A"] == builds["B"] and envs["A"] == envs["B"] and \
            any(layer["variants"][0] == layer["variants"][1] for layer in layers):
        parser.error("A and B are one build with one environment: each layer must name two different variants")

    if not args.dry_run:
        found = {folder: build_of(folder) for folder in set(builds.values())}
        ids = {side: found[builds[side]] for side in ("A", "B")}
        for side in ("A", "B"):
            print(f"build {side}: {builds[side]}: {ids[side][1]}")
        if (os.path.realpath(builds["A"]) != os.path.realpath(builds["B"]) and ids["A"][0] is not None and
                ids["A"][0] == ids["B"][0]):
            print("WARNING: A and B are different folders with the same build: B/A compares one binary with itself")

    with tempfile.TemporaryDirectory() as scratch:
        json_path = os.path.join(scratch, "rows.json")
        results = []
        for layer in layers:
            times = {"A": [], "B": []}
            plans = {"A": "", "B": ""}
            for round_index in range(args.rounds):
                for side in ("A", "B") if round_index % 2 == 0 else ("B", "A"):
                    variant = layer["variants"][0 if side == "A" else 1]
                    command = bench_command(builds[side], layer, variant, json_path)
                    if args.dry_run:
                        prefix = " ".join(f"{k}={v}" for k, v in envs[side].items())
                        print(f"round {round_index + 1} {side}: {prefix + ' ' if prefix else ''}{' '.join(command)}")
                        continue
                    rows = run_bench(command, json_path, envs[side])
                    times[side].append({t: rows[t][0] for t in layer["tokens"]})
                    plans[side] = plan_text({t: rows[t][1] for t in layer["tokens"]})
            results.append((layer, times, plans))
        if args.dry_run:
            return 0
        print(f"{'layer':<40} {'T':>6}  {'A us (rounds)':<24} {'B us (rounds)':<24} {'B/A':>7}")
        for layer, times, plans in results:
            for t in layer["tokens"]:
                a = [r[t] for r in times["A"]]
                b = [r[t] for r in times["B"]]
                ratio = (sum(b) / len(b)) / (sum(a) / len(a))
                print(f"{layer['preset'] + ':' + layer['dtype']:<40} {t:>6}  "
                      f"{' / '.join(f'{x:.1f}' for x in a):<24} {' / '.join(f'{x:.1f}' for x in b):<24} {ratio:>6.3f}x")
            print(f"  plans: A {plans['A']}; B {plans['B']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
