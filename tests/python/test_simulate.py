"""simulate() and the compiler's predictions, against the closed forms of
reference/pipeoffload.md section 1.2 for 1F1B."""
import pytest

import pipeoffload as po


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
def test_1f1b_makespan_and_peaks(p, m, unit):
    # Unit costs: F = 1 and the unsplit B = B + W = 2, P2P free, so the makespan is
    # (m + p - 1) * 3 and stage d holds p - d microbatches at its peak.
    predictions = po.compile(stages=p, microbatches=m, costs=unit).simulate()
    assert predictions.step_time == (m + p - 1) * 3
    assert predictions.bubble_ratio == pytest.approx(1 - (3 * m * p) / (p * (m + p - 1) * 3))
    assert [s.peak_units for s in predictions.stages] == [p - d for d in range(p)]
    assert [s.busy_time for s in predictions.stages] == [3.0 * m] * p
    assert predictions.collisions == 0 and predictions.warnings == []


def test_compiled_predictions_equal_a_fresh_simulation(unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    assert schedule.predictions == schedule.simulate()


def test_simulate_under_other_costs(unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    # F = 2, unsplit B = 1 + 1: the same closed form with F + B = 4 instead of 3.
    slower = schedule.simulate(po.Costs(unit_costs=True, overrides={"forward_time": 2}))
    assert slower.step_time == (8 + 4 - 1) * 4
    # Bytes follow the cost model: 4 entries of 1000 bytes on stage 0.
    sized = schedule.simulate(po.Costs(unit_costs=True, overrides={"activation_bytes": 1000}))
    assert sized.stages[0].peak_bytes == 4000


def test_offload_lowers_the_peak_and_warns_when_links_fall_short():
    # k = 1: one entry's transfer takes 3 units each way, more than po-h can hide on every stage.
    schedule = po.compile(family="group-interleaved", offload="po-h", stages=4,
                          microbatches=8, chunks=2, costs=po.Costs.unit(1.0))
    predictions = schedule.predictions
    stage0 = predictions.stages[0]
    assert stage0.peak_units < stage0.peak_units_without_offload
    assert stage0.offloaded_bytes > 0 and stage0.host_bytes > 0
    assert len(predictions.warnings) == 1
    assert predictions.warnings[0].startswith(
        "offload po-h: the host links carry less than requested: planned ")
    assert [link.name for link in predictions.links][:2] == ["host:0", "host:1"]
