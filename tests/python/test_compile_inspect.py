"""compile() and reading ops: every golden schedule (tests/golden/*.txt, checked by hand
against reference/pipeoffload.md) comes out of the Python package op for op."""
import re

import pytest

import pipeoffload as po

GOLDEN_HEADER = re.compile(r"# family=(\S+) p=(\d+) m=(\d+) v=(\d+) g=(\d+) split=(\d)")


def lowered_rows(path):
    """The [lowered] section's rows: stage -> list of op strings."""
    rows, section = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line
        elif section == "[lowered]" and line.startswith("stage "):
            head, ops = line.split(" | ")
            rows[int(head.split()[1])] = ops.split()
    return rows


def golden_files():
    from conftest import SOURCE_DIR
    # The schedules' text goldens; *_fingerprints.txt are the compiler's hashes (fingerprint_test).
    files = sorted(p for p in (SOURCE_DIR / "tests" / "golden").glob("*.txt")
                   if not p.name.endswith("_fingerprints.txt"))
    assert files, "no golden schedules found"
    return files


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.name)
def test_golden_schedules_op_for_op(path, unit):
    header = GOLDEN_HEADER.search(path.read_text())
    family, p, m, v, g, split = header.groups()
    schedule = po.compile(family=family, stages=int(p), microbatches=int(m), chunks=int(v),
                          group_size=int(g), split_backward=split == "1", costs=unit)
    expected = lowered_rows(path)
    assert schedule.num_stages == int(p) == len(expected)
    for d in range(int(p)):
        assert [str(op) for op in schedule.ops(d)] == expected[d], f"stage {d}"


def test_first_ops_of_1f1b_stage_0(unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    assert schedule.ops(0)[:10] == [
        po.Op("F", 0, 0, -1), po.Op("SEND_F", 0, 0, 1),
        po.Op("F", 1, 0, -1), po.Op("SEND_F", 1, 0, 1),
        po.Op("F", 2, 0, -1), po.Op("SEND_F", 2, 0, 1),
        po.Op("F", 3, 0, -1), po.Op("SEND_F", 3, 0, 1),
        po.Op("RECV_B", 0, 0, 1), po.Op("B", 0, 0, -1)]
    # Stages 0 and p-1 talk to one neighbour, the middle ones to two: 32 + 48 + 48 + 32.
    assert [len(schedule.ops(d)) for d in range(4)] == [32, 48, 48, 32]


def test_spec_comes_back_resolved(unit):
    schedule = po.compile(family="group-interleaved", stages=4, microbatches=8, chunks=2,
                          costs=unit)
    # group_size 0 asks for the family's default, ceil(p/2).
    assert schedule.spec == po.Spec(
        family="group-interleaved", offload="none", num_stages=4, num_microbatches=8,
        chunks_per_stage=2, group_size=2, split_backward=False, offload_fraction=0.0,
        offload_chunks=0, memory_budget_bytes=0, strict=False, recompute="none",
        recompute_fraction=1.0, recompute_chunks=0)


def test_defaults_are_po_schedules():
    # po-schedule's defaults: 8 stages, 32 microbatches, 1f1b, the GPT estimate.
    spec = po.compile().spec
    assert (spec.num_stages, spec.num_microbatches, spec.family) == (8, 32, "1f1b")


def test_offload_plan_places_transfers_on_stage_0(unit):
    schedule = po.compile(family="group-interleaved", offload="po-f", stages=4,
                          microbatches=8, chunks=2, costs=unit)
    kinds = [op.kind for op in schedule.ops(0)]
    assert kinds.count("OFFLOAD") == kinds.count("RELEASE") == kinds.count("RELOAD") > 0
    # Each entry's life cycle: F < OFFLOAD < RELEASE < RELOAD < B (DESIGN.md section 3).
    ops = schedule.ops(0)
    for i, op in enumerate(ops):
        if op.kind != "OFFLOAD":
            continue
        index = {o.kind: j for j, o in enumerate(ops) if (o.mb, o.chunk) == (op.mb, op.chunk)
                 and o.kind in ("F", "OFFLOAD", "RELEASE", "RELOAD", "B")}
        assert index["F"] < i < index["RELEASE"] < index["RELOAD"] < index["B"]


def test_with_closes_the_handle(unit):
    with po.compile(stages=2, microbatches=2, costs=unit) as schedule:
        assert schedule.num_stages == 2
    with pytest.raises(po.FailedPreconditionError, match="the schedule was closed"):
        schedule.ops(0)
