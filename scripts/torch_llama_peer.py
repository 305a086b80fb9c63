#!/usr/bin/env python3
"""The PyTorch peer of the layer-sliding benchmark (issue 13, item (c)): HF Llama on one GPU.

What a user would run instead of pipeoffload on the same GPU. It is Hugging Face transformers'
LlamaForCausalLM built from a LlamaConfig (nothing is downloaded), randomly initialized, with
bf16 parameters and bf16 AdamW state on the GPU, SDPA attention and gradient checkpointing on.
The defaults are Llama-3-8B: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 kv heads,
vocab 128256, rope_theta 500000, rms_norm_eps 1e-5, max_position_embeddings 8192, untied head.

Reference numbers the issue quotes for this setup on the H200 (defaults, adamw-fused):
  8 x 2048 tokens:  1.94 s per step = 8,460 tokens/s, 76.8 GiB
  16 x 2048 tokens: 8,540 tokens/s, 108.7 GiB
so a run far from these means something about the setup changed.

Build: torch.set_default_dtype(torch.bfloat16) and `with torch.device("cuda"):` around the
construction, so every parameter is created in bf16 on the GPU (no fp32 copy on the CPU), and
transformers' own post_init initialization runs there (normal(0, initializer_range = 0.02) for
linear and embedding weights, ones for the RMSNorm weights). The time it takes is printed. The
model and the optimizer are built once and shared by all the --configs (the losses therefore
continue from one configuration to the next; the step time does not depend on the values).

One step = for each of --microbatches slices of the batch: forward with labels = the inputs (the
model shifts them itself and returns its own mean cross-entropy), backward of loss / microbatches
(gradient accumulation); then optimizer.step() and zero_grad(set_to_none=True). Optimizer
"adamw-fused" = torch.optim.AdamW(fused=True, lr=1e-5, weight_decay=0.0), its state in the
parameters' dtype (bf16); "none" times forward + backward only. Token ids are uniform random in
the vocab, drawn fresh for every step before its timing starts.

Method: --warmup untimed steps (they allocate the optimizer state), then --steps timed ones, CUDA
events around each step, the median step. Model FLOP by the SlideFormer / Megatron metric
(examples/llama/llama_config.h ModelFlopsPerToken; recomputation not counted):
  per token = 3 x (2 x matrix parameters of the layers and the LM head + 4 T NH hd per layer)
(Llama-3-8B at T = 2048: 48.2e9). Memory: torch.cuda.max_memory_allocated and
max_memory_reserved over the timed steps, in GiB (2^30 bytes).

Prints markdown rows and appends one JSON line per configuration to --json; a configuration that
runs out of GPU memory gives an "OOM" row (and a JSON line with "status": "oom") and the next
one runs. Exit status 0 (OOM rows included), 1 on a failure or when no configuration ran, 77
without a GPU. Progress lines go to stderr, flushed.
"""
import argparse
import gc
import json
import math
import statistics
import sys
import time
import traceback

PREFIX = "torch_llama_peer"
FORMULA = "FLOP/token = 3 x (2 x matrix params of layers + LM head + 4 T NH hd per layer)"


