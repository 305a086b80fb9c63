"""Bad input becomes an exception carrying the library's message, never a crash."""
import pytest

import pipeoffload as po

MISSING_B = ('{"format": "pipeoffload.schedule/1", "spec": {"family": "1f1b", "stages": 1, '
             '"microbatches": 1, "chunks": 1}, "stages": [{"stage": 0, "ops": '
             '[{"op": "F", "mb": 0, "chunk": 0}]}]}')


def test_unknown_family_is_a_value_error():
    with pytest.raises(po.InvalidArgumentError) as info:
        po.compile(family="2f2b")
    assert isinstance(info.value, ValueError)
    assert info.value.code == 3 and info.value.code_name == "INVALID_ARGUMENT"
    assert info.value.message == ('po_schedule_compile: po_spec.family: unknown family '
                                  '"2f2b"; expected 1f1b, interleaved or group-interleaved')


def test_the_compilers_own_message_comes_through(unit):
    with pytest.raises(po.InvalidArgumentError) as info:
        po.compile(family="interleaved", stages=4, microbatches=6, chunks=2, costs=unit)
    assert info.value.message == (
        "po_schedule_compile: interleaved needs num_microbatches % num_stages == 0 (m=6, p=4); "
        "use m=4 or 8, or group-interleaved, which takes any m")


def test_bad_cost_override_names_the_field():
    with pytest.raises(po.InvalidArgumentError,
                       match=r"^po_schedule_compile: po_cost_options.cost_model_json: .*"
                             r"forward_tme"):
        po.compile(stages=2, microbatches=2, costs=po.Costs(overrides={"forward_tme": 1}))


def test_auto_without_a_fitting_plan(unit):
    with pytest.raises(po.ResourceExhaustedError) as info:
        po.compile(stages=4, microbatches=8, offload="auto", memory_budget_bytes=1, costs=unit)
    assert info.value.message.startswith(
        "po_schedule_compile: auto offload: no plan fits memory_budget_bytes=1 per stage; ")


def test_stage_out_of_range_is_an_index_error(unit):
    schedule = po.compile(stages=4, microbatches=8, costs=unit)
    with pytest.raises(IndexError) as info:
        schedule.ops(4)
    assert isinstance(info.value, po.OutOfRangeError)
    assert info.value.message == "po_schedule_num_ops: stage 4 is out of range [0, 4)"
    with pytest.raises(po.OutOfRangeError, match=r"stage -1 is out of range \[0, 4\)$"):
        schedule.ops(-1)


def test_invalid_schedule_names_the_invariant():
    with pytest.raises(po.FailedPreconditionError) as info:
        po.parse(MISSING_B)
    assert info.value.message.startswith(
        "po_schedule_parse: Validate: invariant 2 (completeness) violated at stage 0, op 0 "
        "(F0.0): missing B: B0.0 never runs on this stage")


def test_files(tmp_path, unit):
    with pytest.raises(po.NotFoundError) as info:
        po.load(tmp_path / "missing.json")
    assert info.value.message == (f"po_schedule_load: cannot open '{tmp_path}/missing.json': "
                                  "No such file or directory")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pipeoffload.schedule/1", "spec": 3}')
    with pytest.raises(po.InvalidArgumentError) as info:
        po.load(bad)
    assert info.value.message == (f"po_schedule_load: {bad}: spec: expected an object, got the "
                                  "integer 3")
    schedule = po.compile(stages=2, microbatches=2, costs=unit)
    with pytest.raises(po.NotFoundError, match="^po_schedule_write: cannot create "):
        schedule.write(tmp_path / "no" / "such" / "dir.json")


def test_formats_and_csv_options(unit):
    schedule = po.compile(stages=2, microbatches=2, costs=unit)
    with pytest.raises(po.InvalidArgumentError, match="unknown format 'svgz'; expected one of "
                                                      "json, text, pytorch-csv"):
        schedule.to_string("svgz")
    with pytest.raises(po.InvalidArgumentError,
                       match=r"po_load_options.num_stages must be >= 1 for a PyTorch CSV"):
        po.parse("0F0,0B0\n", "pytorch-csv")
    with pytest.raises(po.InvalidArgumentError, match="cannot be read back"):
        po.parse("stage 0 | F0.0", "text")


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword 'stage'"):
        po.compile(stage=4)
