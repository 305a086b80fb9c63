"""pipeoffload.LocalPipeline: the toy pipeline of tests/c_api/c_api_stage_test.c driven by
Python callbacks on the CPU backend (virtual stage l computes y = a_l * x elementwise, the loss
is 0.5 * |y - t|^2), checked bitwise against a straight-line computation, stash peaks and bytes
against the compiler's predictions; then exceptions in callbacks and bad models."""
import ctypes
import gc

import pytest

import pipeoffload as po

WIDTH = 16
FLOAT = ctypes.sizeof(ctypes.c_float)


def weight(l, i):
    return 1.0 + 0.01 * ((l + 1) * (i % 5))


def model_input(mb, i):
    return ((mb * 7 + i * 3) % 11) * 0.25 - 1.0


def target(i):
    return 0.5 * i / WIDTH


def f32(value):
    """`value` rounded to float32, as the callbacks store every number."""
    return ctypes.c_float(value).value


class Toy:
    """Stage `stage` of p: chunk c is virtual stage c * p + stage (loop placement). Records
    weight_grad[(l, mb)] and, on virtual stage 0, input_grad[mb]."""

    boundary_bytes = WIDTH * FLOAT

    def __init__(self, stage, num_stages, num_chunks, results):
        self.stage, self.p, self.v = stage, num_stages, num_chunks
        self.results = results
        self.calls = []

    def saved_bytes(self, chunk, split_backward):
        return (2 if split_backward else 1) * WIDTH * FLOAT  # x, and dy for W when split

    def _virtual(self, chunk):
        return chunk * self.p + self.stage

    def forward(self, call):
        self.calls.append(("F", call.mb, call.chunk))
        l = self._virtual(call.chunk)
        assert call.stream == 0 and call.saved_bytes >= WIDTH * FLOAT
        x = call.saved_array()
        source = call.input_array()
        for i in range(WIDTH):
            x[i] = model_input(call.mb, i) if source is None else source[i]
        out = call.output_array()
        if out is not None:
            for i in range(WIDTH):
                out[i] = weight(l, i) * x[i]

    def backward(self, call):
        self.calls.append(("B", call.mb, call.chunk))
        l = self._virtual(call.chunk)
        saved = call.saved_array()
        grad_output = call.input_array()
        dy = [grad_output[i] if grad_output is not None
              else f32(f32(weight(l, i) * saved[i]) - target(i)) for i in range(WIDTH)]
        grad_input = call.output_array()
        dx = [f32(weight(l, i) * dy[i]) for i in range(WIDTH)]
        if grad_input is not None:
            for i in range(WIDTH):
                grad_input[i] = dx[i]
        else:
            self.results["input_grad", call.mb] = dx
        if call.with_weight_grad:
            self.results["weight_grad", l, call.mb] = [f32(dy[i] * saved[i])
                                                       for i in range(WIDTH)]
        else:
            for i in range(WIDTH):
                saved[WIDTH + i] = dy[i]

    def backward_weight(self, call):
        self.calls.append(("W", call.mb, call.chunk))
        saved = call.saved_array()
        self.results["weight_grad", self._virtual(call.chunk), call.mb] = [
            f32(saved[WIDTH + i] * saved[i]) for i in range(WIDTH)]


def reference(num_virtual, m):
    """The same model as one straight line, with float32 rounding where the callbacks store."""
    results = {}
    for mb in range(m):
        xs = [[f32(model_input(mb, i)) for i in range(WIDTH)]]
        for l in range(num_virtual):
            xs.append([f32(weight(l, i) * xs[l][i]) for i in range(WIDTH)])
        dy = [f32(xs[num_virtual][i] - target(i)) for i in range(WIDTH)]
        for l in reversed(range(num_virtual)):
            results["weight_grad", l, mb] = [f32(dy[i] * xs[l][i]) for i in range(WIDTH)]
            dy = [f32(weight(l, i) * dy[i]) for i in range(WIDTH)]
        results["input_grad", mb] = dy
    return results


def toys(p, v, results, cls=Toy):
    return [cls(d, p, v, results) for d in range(p)]


SCHEDULES = [
    dict(family="1f1b", offload="none", stages=2, microbatches=4),
    dict(family="1f1b", offload="po-h", stages=4, microbatches=8),
    dict(family="1f1b", offload="po-f", stages=4, microbatches=8),
    dict(family="1f1b", offload="po-f", stages=2, microbatches=4, split_backward=True),
    dict(family="group-interleaved", offload="po-f", stages=2, microbatches=4, chunks=2),
]