def log(message):
    print(f"{PREFIX}: {message}", file=sys.stderr, flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shape = parser.add_argument_group("model shape (defaults: Llama-3-8B)")
    shape.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    shape.add_argument("--intermediate", type=int, default=14336,
                       help="MLP intermediate size (default 14336)")
    shape.add_argument("--layers", type=int, default=32, help="decoder layers (default 32)")
    shape.add_argument("--heads", type=int, default=32,
                       help="attention heads; head_dim = hidden / heads (default 32)")
    shape.add_argument("--kv-heads", type=int, default=8, help="key/value heads (default 8)")
    shape.add_argument("--vocab", type=int, default=128256, help="vocabulary (default 128256)")
    shape.add_argument("--tied", action="store_true",
                       help="tie the LM head to the embedding (default: untied, as Llama-3-8B)")
    shape.add_argument("--rope-theta", type=float, default=500000.0,
                       help="RoPE base (default 500000)")
    shape.add_argument("--rms-norm-eps", type=float, default=1e-5,
                       help="RMSNorm epsilon (default 1e-5)")
    shape.add_argument("--max-position", type=int, default=8192,
                       help="max_position_embeddings; every --seq must fit (default 8192)")
    shape.add_argument("--layers-override", type=int, default=0,
                       help="quick smoke run: use this many layers instead of --layers, and mark "
                            "the rows so (0 = off)")
    run = parser.add_argument_group("what is run")
    run.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    run.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    run.add_argument("--configs", default="",
                     help="B:T,B:T,... run these (batch, seq) configurations in turn in this "
                          "process instead of --batch/--seq, e.g. 8:2048,16:2048,16:1024")
    run.add_argument("--microbatches", type=int, default=1,
                     help="split each step's batch into this many microbatches with gradient "
                          "accumulation; must divide every batch (default 1)")
    run.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    run.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    run.add_argument("--no-checkpointing", action="store_true",
                     help="turn gradient checkpointing off (default: on, per decoder layer)")
    run.add_argument("--reentrant", action="store_true",
                     help="reentrant torch.utils.checkpoint (default: use_reentrant=False, "
                          "PyTorch's recommended variant)")
    run.add_argument("--optimizer", choices=("adamw-fused", "none"), default="adamw-fused",
                     help="adamw-fused: torch.optim.AdamW(fused=True), state in bf16; none: "
                          "forward + backward only (default adamw-fused)")
    run.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (default 1e-5)")
    run.add_argument("--seed", type=int, default=1234,
                     help="seed of the initialization and of the token ids (default 1234)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", default="", help="append one JSON line per configuration here")
    out.add_argument("--md", default="", help="append the markdown table here")
    args = parser.parse_args()

    def bad_configs():
        parser.error(f"bad --configs={args.configs}: expected B:T,B:T,... with B, T >= 1")

    try:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    except ValueError:
        bad_configs()
    if any(len(c) != 2 or min(c) < 1 for c in configs):
        bad_configs()
    args.configs = configs or [(args.batch, args.seq)]
    if args.layers_override < 0:
        parser.error("--layers-override must be >= 0")
    args.smoke = args.layers_override > 0
    if args.smoke:
        args.layers = args.layers_override
    if min(args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab,
           args.max_position, args.microbatches, args.steps) < 1 or args.warmup < 0:
        parser.error("shape, --microbatches and --steps must be >= 1, --warmup >= 0")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error(f"--heads={args.heads} must divide --hidden={args.hidden} and "
                     f"--kv-heads={args.kv_heads} must divide --heads")
    for batch, seq in args.configs:
        if batch % args.microbatches:
            parser.error(f"--microbatches={args.microbatches} does not divide batch {batch}")
        if seq > args.max_position:
            parser.error(f"seq {seq} > --max-position={args.max_position}")
    return args


def matrix_params(args):
    """Matrix parameters of the layers and the LM head (the embedding is a gather)."""
    head_dim = args.hidden // args.heads
    per_layer = (args.hidden * args.heads * head_dim            # q_proj
                 + 2 * args.hidden * args.kv_heads * head_dim   # k_proj, v_proj
                 + args.heads * head_dim * args.hidden          # o_proj
                 + 3 * args.hidden * args.intermediate)         # gate, up, down
    return args.layers * per_layer + args.vocab * args.hidden  # a tied head still does its GEMM


def flop_per_token(args, seq):
    """SlideFormer / Megatron training FLOP per token (see FORMULA); recompute not counted."""
    head_dim = args.hidden // args.heads
    attention = 4 * seq * args.heads * head_dim * args.layers
    return 3 * (2 * matrix_params(args) + attention)


def build(torch, transformers, args):
    """The model and optimizer in bf16 on the GPU; returns (model, optimizer, init_s, notes)."""
    config_kwargs = dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        hidden_act="silu", max_position_embeddings=args.max_position,
        rms_norm_eps=args.rms_norm_eps, tie_word_embeddings=args.tied, attention_bias=False,
        mlp_bias=False, use_cache=False, attn_implementation="sdpa")
    if int(transformers.__version__.split(".")[0]) >= 5:  # 5 moved rope_theta into a dict
        config_kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": args.rope_theta}
    else:
        config_kwargs["rope_theta"] = args.rope_theta
    config = transformers.LlamaConfig(**config_kwargs)
    config._attn_implementation = "sdpa"  # older releases ignore the constructor argument

    torch.manual_seed(args.seed)
    torch.cuda.synchronize()
    start = time.perf_counter()
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - start

    model.train()  # checkpointing only acts in training mode
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": args.reentrant})
    optimizer = None
    if args.optimizer == "adamw-fused":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0,
                                      fused=True)

    notes = check_model(torch, model, args)
    return model, optimizer, init_s, notes


