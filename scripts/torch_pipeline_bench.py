#!/usr/bin/env python3
"""Step time and activation memory of a 4-stage torch pipeline on one GPU (pipeoffload.torch's
toy model: residual MLP blocks) under our schedules with and without offload, beside a plain
loop over the microbatches and torch.distributed.pipelining's own schedule without offload.

torch's schedule on one GPU: Schedule1F1B and ScheduleGPipe are single-stage-per-rank
(PipelineScheduleSingle), so four stages in one process need a multi-stage schedule;
ScheduleLoopedBFS / ScheduleInterleaved1F1B (_PipelineScheduleRuntime) pass activations
between adjacent stages of one rank locally (set_local_fwd_input, schedules.py in torch 2.11),
in a process group of world size 1. It runs in a child process under a time limit, because its
set-up sends P2P messages to itself, which we could not check without a GPU; when it fails the
table says why and the plain loop is the torch baseline.

    python3 scripts/torch_pipeline_bench.py --json out.json --markdown out.md
Times: median of --steps steps after --warmup steps, torch.cuda.synchronize() around each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=2048, help="model width h (default 2048)")
    parser.add_argument("--tokens", type=int, default=4096,
                        help="tokens per microbatch (default 4096)")
    parser.add_argument("--blocks", type=int, default=2, help="MLP blocks per stage (default 2)")
    parser.add_argument("--microbatches", type=int, default=8, help="m (default 8)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--policies", default="none,po-h,po-f",
                        help="our offload policies, comma-separated (default none,po-h,po-f)")
    parser.add_argument("--torch-schedule", default="ScheduleLoopedBFS",
                        help="torch.distributed.pipelining schedule to compare, or 'off' "
                             "(default ScheduleLoopedBFS)")
    parser.add_argument("--torch-timeout", type=int, default=120,
                        help="seconds the torch schedule's child process may take (default 120)")
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--markdown", help="write the table here as markdown")
    parser.add_argument("--only-torch-schedule", action="store_true",
                        help=argparse.SUPPRESS)  # the child process
    return parser.parse_args(argv)


def timed(step, inputs, targets, params, args):
    import torch
    times = []
    for i in range(args.warmup + args.steps):
        for p in params:
            p.grad = None if p.grad is None else p.grad.zero_()
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(inputs, targets)
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def setup(args):
    import torch
    from pipeoffload.torch import toy
    device = torch.device("cuda", 0)
    stages = toy.make_stages(4, args.hidden, args.blocks, device)
    inputs, targets = toy.make_data(args.microbatches, args.tokens, args.hidden, device)
    return device, stages, inputs, targets, toy.mse_loss(args.microbatches)


def peak_of(run, device):
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - before


def ours(args, policy):
    import pipeoffload as po
    import pipeoffload.torch as pot
    device, stages, inputs, targets, loss = setup(args)
    schedule = po.compile(stages=4, microbatches=args.microbatches, offload=policy,
                          costs=po.Costs.unit(0.25))
    runner = pot.PipelineRunner(stages, schedule, loss, offload=policy != "none")
    params = [p for s in stages for p in s.parameters()]
    seconds = timed(runner.step, inputs, targets, params, args)
    report = runner.memory_report()
    return {"name": f"pipeoffload {policy}", "step_ms": seconds * 1e3,
            "activation_peak_mib": report.measured_peak_bytes / 2**20,
            "predicted_stash_peak_mib": report.predicted_stash_peak_bytes / 2**20,
            "host_pinned_mib": report.host_pinned_bytes / 2**20}


def plain(args):
    from pipeoffload.torch import toy
    device, stages, inputs, targets, loss = setup(args)
    step = toy.plain_step(stages, loss)
    params = [p for s in stages for p in s.parameters()]
    seconds = timed(step, inputs, targets, params, args)
    return {"name": "plain loop (torch, no pipeline)", "step_ms": seconds * 1e3,
            "activation_peak_mib": peak_of(lambda: step(inputs, targets), device) / 2**20}


def torch_schedule(args):
    """Runs in the child: torch's own multi-stage schedule, world size 1."""
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining
    device, stages, inputs, targets, loss = setup(args)
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        wrapped = [pipelining.PipelineStage(stage, i, 4, device) for i, stage in
                   enumerate(stages)]
        schedule_class = getattr(pipelining, args.torch_schedule)
        schedule = schedule_class(wrapped, n_microbatches=args.microbatches, loss_fn=loss,
                                  scale_grads=False)
        batch = torch.cat(inputs)
        target = torch.cat(targets)
        params = [p for s in stages for p in s.parameters()]
        seconds = timed(lambda x, t: schedule.step(x, target=t), batch, target, params, args)
        peak = peak_of(lambda: schedule.step(batch, target=target), device)
        return {"name": f"torch {args.torch_schedule}", "step_ms": seconds * 1e3,
                "activation_peak_mib": peak / 2**20}
    finally:
        dist.destroy_process_group()


def run_torch_schedule_child(args):
    # The child gets the model flags, not the output files (the parent writes those).
    forwarded = []
    skip_value = False
    for a in sys.argv[1:]:
        if skip_value:
            skip_value = False
        elif a in ("--json", "--markdown"):
            skip_value = True
        elif not a.startswith(("--json=", "--markdown=")):
            forwarded.append(a)
    command = [sys.executable, os.path.abspath(__file__), "--only-torch-schedule"] + forwarded
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.torch_timeout)
    except subprocess.TimeoutExpired:
        return {"name": f"torch {args.torch_schedule}",
                "error": f"no result within {args.torch_timeout} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"name": f"torch {args.torch_schedule}",
            "error": f"exit {done.returncode}: {reason[:300]}"}


def markdown(rows, args):
    base = next((r for r in rows if r["name"] == "pipeoffload none"), None)
    lines = [f"h = {args.hidden}, {args.tokens} tokens x {args.microbatches} microbatches, "
             f"{args.blocks} blocks x 4 stages, fp32, one GPU; median of {args.steps} steps", "",
             "| run | step (ms) | vs pipeoffload none | activation peak (MiB) | "
             "predicted stash peak (MiB) | pinned host (MiB) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} | | | | |")
            continue
        ratio = f"{r['step_ms'] / base['step_ms'] - 1:+.1%}" if base else ""
        lines.append(f"| {r['name']} | {r['step_ms']:.1f} | {ratio} | "
                     f"{r['activation_peak_mib']:.0f} | "
                     f"{r.get('predicted_stash_peak_mib', float('nan')):.0f} | "
                     f"{r.get('host_pinned_mib', 0):.0f} |")
    return "\n".join(lines)


def main():
    args = parse_args()
    if args.only_torch_schedule:
        print(json.dumps(torch_schedule(args)))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("torch_pipeline_bench: no CUDA device", file=sys.stderr)
        return 2
    rows = [ours(args, policy) for policy in args.policies.split(",")]
    rows.append(plain(args))
    if args.torch_schedule != "off":
        rows.append(run_torch_schedule_child(args))
    table = markdown(rows, args)
    print(table)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "args": {k: v for k, v in vars(args).items() if k != "only_torch_schedule"},
              "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