@pytest.mark.parametrize("spec", SCHEDULES, ids=lambda s: f"{s['family']}-{s['offload']}-"
                         f"p{s['stages']}-split{int(s.get('split_backward', False))}")
def test_schedules_train_bitwise_with_predicted_peaks(spec):
    p, v, m = spec["stages"], spec.get("chunks", 1), spec["microbatches"]
    results = {}
    models = toys(p, v, results)
    seen = []
    with po.LocalPipeline(models, **spec) as pipeline:
        stats = pipeline.run(iterations=2, on_iteration=seen.append)
        predicted = pipeline.schedule.predictions
    assert seen == [0, 1]
    assert results == reference(p * v, m)
    for d, model in enumerate(models):
        for iteration in stats:
            assert iteration[d].stage == d
            assert iteration[d].stash_high_water_bytes == predicted.stages[d].peak_bytes
            assert iteration[d].offloaded_bytes == predicted.stages[d].offloaded_bytes
            assert iteration[d].reloaded_bytes == predicted.stages[d].offloaded_bytes
        compute_ops = 3 if spec.get("split_backward") else 2
        assert len(model.calls) == 2 * m * v * compute_ops
    offloaded = sum(stage.offloaded_bytes for stage in predicted.stages)
    assert (offloaded > 0) == (spec["offload"] != "none")


def test_run_local_pipeline_runs_a_given_schedule():
    schedule = po.compile(stages=2, microbatches=4, offload="po-f", costs=po.Costs.unit())
    results = {}
    stats = po.run_local_pipeline(toys(2, 1, results), iterations=1, schedule=schedule)
    assert len(stats) == 1 and [s.stage for s in stats[0]] == [0, 1]
    assert results == reference(2, 4)


def test_callbacks_stay_alive_without_references_of_the_callers():
    results = {}
    pipeline = po.LocalPipeline(toys(2, 1, results), stages=2, microbatches=4)
    gc.collect()  # the ctypes callback objects must be held by the pipeline itself
    pipeline.run()
    pipeline.close()
    assert results == reference(2, 4)


class FailingToy(Toy):
    def forward(self, call):
        if self.stage == 1 and call.mb == 1:
            raise ValueError("boom at mb 1")
        super().forward(call)


def test_an_exception_in_a_callback_is_the_runs_error_with_the_python_message():
    with po.LocalPipeline(toys(2, 1, {}, FailingToy), stages=2, microbatches=4,
                          wait_timeout_seconds=2.0) as pipeline:
        with pytest.raises(po.Error) as failure:
            pipeline.run()
        assert failure.value.code_name == "UNKNOWN"
        assert str(failure.value) == ("po_pipeline_run: iteration 0: stage 1, F1.0: forward "
                                      "callback: ValueError: boom at mb 1")
        assert isinstance(failure.value.__cause__, ValueError)
        with pytest.raises(po.FailedPreconditionError, match="an earlier run of this pipeline "
                                                             "failed"):
            pipeline.run()


def test_an_exception_in_on_iteration_stops_the_run():
    def diverged(iteration):
        raise RuntimeError(f"loss diverged after {iteration}")

    with po.LocalPipeline(toys(2, 1, {}), stages=2, microbatches=4) as pipeline:
        with pytest.raises(po.Error, match="^po_pipeline_run: iteration 0: on_iteration "
                                           "callback: RuntimeError: loss diverged after 0$"):
            pipeline.run(3, on_iteration=diverged)
        assert len(pipeline.run(1)) == 1  # the stages finished cleanly: it may run again


class NoBackward(Toy):
    backward = None


class BadSize(Toy):
    def saved_bytes(self, chunk, split_backward):
        if self.stage == 1:
            raise KeyError(chunk)
        return super().saved_bytes(chunk, split_backward)


def test_bad_models_are_refused_at_open_naming_the_stage():
    with pytest.raises(po.InvalidArgumentError,
                       match=r"^po_pipeline_open: po_stage_callbacks\[0\]\.backward is NULL$"):
        po.LocalPipeline(toys(2, 1, {}, NoBackward), stages=2, microbatches=4)
    with pytest.raises(po.InvalidArgumentError) as failure:
        po.LocalPipeline(toys(2, 1, {}, BadSize), stages=2, microbatches=4)
    assert str(failure.value).startswith("po_pipeline_open: stage 1: saved_bytes callback "
                                         "returned -1 for chunk 0")
    assert str(failure.value).endswith("(a callback raised KeyError: 0)")
    assert isinstance(failure.value.__cause__, KeyError)


