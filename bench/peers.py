#!/usr/bin/env python3
"""PyTorch peers of `hmoe bench` on the same card, shapes and expert load.

Reads the JSON `hmoe bench --json` wrote (layer shape, token counts, and the tokens each expert got
in every input set) and times, per token count, on exactly that load:
  torch-grouped-mm-bf16     torch._grouped_mm GEMM1 -> silu(gate) * up -> torch._grouped_mm GEMM2
                            (rows already in expert order; GEMMs and activation only, like the
                            cuBLAS loop of `hmoe bench --peers cublas`)
  torch-eager-loop-bf16     an eager PyTorch MoE layer in the style of Hugging Face's sparse MoE
                            blocks: per expert, gather its tokens, GEMM1, SwiGLU, GEMM2, scale by
                            the routing weight, index_add into the output (routing itself excluded)
  torch-scaled-grouped-mm-fp8-rowwise
                            torch._scaled_grouped_mm with e4m3 weights (per output row scales) and
                            activations quantised per row (x ahead of time, the SwiGLU output inside
                            the timed region)
Each is captured in a CUDA graph per input set and replayed round-robin (eager event timing when
capture fails; the row says which); the time is the mean over input sets of each set's median replay
(as hmoe's testkit/replay_timing.hpp: the sets route differently, and the median of all replays
together jumps between their modes), p10/p90 over all replays. Output: JSON in the rows format
of `hmoe bench --json` (schema hmoe-bench/1), so bench/report.py merges it with hmoe's rows.

Any torch API that is missing or fails is skipped with a one-line message on stderr; the other
peers still run. Exit 2 on bad usage, 1 when torch or a CUDA device is missing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys

PEERS = ("grouped_mm", "eager", "scaled_grouped_mm")
IMPL_NAMES = {
    "grouped_mm": "torch-grouped-mm-bf16",
    "eager": "torch-eager-loop-bf16",
    "scaled_grouped_mm": "torch-scaled-grouped-mm-fp8-rowwise",
}
FP8_MAX = 448.0


def skip(message: str) -> None:
    print(f"peers.py: skip: {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-json", required=True, help="JSON written by `hmoe bench --json` (shapes and expert loads)")
    parser.add_argument("--out", required=True, help="JSON file to write (rows in the hmoe-bench/1 format)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--seconds", type=float, default=0.25, help="timed replays per point, in seconds (default 0.25)")
    parser.add_argument("--min-replays", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        parser.error(f"--peers {args.peers!r}: expected a comma-separated subset of {','.join(PEERS)}")
    if not (args.seconds > 0) or args.min_replays < 1:
        parser.error("--seconds must be > 0 and --min-replays >= 1")
    args.peers = peers
    return args


def load_hmoe_json(path: str):
    with open(path) as f:
        report = json.load(f)
    if report.get("schema") != "hmoe-bench/1" or not report.get("layer"):
        raise ValueError(f"{path}: not an `hmoe bench --json` sweep (schema hmoe-bench/1 with a layer)")
    hmoe_rows = [r for r in report["rows"] if r["impl"] == "hmoe"]
    if not hmoe_rows or not all(r.get("tokens_per_expert") for r in hmoe_rows):
        raise ValueError(f"{path}: hmoe rows without tokens_per_expert")
    return report, hmoe_rows



def percentile(sorted_values, fraction):
    return sorted_values[int(fraction * (len(sorted_values) - 1))]


WARMUP_SECONDS = 0.1


def summarize_replays(times_us, sets):
    """(mean over sets of each set's median, p10, p90 over all): replay i ran input set i % sets."""
    medians = [percentile(sorted(times_us[s::sets]), 0.5) for s in range(sets)]
    ordered = sorted(times_us)
    return sum(medians) / sets, percentile(ordered, 0.1), percentile(ordered, 0.9)

class Timer:
    """Graph replays (or eager calls) of one callable per input set, timed one by one with events."""

    def __init__(self, torch, seconds: float, min_replays: int):
        self.torch = torch
        self.seconds = seconds
        self.min_replays = min_replays

    def _capture(self, work):
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (library handles, workspaces)
                work()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            work()
        return graph.replay

    def time(self, works):
        """works: one callable per input set. Returns (median, p10, p90, replays, mode)."""
        torch = self.torch
        mode = "cuda-graph"
        try:
            launches = [self._capture(w) for w in works]
        except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager timing
            skip(f"CUDA graph capture failed ({type(error).__name__}: {error}); timing eager calls")
            torch.cuda.synchronize()
            launches = list(works)
            mode = "eager"
        for _ in range(3):
            for launch in launches:
                launch()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for launch in launches:
            launch()
        stop.record()
        torch.cuda.synchronize()
        per_replay_s = max(start.elapsed_time(stop) * 1e-3 / len(launches), 1e-7)
        # As hmoe's testkit/replay_timing.cpp: untimed replays for 0.1 s of GPU time, so clocks and
        # power settle before the timed ones.
        for _ in range(int(min(WARMUP_SECONDS / (per_replay_s * len(launches)), 1e5))):
            for launch in launches:
                launch()
        replays = min(max(int(self.seconds / per_replay_s), self.min_replays), 20000)
        replays += len(launches) - 1 - (replays - 1) % len(launches)
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
        marks[0].record()
        for index in range(replays):
            launches[index % len(launches)]()
            marks[index + 1].record()
        torch.cuda.synchronize()
        times_us = [1e3 * marks[i].elapsed_time(marks[i + 1]) for i in range(replays)]
        return (*summarize_replays(times_us, len(launches)), replays, mode)


def quantise_rows(torch, matrix):
    """e4m3 values and one fp32 scale per row (amax / 448), the last dimension being K."""
    amax = matrix.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    quantised = (matrix.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantised, scale.squeeze(-1)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        report, hmoe_rows = load_hmoe_json(args.from_json)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as error:
        print(f"peers.py: {error}", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        print(f"peers.py: PyTorch is not installed ({error}); no peers timed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("peers.py: torch sees no CUDA device; no peers timed", file=sys.stderr)
        return 1

    layer = report["layer"]
    experts, top_k, hidden, inter = layer["E"], layer["k"], layer["H"], layer["I"]
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(args.seed)

    def uniform(shape, scale, dtype=torch.bfloat16):
        return ((torch.rand(shape, device=device, generator=generator) * 2 - 1) * scale).to(dtype)

    w13 = uniform((experts, 2 * inter, hidden), 1 / math.sqrt(hidden))  # HF layout: gate rows, then up rows
    w2 = uniform((experts, hidden, inter), 1 / math.sqrt(inter))
    # NOTE: _grouped_mm wants the 3-D operand with K contiguous ([G, K, N] column-major per group):
    # the transposed views of the HF layouts are exactly that, so no copy is made.
    w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)

    peers = list(args.peers)
    if "grouped_mm" in peers and not hasattr(torch, "_grouped_mm"):
        skip(f"torch {torch.__version__} has no torch._grouped_mm")
        peers.remove("grouped_mm")
    fp8_weights = None
    if "scaled_grouped_mm" in peers:
        if not hasattr(torch, "_scaled_grouped_mm") or not hasattr(torch, "float8_e4m3fn"):
            skip(f"torch {torch.__version__} has no torch._scaled_grouped_mm / float8_e4m3fn")
            peers.remove("scaled_grouped_mm")
        else:
            w13_q, w13_s = quantise_rows(torch, w13)  # scales [E, 2I]: one per output row
            w2_q, w2_s = quantise_rows(torch, w2)     # scales [E, H]
            fp8_weights = (w13_q.transpose(1, 2), w13_s, w2_q.transpose(1, 2), w2_s)

    timer = Timer(torch, args.seconds, args.min_replays)
    out_rows = []
    for hmoe_row in hmoe_rows:
        tokens = hmoe_row["T"]
        rows_total = tokens * top_k
        loads = hmoe_row["tokens_per_expert"]
        sets = []
        for set_index, load in enumerate(loads):
            if len(load) != experts or sum(load) > rows_total:
                print(f"peers.py: T={tokens} set {set_index}: expert load does not match E={experts}, T*k={rows_total}",
                      file=sys.stderr)
                return 2
            rows = sum(load)
            offsets = torch.tensor(list(_cumulative(load)), dtype=torch.int32, device=device)
            x_sorted = uniform((rows, hidden), 1.0)
            # The eager layer gathers from [T, H] by token index: slot s of expert e reads token s // k
            # after a seeded shuffle, so every expert's tokens are spread like real routing.
            slots = torch.randperm(rows_total, device=device, generator=generator)[:rows]
            token_of_row = (slots // top_k).to(torch.int64)
            weight_of_row = torch.rand(rows, device=device, generator=generator, dtype=torch.float32).to(torch.bfloat16)
            sets.append(dict(load=load, offsets=offsets, x_sorted=x_sorted, x=uniform((tokens, hidden), 1.0),
                             token_of_row=token_of_row, weight_of_row=weight_of_row))

        def grouped_mm_work(s):
            def work():
                h = torch._grouped_mm(s["x_sorted"], w13_t, offs=s["offsets"])
                act = F.silu(h[:, :inter]) * h[:, inter:]
                return torch._grouped_mm(act, w2_t, offs=s["offsets"])
            return work

        def eager_work(s):
            bounds = list(_cumulative(s["load"]))
            out = torch.empty((tokens, hidden), device=device, dtype=torch.bfloat16)

            def work():
                out.zero_()
                start = 0
                for expert, stop in enumerate(bounds):
                    if stop > start:
                        index = s["token_of_row"][start:stop]
                        h = s["x"].index_select(0, index) @ w13[expert].t()
                        act = F.silu(h[:, :inter]) * h[:, inter:]
                        y = (act @ w2[expert].t()) * s["weight_of_row"][start:stop, None]
                        out.index_add_(0, index, y)
                    start = stop
                return out
            return work

        def scaled_grouped_mm_work(s):
            w13_qt, w13_scale, w2_qt, w2_scale = fp8_weights
            x_q, x_scale = quantise_rows(torch, s["x_sorted"])

            def work():
                h = torch._scaled_grouped_mm(x_q, w13_qt, x_scale, w13_scale, offs=s["offsets"],
                                             out_dtype=torch.bfloat16, use_fast_accum=True)
                act = F.silu(h[:, :inter]) * h[:, inter:]
                act_q, act_scale = quantise_rows(torch, act)
                return torch._scaled_grouped_mm(act_q, w2_qt, act_scale, w2_scale, offs=s["offsets"],
                                                out_dtype=torch.bfloat16, use_fast_accum=True)
            return work

        builders = {"grouped_mm": grouped_mm_work, "eager": eager_work, "scaled_grouped_mm": scaled_grouped_mm_work}
        for peer in list(peers):
            try:
                works = [builders[peer](s) for s in sets]
                works[0]()  # fails here, not inside a capture, when the API rejects the shapes
                torch.cuda.synchronize()
                median, p10, p90, replays, mode = timer.time(works)
            except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                skip(f"{IMPL_NAMES[peer]} at T={tokens}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
                torch.cuda.synchronize()
                continue
            out_rows.append(_row(IMPL_NAMES[peer], tokens, median, p10, p90, replays, mode, hmoe_row, layer,
                                 comparable=peer != "scaled_grouped_mm"))
            print(f"{IMPL_NAMES[peer]:38s} T={tokens:6d} median {median:10.1f} us (p10 {p10:.1f}, p90 {p90:.1f}; "
                  f"{replays} replays, {mode}); hmoe {hmoe_row['median_us']:.1f} us", flush=True)
        del sets
        torch.cuda.empty_cache()

    result = {
        "schema": "hmoe-bench/1",
        "command": "python3 bench/peers.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        "torch_cuda_version": torch.version.cuda,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ceilings": report.get("ceilings"),
        "layer": layer,
        "rows": out_rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def _cumulative(load):
    total = 0
    for count in load:
        total += count
        yield total


def _row(impl, tokens, median, p10, p90, replays, mode, hmoe_row, layer, comparable):
    flops = 6.0 * tokens * layer["k"] * layer["H"] * layer["I"]
    hmoe_median = hmoe_row["median_us"]
    return {
        "impl": impl, "T": tokens, "replays": replays, "median_us": median, "p10_us": p10, "p90_us": p90,
        "tflop_per_s": flops / (median * 1e-6) / 1e12,
        "gb_per_s": (hmoe_row.get("gb_per_s") or 0.0) * hmoe_median / median,
        "floor_us": hmoe_row.get("floor_us"),
        "percent_of_floor": 100.0 * hmoe_row["floor_us"] / median if hmoe_row.get("floor_us") else None,
        "experts_hit": hmoe_row.get("experts_hit"),
        "variant": impl, "variant_source": f"PyTorch, {mode} timing",
        "gemm1": "", "gemm2": "",
        # An FP8 peer against hmoe's bf16 layer is not a like-for-like ratio: left empty.
        "hmoe_over_peer": hmoe_median / median if comparable else None,
        "tokens_per_expert": [],
    }


if __name__ == "__main__":
    sys.exit(main())
