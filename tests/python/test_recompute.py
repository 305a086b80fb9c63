"""Recompute through the Python package (issue 15): the spec fields of compile() and
Schedule.spec, RECOMPUTE / RECOMPUTE_LEAN ops in inspection, export and pipeoffload.torch's
KINDS, and a LocalPipeline whose models offer recompute, bitwise equal to no recompute with
stash peaks equal to the predictions. No torch needed."""
import json

import pytest

import pipeoffload as po
from pipeoffload.torch import PipelinePlan, PlanError
from pipeoffload.torch import plan as torch_plan
from test_stage import WIDTH, RecomputingToy, Toy, reference, toys


def kinds(schedule):
    return [op.kind for d in range(schedule.num_stages) for op in schedule.ops(d)]


def test_spec_defaults_to_no_recompute(unit):
    spec = po.compile(stages=4, microbatches=8, costs=unit).spec
    assert (spec.recompute, spec.recompute_fraction, spec.recompute_chunks) == ("none", 1.0, 0)


@pytest.mark.parametrize("mode,kind", [("full", "RECOMPUTE"), ("lean", "RECOMPUTE_LEAN")])
def test_recompute_spec_fields_come_back_and_make_the_ops(unit, mode, kind):
    schedule = po.compile(stages=4, microbatches=8, recompute=mode, recompute_fraction=0.5,
                          costs=unit)
    spec = schedule.spec
    assert (spec.recompute, spec.recompute_fraction, spec.recompute_chunks) == (mode, 0.5, 0)
    found = kinds(schedule)
    assert found.count(kind) == 4 * 8 // 2 and len(set(found) & set(torch_plan.RECOMPUTE_KINDS)) == 1
    first = next(op for op in schedule.ops(0) if op.kind == kind)
    assert str(first) == f"{kind}{first.mb}.0" and first.peer == -1
    # Right before the entry's B, and in the text and JSON exports.
    ops = [str(op) for op in schedule.ops(0)]
    assert ops[ops.index(str(first)) + 1] == f"B{first.mb}.0"
    assert kind in schedule.to_string("text")
    exported = json.loads(schedule.to_string("json"))
    assert kind in json.dumps(exported["stages"])
    assert po.parse(schedule.to_string("json")).spec == spec


def test_recompute_chunks_picks_whole_chunks(unit):
    schedule = po.compile(family="interleaved", stages=2, microbatches=4, chunks=2,
                          recompute="full", recompute_chunks=1, costs=unit)
    assert schedule.spec.recompute_chunks == 1
    recomputed = [op for d in range(2) for op in schedule.ops(d) if op.kind == "RECOMPUTE"]
    assert len(recomputed) == 2 * 4 and {op.chunk for op in recomputed} == {0}


def test_auto_with_recompute_allowed_mixes_per_entry():
    # Transfers as long as F + B + W and 0.4 of 1F1B's peak (2 entries of 1 MiB): the planner
    # offloads and recomputes, lean and full (measured: 54 lean, 10 full, every lean block and
    # some of the full ones' inputs offloaded; at 0.6 every entry lean, their blocks offloaded).
    budget = int(0.4 * 2 * 2**20)
    schedule = po.compile(stages=2, microbatches=8, offload="auto", recompute="full",
                          memory_budget_bytes=budget, costs=po.Costs.unit(1.0))
    found = kinds(schedule)
    assert found.count("OFFLOAD") > 0 and found.count("RECOMPUTE") > 0
    assert found.count("RECOMPUTE_LEAN") > 0
    assert all(s.peak_bytes <= budget for s in schedule.predictions.stages)


def test_bad_recompute_specs_name_the_field(unit):
    with pytest.raises(po.InvalidArgumentError, match=r'po_spec\.recompute: unknown recompute '
                                                      r'mode "half"; expected none, lean or full'):
        po.compile(stages=2, microbatches=4, recompute="half", costs=unit)
    with pytest.raises(po.InvalidArgumentError, match=r"recompute_fraction must be in \(0, 1\]"):
        po.compile(stages=2, microbatches=4, recompute="full", recompute_fraction=0, costs=unit)


def test_recompute_beside_po_f_offloads_retained_blocks(unit):
    # Every entry recomputed lean; po-f's candidates are their lean blocks (half an entry in
    # the unit costs), which go to the host and back before each RECOMPUTE_LEAN.
    spec = dict(family="interleaved", stages=4, microbatches=8, chunks=2, recompute="lean",
                costs=unit)
    alone = po.compile(**spec)
    both = po.compile(offload="po-f", **spec)
    found = kinds(both)
    assert found.count("RECOMPUTE_LEAN") == 4 * 8 * 2 and found.count("OFFLOAD") > 0
    for d, stage in enumerate(both.predictions.stages):
        offloads = sum(op.kind == "OFFLOAD" for op in both.ops(d))
        assert stage.offloaded_bytes == offloads * 2**20 // 2
    assert both.predictions.stages[0].peak_bytes < alone.predictions.stages[0].peak_bytes


def test_torch_kinds_and_plan_accept_recompute(unit):
    assert torch_plan.RECOMPUTE_KINDS == ("RECOMPUTE", "RECOMPUTE_LEAN")
    assert set(torch_plan.RECOMPUTE_KINDS) <= set(torch_plan.KINDS)
    schedule = po.compile(stages=4, microbatches=8, recompute="lean", costs=unit)
    plan = PipelinePlan.from_schedule(schedule)
    # torch has no recompute action: the torch actions are those without recompute, and each
    # RECOMPUTE_LEAN is a hook issued after the action before it.
    plain = PipelinePlan.from_schedule(po.compile(stages=4, microbatches=8, costs=unit))
    assert plan.torch_actions() == plain.torch_actions()
    hooked = [a for hooks in plan.offload_hooks().values() for _, ops in hooks for a in ops]
    assert len(hooked) == 4 * 8 and {a.kind for a in hooked} == {"RECOMPUTE_LEAN"}
    assert len(plan.single_process_order()) == sum(len(p) for p in plan.programs)


