"""The ctypes binding of libpipeoffload_c.so (include/pipeoffload/c_api.h): where the library
is found, the C structs, every function's signature, and `check`, which turns a failed
po_status into the package's exception. Nothing else in the package touches ctypes' loader.

The library is looked for, in order:
  1. $PIPEOFFLOAD_LIBRARY: the path of the .so (an error if it cannot be loaded);
  2. the installed location, when this package was installed by CMake (_install_paths.py);
  3. a build tree: $PIPEOFFLOAD_BUILD_DIR, then build/ beside python/ in the source tree;
  4. the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig)."""
import ctypes
import os
import pathlib

from . import errors

_LIBRARY_NAMES = ("libpipeoffload_c.so", "libpipeoffload_c.so.1")
# The PO_C_API_VERSION this binding was written for (c_api.h).
C_API_VERSION = 1


def _candidates():
    package_dir = pathlib.Path(__file__).resolve().parent
    try:
        from . import _install_paths  # written by CMake into installed copies only
        library_dir = pathlib.Path(_install_paths.LIBRARY_DIR)
        if not library_dir.is_absolute():
            library_dir = package_dir / library_dir
        yield from (library_dir / name for name in _LIBRARY_NAMES)
    except ImportError:
        pass
    build_dirs = []
    if os.environ.get("PIPEOFFLOAD_BUILD_DIR"):
        build_dirs.append(pathlib.Path(os.environ["PIPEOFFLOAD_BUILD_DIR"]))
    build_dirs.append(package_dir.parent.parent / "build")  # <source>/python/pipeoffload
    for build_dir in build_dirs:
        yield from (build_dir / name for name in _LIBRARY_NAMES)


def _load():
    explicit = os.environ.get("PIPEOFFLOAD_LIBRARY")
    if explicit:
        try:
            return ctypes.CDLL(explicit), explicit
        except OSError as e:
            raise ImportError(f"pipeoffload: cannot load PIPEOFFLOAD_LIBRARY={explicit}: {e}")
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.exists():
            return ctypes.CDLL(str(path)), str(path)
    for name in _LIBRARY_NAMES:
        tried.append(name)
        try:
            return ctypes.CDLL(name), name
        except OSError:
            pass
    raise ImportError("pipeoffload: cannot find libpipeoffload_c.so; tried " +
                      ", ".join(tried) +
                      ". Build it (ninja po_c_api) or set PIPEOFFLOAD_LIBRARY to its path.")


lib, library_path = _load()


# --- structs: field for field as c_api.h lays them out --------------------------------------

class Op(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("mb", ctypes.c_int32), ("chunk", ctypes.c_int32),
                ("peer", ctypes.c_int32)]


class Spec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_stages", ctypes.c_int32),
                ("num_microbatches", ctypes.c_int32), ("chunks_per_stage", ctypes.c_int32),
                ("group_size", ctypes.c_int32), ("split_backward", ctypes.c_int32),
                ("offload_chunks", ctypes.c_int32), ("strict", ctypes.c_int32),
                ("family", ctypes.c_char_p), ("offload", ctypes.c_char_p),
                ("offload_fraction", ctypes.c_double), ("memory_budget_bytes", ctypes.c_int64),
                ("recompute", ctypes.c_char_p), ("recompute_fraction", ctypes.c_double),
                ("recompute_chunks", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class CostOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("unit_costs", ctypes.c_int32),
                ("gpt_hidden", ctypes.c_int32), ("gpt_sequence", ctypes.c_int32),
                ("gpt_layers_per_chunk", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("offload_ratio", ctypes.c_double), ("gpt_tflops", ctypes.c_double),
                ("cost_model_json", ctypes.c_char_p)]


class LoadOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("format", ctypes.c_int32),
                ("num_stages", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("family", ctypes.c_char_p)]


class PredictionSummary(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_stages", ctypes.c_int32),
                ("num_links", ctypes.c_int32), ("num_warnings", ctypes.c_int32),
                ("collisions", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("step_time", ctypes.c_double), ("bubble_ratio", ctypes.c_double),
                ("step_time_without_offload", ctypes.c_double)]


class StagePrediction(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("stage", ctypes.c_int32),
                ("peak_units", ctypes.c_int64), ("peak_bytes", ctypes.c_int64),
                ("peak_units_without_offload", ctypes.c_int64),
                ("peak_bytes_without_offload", ctypes.c_int64),
                ("host_bytes", ctypes.c_int64), ("offloaded_bytes", ctypes.c_int64),
                ("busy_time", ctypes.c_double), ("end_time", ctypes.c_double)]


class LinkTraffic(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_int32),
                ("name", ctypes.c_char_p), ("bytes_d2h", ctypes.c_int64),
                ("bytes_h2d", ctypes.c_int64)]


# --- running a pipeline (c_api.h, "running a pipeline with C callbacks") ----------------------

class ComputeArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("kind", ctypes.c_int32),
                ("stage", ctypes.c_int32), ("mb", ctypes.c_int32), ("chunk", ctypes.c_int32),
                ("with_weight_grad", ctypes.c_int32), ("input", ctypes.c_void_p),
                ("output", ctypes.c_void_p), ("saved", ctypes.c_void_p),
                ("boundary_bytes", ctypes.c_int64), ("saved_bytes", ctypes.c_int64),
                ("stream", ctypes.c_uint64), ("recompute", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("retained", ctypes.c_void_p),
                ("retained_bytes", ctypes.c_int64)]


# po_compute_fn, saved_bytes and po_iteration_fn; the po_callback_error* stays a void*.
ComputeFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(ComputeArgs),
                             ctypes.c_void_p)
SavedBytesFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                ctypes.c_int32)
# retained_bytes(user, stage, chunk, mode, split_backward)
RetainedBytesFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32,
                                   ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
# backward_reads_retained(user, stage, chunk, mode, split_backward)
BackwardReadsRetainedFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                                           ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
IterationFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)


class StageCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_int32),
                ("user", ctypes.c_void_p), ("boundary_bytes", ctypes.c_int64),
                ("saved_bytes", SavedBytesFn), ("forward", ComputeFn),
                ("backward", ComputeFn), ("backward_weight", ComputeFn),
                ("retained_bytes", RetainedBytesFn), ("forward_retaining", ComputeFn),
                ("recompute", ComputeFn),
                ("backward_reads_retained", BackwardReadsRetainedFn)]


class PipelineOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("backend", ctypes.c_int32),
                ("spec", ctypes.POINTER(Spec)), ("schedule", ctypes.c_void_p),
                ("schedule_file", ctypes.c_char_p), ("nominal_chunk_time", ctypes.c_double),
                ("wait_timeout_seconds", ctypes.c_double),
                ("arena_budget_bytes", ctypes.c_int64), ("cuda_device", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class IterationStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("stage", ctypes.c_int32),
                ("stash_high_water_bytes", ctypes.c_int64),
                ("stash_physical_high_water_bytes", ctypes.c_int64),
                ("stash_high_water_entries", ctypes.c_int64),
                ("p2p_high_water_bytes", ctypes.c_int64),
                ("host_high_water_bytes", ctypes.c_int64),
                ("offloaded_bytes", ctypes.c_int64), ("reloaded_bytes", ctypes.c_int64),
                ("start_time", ctypes.c_double), ("end_time", ctypes.c_double),
                ("compute_seconds", ctypes.c_double), ("wait_seconds", ctypes.c_double),
                ("recompute_seconds", ctypes.c_double)]


def result_struct(cls):
    """A result struct with struct_size set, as the library requires before it fills one."""
    value = cls()
    value.struct_size = ctypes.sizeof(cls)
    return value


# --- functions -------------------------------------------------------------------------------