def check_model(torch, model, args):
    """Fails when the model is not what the flags describe; returns facts worth printing."""
    params = list(model.parameters())
    wrong = sorted({f"{p.dtype} on {p.device}" for p in params
                    if p.dtype != torch.bfloat16 or p.device.type != "cuda"})
    if wrong:
        raise RuntimeError(f"parameters not bf16 on the GPU: {', '.join(wrong)}")
    measured = sum(p.numel() for name, p in model.named_parameters()
                   if p.dim() == 2 and "embed_tokens" not in name)
    if args.tied:
        measured += args.vocab * args.hidden
    if measured != matrix_params(args):
        raise RuntimeError(f"the model has {measured} matrix parameters, the FLOP formula "
                           f"counts {matrix_params(args)}: the shape flags do not match the model")
    notes = {"params": sum(p.numel() for p in params)}
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is not None and inv_freq.numel() > 1:  # inv_freq[1] = theta^(-2 / head_dim)
        head_dim = args.hidden // args.heads
        theta = float(inv_freq[1].double()) ** (-head_dim / 2)
        if abs(theta / args.rope_theta - 1) > 1e-3:
            raise RuntimeError(f"the model's RoPE base is {theta:.6g}, not --rope-theta="
                               f"{args.rope_theta:g}")
        notes["rope_theta"] = theta
    weight = model.model.layers[0].self_attn.q_proj.weight
    notes["q_proj_std"] = float(weight.float().std())
    return notes


def run_config(torch, model, optimizer, args, batch, seq):
    """Warm-up and timed steps of one (batch, seq); returns the row (raises on OOM)."""
    micro = batch // args.microbatches
    generator = torch.Generator(device="cuda")
    generator.manual_seed(args.seed + 1000003 * batch + seq)
    times, losses = [], []
    total = args.warmup + args.steps
    for step in range(total):
        timed = step >= args.warmup
        ids = torch.randint(0, args.vocab, (batch, seq), device="cuda", generator=generator)
        torch.cuda.synchronize()
        if step == args.warmup:
            static = torch.cuda.memory_allocated()  # params + optimizer state + ids
            torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss_sum = None
        for m in range(args.microbatches):
            chunk = ids[m * micro:(m + 1) * micro]
            loss = model(input_ids=chunk, labels=chunk, use_cache=False).loss
            (loss / args.microbatches).backward()
            part = loss.detach() / args.microbatches
            loss_sum = part if loss_sum is None else loss_sum + part
            del loss
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        loss_value = float(loss_sum)
        del ids, chunk, loss_sum
        if not math.isfinite(loss_value):
            raise RuntimeError(f"{batch}x{seq} step {step + 1}: the loss is {loss_value}")
        log(f"{batch}x{seq} step {step + 1}/{total}{'' if timed else ' (warm-up)'}: "
            f"{seconds:.3f} s, loss {loss_value:.4f}")
        if timed:
            times.append(seconds)
            losses.append(loss_value)
    step_s = statistics.median(times)
    tokens = batch * seq
    return {"status": "ok", "step_s": step_s, "step_min_s": min(times),
            "step_max_s": max(times), "step_times_s": times, "tokens_per_s": tokens / step_s,
            "flop_per_token": flop_per_token(args, seq),
            "model_tflops": flop_per_token(args, seq) * tokens / step_s / 1e12,
            "max_allocated_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
            "max_reserved_gib": torch.cuda.max_memory_reserved() / 2 ** 30,
            "static_gib": static / 2 ** 30, "loss_first": losses[0], "loss_last": losses[-1]}


def describe(args):
    return (f"h={args.hidden} F={args.intermediate} L={args.layers} NH={args.heads} "
            f"NKV={args.kv_heads} V={args.vocab} {'tied' if args.tied else 'untied'}"
            f"{' (SMOKE: --layers-override)' if args.smoke else ''}")


