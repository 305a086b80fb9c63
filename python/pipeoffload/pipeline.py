"""Run a pipeline with Python callbacks: every stage in this process (LocalPipeline, po_pipeline
of c_api.h), or one stage per MPI rank (RankStage, po_stage):
the runtime walks each stage's compiled program, calls the stage model's forward / backward /
backward_weight for its compute ops, and moves stash entries to host memory and back as the
schedule's offload ops say.

    class Stage:
        boundary_bytes = 4 * n                        # the activation between virtual stages
        def saved_bytes(self, chunk, split_backward): return 4 * n
        def forward(self, call): ...                  # call.saved_array(), call.input_array()
        def backward(self, call): ...
    with po.LocalPipeline([Stage(), Stage()], stages=2, microbatches=4, offload="po-f") as p:
        stats = p.run(iterations=3, on_iteration=optimizer_step)

Threads: stage d's callbacks run on a thread of the library's (they take the GIL), one call at a
time per stage, stages at once; on_iteration runs on the thread that called run(). An exception
in a callback fails the run: run() raises the library's error (its message names the stage, op
and the exception) chained to the exception itself."""
import ctypes
import dataclasses
import os
import threading
from typing import Callable, List, Optional

from . import _native, errors
from .schedule import Schedule, spec_struct

BACKENDS = {"cpu": 0, "cuda": 1}  # PO_BACKEND_*
# PO_OP_FORWARD, _BACKWARD, _BACKWARD_WEIGHT, _RECOMPUTE, _RECOMPUTE_LEAN
_KINDS = {0: "F", 1: "B", 2: "W", 11: "RECOMPUTE", 12: "RECOMPUTE_LEAN"}
RECOMPUTE_MODES = {"none": 0, "lean": 1, "full": 2}  # PO_RECOMPUTE_*
_MODE_NAMES = {code: name for name, code in RECOMPUTE_MODES.items()}


