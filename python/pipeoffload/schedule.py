"""Schedules over the C ABI: compile a spec, load or parse a file, read each stage's ops,
export every format, simulate. A Schedule owns its po_schedule handle (freed by close(), by
`with`, or when it is collected); it is immutable, like the handle."""
import ctypes
import dataclasses
import json
import os
from typing import Any, Dict, List, Optional

from . import _native, errors, predictions

# Format names as po-schedule's --format spells them, to the C ABI's PO_FORMAT_* numbers.
FORMATS = {"json": 0, "text": 1, "pytorch-csv": 2, "pytorch-csv-comms": 3, "trace": 4,
           "svg": 5}


def _format_code(name):
    if name not in FORMATS:
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT, "INVALID_ARGUMENT",
            f"unknown format {name!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[name]


@dataclasses.dataclass(frozen=True)
class Op:
    """One instruction of a stage's program. `kind` is the IR's name ("F", "SEND_F", ...);
    `peer` is the other stage of P2P ops and BARRIER, else -1."""
    kind: str
    mb: int
    chunk: int
    peer: int

    def __str__(self):
        """The short form the text format prints: "F3.1", "SEND_F0.0->1", "RECV_B2.0<-3"."""
        kind = _KIND_CODES[self.kind]
        buffer = ctypes.create_string_buffer(64)
        length = ctypes.c_size_t()
        _native.check(_native.lib.po_op_format(
            ctypes.byref(_native.Op(kind, self.mb, self.chunk, self.peer)), buffer,
            len(buffer), ctypes.byref(length)))
        return buffer.value.decode()


def _op_kind_names():
    names, code = [], 0
    while (name := _native.lib.po_op_kind_name(code)) is not None:
        names.append(name.decode())
        code += 1
    return names


_KIND_NAMES = _op_kind_names()
_KIND_CODES = {name: code for code, name in enumerate(_KIND_NAMES)}


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a schedule was compiled from (PipelineSpec, schedule.h), group_size resolved."""
    family: str
    offload: str
    num_stages: int
    num_microbatches: int
    chunks_per_stage: int
    group_size: int
    split_backward: bool
    offload_fraction: float
    offload_chunks: int
    memory_budget_bytes: int
    strict: bool
    recompute: str             # "none", "lean" or "full"
    recompute_fraction: float  # share of each stage's entries recomputed, longest-lived first
    recompute_chunks: int      # every entry of chunks [0, n) instead; 0 = use the fraction


@dataclasses.dataclass
class Costs:
    """How to build the cost model, as po-schedule does: a GPT-layer estimate (default) or unit
    costs, then `overrides`, a dict of CostModel fields (cost_model.h), e.g.
    {"activation_bytes": 1 << 20}. None leaves the library's default."""
    unit_costs: Optional[bool] = None
    offload_ratio: Optional[float] = None  # unit costs: one entry's transfer over its F+B+W
    gpt_hidden: Optional[int] = None
    gpt_sequence: Optional[int] = None
    gpt_layers_per_chunk: Optional[int] = None
    gpt_tflops: Optional[float] = None
    overrides: Optional[Dict[str, Any]] = None

    @classmethod
    def unit(cls, offload_ratio=0.25):
        """F = B = W = 1, free P2P, one entry's transfer = 3 * offload_ratio units."""
        return cls(unit_costs=True, offload_ratio=offload_ratio)

    def _struct(self):
        options = _native.CostOptions()
        _native.lib.po_cost_options_init(ctypes.byref(options))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and field.name != "overrides":
                setattr(options, field.name, value)
        if self.overrides is not None:
            # Kept on the struct's owner for the call: ctypes holds the bytes while `options`
            # lives, and the library copies them during the call (c_api.h).
            options.cost_model_json = json.dumps(self.overrides).encode()
        return options


def _cost_pointer(costs):
    return None if costs is None else ctypes.byref(costs._struct())


# compile()'s keywords (po-schedule's option names) to po_spec fields.
_SPEC_FIELDS = {
    "stages": "num_stages", "microbatches": "num_microbatches", "chunks": "chunks_per_stage",
    "group_size": "group_size", "split_backward": "split_backward",
    "offload_chunks": "offload_chunks", "strict": "strict", "family": "family",
    "offload": "offload", "offload_fraction": "offload_fraction",
    "memory_budget_bytes": "memory_budget_bytes", "recompute": "recompute",
    "recompute_fraction": "recompute_fraction", "recompute_chunks": "recompute_chunks",
}


