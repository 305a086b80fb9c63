#!/usr/bin/env python3
"""PyTorch's peers of the fused linear cross-entropy (issue 13, "Fused loss"): time and memory.

The loss of x W^T against targets and its gradients for x and W, at Llama-3's head shape (V 128256,
H 4096), as a PyTorch user computes it:
  materialised  logits = x @ W^T (bf16, (N, V)), loss = F.cross_entropy(logits.float(), targets)
                (what HF LlamaForCausalLM does: it upcasts the logits), backward
  liger         Liger-Kernel's LigerFusedLinearCrossEntropyLoss (chunked, never the whole
                logits), when the liger_kernel package is importable; skipped with a note if not
x and W are bf16 leaf tensors requiring grad (W's gradient is bf16 here, as torch keeps it in the
parameter's dtype; ours accumulates in fp32). Method: 2 warm-up calls, then --reps timed ones
between CUDA events, the median. Memory: torch.cuda.max_memory_allocated during one call minus
what was allocated before it (x, W, their gradients and the targets), in MiB (2^20 bytes).
Prints one markdown row per (N, variant) and appends a JSON line each to --json. Exit status 0,
77 without a GPU.
"""
import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="2048,16384", help="comma-separated N (tokens)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default="", help="append one JSON line per result here")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("torch_ce_peer: no GPU: skipped", file=sys.stderr)
        return 77
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss()
    except ImportError as error:
        print(f"torch_ce_peer: liger_kernel not importable ({error}): its row is skipped")
        liger = None

    def materialised(x, w, t):
        logits = x @ w.t()
        return F.cross_entropy(logits.float(), t)

    variants = [("torch materialised (fp32 upcast)", materialised)]
    if liger is not None:
        variants.append(("liger fused", lambda x, w, t: liger(w, x, t)))
    H, V = args.hidden, args.vocab
    print("| N | variant | ms | logits-side memory MiB | loss |")
    print("|---|---|---|---|---|")
    for N in (int(n) for n in args.rows.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(61)
        x = torch.randn(N, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        w = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02)
        w.requires_grad_()
        t = (torch.arange(N, device="cuda", dtype=torch.int64) * 7919) % V
        for name, fn in variants:
            times, peak, loss_value = [], 0.0, float("nan")
            for rep in range(2 + args.reps):
                x.grad = None
                w.grad = None
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                loss = fn(x, w, t)
                loss.backward()
                stop.record()
                torch.cuda.synchronize()
                if rep >= 2:
                    times.append(start.elapsed_time(stop))
                # x.grad and w.grad stay allocated after the call: they are not the loss's memory.
                grads = x.grad.numel() * 2 + w.grad.numel() * w.grad.element_size()
                peak = max(peak, (torch.cuda.max_memory_allocated() - base - grads) / 2**20)
                loss_value = loss.item()
            times.sort()
            median = times[len(times) // 2]
            print(f"| {N} | {name} | {median:.3f} | {peak:.1f} | {loss_value:.6f} |", flush=True)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps({"N": N, "H": H, "V": V, "variant": name, "ms": median,
                                          "memory_mib": peak, "loss": loss_value}) + "\n")
        del x, w, t
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
