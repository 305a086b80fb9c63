"""Every format the C++ side writes, and write-then-read round trips equal op by op."""
import json

import pipeoffload as po


def all_ops(schedule):
    return [schedule.ops(d) for d in range(schedule.num_stages)]


def test_pytorch_csv_is_exact(unit):
    schedule = po.compile(stages=2, microbatches=2, costs=unit)
    # One row per rank, actions "<virtual stage><TYPE><mb>" (schedule_io.h).
    assert schedule.to_string("pytorch-csv") == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def test_text_rows_match_ops(unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    rows = [line for line in schedule.to_string("text").splitlines()
            if line.startswith("stage ") and " | " in line]
    assert rows == [f"stage {d} | " + " ".join(str(op) for op in schedule.ops(d))
                    for d in range(4)]


def test_json_round_trip_through_a_file(tmp_path, unit):
    schedule = po.compile(family="group-interleaved", offload="po-f", stages=4,
                          microbatches=8, chunks=2, costs=unit)
    path = tmp_path / "s.json"
    schedule.write(path)
    assert path.read_text() == schedule.to_string("json")
    loaded = po.load(path)
    assert all_ops(loaded) == all_ops(schedule)
    assert loaded.spec == schedule.spec
    # The file keeps the compiler's predictions, doubles bit for bit.
    assert loaded.predictions == schedule.predictions


def test_csv_round_trips(tmp_path, unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    # Compute only: the reader inserts the same comm ops the compiler did.
    path = tmp_path / "s.csv"
    schedule.write(path, "pytorch-csv")
    assert all_ops(po.load(path, "pytorch-csv", stages=4)) == all_ops(schedule)
    # With comm actions: kept as they are.
    text = schedule.to_string("pytorch-csv-comms")
    parsed = po.parse(text, "pytorch-csv-comms", stages=4)
    assert all_ops(parsed) == all_ops(schedule)
    assert parsed.predictions is None  # a CSV carries none


def test_trace_has_one_process_per_stage_and_an_event_per_op(unit):
    schedule = po.compile(stages=2, microbatches=2, costs=unit)
    trace = json.loads(schedule.to_string("trace"))
    events = trace["traceEvents"]
    processes = sorted(e["args"]["name"] for e in events
                       if e.get("ph") == "M" and e.get("name") == "process_name")
    assert processes == ["stage 0", "stage 1"]
    # Without offload every op occupies an engine (compute, send or recv), so each has an
    # "X" event named as the text form prints it.
    names = sorted(e["name"] for e in events if e.get("ph") == "X")
    assert names == sorted(str(op) for d in range(2) for op in schedule.ops(d))


def test_svg_draws_one_block_per_compute_op(unit):
    schedule = po.compile(stages=2, microbatches=4, costs=unit)
    svg = schedule.to_string("svg")
    assert svg.startswith("<?xml") and "\n<svg " in svg and '<g id="stage-1">' in svg
    # timeline_svg.h: every compute op is one <rect> whose class is its kind.
    for kind in ("F", "B"):
        drawn = svg.count(f'<rect class="{kind}"')
        assert drawn == sum(op.kind == kind for d in range(2) for op in schedule.ops(d)) == 8