class NoWeightGrad(Toy):
    backward_weight = None


def test_a_split_schedule_needs_backward_weight():
    with pytest.raises(po.InvalidArgumentError, match=r"backward_weight is NULL, but the "
                                                      r"schedule splits W"):
        po.LocalPipeline(toys(2, 1, {}, NoWeightGrad), stages=2, microbatches=4,
                         split_backward=True)


def test_bad_options_are_errors():
    with pytest.raises(po.FailedPreconditionError,
                       match="the schedule has 4 stages but 2 callback tables were given"):
        po.LocalPipeline(toys(2, 1, {}), stages=4, microbatches=4)
    with pytest.raises(po.InvalidArgumentError, match="give exactly one of spec, schedule"):
        po.LocalPipeline(toys(2, 1, {}))
    with pytest.raises(po.InvalidArgumentError, match="unknown backend 'tpu'"):
        po.LocalPipeline(toys(2, 1, {}), stages=2, microbatches=4, backend="tpu")
    with pytest.raises(TypeError, match="unexpected keyword 'stage'"):
        po.LocalPipeline(toys(2, 1, {}), stage=2)
    with pytest.raises(po.InvalidArgumentError, match="num_stages must be >= 1"):
        po.LocalPipeline([], stages=2, microbatches=4)


class RecomputingToy(Toy):
    """Toy whose entry also holds PAD floats derived from x (after x, and dy when split), so
    recompute saves memory: "full" keeps x, "lean" keeps x and the first half of the padding,
    and recompute() rebuilds the rest; backward checks the padding bitwise."""

    PAD = 4 * WIDTH

    def _pad_offset(self, split_backward):
        return (2 if split_backward else 1) * WIDTH

    def saved_bytes(self, chunk, split_backward):
        return super().saved_bytes(chunk, split_backward) + self.PAD * FLOAT

    def retained_bytes(self, chunk, mode, split_backward):
        kept = {"full": WIDTH, "lean": self._pad_offset(split_backward) + self.PAD // 2}
        return kept[mode] * FLOAT

    @staticmethod
    def _pad(x, k):
        return f32(2.0 * x[k % WIDTH] + k)

    def _fill_pad(self, entry, first, split_backward):
        offset = self._pad_offset(split_backward)
        for k in range(first, self.PAD):
            entry[offset + k] = self._pad(entry, k)

    def forward(self, call):
        super().forward(call)
        self._fill_pad(call.saved_array(), 0, call.saved_bytes > (WIDTH + self.PAD) * FLOAT)

    def forward_retaining(self, call):
        assert call.saved is None and call.kind == "F" and call.recompute in ("full", "lean")
        self.calls.append(("F", call.mb, call.chunk))
        l = self._virtual(call.chunk)
        # The full entry as forward would write it, then only its retained prefix.
        full = [0.0] * (call.saved_bytes // FLOAT)
        source = call.input_array()
        for i in range(WIDTH):
            full[i] = f32(model_input(call.mb, i)) if source is None else source[i]
        out = call.output_array()
        if out is not None:
            for i in range(WIDTH):
                out[i] = weight(l, i) * full[i]
        self._fill_pad(full, 0, call.saved_bytes > (WIDTH + self.PAD) * FLOAT)
        retained = call.retained_array()
        for i in range(len(retained)):
            retained[i] = full[i]

    def recompute(self, call):
        self.calls.append((call.kind, call.mb, call.chunk))
        assert call.kind == {"full": "RECOMPUTE", "lean": "RECOMPUTE_LEAN"}[call.recompute]
        split = call.saved_bytes > (WIDTH + self.PAD) * FLOAT
        saved, retained = call.saved_array(), call.retained_array()
        for i in range(len(retained)):
            saved[i] = retained[i]
        first = 0 if call.recompute == "full" else self.PAD // 2
        self._fill_pad(saved, first, split)

    def backward(self, call):
        saved = call.saved_array()
        offset = self._pad_offset(not call.with_weight_grad)
        wrong = [k for k in range(self.PAD) if saved[offset + k] != self._pad(saved, k)]
        assert not wrong, f"entry (mb {call.mb}, chunk {call.chunk}) padding differs at {wrong}"
        super().backward(call)
