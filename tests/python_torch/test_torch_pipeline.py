"""pipeoffload.torch on one GPU: a toy pipeline of 4 stages (residual MLP blocks, fp32) trained
with our schedules, with and without offload. Run by run_torch_tests.py (or pytest).

What is asserted, exactly: losses and parameters after every step torch.equal with and without
offload (po-h, po-f; 1f1b and group-interleaved with split backward); the no-offload pipeline
torch.equal to a plain loop over the microbatches; pinned buffers allocated = the replay's
prediction, every later step reusing them; bad input refused with a message. Plans compiled
with recompute "full" (1f1b, group-interleaved with split backward, po-f beside it, offload off,
stages with dropout) torch.equal to the no-recompute plan of the same compute order; plans with
RECOMPUTE_LEAN refused naming the first op. With a tolerance: the activation peak falls by the
predicted stash reduction within 10% of the no-offload stash peak (kernel transients and the
stage boundaries are in the measurement, not the prediction), for offload and for recompute."""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts

import torch  # noqa: E402

import pipeoffload as po  # noqa: E402
import pipeoffload.torch as pot  # noqa: E402
from pipeoffload.torch import toy  # noqa: E402

DEVICE = torch.device("cuda", 0)
HIDDEN, TOKENS, BLOCKS, MICROBATCHES, STEPS = 256, 512, 2, 8, 3
UNIT = po.Costs.unit(0.25)


def compile_plan(offload, family="1f1b", chunks=1, split=False, recompute="none",
                 fraction=1.0):
    return po.compile(family=family, stages=4, microbatches=MICROBATCHES, chunks=chunks,
                      offload=offload, split_backward=split, recompute=recompute,
                      recompute_fraction=fraction, costs=UNIT)


def run(schedule, *, offload=True, sync_release=False, steps=STEPS, chunks=1, dropout=0.0):
    """Trains fresh, identically seeded stages; returns (losses, params per step, runner)."""
    stages = toy.make_stages(4 * chunks, HIDDEN, BLOCKS, DEVICE, dropout=dropout)
    inputs, targets = toy.make_data(MICROBATCHES, TOKENS, HIDDEN, DEVICE)
    runner = pot.PipelineRunner(stages, schedule, toy.mse_loss(MICROBATCHES), offload=offload,
                                sync_release=sync_release)
    losses, params = toy.train(stages, runner.step, inputs, targets, steps)
    return losses, params, runner


def assert_bitwise(a, b, what):
    for step, (xs, ys) in enumerate(zip(a, b)):
        assert len(xs) == len(ys), f"{what}: step {step} has {len(xs)} vs {len(ys)} tensors"
        for i, (x, y) in enumerate(zip(xs, ys)):
            if not torch.equal(x, y):
                diff = (x.double() - y.double()).abs().max().item()
                raise AssertionError(f"{what}: step {step}, tensor {i} differs "
                                     f"(max abs diff {diff:.3e})")


def check_offload_is_exact(offload, **spec):
    chunks = spec.get("chunks", 1)
    base_losses, base_params, _ = run(compile_plan("none", **spec), offload=False,
                                      chunks=chunks)
    losses, params, runner = run(compile_plan(offload, **spec), chunks=chunks)
    assert runner.plan.offloaded_entries(), f"{offload} {spec}: the plan offloads nothing"
    assert_bitwise(base_losses, losses, f"{offload} {spec} losses")
    assert_bitwise(base_params, params, f"{offload} {spec} parameters")
    assert runner.offloader.pool.stats.reused > 0, "pinned buffers were never reused"


def test_po_f_trains_bitwise_equal_to_no_offload():
    check_offload_is_exact("po-f")


def test_po_h_trains_bitwise_equal_to_no_offload():
    check_offload_is_exact("po-h")


def test_group_interleaved_split_backward_po_f_is_exact():
    check_offload_is_exact("po-f", family="group-interleaved", chunks=2, split=True)


def test_pipeline_equals_a_plain_loop():
    losses, params, _ = run(compile_plan("none"), offload=False)
    stages = toy.make_stages(4, HIDDEN, BLOCKS, DEVICE)
    inputs, targets = toy.make_data(MICROBATCHES, TOKENS, HIDDEN, DEVICE)
    plain_losses, plain_params = toy.train(
        stages, toy.plain_step(stages, toy.mse_loss(MICROBATCHES)), inputs, targets, STEPS)
    assert_bitwise(plain_losses, losses, "plain loop vs pipeline losses")
    assert_bitwise(plain_params, params, "plain loop vs pipeline parameters")


