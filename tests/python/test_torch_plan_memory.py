"""pipeoffload.torch's bookkeeping without torch: the stash ledger's state machine, its replay of
compiled plans against the compiler's own memory predictions, and the pinned pool's reuse rule
(python/pipeoffload/torch/ledger.py, pinned_pool.py)."""
import pytest

import pipeoffload as po
from pipeoffload.torch import (PinnedPool, PipelinePlan, PlanError, StashLedger, dense_span,
                               peak_without_offload, replay)
from pipeoffload.torch import ledger as ledger_module
from pipeoffload.torch.plan import RECOMPUTE_KINDS

SPECS = [("1f1b", 1, 8), ("interleaved", 2, 8), ("group-interleaved", 2, 8),
         ("group-interleaved", 3, 12)]


@pytest.mark.parametrize("family,chunks,m", SPECS)
@pytest.mark.parametrize("offload", ["none", "po-h", "po-f"])
@pytest.mark.parametrize("split", [False, True])
def test_replay_peaks_are_the_compilers(unit, family, chunks, m, offload, split):
    schedule = po.compile(family=family, stages=4, microbatches=m, chunks=chunks,
                          offload=offload, split_backward=split, costs=unit)
    result = replay(PipelinePlan.from_schedule(schedule))
    entry_bytes = 1 << 20  # the unit cost model's activation_bytes per entry
    for d, predicted in enumerate(schedule.predictions.stages):
        assert result.device[d].peak_units == predicted.peak_units, f"stage {d}"
        host = result.host[d].peak_units if d in result.host else 0
        assert host * entry_bytes == predicted.host_bytes, f"stage {d}"


def test_one_process_peaks_of_1f1b(unit):
    # Four stages of one process: stage 0 holds 4 entries at its peak, stage 3 one; together 10
    # at the worst moment of the one-process order, 7 with po-f.
    none = PipelinePlan.from_schedule(po.compile(stages=4, microbatches=8, costs=unit))
    pof = PipelinePlan.from_schedule(po.compile(stages=4, microbatches=8, offload="po-f",
                                                costs=unit))
    assert replay(none).device_total.peak_units == 10
    assert replay(pof).device_total.peak_units == 7
    assert peak_without_offload(pof).device_total.peak_units == 10
    assert replay(pof).host_total.peak_units == 8


def test_replay_with_entry_sizes_counts_bytes_and_buffers(unit):
    plan = PipelinePlan.from_schedule(po.compile(stages=4, microbatches=8, offload="po-f",
                                                 costs=unit))
    sizes = {(d, 0, mb): (100, 400, 400) for d in range(4) for mb in range(8)}
    result = replay(plan, entry_sizes=sizes)
    assert result.device_total.peak_bytes == 7 * 900
    assert result.host_buffers_peak == {100: 8, 400: 16}
    assert peak_without_offload(plan, sizes).device_total.peak_bytes == 10 * 900


def test_ledger_walks_an_offloaded_entry():
    ledger = StashLedger(split_backward=True)
    key = (1, 0, 3)
    states = [ledger.apply(kind, key) for kind in ("F", "OFFLOAD", "RELEASE", "RELOAD", "B",
                                                   "W")]
    assert states == ["DEVICE", "COPYING_OUT", "ON_HOST", "RELOADED", "BACKWARD_DONE", "FREED"]
    assert (ledger.device[1].peak_units, ledger.device[1].units) == (1, 0)
    assert (ledger.host[1].peak_units, ledger.host[1].units) == (1, 0)
    ledger.finish()


def test_ledger_counts_device_residency_like_the_compiler():
    ledger = StashLedger(split_backward=False)
    ledger.apply("F", (0, 0, 0))
    ledger.apply("OFFLOAD", (0, 0, 0))
    assert ledger.device[0].units == 1          # the copy is in flight: still resident
    ledger.apply("RELEASE", (0, 0, 0))
    assert ledger.device[0].units == 0
    ledger.apply("F", (0, 0, 1))
    ledger.apply("RELOAD", (0, 0, 0))
    assert (ledger.device[0].units, ledger.host[0].units) == (2, 1)
    ledger.apply("B", (0, 0, 0))
    assert (ledger.device[0].units, ledger.host[0].units) == (1, 0)


def test_ledger_refuses_backward_before_reload():
    ledger = StashLedger(split_backward=False)
    for kind in ("F", "OFFLOAD", "RELEASE"):
        ledger.apply(kind, (2, 1, 5))
    with pytest.raises(PlanError, match=r"stage 2: B of \(mb 5, chunk 1\) while the entry is "
                                        r"ON_HOST; B needs it DEVICE or RELOADED"):
        ledger.apply("B", (2, 1, 5))


