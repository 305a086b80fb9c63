"""PipelineRunner: every virtual stage of a compiled schedule, as torch modules in one process
on one GPU, run in the plan's one-process order with its offload ops (plan.py, offload.py).

Op semantics (the executor's, runtime.h, on one device):
  F       runs the virtual stage's module on its input (the microbatch for virtual stage 0, else
          the previous stage's output, detached, as a leaf that requires grad) inside the
          entry's saved-tensor capture; the last virtual stage applies loss_fn.
  B       waits (on the GPU) for the entry's reload, then runs the full backward: from the loss
          on the last virtual stage, else from the output with the next stage's input gradient.
  W       (split-backward plans) runs no compute, since B already produced the weight
          gradients; it frees the entry, so memory follows the plan, not the zero-bubble timing.
  OFFLOAD / RELEASE / RELOAD go to the ActivationOffloader; SEND_* / RECV_* / BARRIER are
  markers (the order already puts each op after its inputs, and one process shares one link).
Gradients accumulate into the modules' .grad as a plain loop over the microbatches would; the
caller zeroes them and steps its optimizer.
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .ledger import peak_without_offload, replay
from .offload import ActivationOffloader
from .plan import RECOMPUTE_KINDS, PipelinePlan, PlanError


@dataclasses.dataclass
class MemoryReport:
    """One step's activation memory, measured and predicted, in bytes.

    measured_peak_bytes: torch.cuda.max_memory_allocated() during the step minus
        memory_allocated() before it (parameters, gradients and the optimizer state that
        exist before the step are not in it; transients of the kernels and the stage
        boundaries are).
    predicted_stash_peak_bytes: the peak of the saved tensors resident at once when the plan's
        ops run in the one-process order, each entry weighed with the bytes its capture saw.
    predicted_stash_peak_without_offload_bytes: the same order with the offload ops dropped.
    compiler_stage_peak_units / compiler_stage_peak_units_without_offload: the compiler's
        per-stage peaks (entries), which ledger.replay() reproduces per stage.
    host_pinned_bytes: pinned host memory the pool allocated (all steps so far)."""
    measured_peak_bytes: int
    predicted_stash_peak_bytes: int
    predicted_stash_peak_without_offload_bytes: int
    compiler_stage_peak_units: List[int]
    compiler_stage_peak_units_without_offload: List[int]
    host_pinned_bytes: int
    host_buffers_allocated: Dict[int, int]
    host_buffers_predicted: Dict[int, int]
    entry_bytes: Dict[str, int]


class PipelineRunner:
    """Runs `schedule` (a pipeoffload.Schedule or a PipelinePlan) on `stages`, one nn.Module per
    virtual stage (chunk c of stage d is stages[c * p + d]), all on one CUDA device.

    offload=False runs the same order with the offload ops skipped (the baseline with the same
    compute order, so its gradients must be bitwise those of the offloaded run).
    sync_release: see ActivationOffloader (True for exact memory measurements).
    Raises ValueError for stages that do not fit the plan, PlanError for a plan that cannot run.
    """

    def __init__(self, stages: Sequence[torch.nn.Module], schedule,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 offload: bool = True, sync_release: bool = False, min_offload_bytes: int = 0,
                 device=None):
        self.plan = schedule if isinstance(schedule, PipelinePlan) else \
            PipelinePlan.from_schedule(schedule)
        if len(stages) != self.plan.num_virtual_stages:
            raise ValueError(f"PipelineRunner: {len(stages)} stage modules for a plan of "
                             f"{self.plan.num_virtual_stages} virtual stages "
                             f"({self.plan.num_stages} stages x {self.plan.chunks_per_stage} "
                             "chunks)")
        recomputed = [a for program in self.plan.programs for a in program
                      if a.kind in RECOMPUTE_KINDS]
        if recomputed:
            raise PlanError(f"PipelineRunner does not recompute yet: the plan has "
                            f"{len(recomputed)} recompute ops (first: stage "
                            f"{recomputed[0].stage}, {recomputed[0]}); compile without "
                            "recompute for torch stages")
        self.stages = list(stages)
        tensors = [t for m in self.stages for t in list(m.parameters()) + list(m.buffers())]
        self.device = torch.device(device) if device is not None else (
            tensors[0].device if tensors else torch.device("cuda"))
        wrong = [t.device for t in tensors if t.device != self.device]
        if self.device.type != "cuda" or wrong:
            raise ValueError(f"PipelineRunner: every stage must be on one CUDA device; got "
                             f"{self.device} and {sorted(set(map(str, wrong)))}")
        self.loss_fn = loss_fn
        self.offload_enabled = offload
        self.order = self.plan.single_process_order()
        self.offloader = ActivationOffloader(self.device, self.plan.split_backward,
                                             excluded=tensors, sync_release=sync_release,
                                             min_bytes=min_offload_bytes)
        self.last_report: Optional[MemoryReport] = None
        self._compiler_peaks = None
        if not isinstance(schedule, PipelinePlan) and schedule.predictions is not None:
            self._compiler_peaks = (
                [s.peak_units for s in schedule.predictions.stages],
                [s.peak_units_without_offload for s in schedule.predictions.stages])

    def step(self, inputs: Sequence[torch.Tensor], targets: Sequence) -> List[torch.Tensor]:
        """One iteration over the plan's microbatches; returns each microbatch's loss (detached)
        and leaves the gradients in the modules. Measures memory into last_report."""
        m = self.plan.num_microbatches
        if len(inputs) != m or len(targets) != m:
            raise ValueError(f"PipelineRunner.step: the plan has {m} microbatches; got "
                             f"{len(inputs)} inputs and {len(targets)} targets")
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.offloader.new_iteration()
        state = _StepState(list(inputs), list(targets))
        for action in self.order:
            self._run(action, state)
        self.offloader.finish()
        torch.cuda.synchronize(self.device)
        measured = torch.cuda.max_memory_allocated(self.device) - before
        self.last_report = self._report(measured)
        return [state.losses[mb] for mb in range(m)]

    # --- ops ---------------------------------------------------------------------------------

    def _run(self, action, state):
        key = action.key
        kind = action.kind
        if kind == "F":
            self._forward(action, state)
        elif kind == "B":
            self.offloader.before_backward(key)
            self._backward(action, state)
            self.offloader.after_backward(key)
        elif kind == "W":
            self.offloader.after_weight(key)
        elif kind in ("OFFLOAD", "RELEASE", "RELOAD") and self.offload_enabled:
            getattr(self.offloader, kind.lower())(key)

    def _forward(self, action, state):
        l, mb = action.virtual_stage, action.mb
        if l == 0:
            x = state.inputs[mb]
        else:
            x = state.activations.pop((l, mb), None)
            if x is None:
                raise PlanError(f"stage {action.stage}: {action} has no input from virtual "
                                f"stage {l - 1}")
        last = l == self.plan.num_virtual_stages - 1
        # The input and the target stay where the caller keeps them: offloading them would free
        # nothing.
        held = [x] + ([state.targets[mb]] if last and torch.is_tensor(state.targets[mb]) else [])
        with self.offloader.capture(action.key, inputs=held):
            out = self.stages[l](x)
            if last:
                out = self.loss_fn(out, state.targets[mb])
                state.losses[mb] = out.detach()
        if not last:
            state.activations[(l + 1, mb)] = out.detach().requires_grad_(True)
        state.pending[(l, mb)] = (x, out)

    def _backward(self, action, state):
        l, mb = action.virtual_stage, action.mb
        x, out = state.pending.pop((l, mb))
        if l == self.plan.num_virtual_stages - 1:
            torch.autograd.backward(out)
        else:
            grad = state.gradients.pop((l, mb), None)
            if grad is None:
                raise PlanError(f"stage {action.stage}: {action} has no output gradient from "
                                f"virtual stage {l + 1}")
            torch.autograd.backward(out, grad)
        if l > 0:
            state.gradients[(l - 1, mb)] = x.grad

    def _report(self, measured):
        sizes = self.offloader.entry_sizes
        with_offload = replay(self.plan, self.order if self.offload_enabled else
                              [a for a in self.order
                               if a.kind not in ("OFFLOAD", "RELEASE", "RELOAD")], sizes)
        without = peak_without_offload(self.plan, sizes, self.order)
        compiler = self._compiler_peaks or ([], [])
        entry_bytes = [sum(v) for v in sizes.values()]
        return MemoryReport(
            measured_peak_bytes=measured,
            predicted_stash_peak_bytes=with_offload.device_total.peak_bytes,
            predicted_stash_peak_without_offload_bytes=without.device_total.peak_bytes,
            compiler_stage_peak_units=compiler[0],
            compiler_stage_peak_units_without_offload=compiler[1],
            host_pinned_bytes=self.offloader.pool.stats.allocated_bytes,
            host_buffers_allocated=dict(self.offloader.pool.stats.allocated),
            host_buffers_predicted=with_offload.host_buffers_peak if self.offload_enabled
            else {},
            entry_bytes={"min": min(entry_bytes, default=0), "max": max(entry_bytes, default=0)})

    def memory_report(self) -> Optional[MemoryReport]:
        """The last step's MemoryReport (None before the first step)."""
        return self.last_report


@dataclasses.dataclass
class _StepState:
    inputs: list
    targets: list
    losses: dict = dataclasses.field(default_factory=dict)
    activations: dict = dataclasses.field(default_factory=dict)  # (virtual stage, mb) -> input
    gradients: dict = dataclasses.field(default_factory=dict)    # (virtual stage, mb) -> grad
    pending: dict = dataclasses.field(default_factory=dict)      # (virtual stage, mb) -> (x, out)
