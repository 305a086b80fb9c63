#!/usr/bin/env python3
"""The PyTorch peer of pipeline_bench (issue 5): the same GPT layer stack in plain PyTorch.

What users would otherwise run: pre-LN GPT layers (LayerNorm, QKV linear, causal
scaled_dot_product_attention, projection, residual, LayerNorm, 4h linear, GELU (tanh), projection,
residual) in bf16 on one GPU, `layers` of them (pipeline_bench's p * v * layers_per_chunk), and one
step = `microbatches` microbatches of batch 1 with gradient accumulation (forward, then backward
from a fixed random output gradient, per microbatch; pipeline_bench's last stage starts from one
too). Modes (PyTorch's memory options, what a user picks among; issue 16):
  none                 activations stay on the GPU;
  full_recompute       torch.utils.checkpoint per layer (use_reentrant=False): each layer keeps
                       only its input and reruns its forward inside the backward;
  attention_recompute  checkpoint the attention branch of each layer only (LayerNorm, QKV,
                       core attention, projection; the MLP's activations are kept): Megatron's
                       selective recompute of core attention, widened to the branch because with
                       flash attention the core alone keeps no T x T scores to save;
  save_on_cpu          torch.autograd.graph.save_on_cpu(pin_memory=True) around each forward.
Method: fresh random inputs for every microbatch of every step (drawn before the step's timing
starts), warm-up steps, CUDA events around each step, the median step. Model FLOP per step by
pipeline_bench's convention (reference/hardware.md section 4): (72 h^2 s + 12 s^2 h) per layer and
microbatch, attention counted dense. Memory: torch.cuda.max_memory_allocated over the timed steps
("peak"); "static" is what is allocated when a step starts (parameters, their accumulated
gradients, and the step's inputs; there is no optimizer state: the step is forward + backward
only, like pipeline_bench's), and "activations" = peak - static.

Prints markdown rows and appends one JSON line per mode to --json (pipeline_bench --summarize
--peer reads them). Exit status 0, 1 on a failure, 77 without a GPU.
"""
import argparse
import json
import math
import statistics
import sys

MODES = ("none", "full_recompute", "attention_recompute", "save_on_cpu")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="modes: " + ", ".join(MODES) + " (the module "
                                     "docstring says what each does)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=0, help="0 = hidden / 128")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--configs", default="",
                        help="H:LAYERS,H:LAYERS,... run these (hidden, layers) in turn in this "
                             "process instead of --hidden/--layers (heads = H / 128)")
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--modes", default="none,save_on_cpu",
                        help="comma-separated, run in this order: none (activations on the GPU), "
                             "full_recompute (torch.utils.checkpoint per layer), "
                             "attention_recompute (checkpoint each layer's attention branch), "
                             "save_on_cpu (autograd.graph.save_on_cpu, pinned)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--offload-steps", type=int, default=0,
                        help="timed steps of save_on_cpu (0 = --steps): it is ~6x slower "
                             "(~26 s a step at h=8192, 16 layers)")
    parser.add_argument("--json", default="", help="append one JSON line per mode here")
    parser.add_argument("--md", default="", help="append the markdown rows here")
    args = parser.parse_args()
    try:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    except ValueError:
        parser.error(f"bad --configs={args.configs}: expected H:LAYERS,H:LAYERS,...")
    if any(len(c) != 2 for c in configs):
        parser.error(f"bad --configs={args.configs}: expected H:LAYERS,H:LAYERS,...")
    args.configs = configs or [(args.hidden, args.layers)]
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    for hidden, layers in args.configs:
        heads = args.heads or max(1, hidden // 128)
        if bad or hidden % heads or min(hidden, args.seq, layers, args.microbatches,
                                         args.steps) < 1:
            parser.error(f"bad arguments: modes {bad or modes}, hidden {hidden} heads {heads} "
                         f"(must divide), seq/layers/microbatches/steps >= 1")
    args.modes = modes
    args.offload_steps = args.offload_steps or args.steps
    return args


def build(torch, args):
    nn = torch.nn
    functional = torch.nn.functional
    checkpoint = torch.utils.checkpoint.checkpoint  # attention_recompute's

    class Layer(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def attention(self, x):  # x: [B, T, C] -> the attention branch's output
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            shape = (b, t, self.heads, c // self.heads)
            q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))  # [B, nh, T, hd]
            y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

        def forward(self, x, recompute_attention=False):
            if recompute_attention:
                x = x + checkpoint(self.attention, x, use_reentrant=False)
            else:
                x = x + self.attention(x)
            return x + self.fc2(functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    torch.manual_seed(1)
    # Built on the GPU: initialising h = 8192's 12.9e9 parameters on the CPU took minutes (the
    # h = 8192 peer ran past its time limit on the H200 that way).
    with torch.device("cuda"):
        layers = nn.Sequential(*[Layer(args.hidden, args.heads) for _ in range(args.layers)])
    for module in layers.modules():  # small weights: activations stay O(1) over many layers
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02 / math.sqrt(2 * args.layers))
            nn.init.zeros_(module.bias)
    return layers.to(device="cuda", dtype=torch.bfloat16)


def forward(torch, model, x, mode):
    """One microbatch's forward through every layer, as `mode` keeps its activations."""
    if mode == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return model(x)
    for layer in model:
        if mode == "full_recompute":
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        else:
            x = layer(x, recompute_attention=mode == "attention_recompute")
    return x


def run_mode(torch, model, args, mode):
    steps = args.offload_steps if mode == "save_on_cpu" else args.steps
    shape = (1, args.seq, args.hidden)
    generator = torch.Generator(device="cuda")
    generator.manual_seed(1234)
    grad_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    flops = (72 * args.hidden ** 2 * args.seq + 12 * args.seq ** 2 * args.hidden) * \
        args.layers * args.microbatches
    times, peak, static = [], 0, 0
    for step in range(args.warmup + steps):
        inputs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
                  for _ in range(args.microbatches)]  # fresh every step, outside the timing
        torch.cuda.synchronize()
        static = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for x in inputs:
            out = forward(torch, model, x, mode)
            out.backward(grad_out)  # gradients accumulate in .grad over the microbatches
        end.record()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(start.elapsed_time(end) / 1e3)
            peak = max(peak, torch.cuda.max_memory_allocated())
        del inputs, out
    for p in model.parameters():
        bad = p.grad is None or not torch.isfinite(p.grad).all()
        if bad:
            raise RuntimeError(f"mode {mode}: a gradient is missing or not finite")
        p.grad = None
    step_s = statistics.median(times)
    return {"hidden": args.hidden, "seq": args.seq, "layers": args.layers,
            "microbatches": args.microbatches, "mode": mode, "step_s": step_s,
            "step_min_s": min(times), "step_max_s": max(times),
            "tflops": flops / step_s / 1e12, "peak_bytes": peak, "static_bytes": static,
            "activation_bytes": peak - static}