def test_ledger_refuses_a_second_forward_and_a_stranger():
    ledger = StashLedger(split_backward=False)
    ledger.apply("F", (0, 0, 0))
    with pytest.raises(PlanError, match=r"F of \(mb 0, chunk 0\) while the entry is DEVICE"):
        ledger.apply("F", (0, 0, 0))
    with pytest.raises(PlanError, match=r"SEND_F is not a stash op"):
        ledger.apply("SEND_F", (0, 0, 0))


def test_ledger_finish_names_what_is_left():
    ledger = StashLedger(split_backward=False)
    ledger.apply("F", (0, 0, 0))
    ledger.apply("OFFLOAD", (0, 0, 0))
    with pytest.raises(PlanError, match=r"1 stash entries are not freed at the end of the "
                                        r"iteration \(first: stage 0, mb 0, chunk 0, "
                                        r"COPYING_OUT\)"):
        ledger.finish()
    assert ledger.entries_in(ledger_module.COPYING_OUT) == [(0, 0, 0)]


# Recompute: bytes the compiler's way, so the ledger's replay can be held to its predictions.
ENTRY, INPUT, LEAN = 1 << 20, 1 << 16, 1 << 19
RECOMPUTE_COSTS = {"activation_bytes": ENTRY, "retained_full_bytes": INPUT,
                   "retained_lean_bytes": LEAN}


def recompute_plan(**spec):
    costs = po.Costs(unit_costs=True, offload_ratio=1.0, overrides=RECOMPUTE_COSTS)
    return po.compile(costs=costs, **spec)