class Call:
    """One compute call of a stage (po_compute_args). Buffers are addresses (int) or None, valid
    only during the call: host memory on the CPU backend, device memory on CUDA.

    Attributes: kind ("F", "B", "W", or "RECOMPUTE" / "RECOMPUTE_LEAN" in recompute()), stage,
    mb, chunk, with_weight_grad (B: full backward), input (F: the input activation, None on
    virtual stage 0; B: the output's gradient, None on the last virtual stage), output (F: the
    output, None on the last virtual stage; B: the input's gradient, None on virtual stage 0),
    saved (the stash entry; None in forward_retaining), boundary_bytes, saved_bytes, stream (0
    on the CPU backend, the cudaStream_t on CUDA); recompute ("none", or in forward_retaining
    and recompute the entry's mode, "lean" or "full"), retained (forward_retaining: where F
    writes the retained block; recompute: that block, to rebuild `saved` from; else None),
    retained_bytes. B (and W) of an entry the model reads in place (backward_reads_retained)
    get recompute = its mode and retained = saved = the retained block."""

    __slots__ = ("kind", "stage", "mb", "chunk", "with_weight_grad", "input", "output", "saved",
                 "boundary_bytes", "saved_bytes", "stream", "recompute", "retained",
                 "retained_bytes")

    def __init__(self, args):
        self.kind = _KINDS[args.kind]
        self.stage, self.mb, self.chunk = args.stage, args.mb, args.chunk
        self.with_weight_grad = bool(args.with_weight_grad)
        self.input, self.output, self.saved = args.input, args.output, args.saved
        self.boundary_bytes, self.saved_bytes = args.boundary_bytes, args.saved_bytes
        self.stream = args.stream
        self.recompute = _MODE_NAMES.get(args.recompute, "none")
        self.retained, self.retained_bytes = args.retained, args.retained_bytes

    @staticmethod
    def _array(address, size, ctype):
        if address is None:
            return None
        return (ctype * (size // ctypes.sizeof(ctype))).from_address(address)

    def input_array(self, ctype=ctypes.c_float):
        """`input` as a ctypes array of boundary_bytes / sizeof(ctype) elements (host memory
        only), or None."""
        return self._array(self.input, self.boundary_bytes, ctype)

    def output_array(self, ctype=ctypes.c_float):
        """`output` as a ctypes array (host memory only), or None."""
        return self._array(self.output, self.boundary_bytes, ctype)

    def saved_array(self, ctype=ctypes.c_float):
        """`saved` as a ctypes array of saved_bytes / sizeof(ctype) elements (host memory
        only)."""
        return self._array(self.saved, self.saved_bytes, ctype)

    def retained_array(self, ctype=ctypes.c_float):
        """`retained` as a ctypes array of retained_bytes / sizeof(ctype) elements (host
        memory only), or None."""
        return self._array(self.retained, self.retained_bytes, ctype)


@dataclasses.dataclass(frozen=True)
class IterationStats:
    """One stage's measured iteration (po_iteration_stats). stash_high_water_bytes is what the
    compiler predicts exactly (schedule.predictions.stages[d].peak_bytes)."""
    stage: int
    stash_high_water_bytes: int
    stash_physical_high_water_bytes: int
    stash_high_water_entries: int
    p2p_high_water_bytes: int
    host_high_water_bytes: int
    offloaded_bytes: int   # device-to-host bytes this iteration
    reloaded_bytes: int    # host-to-device bytes this iteration
    start_time: float      # seconds on the backend's clock
    end_time: float
    compute_seconds: float  # inside the callbacks
    wait_seconds: float     # blocked on receives, copies, reloads and barriers
    recompute_seconds: float  # of compute_seconds: the recompute() calls


def _error_text(exception):
    return f"{type(exception).__name__}: {exception}"


class _CallbackRunner(_native.OwnedHandle):
    """What LocalPipeline and RankStage share: Python models as C callback tables, the options
    struct, the first exception a callback raised (chained to the run's error), and the
    on_iteration hook."""

    def __init__(self):
        super().__init__(None)
        self._lock = threading.Lock()
        self._exception = None  # the first exception a callback raised
        self._keep = []  # every ctypes callback object: the library calls them until close()

    @staticmethod
    def _options(what, schedule, schedule_file, backend, cuda_device, nominal_chunk_time,
                 wait_timeout_seconds, arena_budget_bytes, spec):
        """A po_pipeline_options, and the spec struct it points to (keep it alive)."""
        if backend not in BACKENDS:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        options = _native.PipelineOptions()
        _native.lib.po_pipeline_options_init(ctypes.byref(options))
        options.backend = BACKENDS[backend]
        options.cuda_device = cuda_device
        options.nominal_chunk_time = nominal_chunk_time
        options.wait_timeout_seconds = wait_timeout_seconds
        options.arena_budget_bytes = arena_budget_bytes
        raw_spec = None
        if spec:
            raw_spec = spec_struct(what, spec)
            options.spec = ctypes.pointer(raw_spec)
        if schedule is not None:
            options.schedule = schedule._live()
        if schedule_file is not None:
            options.schedule_file = os.fsencode(schedule_file)
        return options, raw_spec

    def _remember(self, exception):
        with self._lock:
            if self._exception is None:
                self._exception = exception

    def _compute(self, method):
        """A po_compute_fn over model.method(Call); an exception becomes UNKNOWN and its text."""
        def call(user, args, error):
            try:
                method(Call(args.contents))
                return errors.OK
            except BaseException as exception:  # noqa: B036 (nothing may unwind into C)
                self._remember(exception)
                _native.lib.po_callback_error_set(error, _error_text(exception).encode())
                return errors.UNKNOWN
        return _native.ComputeFn(call)

    def _saved_bytes(self, model):
        def saved_bytes(user, stage, chunk, split_backward):
            try:
                return int(model.saved_bytes(chunk, bool(split_backward)))
            except BaseException as exception:  # noqa: B036
                self._remember(exception)
                return -1  # the library then fails open naming the stage and chunk
        return _native.SavedBytesFn(saved_bytes)

    def _retained_bytes(self, model):
        def retained_bytes(user, stage, chunk, mode, split_backward):
            try:
                answer = model.retained_bytes(chunk, _MODE_NAMES[mode], bool(split_backward))
                return -1 if answer is None else int(answer)
            except BaseException as exception:  # noqa: B036
                self._remember(exception)
                return -1  # not offered: open then names the stage, chunk and mode
        return _native.RetainedBytesFn(retained_bytes)

    def _backward_reads_retained(self, model):
        def backward_reads_retained(user, stage, chunk, mode, split_backward):
            try:
                return int(bool(model.backward_reads_retained(chunk, _MODE_NAMES[mode],
                                                              bool(split_backward))))
            except BaseException as exception:  # noqa: B036
                self._remember(exception)
                return 0  # rebuilt as usual; the exception is raised once open returns
        return _native.BackwardReadsRetainedFn(backward_reads_retained)

    def _fill(self, table, model):
        _native.lib.po_stage_callbacks_init(ctypes.byref(table))
        table.boundary_bytes = int(getattr(model, "boundary_bytes", 0))
        if hasattr(model, "saved_bytes"):
            table.saved_bytes = self._saved_bytes(model)
            self._keep.append(table.saved_bytes)
        if hasattr(model, "retained_bytes"):
            table.retained_bytes = self._retained_bytes(model)
            self._keep.append(table.retained_bytes)
        if hasattr(model, "backward_reads_retained"):
            table.backward_reads_retained = self._backward_reads_retained(model)
            self._keep.append(table.backward_reads_retained)
        for field in ("forward", "backward", "backward_weight", "forward_retaining",
                      "recompute"):
            method = getattr(model, field, None)
            if method is not None:  # a missing one stays NULL, which open names
                function = self._compute(method)
                setattr(table, field, function)
                self._keep.append(function)

    def _iteration_hook(self, on_iteration):
        """on_iteration(i) as a po_iteration_fn (NULL for None)."""
        if on_iteration is None:
            return _native.IterationFn()
        def call_on_iteration(user, iteration, error):
            try:
                on_iteration(iteration)
                return errors.OK
            except BaseException as exception:  # noqa: B036
                self._remember(exception)
                _native.lib.po_callback_error_set(error, _error_text(exception).encode())
                return errors.UNKNOWN
        return _native.IterationFn(call_on_iteration)  # the caller holds it through the run

    def _call(self, status):
        """check(status), the error chained to (and naming) the first callback exception."""
        if status == errors.OK:
            return
        code_name = _native.lib.po_status_name(status).decode()
        message = _native.lib.po_last_error_message().decode()
        with self._lock:
            exception, self._exception = self._exception, None
        if exception is not None and _error_text(exception) not in message:
            message += f" (a callback raised {_error_text(exception)})"
        raise errors.error_for(status, code_name, message) from exception

    @staticmethod
    def _to_stats(raw):
        return IterationStats(**{field.name: getattr(raw, field.name)
                                 for field in dataclasses.fields(IterationStats)})


class LocalPipeline(_CallbackRunner):
    """Every stage of a pipeline in this process, stage d driven by models[d].

    A model has `boundary_bytes` (int), `saved_bytes(chunk, split_backward)` (int > 0, the same
    for every microbatch), `forward(call)` and `backward(call)`, and `backward_weight(call)`
    when the schedule splits W (see Call). A model that offers recompute (the spec's
    recompute="lean" / "full", or offload="auto" with recompute allowed) also has all three of
    `retained_bytes(chunk, mode, split_backward)` (int > 0 that F keeps of an entry recomputed
    with mode "lean" or "full", or None / -1: not offered), `forward_retaining(call)` (F of
    such an entry: the same output, writes only call.retained) and `recompute(call)` (rebuilds
    call.saved exactly as forward would have written it, from call.retained, before B). It may
    also have `backward_reads_retained(chunk, mode, split_backward)` (true: B reads that mode's
    retained block itself, so no recompute() comes for it, B gets call.recompute = the mode and
    call.saved = call.retained = the block, and the planner counts the entry at its retained
    size until B). Give the schedule as compile()'s keywords (stages,
    microbatches, chunks, family, offload, ...; compiled under nominal costs and the models'
    exact sizes), or as `schedule` (a Schedule) or `schedule_file` (JSON). `backend`: "cpu" or
    "cuda" (a library built with CUDA; device `cuda_device`). `wait_timeout_seconds` bounds every
    wait; `arena_budget_bytes` 0 sizes each stage's arena from the plan.

    Raises InvalidArgumentError for a model without forward / backward / saved_bytes, a size
    <= 0, a missing backward_weight under a split schedule (the message names the stage);
    FailedPreconditionError for a schedule of another stage count; the compiler's errors.
    close() (or `with`) drains and frees every stage."""
    _free = "po_pipeline_free"
    _what = "pipeline"

    def __init__(self, models, *, schedule: Optional[Schedule] = None,
                 schedule_file=None, backend: str = "cpu", cuda_device: int = 0,
                 nominal_chunk_time: float = 1.0, wait_timeout_seconds: float = 60.0,
                 arena_budget_bytes: int = 0, **spec):
        super().__init__()
        self._models = list(models)
        options, _spec = self._options("LocalPipeline()", schedule, schedule_file, backend,
                                       cuda_device, nominal_chunk_time, wait_timeout_seconds,
                                       arena_budget_bytes, spec)
        tables = (_native.StageCallbacks * max(len(self._models), 1))()
        for d, model in enumerate(self._models):
            self._fill(tables[d], model)
        self._tables = tables
        handle = ctypes.c_void_p()
        self._call(_native.lib.po_pipeline_open(tables, len(self._models),
                                                ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

    @property
    def num_stages(self) -> int:
        return len(self._models)

    @property
    def schedule(self) -> Schedule:
        """The schedule the stages run, with the predictions they were planned with."""
        handle = ctypes.c_void_p()
        _native.check(_native.lib.po_pipeline_schedule(self._live(), ctypes.byref(handle)))
        return Schedule(handle)

    def run(self, iterations: int = 1,
            on_iteration: Optional[Callable[[int], None]] = None) -> List[List[IterationStats]]:
        """Runs `iterations` iterations; after iteration i has finished on every stage, calls
        on_iteration(i) (e.g. an optimizer step). Returns stats[i][d] of every iteration and
        stage. After a failed run the pipeline may only be closed (FailedPreconditionError
        otherwise): open a new one."""
        handle = self._live()
        hook = self._iteration_hook(on_iteration)
        self._call(_native.lib.po_pipeline_run(handle, iterations, hook, None))
        return [[self._stats(i, d) for d in range(self.num_stages)] for i in range(iterations)]

    def _stats(self, iteration, stage):
        raw = _native.result_struct(_native.IterationStats)
        _native.check(_native.lib.po_pipeline_stats(self._handle, iteration, stage,
                                                    ctypes.byref(raw)))
        return self._to_stats(raw)


TRANSPORTS = {"mpi": 0, "nccl": 1}  # PO_TRANSPORT_*


class RankStage(_CallbackRunner):
    """This process's stage of a pipeline whose stages are the ranks of an MPI job (po_stage,
    c_api.h): launch the script with `mpirun -np P python3 train.py`, and rank r runs stage r
    with `model` (the same protocol as LocalPipeline's models).

    `transport`: "mpi" (the CPU backend; host buffers) or "nccl" (backend "cuda"; cuda_device
    -1 takes the rank's local index on its node). The library starts MPI unless the process
    already did (e.g. mpi4py), and then finalizes it at close(): one RankStage per process in
    that case. Opening, run() and their failures are collective: every rank must call them,
    and all raise the same error, naming each failed rank with its reason."""
    _free = "po_stage_free"
    _what = "stage"

    def __init__(self, model, *, transport: str = "mpi", schedule: Optional[Schedule] = None,
                 schedule_file=None, backend: str = "cpu", cuda_device: int = 0,
                 nominal_chunk_time: float = 1.0, wait_timeout_seconds: float = 60.0,
                 arena_budget_bytes: int = 0, **spec):
        super().__init__()
        if transport not in TRANSPORTS:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}")
        self._model = model
        options, _spec = self._options("RankStage()", schedule, schedule_file, backend,
                                       cuda_device, nominal_chunk_time, wait_timeout_seconds,
                                       arena_budget_bytes, spec)
        self._table = _native.StageCallbacks()
        self._fill(self._table, model)
        handle = ctypes.c_void_p()
        self._call(_native.lib.po_stage_open(ctypes.byref(self._table), ctypes.byref(options),
                                             TRANSPORTS[transport], ctypes.byref(handle)))
        self._handle = handle
        rank, size = ctypes.c_int32(), ctypes.c_int32()
        _native.check(_native.lib.po_stage_rank(handle, ctypes.byref(rank), ctypes.byref(size)))
        self.rank, self.num_stages = rank.value, size.value

    @property
    def schedule(self) -> Schedule:
        """The schedule every rank runs, with the predictions it was planned with."""
        handle = ctypes.c_void_p()
        _native.check(_native.lib.po_stage_schedule(self._live(), ctypes.byref(handle)))
        return Schedule(handle)

    def run(self, iterations: int = 1,
            on_iteration: Optional[Callable[[int], None]] = None) -> List[IterationStats]:
        """Collective: runs `iterations` iterations of this rank's stage, calling
        on_iteration(i) after iteration i has finished on every rank. Returns this stage's
        stats of each iteration."""
        handle = self._live()
        hook = self._iteration_hook(on_iteration)
        self._call(_native.lib.po_stage_run(handle, iterations, hook, None))
        stats = []
        for i in range(iterations):
            raw = _native.result_struct(_native.IterationStats)
            _native.check(_native.lib.po_stage_stats(handle, i, ctypes.byref(raw)))
            stats.append(self._to_stats(raw))
        return stats


def run_local_pipeline(models, iterations: int = 1, *,
                       on_iteration: Optional[Callable[[int], None]] = None,
                       **options) -> List[List[IterationStats]]:
    """Opens a LocalPipeline(models, **options), runs it and closes it; returns its stats."""
    with LocalPipeline(models, **options) as pipeline:
        return pipeline.run(iterations, on_iteration)
