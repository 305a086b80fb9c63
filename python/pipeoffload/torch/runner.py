"""PipelineRunner: every virtual stage of a compiled schedule, as torch modules in one process
on one GPU, run in the plan's one-process order with its offload ops (plan.py, offload.py).

Op semantics (the executor's, runtime.h, on one device):
  F       runs the virtual stage's module on its input (the microbatch for virtual stage 0, else
          the previous stage's output, detached, as a leaf that requires grad) inside the
          entry's saved-tensor capture; the last virtual stage applies loss_fn.
  B       waits (on the GPU) for the entry's reload, then runs the full backward: from the loss
          on the last virtual stage, else from the output with the next stage's input gradient.
  F of an entry the plan recomputes (RECOMPUTE) runs the module (and loss_fn on the last
          virtual stage) under torch.no_grad(): nothing is saved, the output (and the loss) is
          handed on as usual. The runner keeps the input (the target stays in the caller's
          list) and the CPU and CUDA RNG states from before the forward, as
          torch.utils.checkpoint does with preserve_rng_state.
  RECOMPUTE re-runs that forward with grad enabled on the kept input, inside the entry's
          saved-tensor capture, with the RNG states of F restored in a torch.random.fork_rng()
          block (dropout draws the same bits; the global RNG is left as if nothing ran). From
          then on the entry holds its saved tensors and B backpropagates through the rebuilt
          graph. The retained block is the input the runner holds anyway, so the plan's
          OFFLOAD / RELEASE / RELOAD of it move nothing (a retained size of 0 in the ledger).
  RECOMPUTE_LEAN is refused: it rebuilds an entry from what a model declares its cheap parts'
          inputs, and an nn.Module declares none (compile with recompute "full" or "none").
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
from .plan import PipelinePlan, PlanError


@dataclasses.dataclass
class MemoryReport:
    """One step's activation memory, measured and predicted, in bytes.

    measured_peak_bytes: torch.cuda.max_memory_allocated() during the step minus
        memory_allocated() before it (parameters, gradients and the optimizer state that
        exist before the step are not in it; transients of the kernels and the stage
        boundaries are).
    predicted_stash_peak_bytes: the peak of the saved tensors resident at once when the plan's
        ops run in the one-process order, each entry weighed with the bytes its capture saw
        (a recomputed entry: 0 bytes from F to its RECOMPUTE, since the input it keeps is held
        for every entry and is in no entry's bytes; then the bytes the recompute saved).
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
    preserve_rng_state=False skips saving and restoring the RNG states around a recompute
    (torch.utils.checkpoint's option of that name): only for stages that draw no random numbers.
    Raises ValueError for stages that do not fit the plan, PlanError for a plan that cannot run
    (RECOMPUTE_LEAN ops included).
    """

    def __init__(self, stages: Sequence[torch.nn.Module], schedule,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 offload: bool = True, sync_release: bool = False, min_offload_bytes: int = 0,
                 preserve_rng_state: bool = True, device=None):
        self.plan = schedule if isinstance(schedule, PipelinePlan) else \
            PipelinePlan.from_schedule(schedule)
        if len(stages) != self.plan.num_virtual_stages:
            raise ValueError(f"PipelineRunner: {len(stages)} stage modules for a plan of "
                             f"{self.plan.num_virtual_stages} virtual stages "
                             f"({self.plan.num_stages} stages x {self.plan.chunks_per_stage} "
                             "chunks)")
        lean = [a for program in self.plan.programs for a in program
                if a.kind == "RECOMPUTE_LEAN"]
        if lean:
            raise PlanError(f"PipelineRunner cannot run RECOMPUTE_LEAN (the plan has {len(lean)};"
                            f" first: stage {lean[0].stage}, {lean[0]}): a lean recompute "
                            "rebuilds an entry from the inputs of the model's cheap parts, and "
                            "an nn.Module defines none; compile with recompute \"full\" (or "
                            "\"none\") for torch stages")
        # (stage, chunk, mb) -> "RECOMPUTE" for every entry whose F keeps only its input.
        self.recomputed = {a.key: a.kind for program in self.plan.programs for a in program
                           if a.kind == "RECOMPUTE"}
        self.preserve_rng_state = preserve_rng_state
        self.stages = list(stages)
        tensors = [t for m in self.stages for t in list(m.parameters()) + list(m.buffers())]
        self.device = torch.device(device) if device is not None else (
            tensors[0].device if tensors else torch.device("cuda"))
        wrong = [t.device for t in tensors if t.device != self.device]
        if self.device.type != "cuda" or wrong:
            raise ValueError(f"PipelineRunner: every stage must be on one CUDA device; got "
                             f"{self.device} and {sorted(set(map(str, wrong)))}")
        self._rng_device = self.device.index if self.device.index is not None else \
            torch.cuda.current_device()
        self.loss_fn = loss_fn
        self.offload_enabled = offload
        self.order = self.plan.single_process_order()
        self.offloader = ActivationOffloader(self.device, self.plan.split_backward,
                                             excluded=tensors, sync_release=sync_release,
                                             min_bytes=min_offload_bytes,
                                             recomputed=self.recomputed)
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
        elif kind == "RECOMPUTE":
            self._recompute(action, state)
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
        if action.key in self.recomputed:
            # Nothing saved: RECOMPUTE rebuilds the graph from x with these RNG states.
            rng = _RngState.now(self._rng_device) if self.preserve_rng_state else None
            self.offloader.retain(action.key)
            with torch.no_grad():
                out = self._stage_forward(l, x, state, mb)
            state.retained[(l, mb)] = (x, rng)
        else:
            # The input and the target stay where the caller keeps them: offloading them would
            # free nothing.
            with self.offloader.capture(action.key, inputs=self._held(l, x, state, mb)):
                out = self._stage_forward(l, x, state, mb)
            state.pending[(l, mb)] = (x, out)
        if last:
            state.losses[mb] = out.detach()
        else:
            state.activations[(l + 1, mb)] = out.detach().requires_grad_(True)

    def _recompute(self, action, state):
        l, mb = action.virtual_stage, action.mb
        kept = state.retained.pop((l, mb), None)
        if kept is None:
            raise PlanError(f"stage {action.stage}: {action} of an entry whose F did not keep "
                            "its input (no F yet, or recomputed already)")
        x, rng = kept
        with torch.random.fork_rng(devices=[self._rng_device], enabled=rng is not None):
            if rng is not None:
                rng.restore(self._rng_device)
            with torch.enable_grad(), self.offloader.capture(
                    action.key, inputs=self._held(l, x, state, mb), op="RECOMPUTE"):
                out = self._stage_forward(l, x, state, mb)
        state.pending[(l, mb)] = (x, out)

    def _held(self, l, x, state, mb):
        """Tensors of an entry the runner holds anyway: its input, and on the last virtual
        stage its target."""
        last = l == self.plan.num_virtual_stages - 1
        return [x] + ([state.targets[mb]] if last and torch.is_tensor(state.targets[mb]) else [])

    def _stage_forward(self, l, x, state, mb):
        """Virtual stage l on x; the loss on the last virtual stage."""
        out = self.stages[l](x)
        if l == self.plan.num_virtual_stages - 1:
            out = self.loss_fn(out, state.targets[mb])
        return out

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
        # A recomputed entry's retained block is its input, held for every entry: 0 bytes.
        retained = {key: 0 for key in self.recomputed}
        with_offload = replay(self.plan, self.order if self.offload_enabled else
                              [a for a in self.order
                               if a.kind not in ("OFFLOAD", "RELEASE", "RELOAD")], sizes,
                              retained)
        without = peak_without_offload(self.plan, sizes, self.order, retained)
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
    # (virtual stage, mb) -> (x, _RngState or None) of a recomputed entry, from F to RECOMPUTE
    retained: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _RngState:
    """The CPU and one CUDA device's RNG states before a forward that RECOMPUTE repeats."""
    cpu: torch.Tensor
    cuda: torch.Tensor

    @staticmethod
    def now(device: int) -> "_RngState":
        return _RngState(torch.get_rng_state(), torch.cuda.get_rng_state(device))

    def restore(self, device: int):
        torch.set_rng_state(self.cpu)
        torch.cuda.set_rng_state(self.cuda, device)