_status = ctypes.c_int32
_handle = ctypes.c_void_p
_P = ctypes.POINTER
_SIGNATURES = {
    "po_status_name": (ctypes.c_char_p, [_status]),
    "po_last_error_message": (ctypes.c_char_p, []),
    "po_version": (ctypes.c_char_p, []),
    "po_c_api_version": (ctypes.c_int32, []),
    "po_free": (None, [ctypes.c_void_p]),
    "po_op_kind_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "po_op_format": (_status, [_P(Op), ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "po_spec_init": (None, [_P(Spec)]),
    "po_cost_options_init": (None, [_P(CostOptions)]),
    "po_load_options_init": (None, [_P(LoadOptions)]),
    "po_schedule_compile": (_status, [_P(Spec), _P(CostOptions), _P(_handle)]),
    "po_schedule_parse": (_status, [ctypes.c_char_p, ctypes.c_size_t, _P(LoadOptions),
                                    _P(CostOptions), _P(_handle)]),
    "po_schedule_load": (_status, [ctypes.c_char_p, _P(LoadOptions), _P(CostOptions),
                                   _P(_handle)]),
    "po_schedule_free": (None, [_handle]),
    "po_schedule_spec": (_status, [_handle, _P(Spec)]),
    "po_schedule_num_stages": (_status, [_handle, _P(ctypes.c_int32)]),
    "po_schedule_num_ops": (_status, [_handle, ctypes.c_int32, _P(ctypes.c_size_t)]),
    "po_schedule_ops": (_status, [_handle, ctypes.c_int32, ctypes.c_size_t, ctypes.c_size_t,
                                  _P(Op)]),
    # char** as void**: the text must reach po_free as the library's pointer, not a copy.
    "po_schedule_format": (_status, [_handle, ctypes.c_int32, _P(ctypes.c_void_p),
                                     _P(ctypes.c_size_t)]),
    "po_schedule_write": (_status, [_handle, ctypes.c_int32, ctypes.c_char_p]),
    "po_schedule_simulate": (_status, [_handle, _P(CostOptions), _P(_handle)]),
    "po_schedule_predictions": (_status, [_handle, _P(_handle)]),
    "po_predictions_free": (None, [_handle]),
    "po_predictions_summary": (_status, [_handle, _P(PredictionSummary)]),
    "po_predictions_stage": (_status, [_handle, ctypes.c_int32, _P(StagePrediction)]),
    "po_predictions_link": (_status, [_handle, ctypes.c_int32, _P(LinkTraffic)]),
    "po_predictions_warning": (_status, [_handle, ctypes.c_int32, _P(ctypes.c_char_p)]),
    "po_callback_error_set": (None, [ctypes.c_void_p, ctypes.c_char_p]),
    "po_stage_callbacks_init": (None, [_P(StageCallbacks)]),
    "po_pipeline_options_init": (None, [_P(PipelineOptions)]),
    "po_pipeline_open": (_status, [_P(StageCallbacks), ctypes.c_int32, _P(PipelineOptions),
                                   _P(_handle)]),
    "po_pipeline_run": (_status, [_handle, ctypes.c_int32, IterationFn, ctypes.c_void_p]),
    "po_pipeline_num_stages": (_status, [_handle, _P(ctypes.c_int32)]),
    "po_pipeline_stats": (_status, [_handle, ctypes.c_int32, ctypes.c_int32,
                                    _P(IterationStats)]),
    "po_pipeline_schedule": (_status, [_handle, _P(_handle)]),
    "po_pipeline_free": (None, [_handle]),
    "po_stage_open": (_status, [_P(StageCallbacks), _P(PipelineOptions), ctypes.c_int32,
                                _P(_handle)]),
    "po_stage_run": (_status, [_handle, ctypes.c_int32, IterationFn, ctypes.c_void_p]),
    "po_stage_rank": (_status, [_handle, _P(ctypes.c_int32), _P(ctypes.c_int32)]),
    "po_stage_stats": (_status, [_handle, ctypes.c_int32, _P(IterationStats)]),
    "po_stage_schedule": (_status, [_handle, _P(_handle)]),
    "po_stage_free": (None, [_handle]),
}
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _function = getattr(lib, _name)
    _function.restype = _restype
    _function.argtypes = _argtypes

if lib.po_c_api_version() != C_API_VERSION:
    raise ImportError(f"pipeoffload: {library_path} speaks C API version "
                      f"{lib.po_c_api_version()}, this package version {C_API_VERSION}")


class OwnedHandle:
    """A library handle this object owns, freed by close(), by `with`, or when collected.
    Subclasses name their po_*_free function (`_free`) and what they are (`_what`)."""
    _free = None
    _what = "handle"

    def __init__(self, handle):
        self._handle = handle

    def close(self):
        """Frees the handle now; the object may not be used afterwards."""
        if self._handle:
            getattr(lib, self._free)(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _live(self):
        if not self._handle:
            raise errors.FailedPreconditionError(errors.FAILED_PRECONDITION,
                                                 "FAILED_PRECONDITION",
                                                 f"the {self._what} was closed")
        return self._handle


def check(status):
    """Raises the package's exception for a failed po_status, with the library's message
    (thread-local in the library, so read at once on the calling thread)."""
    if status != errors.OK:
        raise errors.error_for(status, lib.po_status_name(status).decode(),
                               lib.po_last_error_message().decode())


def encode(text):
    """A Python str as the char* the library takes (None stays NULL)."""
    return None if text is None else text.encode()