def test_torch_plan_refuses_a_recompute_out_of_place():
    with pytest.raises(PlanError, match="RECOMPUTE0.0 after nothing of that entry"):
        PipelinePlan(1, 1, 1, False, [[po.Op("RECOMPUTE", 0, 0, -1), po.Op("F", 0, 0, -1),
                                      po.Op("B", 0, 0, -1)]])


def train_bitwise(spec, cls):
    """Two iterations of `spec` on models of `cls`, whose results must be the straight line's;
    returns the models, the stats and the schedule."""
    p, v, m = spec["stages"], spec.get("chunks", 1), spec["microbatches"]
    results = {}
    models = toys(p, v, results, cls)
    with po.LocalPipeline(models, **spec) as pipeline:
        stats = pipeline.run(iterations=2)
        schedule = pipeline.schedule
    assert results == reference(p * v, m)
    return models, stats, schedule


@pytest.mark.parametrize("spec", [
    dict(stages=4, microbatches=8, recompute="full"),
    dict(stages=4, microbatches=8, recompute="lean", split_backward=True),
    dict(family="interleaved", stages=2, microbatches=4, chunks=2, recompute="full",
         recompute_chunks=1),
], ids=["full", "lean-split", "interleaved-chunk0"])
def test_models_that_recompute_train_bitwise_with_predicted_peaks(spec):
    p, v = spec["stages"], spec.get("chunks", 1)
    models, stats, schedule = train_bitwise(spec, RecomputingToy)
    plain_spec = {k: val for k, val in spec.items() if not k.startswith("recompute")}
    with po.LocalPipeline(toys(p, v, {}, RecomputingToy), **plain_spec) as pipeline:
        plain = pipeline.schedule.predictions
    for d in range(p):
        predicted = schedule.predictions.stages[d]
        for iteration in stats:
            assert iteration[d].stash_high_water_bytes == predicted.peak_bytes
            assert 0 <= iteration[d].recompute_seconds <= iteration[d].compute_seconds
        recomputes = sum(op.kind.startswith("RECOMPUTE") for op in schedule.ops(d))
        assert sum(c[0].startswith("RECOMPUTE") for c in models[d].calls) == 2 * recomputes
    assert schedule.predictions.stages[0].peak_bytes < plain.stages[0].peak_bytes


class InPlaceToy(RecomputingToy):
    """RecomputingToy whose B reads a lean block as it is (unsplit): no recompute() for it, and
    B checks the half of the padding the block keeps."""

    def backward_reads_retained(self, chunk, mode, split_backward):
        return mode == "lean" and not split_backward

    def backward(self, call):
        if call.recompute != "lean":
            return super().backward(call)
        assert call.saved == call.retained and call.with_weight_grad
        assert call.retained_bytes == self.retained_bytes(call.chunk, "lean", False)
        kept = call.retained_array()
        wrong = [k for k in range(self.PAD // 2) if kept[WIDTH + k] != self._pad(kept, k)]
        assert not wrong, f"lean block (mb {call.mb}, chunk {call.chunk}) differs at {wrong}"
        Toy.backward(self, call)  # the plain B: x is where it always is


@pytest.mark.parametrize("spec", [
    dict(stages=4, microbatches=8, recompute="lean"),
    dict(stages=4, microbatches=8, recompute="lean", offload="po-f"),
    dict(family="interleaved", stages=2, microbatches=4, chunks=2, recompute="lean"),
], ids=["1f1b", "po-f", "interleaved"])
def test_lean_blocks_read_in_place_train_bitwise_with_lower_predicted_peaks(spec):
    p, v = spec["stages"], spec.get("chunks", 1)
    models, stats, schedule = train_bitwise(spec, InPlaceToy)
    with po.LocalPipeline(toys(p, v, {}, RecomputingToy), **spec) as pipeline:
        rebuilt = pipeline.schedule.predictions
    for d in range(p):
        predicted = schedule.predictions.stages[d]
        for iteration in stats:
            assert iteration[d].stash_high_water_bytes == predicted.peak_bytes
        assert not any(c[0].startswith("RECOMPUTE") for c in models[d].calls)
        assert predicted.peak_bytes <= rebuilt.stages[d].peak_bytes
    assert schedule.predictions.stages[0].peak_bytes < rebuilt.stages[0].peak_bytes


def test_a_model_without_recompute_is_refused_naming_the_mode():
    with pytest.raises(po.InvalidArgumentError, match="recompute full: the cost model offers "
                                                      "it for no entry of chunk 0 on stage 0"):
        po.LocalPipeline(toys(2, 1, {}), stages=2, microbatches=4, recompute="full")


class HalfRecompute(RecomputingToy):
    recompute = None


def test_half_a_recompute_table_is_refused():
    with pytest.raises(po.InvalidArgumentError, match=r"po_stage_callbacks\[0\]: set all of "
                                                      r"retained_bytes, forward_retaining and "
                                                      r"recompute, or none \(2 of 3 are set\)"):
        po.LocalPipeline(toys(2, 1, {}, HalfRecompute), stages=2, microbatches=4)
