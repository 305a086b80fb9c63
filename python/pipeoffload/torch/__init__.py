"""pipeoffload.torch: our compiled schedules, OFFLOAD / RELEASE / RELOAD included, run on torch
pipeline stages (docs/torch.md).

    import pipeoffload as po
    import pipeoffload.torch as pot
    schedule = po.compile(stages=4, microbatches=8, offload="po-f", costs=po.Costs.unit())
    runner = pot.PipelineRunner(stages, schedule, loss_fn)   # stages: 4 nn.Modules on one GPU
    losses = runner.step(inputs, targets)                    # lists of microbatches
    runner.memory_report()                                   # measured vs predicted

Why this shape. torch.distributed.pipelining's schedule IR (_Action, schedules.py in torch
2.11) has a fixed set of computation types with no offload action; its _PipelineScheduleRuntime
runs one rank's actions and lets a caller replace the function of a compute type
(register_custom_function) but not add a type. So the offload plan cannot travel inside torch's
IR. We keep the compiler's per-stage programs as they are (plan.py), do all the bookkeeping
without torch (ledger.py: where each (stage, mb) is; pinned_pool.py: when a host buffer may be
reused), and keep the torch layer thin:
  - offload.py captures each (stage, chunk, mb)'s saved tensors with
    torch.autograd.graph.saved_tensors_hooks and moves them on side streams with events;
  - runner.py runs every stage of one process on one GPU in the plan's order
    (PipelinePlan.single_process_order), the setup the tests and the benchmark use.
For multi-rank torch pipelines, PipelinePlan.torch_actions() gives each rank's actions in torch's
notation and offload_hooks() the offload ops to issue after each of them, which is what a
runtime beside torch's (or a subclass registering custom F / B functions) needs.

The torch-free parts import without torch; PipelineRunner and ActivationOffloader import torch
when first used.
"""
from .ledger import Replay, StashLedger, Usage, peak_without_offload, replay
from .pinned_pool import PinnedPool, PoolStats, dense_span
from .plan import Action, PipelinePlan, PlanError

_TORCH_NAMES = {"PipelineRunner": "runner", "MemoryReport": "runner",
                "ActivationOffloader": "offload"}


def __getattr__(name):
    """PipelineRunner / MemoryReport / ActivationOffloader, importing torch on first use."""
    if name in _TORCH_NAMES:
        import importlib
        module = importlib.import_module(f".{_TORCH_NAMES[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Action", "ActivationOffloader", "MemoryReport", "PinnedPool", "PipelinePlan",
           "PipelineRunner", "PlanError", "PoolStats", "Replay", "StashLedger", "Usage",
           "dense_span", "peak_without_offload", "replay"]