def entry_and_lean_bytes(plan, chunks_given):
    # auto may re-chunk the same layers into v chunks (RechunkedCost): an entry and its lean
    # part scale with chunks_given / v; a full recompute keeps the chunk's input, which stays.
    assert ENTRY * chunks_given % plan.chunks_per_stage == 0
    return (ENTRY * chunks_given // plan.chunks_per_stage,
            LEAN * chunks_given // plan.chunks_per_stage)


def retained_sizes(plan, lean):
    return {a.key: INPUT if a.kind == "RECOMPUTE" else lean
            for program in plan.programs for a in program if a.kind in RECOMPUTE_KINDS}


@pytest.mark.parametrize("spec", [
    dict(stages=4, microbatches=8, recompute="full", recompute_fraction=0.5),
    dict(stages=4, microbatches=8, recompute="lean"),
    dict(family="interleaved", stages=2, microbatches=8, chunks=2, recompute="full",
         recompute_chunks=1, split_backward=True),
    # auto's per-entry mix: offloaded, lean and full entries in one plan.
    dict(stages=2, microbatches=8, offload="auto", recompute="full",
         memory_budget_bytes=int(0.4 * 2 * ENTRY)),
    # Recompute with po-f beside it: retained blocks go to the host and back.
    dict(stages=4, microbatches=8, recompute="lean", offload="po-f"),
    dict(family="interleaved", stages=2, microbatches=8, chunks=2, recompute="full",
         offload="po-f", split_backward=True),
], ids=["full-half", "lean", "interleaved-split", "auto-mix", "lean-po-f", "full-po-f-split"])
def test_replay_of_recompute_plans_is_the_compilers_in_bytes(spec):
    schedule = recompute_plan(**spec)
    plan = PipelinePlan.from_schedule(schedule)
    entry, lean = entry_and_lean_bytes(plan, spec.get("chunks", 1))
    retained = retained_sizes(plan, lean)
    assert retained, "the plan recomputes nothing"
    kinds = {a.kind for program in plan.programs for a in program}
    if spec.get("offload") == "auto":
        assert {"OFFLOAD", "RECOMPUTE", "RECOMPUTE_LEAN"} <= kinds
    if spec.get("offload") == "po-f":
        assert "OFFLOAD" in kinds
    sizes = {(d, c, mb): (entry,) for d in range(plan.num_stages)
             for c in range(plan.chunks_per_stage) for mb in range(plan.num_microbatches)}
    result = replay(plan, entry_sizes=sizes, retained_sizes=retained)
    for d, predicted in enumerate(schedule.predictions.stages):
        assert result.device[d].peak_units == predicted.peak_units, f"stage {d}"
        assert result.device[d].peak_bytes == predicted.peak_bytes, f"stage {d}"
        if "OFFLOAD" in kinds:  # host copies: whole entries, or retained blocks
            host = result.host[d].peak_bytes if d in result.host else 0
            assert host == predicted.host_bytes, f"stage {d}"
    # Counted as if nothing were dropped, the same plan needs more (what replay said before).
    as_kept = replay(plan, entry_sizes=sizes)
    assert max(u.peak_bytes for u in as_kept.device.values()) > max(
        s.peak_bytes for s in schedule.predictions.stages)


def test_ledger_walks_a_recomputed_entry():
    key = (0, 0, 0)
    ledger = StashLedger(split_backward=True, entry_bytes=lambda k: 10,
                         recomputed={key: "RECOMPUTE"}, retained_bytes=lambda k: 3)
    states = [ledger.apply(kind, key) for kind in ("F", "RECOMPUTE", "B", "W")]
    assert states == ["RETAINED", "DEVICE", "BACKWARD_DONE", "FREED"]
    # 3 bytes from F; 3 + 10 while the recompute runs; 10 until W.
    assert (ledger.device[0].peak_units, ledger.device[0].peak_bytes) == (1, 13)
    assert (ledger.device[0].units, ledger.device[0].bytes) == (0, 0)
    assert ledger.host[0].peak_units == 0
    ledger.finish()


def test_ledger_walks_a_recomputed_entry_whose_retained_block_is_offloaded():
    key = (0, 0, 0)
    ledger = StashLedger(split_backward=False, entry_bytes=lambda k: 10,
                         recomputed={key: "RECOMPUTE_LEAN"}, retained_bytes=lambda k: 4)
    states = [ledger.apply(kind, key)
              for kind in ("F", "OFFLOAD", "RELEASE", "RELOAD", "RECOMPUTE_LEAN", "B")]
    assert states == ["RETAINED", "RETAINED_COPYING_OUT", "RETAINED_ON_HOST",
                      "RETAINED_RELOADED", "DEVICE", "FREED"]
    # 4 bytes from F to RELEASE and again from RELOAD; 4 + 10 while the recompute runs.
    assert (ledger.device[0].peak_units, ledger.device[0].peak_bytes) == (1, 14)
    # The host holds the 4-byte block from OFFLOAD to the recompute.
    assert (ledger.host[0].peak_units, ledger.host[0].peak_bytes) == (1, 4)
    assert (ledger.host[0].units, ledger.host[0].bytes) == (0, 0)
    ledger.finish()
    with pytest.raises(PlanError, match=r"B of \(mb 0, chunk 0\) while the entry is "
                                        r"RETAINED_RELOADED"):
        other = StashLedger(split_backward=False, recomputed={key: "RECOMPUTE"})
        for kind in ("F", "OFFLOAD", "RELEASE", "RELOAD", "B"):
            other.apply(kind, key)


def test_ledger_refuses_recompute_ops_it_was_not_told_of():
    ledger = StashLedger(split_backward=False, recomputed={(0, 0, 1): "RECOMPUTE_LEAN"})
    ledger.apply("F", (0, 0, 0))
    with pytest.raises(PlanError, match=r"RECOMPUTE of \(mb 0, chunk 0\) while the entry is "
                                        r"DEVICE; RECOMPUTE needs it RETAINED or "
                                        r"RETAINED_RELOADED"):
        ledger.apply("RECOMPUTE", (0, 0, 0))
    ledger.apply("F", (0, 0, 1))
    with pytest.raises(PlanError, match=r"RECOMPUTE of \(mb 1, chunk 0\), which the ledger was "
                                        r"told is RECOMPUTE_LEAN"):
        ledger.apply("RECOMPUTE", (0, 0, 1))
    with pytest.raises(PlanError, match=r"RELOAD of \(mb 1, chunk 0\) while the entry is "
                                        r"RETAINED"):
        ledger.apply("RELOAD", (0, 0, 1))


class FakeEvent:
    """A copy's completion event: done after `pending` queries, or at synchronize()."""

    def __init__(self, pending=0):
        self.pending = pending
        self.synchronized = False

    def query(self):
        if self.pending == 0:
            return True
        self.pending -= 1
        return False

    def synchronize(self):
        self.synchronized = True
        self.pending = 0


def counting_allocator():
    made = []

    def allocate(nbytes):
        made.append(nbytes)
        return f"buffer{len(made)}:{nbytes}"
    return allocate, made


def test_pool_reuses_a_buffer_only_after_its_last_copy():
    allocate, made = counting_allocator()
    pool = PinnedPool(allocate)
    first = pool.acquire(64)
    fence = FakeEvent(pending=5)
    pool.give_back(first, 64, fence)
    # A ready buffer of another size does not count; the pending one is waited for, not
    # overwritten, and not doubled by a new allocation.
    pool.give_back(pool.acquire(32), 32)
    again = pool.acquire(64)
    assert again == first and fence.synchronized
    assert (made, pool.stats.reused, pool.stats.waited) == ([64, 32], 1, 1)


def test_pool_prefers_a_finished_buffer_over_waiting():
    allocate, made = counting_allocator()
    pool = PinnedPool(allocate)
    a, b = pool.acquire(8), pool.acquire(8)
    slow, done = FakeEvent(pending=100), FakeEvent(pending=0)
    pool.give_back(a, 8, slow)
    pool.give_back(b, 8, done)
    assert pool.acquire(8) == b
    assert not slow.synchronized and pool.stats.waited == 0
    assert (pool.stats.allocated, pool.stats.held, pool.free_buffers()) == ({8: 2}, 1, 1)


def test_pool_allocates_the_peak_held_at_once():
    allocate, made = counting_allocator()
    pool = PinnedPool(allocate)
    held = [pool.acquire(16) for _ in range(3)]
    for buffer in held:
        pool.give_back(buffer, 16, FakeEvent(pending=1))
    held = [pool.acquire(16) for _ in range(2)]
    assert (len(made), pool.stats.allocated_bytes, pool.stats.reused) == (3, 48, 2)
    with pytest.raises(ValueError, match="negative size -1"):
        pool.acquire(-1)


def test_dense_span():
    assert dense_span((4, 8), (8, 1)) == 32         # contiguous
    assert dense_span((8, 4), (1, 8)) == 32         # a transpose of one
    assert dense_span((4, 1, 8), (8, 99, 1)) == 32  # size-1 dims have any stride
    assert dense_span((4, 8), (16, 1)) == -1        # a slice with gaps
    assert dense_span((4, 8), (0, 1)) == -1         # expanded: elements overlap
    assert dense_span((0, 8), (8, 1)) == 0
    assert dense_span((), ()) == 1                  # a scalar
    with pytest.raises(ValueError, match="2 sizes but 1 strides"):
        dense_span((1, 2), (1,))


# PipelineRunner's accounting of recompute "full" (runner.py): F keeps the chunk's input, which
# the runner holds for every entry (it is in no entry's bytes), so the retained block weighs 0.
def runner_replay(schedule, sizes):
    plan = PipelinePlan.from_schedule(schedule)
    retained = {a.key: 0 for program in plan.programs for a in program
                if a.kind == "RECOMPUTE"}
    assert len(retained) == plan.num_stages * plan.num_microbatches
    return (replay(plan, entry_sizes=sizes, retained_sizes=retained),
            peak_without_offload(plan, sizes, retained_sizes=retained))


def test_runner_replay_of_recompute_full(unit):
    sizes = {(d, 0, mb): (100, 400, 400) for d in range(4) for mb in range(8)}
    kept = replay(PipelinePlan.from_schedule(po.compile(stages=4, microbatches=8, costs=unit)),
                  entry_sizes=sizes)
    alone, alone_without = runner_replay(
        po.compile(stages=4, microbatches=8, recompute="full", costs=unit), sizes)
    # Each RECOMPUTE comes right after the RECV_B of its B: one rebuilt entry at a time.
    assert (kept.device_total.peak_bytes, alone.device_total.peak_bytes) == (10 * 900, 900)
    assert alone_without.device_total.peak_bytes == 900
    # po-f beside it offloads retained blocks (0 bytes: nothing moves, no pinned buffer) and
    # hoists each RECOMPUTE before its RECV_B: every stage may hold a rebuilt entry at once.
    both, both_without = runner_replay(
        po.compile(stages=4, microbatches=8, recompute="full", offload="po-f", costs=unit),
        sizes)
    assert both.host_total.peak_units > 0
    assert (both.host_total.peak_bytes, both.host_buffers_peak) == (0, {})
    assert both.device_total.peak_bytes == both_without.device_total.peak_bytes == 4 * 900


def test_ledger_walks_a_recomputed_entry_with_an_empty_retained_block():
    # What ActivationOffloader's ledger does for an entry whose 0-byte block the plan offloads.
    key = (0, 0, 0)
    ledger = StashLedger(split_backward=False, entry_bytes=lambda k: 10,
                         recomputed={key: "RECOMPUTE"}, retained_bytes=lambda k: 0)
    bytes_after = []
    for kind in ("F", "OFFLOAD", "RELEASE", "RELOAD", "RECOMPUTE", "B"):
        ledger.apply(kind, key)
        bytes_after.append((ledger.device[0].bytes, ledger.host[0].bytes))
    assert bytes_after == [(0, 0), (0, 0), (0, 0), (0, 0), (10, 0), (0, 0)]
    assert (ledger.device[0].peak_units, ledger.host[0].peak_units) == (1, 1)
    assert ledger.device[0].peak_bytes == 10
    ledger.finish()