def test_activation_memory_falls_as_predicted():
    # Two steps each: the first creates .grad and cuBLAS workspaces, the second is measured.
    _, _, none = run(compile_plan("none"), offload=False, sync_release=True, steps=2)
    _, _, pof = run(compile_plan("po-f"), sync_release=True, steps=2)
    a, b = none.memory_report(), pof.memory_report()
    print(f"no offload: {a}\npo-f:       {b}")
    assert a.predicted_stash_peak_bytes == b.predicted_stash_peak_without_offload_bytes
    assert b.compiler_stage_peak_units == [2, 2, 2, 1]
    assert b.compiler_stage_peak_units_without_offload == [4, 3, 2, 1]
    predicted = a.predicted_stash_peak_bytes - b.predicted_stash_peak_bytes
    measured = a.measured_peak_bytes - b.measured_peak_bytes
    tolerance = 0.10 * a.predicted_stash_peak_bytes
    assert predicted > 0, f"po-f predicts no saving: {predicted} B"
    assert abs(measured - predicted) <= tolerance, (
        f"activation peak fell by {measured / 2**20:.1f} MiB, predicted "
        f"{predicted / 2**20:.1f} MiB (tolerance {tolerance / 2**20:.1f} MiB)")
    # Without offload the measured peak holds the whole stash plus transients.
    assert a.measured_peak_bytes >= a.predicted_stash_peak_bytes


def test_pinned_buffers_are_reused_exactly():
    _, _, runner = run(compile_plan("po-f"), steps=2)
    report = runner.memory_report()
    stats = runner.offloader.pool.stats
    assert report.host_buffers_allocated == report.host_buffers_predicted, (
        f"allocated {report.host_buffers_allocated}, predicted {report.host_buffers_predicted}")
    buffers = sum(report.host_buffers_predicted.values())
    offloaded = sum(len(runner.offloader.entry_sizes[k]) for k in runner.plan.offloaded_entries())
    # Two steps acquire 2 * offloaded buffers; all but the first allocation of each are reuses.
    assert stats.reused == 2 * offloaded - buffers, (stats, buffers, offloaded)
    assert stats.held == 0 and runner.offloader.pool.free_buffers() == buffers


def test_compute_stream_is_captured_outside_the_side_streams():
    _, _, runner = run(compile_plan("po-f"), steps=1)
    offloader = runner.offloader
    assert offloader.compute_stream == torch.cuda.current_stream(DEVICE)
    assert offloader.compute_stream != offloader.d2h_stream
    assert offloader.compute_stream != offloader.h2d_stream


def test_bad_input_is_refused_with_a_message():
    stages = toy.make_stages(3, HIDDEN, BLOCKS, DEVICE)
    try:
        pot.PipelineRunner(stages, compile_plan("po-f"), toy.mse_loss(MICROBATCHES))
    except ValueError as e:
        assert "3 stage modules for a plan of 4 virtual stages" in str(e), str(e)
    else:
        raise AssertionError("3 modules for 4 stages were accepted")
    runner = pot.PipelineRunner(toy.make_stages(4, HIDDEN, BLOCKS, DEVICE), compile_plan("po-f"),
                                toy.mse_loss(MICROBATCHES))
    inputs, targets = toy.make_data(2, TOKENS, HIDDEN, DEVICE)
    try:
        runner.step(inputs, targets)
    except ValueError as e:
        assert "the plan has 8 microbatches; got 2 inputs" in str(e), str(e)
    else:
        raise AssertionError("2 microbatches for a plan of 8 were accepted")


# --- recompute ------------------------------------------------------------------------------


def compute_order(plan):
    return [(a.stage, a.kind, a.mb, a.chunk) for a in plan.single_process_order()
            if a.kind in ("F", "B", "W")]


def check_recompute_is_exact(offload="none", *, runner_offload=True, dropout=0.0, fraction=1.0,
                             **spec):
    """Recompute "full" (of `fraction` of the entries) trains torch.equal to the no-recompute,
    no-offload plan of the same compute order; returns the recomputing runner."""
    chunks = spec.get("chunks", 1)
    base_plan = compile_plan("none", **spec)
    plan = compile_plan(offload, recompute="full", fraction=fraction, **spec)
    base_losses, base_params, base = run(base_plan, offload=False, chunks=chunks,
                                         dropout=dropout)
    losses, params, runner = run(plan, offload=runner_offload, chunks=chunks, dropout=dropout)
    what = f"recompute full, {offload}, offload={runner_offload}, dropout {dropout}, {spec}"
    assert compute_order(runner.plan) == compute_order(base.plan), f"{what}: another order"
    assert len(runner.recomputed) == int(fraction * 4 * chunks * MICROBATCHES), (
        f"{what}: {len(runner.recomputed)} entries recomputed")
    assert_bitwise(base_losses, losses, f"{what} losses")
    assert_bitwise(base_params, params, f"{what} parameters")
    return runner


