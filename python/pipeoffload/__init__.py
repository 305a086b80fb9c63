"""pipeoffload: compile, inspect, export and simulate pipeline schedules with activation
offload, and run a pipeline with Python callbacks, every stage in this process (LocalPipeline)
or one stage per MPI rank (RankStage), over the library's C ABI (libpipeoffload_c.so, include/pipeoffload/c_api.h).

    import pipeoffload as po
    schedule = po.compile(stages=4, microbatches=8, costs=po.Costs.unit())
    print([str(op) for op in schedule.ops(0)][:4])   # ['F0.0', 'SEND_F0.0->1', ...]
    print(schedule.simulate().step_time)             # 33.0
    schedule.write("s.json")
"""
from . import _native
from .errors import (Error, FailedPreconditionError, InternalError, InvalidArgumentError,
                     NotFoundError, OutOfRangeError, PermissionDeniedError,
                     ResourceExhaustedError)
from .pipeline import (BACKENDS, TRANSPORTS, Call, IterationStats, LocalPipeline, RankStage,
                       run_local_pipeline)
from .predictions import LinkTraffic, Predictions, StagePrediction
from .schedule import FORMATS, Costs, Op, Schedule, Spec, compile, load, parse

__version__ = _native.lib.po_version().decode()
library_path = _native.library_path  # the libpipeoffload_c.so in use

__all__ = [
    "BACKENDS", "Call", "Costs", "Error", "FailedPreconditionError", "FORMATS", "InternalError",
    "InvalidArgumentError", "IterationStats", "LinkTraffic", "LocalPipeline", "NotFoundError",
    "Op", "OutOfRangeError", "PermissionDeniedError", "Predictions", "RankStage",
    "ResourceExhaustedError",
    "Schedule", "Spec", "StagePrediction", "compile", "library_path", "load", "parse",
    "run_local_pipeline", "TRANSPORTS",
]
