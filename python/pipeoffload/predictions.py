"""What the simulator predicts for a schedule (simulate.h), as plain Python values copied out
of a po_predictions handle, which is freed at once."""
import ctypes
import dataclasses
from typing import List

from . import _native


@dataclasses.dataclass(frozen=True)
class StagePrediction:
    stage: int
    peak_units: int        # peak stash entries resident on the device
    peak_bytes: int        # the same peak in bytes
    peak_units_without_offload: int
    peak_bytes_without_offload: int
    host_bytes: int        # pinned host memory the stage needs (peak)
    offloaded_bytes: int   # bytes copied device-to-host per iteration
    busy_time: float       # compute time on this stage
    end_time: float        # completion of the stage's last op


@dataclasses.dataclass(frozen=True)
class LinkTraffic:
    name: str              # "host:0", "p2p:0->1"
    bytes_d2h: int         # host links: device-to-host; P2P links: bytes sent
    bytes_h2d: int


@dataclasses.dataclass(frozen=True)
class Predictions:
    step_time: float       # makespan of one iteration, in the cost model's time unit
    bubble_ratio: float    # 1 - busy compute / (p * step_time)
    step_time_without_offload: float
    collisions: int        # overlapping transfers in one direction of one link
    stages: List[StagePrediction]
    links: List[LinkTraffic]
    warnings: List[str]    # e.g. planned less offload than requested, with numbers


def _fields(struct, cls):
    return {field.name: getattr(struct, field.name) for field in dataclasses.fields(cls)}


def take(handle):
    """Predictions copied out of a po_predictions handle, which this frees."""
    lib, check = _native.lib, _native.check
    try:
        summary = _native.result_struct(_native.PredictionSummary)
        check(lib.po_predictions_summary(handle, ctypes.byref(summary)))
        stages = []
        for d in range(summary.num_stages):
            stage = _native.result_struct(_native.StagePrediction)
            check(lib.po_predictions_stage(handle, d, ctypes.byref(stage)))
            stages.append(StagePrediction(**_fields(stage, StagePrediction)))
        links = []
        for i in range(summary.num_links):
            link = _native.result_struct(_native.LinkTraffic)
            check(lib.po_predictions_link(handle, i, ctypes.byref(link)))
            links.append(LinkTraffic(link.name.decode(), link.bytes_d2h, link.bytes_h2d))
        warnings = []
        for i in range(summary.num_warnings):
            text = ctypes.c_char_p()
            check(lib.po_predictions_warning(handle, i, ctypes.byref(text)))
            warnings.append(text.value.decode())
        return Predictions(summary.step_time, summary.bubble_ratio,
                           summary.step_time_without_offload, summary.collisions, stages,
                           links, warnings)
    finally:
        lib.po_predictions_free(handle)
