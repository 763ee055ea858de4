"""What the Python layer adds to hmoe's MoE layer: hmoe.torch.fused_moe / fused_experts on the
qwen3-30b-a3b shape, captured in CUDA graphs and timed like `hmoe bench` (four input sets replayed
round-robin, each replay between two events, median), beside the extension's Runner called directly
with the same tensors, and the eager host time per call.

    python tests/python/bench_overhead.py [--tokens 1,64,4096] [--hmoe-bench hmoe_bench.log]

--hmoe-bench reads the output of `hmoe bench --model qwen3-30b-a3b --tokens ...` (which times
run_from_logits, the same entry as fused_moe) and adds its median and the difference to the table.
"""

import argparse
import re
import statistics
import time

import torch

import hmoe
import hmoe.torch as hmoe_torch

E, TOP_K, H, I = 128, 8, 2048, 768  # qwen3-30b-a3b (DESIGN.md §3)
INPUT_SETS = 4
MIN_REPLAYS = 200


def time_graphs(graphs, replays):
    """Median µs of one replay, graphs replayed round-robin, each between two events."""
    stream = torch.cuda.current_stream()
    for _ in range(3):
        for graph in graphs:
            graph.replay()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    marks[0].record(stream)
    for index in range(replays):
        graphs[index % len(graphs)].replay()
        marks[index + 1].record(stream)
    torch.cuda.synchronize()
    return statistics.median(marks[i].elapsed_time(marks[i + 1]) * 1e3 for i in range(replays))


def capture(call):
    """A CUDA graph of call(), after a warm-up call on a side stream (plans the runner)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def host_us_per_call(call, calls=300):
    """Eager CPU time of enqueueing one call (the GPU work of small T keeps up; T=1 is the one to read)."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def read_hmoe_bench(path):
    """{T: median µs} from `hmoe bench` output rows ("     T   median_us ...")."""
    medians = {}
    with open(path) as log:
        for line in log:
            match = re.match(r"^\s*(\d+)\s+([0-9.]+)\s+[0-9.]+-[0-9.]+\s", line)
            if match:
                medians[int(match.group(1))] = float(match.group(2))
    return medians


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,64,4096")
    parser.add_argument("--hmoe-bench", default=None, help="output of `hmoe bench` to compare with")
    options = parser.parse_args()
    token_counts = [int(t) for t in options.tokens.split(",")]
    cpp = read_hmoe_bench(options.hmoe_bench) if options.hmoe_bench else {}

    torch.manual_seed(1)
    w13 = (torch.randn(E, 2 * I, H, device="cuda") / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device="cuda") / I ** 0.5).to(torch.bfloat16)
    prepared = hmoe_torch.prepare_weights(w13, w2)
    del w13, w2

    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; hmoe {hmoe.__version__}")
    print(f"layer: qwen3-30b-a3b bf16 E={E} k={TOP_K} H={H} I={I}; softmax routing, renormalise; "
          f"{INPUT_SETS} input sets; CUDA graph replays, median µs")
    rows = []
    for tokens in token_counts:
        sets = []
        for _ in range(INPUT_SETS):
            x = torch.randn(tokens, H, device="cuda").to(torch.bfloat16)
            logits = torch.randn(tokens, E, device="cuda")
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), TOP_K, dim=-1)
            weights = (weights / weights.sum(-1, keepdim=True)).contiguous()
            sets.append((x, logits, weights, ids.to(torch.int32), torch.empty_like(x)))

        runner = hmoe.Runner(hmoe.Spec(E, TOP_K, H, I), tokens)
        workspace = torch.empty(runner.workspace_bytes, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream

        def direct(x, logits, out):
            # NOTE: the stream is read at call time: capture runs on torch.cuda.graph's own stream.
            runner.run_from_logits(x, out, prepared.w13, prepared.w2, logits, workspace,
                                   torch.cuda.current_stream().cuda_stream)

        replays = max(MIN_REPLAYS, 8 * INPUT_SETS)
        moe_graphs = [capture(lambda s=s: hmoe_torch.fused_moe(s[0], s[1], prepared, None, TOP_K, True, out=s[4]))
                      for s in sets]
        experts_graphs = [capture(lambda s=s: hmoe_torch.fused_experts(s[0], prepared, None, s[2], s[3], out=s[4]))
                          for s in sets]
        direct_graphs = [capture(lambda s=s: direct(s[0], s[1], s[4])) for s in sets]
        row = dict(T=tokens,
                   fused_moe=time_graphs(moe_graphs, replays),
                   fused_experts=time_graphs(experts_graphs, replays),
                   runner=time_graphs(direct_graphs, replays))
        s = sets[0]
        # NOTE: only where the GPU keeps up with the host; at large T the launch queue fills and the
        # host time per call becomes the GPU time.
        if tokens <= 256:
            row["eager_moe_host"] = host_us_per_call(
                lambda: hmoe_torch.fused_moe(s[0], s[1], prepared, None, TOP_K, True, out=s[4]))
            row["eager_runner_host"] = host_us_per_call(
                lambda: runner.run_from_logits(s[0], s[4], prepared.w13, prepared.w2, s[1], workspace, stream))
        rows.append(row)
        del moe_graphs, experts_graphs, direct_graphs

    print()
    header = (f"{'T':>6} {'hmoe bench':>11} {'fused_moe':>10} {'Δ vs C++':>9} {'Runner':>9} {'fused_experts':>14}"
              f" {'eager host/call: fused_moe':>27} {'Runner':>7}")
    print(header)
    for row in rows:
        reference = cpp.get(row["T"])
        cpp_text = f"{reference:11.1f}" if reference else f"{'-':>11}"
        delta_text = f"{row['fused_moe'] - reference:+9.1f}" if reference else f"{'-':>9}"
        print(f"{row['T']:>6} {cpp_text} {row['fused_moe']:10.1f} {delta_text} {row['runner']:9.1f} "
              f"{row['fused_experts']:14.1f} {row.get('eager_moe_host', float('nan')):27.1f} "
              f"{row.get('eager_runner_host', float('nan')):7.1f}")
    print("(µs; graph columns: median GPU time of one replay; 'Runner': hmoe.Runner.run_from_logits called "
          "directly; Δ = fused_moe − hmoe bench, the acceptance asks ≤ 5 µs)")


if __name__ == "__main__":
    main()
