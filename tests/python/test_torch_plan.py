"""pipeoffload.torch's plan (python/pipeoffload/torch/plan.py), without torch: compiled
schedules as validated per-stage actions, the one-process issue order, torch's action notation,
and clear errors for plans that cannot run."""
import pytest

import pipeoffload as po
from pipeoffload.torch import Action, PipelinePlan, PlanError


def ops(text):
    """Op-like values from 'F0.0 OFFLOAD0.0 SEND_F0.0->1' (the text format's spelling)."""
    result = []
    for token in text.split():
        peer = -1
        for mark in ("->", "<-", "~"):
            if mark in token:
                token, peer = token.split(mark)
                peer = int(peer)
        kind = token.rstrip("0123456789.")
        mb, chunk = token[len(kind):].split(".")
        result.append(po.Op(kind, int(mb), int(chunk), peer))
    return result


def plan_of(schedule):
    return PipelinePlan.from_schedule(schedule)


def test_actions_keep_the_compilers_ops(unit):
    schedule = po.compile(stages=4, microbatches=8, offload="po-f", costs=unit)
    plan = plan_of(schedule)
    for d in range(4):
        assert [str(a) for a in plan.programs[d]] == [str(op) for op in schedule.ops(d)]
    assert plan.programs[0][2] == Action(0, "OFFLOAD", 0, 0, -1, 0)


def test_virtual_stages_use_the_loop_placement(unit):
    plan = plan_of(po.compile(family="interleaved", stages=4, microbatches=8, chunks=2,
                              costs=unit))
    f = [a for a in plan.programs[1] if a.kind == "F" and a.chunk == 1][0]
    assert (f.virtual_stage, plan.place(5)) == (5, (1, 1))
    assert plan.num_virtual_stages == 8


@pytest.mark.parametrize("family,chunks,offload,split", [
    ("1f1b", 1, "none", False), ("1f1b", 1, "po-f", True),
    ("interleaved", 2, "po-h", False), ("group-interleaved", 2, "po-f", True)])
def test_single_process_order_runs_every_op_after_its_inputs(unit, family, chunks, offload,
                                                             split):
    plan = plan_of(po.compile(family=family, stages=4, microbatches=8, chunks=chunks,
                              offload=offload, split_backward=split, costs=unit))
    order = plan.single_process_order()
    assert len(order) == sum(len(p) for p in plan.programs)
    # Each stage's ops stay in program order.
    for d in range(4):
        assert [a for a in order if a.stage == d] == plan.programs[d]
    done = {}
    for i, a in enumerate(order):
        done[(a.kind, a.virtual_stage, a.mb)] = i
        if a.kind == "F" and a.virtual_stage > 0:
            assert ("F", a.virtual_stage - 1, a.mb) in done, str(a)
        if a.kind == "B" and a.virtual_stage < plan.num_virtual_stages - 1:
            assert ("B", a.virtual_stage + 1, a.mb) in done, str(a)
        if a.kind == "RECV_F":
            assert ("SEND_F", a.virtual_stage - 1, a.mb) in done, str(a)


def test_first_ops_of_the_one_process_order(unit):
    plan = plan_of(po.compile(stages=2, microbatches=2, costs=unit))
    assert [f"{a.stage}:{a}" for a in plan.single_process_order()][:6] == [
        "0:F0.0", "0:SEND_F0.0->1", "0:F1.0", "1:RECV_F0.0<-0", "1:F0.0", "0:SEND_F1.0->1"]