def markdown(torch, transformers, args, init_s, rows):
    lines = [f"PyTorch {torch.__version__} + transformers {transformers.__version__} "
             f"LlamaForCausalLM peer on {torch.cuda.get_device_name(0)}, {describe(args)}; "
             f"bf16 params, optimizer {args.optimizer}"
             f"{' (bf16 state)' if args.optimizer == 'adamw-fused' else ''}, sdpa, "
             f"checkpointing {'off' if args.no_checkpointing else 'on'}, "
             f"m={args.microbatches}, median of {args.steps} steps after {args.warmup}; "
             f"init {init_s:.1f} s on the GPU. {FORMULA}.", "",
             "| B x T | tokens/step | step s (median) | tokens/s | model TFLOP/s | "
             "max allocated GiB | max reserved GiB | loss first -> last |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['batch']} x {r['seq']} | {r['batch'] * r['seq']} |"
        if r["status"] == "ok":
            lines.append(f"{head} {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['model_tflops']:.1f} | {r['max_allocated_gib']:.1f} | "
                         f"{r['max_reserved_gib']:.1f} | {r['loss_first']:.3f} -> "
                         f"{r['loss_last']:.3f} |")
        else:
            error = r.get("error", "").replace("|", "/")[:80]
            lines.append(f"{head} {r['status'].upper()} | - | - | "
                         f"{r.get('max_allocated_gib', 0):.1f} at failure | - | {error} |")
    return "\n".join(lines) + "\n"


def release(torch, model, optimizer):
    """What a failed step left behind: gradients, cached blocks."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as error:
        log(f"no torch here ({error})")
        return 1
    if not torch.cuda.is_available():
        log("no usable GPU; skipping")
        return 77
    try:
        import transformers
    except ImportError as error:
        log(f"no transformers here ({error})")
        return 1
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.cuda.get_device_name(0)}, {describe(args)}, flash sdp "
        f"{'on' if torch.backends.cuda.flash_sdp_enabled() else 'off'}; {FORMULA}")
    try:
        model, optimizer, init_s, notes = build(torch, transformers, args)
    except torch.cuda.OutOfMemoryError as error:
        log(f"the model does not fit: {str(error).splitlines()[0]}")
        return 1
    except Exception:  # pylint: disable=broad-except
        log(f"building the model failed:\n{traceback.format_exc()}")
        return 1
    log(f"built {notes['params'] / 1e9:.3f} B parameters in {init_s:.1f} s (bf16 on the GPU, "
        f"transformers' post_init; q_proj std {notes['q_proj_std']:.4f}, rope_theta "
        f"{notes.get('rope_theta', 'not checked')}), "
        f"{torch.cuda.memory_allocated() / 2 ** 30:.1f} GiB allocated")

    common = {"peer": "torch-hf-llama", "torch": torch.__version__,
              "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0),
              "hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers,
              "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
              "tied": args.tied, "rope_theta": args.rope_theta, "smoke": args.smoke,
              "params": notes["params"], "microbatches": args.microbatches,
              "checkpointing": not args.no_checkpointing, "reentrant": args.reentrant,
              "optimizer": args.optimizer, "lr": args.lr, "attn": "sdpa", "dtype": "bfloat16",
              "steps": args.steps, "warmup": args.warmup, "init_s": init_s,
              "init": "bf16 default dtype under torch.device('cuda'), transformers post_init",
              "flop_formula": FORMULA}
    rows, ran, failed = [], 0, False
    for batch, seq in args.configs:
        row = dict(common, batch=batch, seq=seq)
        log(f"{batch}x{seq}: {flop_per_token(args, seq) / 1e9:.1f} GFLOP/token")
        torch.cuda.reset_peak_memory_stats()
        try:
            row.update(run_config(torch, model, optimizer, args, batch, seq))
            ran += 1
            log(f"{batch}x{seq}: {row['step_s']:.3f} s, {row['tokens_per_s']:,.0f} tokens/s, "
                f"{row['model_tflops']:.1f} TFLOP/s, {row['max_allocated_gib']:.1f} GiB")
        except torch.cuda.OutOfMemoryError as error:
            row.update(status="oom", error=str(error).splitlines()[0],
                       max_allocated_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
            log(f"{batch}x{seq}: out of GPU memory: {row['error']}")
        except Exception:  # pylint: disable=broad-except
            row.update(status="failed", error=traceback.format_exc().strip().splitlines()[-1],
                       max_allocated_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
            log(f"{batch}x{seq} failed:\n{traceback.format_exc()}")
            failed = True
        release(torch, model, optimizer)  # outside the except: the traceback is gone by now
        rows.append(row)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    text = markdown(torch, transformers, args, init_s, rows)
    print(text, flush=True)
    if args.md:
        with open(args.md, "a") as f:
            f.write(text + "\n")
    return 1 if failed or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