class Schedule(_native.OwnedHandle):
    """A validated schedule and the cost model it was compiled or loaded with (a po_schedule*,
    owned: close() frees it)."""
    _free = "po_schedule_free"
    _what = "schedule"

    @property
    def num_stages(self) -> int:
        count = ctypes.c_int32()
        _native.check(_native.lib.po_schedule_num_stages(self._live(), ctypes.byref(count)))
        return count.value

    @property
    def spec(self) -> Spec:
        raw = _native.result_struct(_native.Spec)
        _native.check(_native.lib.po_schedule_spec(self._live(), ctypes.byref(raw)))
        values = {field.name: getattr(raw, field.name) for field in dataclasses.fields(Spec)}
        values["family"] = values["family"].decode()
        values["offload"] = values["offload"].decode()
        values["recompute"] = values["recompute"].decode()
        values["split_backward"] = bool(values["split_backward"])
        values["strict"] = bool(values["strict"])
        return Spec(**values)

    def ops(self, stage: int) -> List[Op]:
        """Stage `stage`'s program, in issue order. OutOfRangeError for a stage outside
        [0, num_stages)."""
        count = ctypes.c_size_t()
        _native.check(_native.lib.po_schedule_num_ops(self._live(), stage,
                                                      ctypes.byref(count)))
        raw = (_native.Op * count.value)()
        _native.check(_native.lib.po_schedule_ops(self._handle, stage, 0, count.value, raw))
        return [Op(_KIND_NAMES[op.kind], op.mb, op.chunk, op.peer) for op in raw]

    def to_string(self, format: str = "json") -> str:
        """The schedule in `format` (FORMATS: po-schedule's --format names)."""
        text = ctypes.c_void_p()
        size = ctypes.c_size_t()
        _native.check(_native.lib.po_schedule_format(self._live(), _format_code(format),
                                                     ctypes.byref(text), ctypes.byref(size)))
        try:
            return ctypes.string_at(text, size.value).decode()
        finally:
            _native.lib.po_free(text)

    def write(self, path, format: str = "json"):
        """Writes the schedule in `format` to the file at `path` (created or truncated)."""
        _native.check(_native.lib.po_schedule_write(self._live(), _format_code(format),
                                                    os.fsencode(path)))

    def simulate(self, costs: Optional[Costs] = None) -> predictions.Predictions:
        """Simulates the schedule under `costs`, or under the model it was compiled or loaded
        with when None (for an auto plan, that model re-cut to the plan's chunks)."""
        handle = ctypes.c_void_p()
        _native.check(_native.lib.po_schedule_simulate(self._live(), _cost_pointer(costs),
                                                       ctypes.byref(handle)))
        return predictions.take(handle)

    @property
    def predictions(self) -> Optional[predictions.Predictions]:
        """The compiler's predictions (with the planner's warnings), the file's for a loaded
        schedule, or None when the file had none."""
        handle = ctypes.c_void_p()
        status = _native.lib.po_schedule_predictions(self._live(), ctypes.byref(handle))
        if status == errors.FAILED_PRECONDITION:  # the only way this call fails on a live handle
            return None
        _native.check(status)
        return predictions.take(handle)


def compile(*, costs: Optional[Costs] = None, **spec) -> Schedule:  # noqa: A001 (the verb)
    """Compiles a schedule, as `po-schedule compile` does. Keywords: stages, microbatches,
    chunks, group_size, split_backward, family ("1f1b", "interleaved", "group-interleaved"),
    offload ("none", "po-h", "po-f", "selective", "auto"), offload_fraction, offload_chunks,
    memory_budget_bytes, strict, recompute ("none", "lean", "full": RECOMPUTE_LEAN /
    RECOMPUTE ops before B instead of keeping the entries; with offload "auto", the most the
    planner may use per entry), recompute_fraction, recompute_chunks; the ones left out keep
    po-schedule's defaults. `costs`: the cost model (None: the GPT estimate). Raises
    InvalidArgumentError for a bad spec, ResourceExhaustedError when auto finds no plan within
    the budget."""
    raw = spec_struct("compile()", spec)
    handle = ctypes.c_void_p()
    _native.check(_native.lib.po_schedule_compile(ctypes.byref(raw), _cost_pointer(costs),
                                                  ctypes.byref(handle)))
    return Schedule(handle)


def spec_struct(caller, spec):
    """The po_spec of compile()'s keywords `spec` (the rest keep po-schedule's defaults);
    TypeError naming `caller` for a keyword it does not know."""
    raw = _native.Spec()
    _native.lib.po_spec_init(ctypes.byref(raw))
    for key, value in spec.items():
        if key not in _SPEC_FIELDS:
            raise TypeError(f"{caller} got an unexpected keyword {key!r}; expected one of "
                            f"{', '.join(_SPEC_FIELDS)}")
        setattr(raw, _SPEC_FIELDS[key], _native.encode(value) if isinstance(value, str)
                else value)
    return raw


def _load_options(format, stages, family):
    options = _native.LoadOptions()
    _native.lib.po_load_options_init(ctypes.byref(options))
    options.format = _format_code(format)
    if stages is not None:
        options.num_stages = stages
    options.family = _native.encode(family)
    return options


def parse(text, format: str = "json", *, stages: Optional[int] = None,
          family: Optional[str] = None, costs: Optional[Costs] = None) -> Schedule:
    """Reads a schedule from `text` (str or bytes), as `po-schedule validate` / `import` do:
    a PyTorch CSV needs `stages` (its ranks) and may name the `family`; a CSV without comm
    actions gets them inserted; the result must pass validation (FailedPreconditionError
    naming the invariant otherwise). `costs` is the model simulate() uses by default."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    options = _load_options(format, stages, family)
    handle = ctypes.c_void_p()
    _native.check(_native.lib.po_schedule_parse(data, len(data), ctypes.byref(options),
                                                _cost_pointer(costs), ctypes.byref(handle)))
    return Schedule(handle)


def load(path, format: str = "json", *, stages: Optional[int] = None,
         family: Optional[str] = None, costs: Optional[Costs] = None) -> Schedule:
    """parse() of the file at `path`; NotFoundError when there is none."""
    options = _load_options(format, stages, family)
    handle = ctypes.c_void_p()
    _native.check(_native.lib.po_schedule_load(os.fsencode(path), ctypes.byref(options),
                                               _cost_pointer(costs), ctypes.byref(handle)))
    return Schedule(handle)