def test_recompute_full_1f1b_trains_bitwise_equal_to_no_recompute():
    check_recompute_is_exact()


def test_recompute_full_group_interleaved_split_backward_is_exact():
    check_recompute_is_exact(family="group-interleaved", chunks=2, split=True)


def test_recompute_full_with_po_f_is_exact_with_and_without_offload():
    runner = check_recompute_is_exact("po-f")
    moved = [a for a in runner.plan.offloaded_entries() if a in runner.recomputed]
    assert moved, "po-f offloads no retained block of a recomputed entry"
    # The retained blocks (the inputs, held anyway) move nothing: no pinned buffer for them.
    report = runner.memory_report()
    assert report.host_buffers_allocated == report.host_buffers_predicted, report
    # The same plan with its offload ops skipped.
    check_recompute_is_exact("po-f", runner_offload=False)


def test_half_recompute_beside_po_f_offloads_the_rest_exactly():
    # Whole entries offloaded beside recomputed ones (whose retained blocks move nothing). With
    # half the entries recomputed, po-f gates 1f1b's warm-up otherwise than without recompute
    # (another F/B order, so other summation orders), so the plan is compared with itself with
    # its offload ops skipped: the offload moves the bits it should, exactly.
    plan = compile_plan("po-f", recompute="full", fraction=0.5)
    base_losses, base_params, _ = run(plan, offload=False)
    losses, params, runner = run(plan)
    assert len(runner.recomputed) == 2 * MICROBATCHES, len(runner.recomputed)
    assert_bitwise(base_losses, losses, "half recompute, po-f: losses")
    assert_bitwise(base_params, params, "half recompute, po-f: parameters")
    whole = [k for k in runner.plan.offloaded_entries() if k not in runner.recomputed]
    assert whole, "po-f offloads no whole entry beside the recomputed ones"
    report = runner.memory_report()
    assert report.host_buffers_allocated == report.host_buffers_predicted, report
    assert report.host_buffers_predicted, report


def test_recompute_with_dropout_draws_the_same_bits():
    runner = check_recompute_is_exact(dropout=0.1)
    assert any(isinstance(m, torch.nn.Dropout) for s in runner.stages for m in s.modules())
    # Dropout really draws: the same stages without it train to other losses.
    with_dropout, _, _ = run(compile_plan("none"), offload=False, dropout=0.1, steps=1)
    without, _, _ = run(compile_plan("none"), offload=False, steps=1)
    assert not torch.equal(with_dropout[0][0], without[0][0])


def test_recompute_lowers_the_activation_peak_as_predicted():
    # Two steps each: the first creates .grad and cuBLAS workspaces, the second is measured.
    _, _, none = run(compile_plan("none"), offload=False, sync_release=True, steps=2)
    _, _, full = run(compile_plan("none", recompute="full"), sync_release=True, steps=2)
    a, b = none.memory_report(), full.memory_report()
    print(f"no recompute:   {a}\nrecompute full: {b}")
    predicted = a.predicted_stash_peak_bytes - b.predicted_stash_peak_bytes
    measured = a.measured_peak_bytes - b.measured_peak_bytes
    assert predicted > 0, f"recompute full predicts no saving: {predicted} B"
    assert b.measured_peak_bytes < a.measured_peak_bytes, (a.measured_peak_bytes,
                                                           b.measured_peak_bytes)
    # Beside the prediction: a rebuilt non-last stage's output (T, h) per stage, and the
    # no_grad forward's transients (within the same tolerance as offload's).
    tolerance = 0.10 * a.predicted_stash_peak_bytes
    assert abs(measured - predicted) <= tolerance, (
        f"activation peak fell by {measured / 2**20:.1f} MiB, predicted "
        f"{predicted / 2**20:.1f} MiB (tolerance {tolerance / 2**20:.1f} MiB)")
    # No offload op in the plan: offload on or off predicts the same.
    assert b.predicted_stash_peak_bytes == b.predicted_stash_peak_without_offload_bytes


def test_recompute_lean_is_refused_naming_the_first_op():
    schedule = compile_plan("none", recompute="lean")
    first = next(a for d in range(4) for a in pot.PipelinePlan.from_schedule(schedule).programs[d]
                 if a.kind == "RECOMPUTE_LEAN")
    try:
        pot.PipelineRunner(toy.make_stages(4, HIDDEN, BLOCKS, DEVICE), schedule,
                           toy.mse_loss(MICROBATCHES))
    except pot.PlanError as e:
        assert "cannot run RECOMPUTE_LEAN" in str(e), str(e)
        assert f"first: stage {first.stage}, {first}" in str(e), str(e)
        assert 'compile with recompute "full"' in str(e), str(e)
    else:
        raise AssertionError("a plan with RECOMPUTE_LEAN was accepted")
