#!/usr/bin/env python3
"""PyTorch's CPU AdamW (foreach and fused), timed like bench/optim/cpu_adam_bench.

Prints markdown rows in cpu_adam_bench's format, so a device run can put them side by side:
  | kernel | threads | params | B/param | median ms | G params/s | GB/s | % of adam-shaped |

fp32 parameters in one flat tensor (an optimizer subgroup), AdamW with the same hyper-parameters
as cpu_adam_bench (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01). Bytes counted per
parameter: read p, m, v, g (16) + write p, m, v (12) = 28, as cpu_adam_bench counts without
its bf16 copy. The "+bf16" rows add what a PyTorch user does to get the bf16 copy for the GPU:
a separate `bf16.copy_(p)` pass after the step, counted as 30 B/param like cpu_adam_bench's
single-pass "+bf16" (the extra pass really moves 6 more bytes, which is the point of fusing).
Every figure is the median of --reps timed steps after --warmup untimed ones (the first step
also allocates m and v, so it is never timed).

usage: torch_cpu_adam.py [--params=N] [--threads=T] [--impls=foreach,fused]
                         [--reps=5] [--warmup=2] [--stream-gbs=X] [--json=PATH]
  --threads     torch.set_num_threads (default: every CPU this process may use)
  --stream-gbs  cpu_adam_bench's adam-shaped GB/s at the same thread count, for the % column
"""
import argparse
import json
import os
import statistics
import sys
import time

ADAM_BYTES = 28.0
ADAM_BF16_BYTES = 30.0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=1 << 24)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--impls", default="foreach,fused")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--stream-gbs", type=float, default=0.0)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if args.params < 1 or args.threads < 1 or args.reps < 1 or args.warmup < 1:
        parser.error("--params, --threads, --reps and --warmup must be >= 1")
    for impl in args.impls.split(","):
        if impl not in ("foreach", "fused"):
            parser.error(f"unknown --impls entry '{impl}' (foreach, fused)")
    return args


def median_seconds(run, reps, warmup):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(torch, impl, with_bf16, args, init_param, grad):
    """Median seconds of one AdamW step (plus the bf16 copy when with_bf16)."""
    param = torch.nn.Parameter(init_param.clone())
    param.grad = grad
    optimizer = torch.optim.AdamW([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01, foreach=(impl == "foreach"),
                                  fused=(impl == "fused"))
    bf16 = torch.empty(args.params, dtype=torch.bfloat16)

    def step():
        optimizer.step()
        if with_bf16:
            with torch.no_grad():
                bf16.copy_(param)

    seconds = median_seconds(step, args.reps, args.warmup)
    del optimizer, param, bf16
    return seconds


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch_cpu_adam: PyTorch is not installed here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"## torch CPU AdamW, torch {torch.__version__}, {args.threads} threads, "
          f"{args.params} params, median of {args.reps} after {args.warmup} warm-up\n")
    print("| kernel | threads | params | B/param | median ms | G params/s | GB/s | "
          "% of adam-shaped |")
    print("|---|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(1)
    init_param = torch.randn(args.params, generator=generator) * 0.1
    grad = torch.randn(args.params, generator=generator) * 1e-2
    rows = []
    for impl in args.impls.split(","):
        for with_bf16 in (False, True):
            seconds = measure(torch, impl, with_bf16, args, init_param, grad)
            params_per_s = args.params / seconds
            nbytes = ADAM_BF16_BYTES if with_bf16 else ADAM_BYTES
            gbs = params_per_s * nbytes / 1e9
            pct = f"{100.0 * gbs / args.stream_gbs:.1f}%" if args.stream_gbs > 0 else "-"
            name = f"torch-{impl}" + ("+bf16" if with_bf16 else "")
            print(f"| {name} | {args.threads} | {args.params} | {nbytes:.0f} | "
                  f"{seconds * 1e3:.2f} | {params_per_s / 1e9:.3f} | {gbs:.1f} | {pct} |",
                  flush=True)
            rows.append({"impl": name, "threads": args.threads, "params": args.params,
                         "bytes_per_param": nbytes, "median_s": seconds,
                         "params_per_s": params_per_s, "gbs": gbs})
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"torch": torch.__version__, "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