def test_torch_actions_use_torchs_notation(unit):
    plan = plan_of(po.compile(stages=2, microbatches=2, offload="po-f", costs=unit))
    assert plan.torch_actions()[1] == [
        "1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]
    split = plan_of(po.compile(stages=2, microbatches=2, split_backward=True, costs=unit))
    assert [a for a in split.torch_actions()[1] if a[1] in "FIW"] == [
        "1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]


def test_offload_hooks_follow_the_torch_action_before_them(unit):
    plan = plan_of(po.compile(stages=4, microbatches=8, offload="po-f", costs=unit))
    hooks = plan.offload_hooks()[0]
    assert hooks[0][0] == "0SEND_F0"
    assert [str(a) for a in hooks[0][1]] == ["OFFLOAD0.0", "RELEASE0.0"]
    issued = [str(a) for _, actions in hooks for a in actions]
    assert issued == [str(a) for a in plan.programs[0]
                      if a.kind in ("OFFLOAD", "RELEASE", "RELOAD")]
    assert plan.offload_hooks()[3] == []  # the last stage offloads nothing under po-f, p = 4


def test_offloaded_entries(unit):
    plan = plan_of(po.compile(stages=4, microbatches=8, offload="po-f", costs=unit))
    assert plan.offloaded_entries()[:3] == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]
    assert len(plan.offloaded_entries()) == 8 + 8 + 1


def test_reload_before_release_is_refused():
    with pytest.raises(PlanError, match=r"stage 0, op 2: RELOAD0.0 after OFFLOAD of that entry"):
        PipelinePlan(1, 1, 1, False, [ops("F0.0 OFFLOAD0.0 RELOAD0.0 B0.0")])


def test_backward_of_a_released_entry_is_refused():
    with pytest.raises(PlanError, match=r"op 3: B0.0 after RELEASE"):
        PipelinePlan(1, 1, 1, False, [ops("F0.0 OFFLOAD0.0 RELEASE0.0 B0.0")])


def test_missing_backward_is_refused():
    with pytest.raises(PlanError, match=r"stage 0: 1 entries do not end with B \(first: mb 1"):
        PipelinePlan(1, 1, 2, False, [ops("F0.0 B0.0 F1.0")])


def test_out_of_range_and_unknown_ops_are_refused():
    with pytest.raises(PlanError, match=r"microbatch 2 out of range \[0, 2\)"):
        PipelinePlan(1, 1, 2, False, [ops("F2.0")])
    with pytest.raises(PlanError, match=r"peer 3 out of range \[0, 2\)"):
        PipelinePlan(2, 1, 1, False, [ops("F0.0 SEND_F0.0->3 B0.0"), ops("F0.0 B0.0")])
    with pytest.raises(PlanError, match=r"unknown op kind 'X'"):
        PipelinePlan(1, 1, 1, False, [[po.Op("X", 0, 0, -1)]])
    with pytest.raises(PlanError, match=r"W in a plan without split backward"):
        PipelinePlan(1, 1, 1, False, [ops("F0.0 B0.0 W0.0")])
    with pytest.raises(PlanError, match=r"plan has 1 programs for 2 stages"):
        PipelinePlan(2, 1, 1, False, [ops("F0.0 B0.0")])


def test_duplicate_send_is_refused():
    with pytest.raises(PlanError, match=r"SEND_F0.0->1 appears twice"):
        PipelinePlan(2, 1, 1, False, [ops("F0.0 SEND_F0.0->1 SEND_F0.0->1 RECV_B0.0<-1 B0.0"),
                                      ops("RECV_F0.0<-0 F0.0 B0.0 SEND_B0.0->0")])


def test_deadlock_names_each_stage_and_op():
    # Both stages wait for a gradient before they send anything.
    with pytest.raises(PlanError, match=r"deadlock in one process: stage 0 at op 1 "
                                        r"\(RECV_B0.0<-1\), stage 1 at op 0 \(RECV_F0.0<-0\)"):
        PipelinePlan(2, 1, 1, False, [
            ops("F0.0 RECV_B0.0<-1 SEND_F0.0->1 B0.0"),
            ops("RECV_F0.0<-0 F0.0 B0.0 SEND_B0.0->0")]).single_process_order()


def test_plan_error_is_a_pipeoffload_error():
    with pytest.raises(po.FailedPreconditionError) as info:
        PipelinePlan(0, 1, 1, False, [])
    assert info.value.code == 9


@pytest.mark.parametrize("family,chunks,split", [("1f1b", 1, False),
                                                 ("group-interleaved", 2, True)])
@pytest.mark.parametrize("offload", ["po-h", "po-f"])
def test_offload_leaves_the_one_process_compute_order_alone(unit, family, chunks, split,
                                                            offload):
    # Why a torch run with offload can be bitwise equal to one without: the same kernels run in
    # the same order on the compute stream.
    def compute_order(policy):
        plan = plan_of(po.compile(family=family, stages=4, microbatches=8, chunks=chunks,
                                  split_backward=split, offload=policy, costs=unit))
        return [(a.stage, a.kind, a.mb, a.chunk) for a in plan.single_process_order()
                if a.kind in ("F", "B", "W")]
    assert compute_order(offload) == compute_order("none")


@pytest.mark.parametrize("family,chunks,split", [("1f1b", 1, False),
                                                 ("group-interleaved", 2, True)])
@pytest.mark.parametrize("offload", ["none", "po-h", "po-f"])
def test_recompute_full_leaves_the_one_process_compute_order_alone(unit, family, chunks, split,
                                                                   offload):
    # Why PipelineRunner's recomputing run can be bitwise equal to the plan without recompute:
    # the same F / B / W in the same order (RECOMPUTE ops sit between them, po-f's hoisted
    # before the RECV_B they overlap).
    def compute_order(policy, recompute):
        plan = plan_of(po.compile(family=family, stages=4, microbatches=8, chunks=chunks,
                                  split_backward=split, offload=policy, recompute=recompute,
                                  costs=unit))
        return [(a.stage, a.kind, a.mb, a.chunk) for a in plan.single_process_order()
                if a.kind in ("F", "B", "W")]
    assert compute_order(offload, "full") == compute_order("none", "none")