def run_config(torch, args):
    """Every mode at args.hidden / args.layers; returns the rows, or None on out-of-memory."""
    print(f"torch_peer: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, h={args.hidden} "
          f"heads={args.heads} s={args.seq} layers={args.layers} m={args.microbatches}, "
          f"flash sdp {'on' if torch.backends.cuda.flash_sdp_enabled() else 'off'}",
          file=sys.stderr)
    model = build(torch, args)
    rows = []
    for mode in args.modes:
        try:
            rows.append(run_mode(torch, model, args, mode))
        except torch.cuda.OutOfMemoryError as error:
            print(f"torch_peer: h={args.hidden} mode {mode} ran out of memory: {error}",
                  file=sys.stderr)
            return None
        print(f"torch_peer: h={args.hidden} {mode}: {rows[-1]['step_s']:.4f} s", file=sys.stderr)
    del model
    torch.cuda.empty_cache()
    return rows


def markdown(torch, args, rows):
    base = next((r["step_s"] for r in rows if r["mode"] == "none"), None)
    lines = [f"PyTorch {torch.__version__} peer, h={args.hidden} s={args.seq}, {args.layers} layers, "
             f"m={args.microbatches} (step = forward + backward, no optimizer)", "",
             "| peer | step s (median) | vs none | model TFLOP/s | activations GB | peak GB | "
             "params+grads+inputs GB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        versus = f"{(r['step_s'] / base - 1) * 100:+.0f}%" if base and r["mode"] != "none" else "-"
        lines.append(f"| torch {r['mode']} | {r['step_s']:.4f} | {versus} | {r['tflops']:.1f} | "
                     f"{r['activation_bytes'] / 1e9:.2f} | {r['peak_bytes'] / 1e9:.2f} | "
                     f"{r['static_bytes'] / 1e9:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    try:
        import torch
        import torch.utils.checkpoint  # noqa: F401 (not imported by `import torch` everywhere)
    except ImportError as error:
        print(f"torch_peer: no torch here ({error})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_peer: no usable GPU; skipping", file=sys.stderr)
        return 77
    status = 0
    explicit_heads = args.heads
    for hidden, layers in args.configs:
        args.hidden, args.layers = hidden, layers
        args.heads = explicit_heads or max(1, hidden // 128)
        rows = run_config(torch, args)
        if rows is None:
            status = 1
            continue
        text = markdown(torch, args, rows)
        print(text)
        if args.md:
            with open(args.md, "a") as f:
                f.write(text + "\n")
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
