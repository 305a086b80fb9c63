/* po_pipeline from C99 (c_api.h, "running a pipeline with C callbacks"): a toy pipeline whose
 * virtual stage l computes y = a_l * x elementwise, with a loss 0.5 * |y - t|^2 at the end, on
 * the CPU backend under 1F1B, po-h, po-f, a split W and group-interleaved po-f. Each checks
 * every gradient and input gradient bitwise against a straight-line computation here, the
 * measured stash peaks and offloaded bytes against the compiler's predictions, the callback
 * order; then failing callbacks (their code and message surface as the run's) and bad options.
 *
 * usage: c_api_stage_test          (CPU; CTest "c_api_stage")
 *        c_api_stage_test --cuda   (PO_BACKEND_CUDA smoke run; exits 77, "skipped", where the
 *                                   library has no CUDA or the machine no GPU) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeoffload/c_api.h"
#include "tests/c_api/expect.h"
#include "tests/c_api/toy_model.h"

typedef struct Rig {
  Toy toys[kMaxStages];
  po_stage_callbacks callbacks[kMaxStages];
  Results results;
} Rig;

/* Nonzero: InitRig's toys read their lean blocks in place (Toy::backward_reads_lean). */
static int32_t ToysReadLean = 0;

static void InitRig(Rig* rig, int32_t p, int32_t v, int32_t split, int32_t backend) {
  int32_t d;
  memset(rig, 0, sizeof(*rig));
  for (d = 0; d < p; ++d) {
    ToyInit(&rig->toys[d], d, p, v, split, &rig->results);
    rig->toys[d].device_buffers = backend == PO_BACKEND_CUDA;
    rig->toys[d].backward_reads_lean = ToysReadLean;
    ToyCallbacks(&rig->toys[d], &rig->callbacks[d]);
  }
}

static int32_t IterationsSeen = 0;
static po_status CountIteration(void* user, int32_t iteration, po_callback_error* error) {
  (void)error;
  EXPECT(iteration == *(int32_t*)user);
  *(int32_t*)user = iteration + 1;
  return PO_OK;
}

/* What CheckRun saw, per iteration over every stage. */
typedef struct RunSummary {
  int64_t offloaded_bytes;
  int64_t recompute_ops;   /* RECOMPUTE and RECOMPUTE_LEAN */
  int64_t lean_ops;        /* RECOMPUTE_LEAN */
  int64_t peak_bytes[kMaxStages];
} RunSummary;

/* Counts the recompute ops of `stage`'s program into `summary`; returns the stage's count. */
static int64_t CountRecompute(const po_schedule* schedule, int32_t stage, RunSummary* summary) {
  po_op ops[4096];
  size_t count = 0, i;
  int64_t found = 0;
  EXPECT_OK(po_schedule_num_ops(schedule, stage, &count));
  EXPECT(count <= sizeof(ops) / sizeof(ops[0]));
  if (count > sizeof(ops) / sizeof(ops[0])) return 0;
  EXPECT_OK(po_schedule_ops(schedule, stage, 0, count, ops));
  for (i = 0; i < count; ++i) {
    const int32_t lean = ops[i].kind == PO_OP_RECOMPUTE_LEAN;
    if (ops[i].kind != PO_OP_RECOMPUTE && !lean) continue;
    ++found;
    summary->lean_ops += lean;
  }
  summary->recompute_ops += found;
  return found;
}

/* Runs `given` (NULL: `spec`, compiled at open; else `spec` is its po_schedule_spec) for two
 * iterations and checks results, callback counts, peaks and bytes. */
static RunSummary CheckRunOf(const po_spec* spec, const po_schedule* given, int32_t backend) {
  const int32_t p = spec->num_stages, v = spec->chunks_per_stage, m = spec->num_microbatches;
  Rig* rig = (Rig*)malloc(sizeof(Rig));
  Results* expected = (Results*)calloc(1, sizeof(Results));
  po_pipeline_options options;
  po_pipeline* pipeline = NULL;
  po_schedule* schedule = NULL;
  po_predictions* predictions = NULL;
  RunSummary summary;
  int32_t d, stages = 0;
  memset(&summary, 0, sizeof(summary));
  InitRig(rig, p, v, spec->split_backward, backend);
  po_pipeline_options_init(&options);
  options.spec = given == NULL ? spec : NULL;
  options.schedule = given;
  options.backend = backend;
  EXPECT_OK(po_pipeline_open(rig->callbacks, p, &options, &pipeline));
  IterationsSeen = 0;
  EXPECT_OK(po_pipeline_run(pipeline, 2, CountIteration, &IterationsSeen));
  EXPECT(IterationsSeen == 2);
  EXPECT_OK(po_pipeline_num_stages(pipeline, &stages));
  EXPECT(stages == p);
  EXPECT_OK(po_pipeline_schedule(pipeline, &schedule));
  EXPECT_OK(po_schedule_predictions(schedule, &predictions));
  for (d = 0; d < p && predictions != NULL; ++d) {
    po_stage_prediction predicted;
    int32_t it;
    const int64_t leans_before = summary.lean_ops;
    const int64_t recomputes = CountRecompute(schedule, d, &summary);
    /* A lean entry read in place gets no recompute call (unsplit only: the toy's answer). */
    const int64_t silent =
        ToysReadLean && !spec->split_backward ? summary.lean_ops - leans_before : 0;
    predicted.struct_size = sizeof(predicted);
    EXPECT_OK(po_predictions_stage(predictions, d, &predicted));
    for (it = 0; it < 2; ++it) {
      po_iteration_stats stats;
      stats.struct_size = sizeof(stats);
      EXPECT_OK(po_pipeline_stats(pipeline, it, d, &stats));
      EXPECT(stats.stage == d);
      EXPECT(stats.stash_high_water_bytes == predicted.peak_bytes);
      EXPECT(stats.offloaded_bytes == predicted.offloaded_bytes);
      EXPECT(stats.reloaded_bytes == predicted.offloaded_bytes);
      EXPECT(stats.end_time >= stats.start_time);
      EXPECT(stats.recompute_seconds >= 0 && stats.recompute_seconds <= stats.compute_seconds);
      EXPECT(recomputes > 0 || stats.recompute_seconds == 0);
    }
    summary.offloaded_bytes += predicted.offloaded_bytes;
    summary.peak_bytes[d] = predicted.peak_bytes;
    /* F and B of every (mb, chunk), W too when split, and each RECOMPUTE* not read in place,
     * in each of 2 iterations; a recomputed entry's F is its forward_retaining call. */
    EXPECT(rig->toys[d].calls ==
           2 * (m * v * (spec->split_backward ? 3 : 2) + recomputes - silent));
    EXPECT(rig->toys[d].recompute_calls == 2 * (2 * recomputes - silent));
    EXPECT(backend != PO_BACKEND_CPU || rig->toys[d].streams_seen == 0);
    EXPECT(backend == PO_BACKEND_CPU || rig->toys[d].streams_seen != 0);
  }
  if (backend == PO_BACKEND_CPU) {
    ToyReference(p * v, m, expected);
    EXPECT(memcmp(expected->weight_grad, rig->results.weight_grad,
                  sizeof(expected->weight_grad)) == 0);
    EXPECT(memcmp(expected->input_grad, rig->results.input_grad,
                  sizeof(expected->input_grad)) == 0);
    EXPECT(memcmp(expected->loss_input, rig->results.loss_input,
                  sizeof(expected->loss_input)) == 0);
  }
  po_predictions_free(predictions);
  po_schedule_free(schedule);
  po_pipeline_free(pipeline);
  free(expected);
  free(rig);
  return summary;
}

static RunSummary CheckRun(const po_spec* spec, int32_t backend) {
  return CheckRunOf(spec, NULL, backend);
}

static void TestSchedules(void) {
  const po_spec one_f_one_b = ToySpec("1f1b", "none", 2, 4, 1, 0);
  const po_spec half = ToySpec("1f1b", "po-h", 4, 8, 1, 0);
  const po_spec full = ToySpec("1f1b", "po-f", 4, 8, 1, 0);
  const po_spec split = ToySpec("1f1b", "po-f", 2, 4, 1, 1);
  const po_spec interleaved = ToySpec("group-interleaved", "po-f", 2, 4, 2, 0);
  EXPECT(CheckRun(&one_f_one_b, PO_BACKEND_CPU).offloaded_bytes == 0);
  EXPECT(CheckRun(&half, PO_BACKEND_CPU).offloaded_bytes > 0);
  EXPECT(CheckRun(&full, PO_BACKEND_CPU).offloaded_bytes >
         CheckRun(&half, PO_BACKEND_CPU).offloaded_bytes);
  CheckRun(&split, PO_BACKEND_CPU);
  EXPECT(CheckRun(&interleaved, PO_BACKEND_CPU).offloaded_bytes > 0);
}

/* Recompute (issue 15) through the callbacks: full and lean on 1F1B, split and interleaved,
 * and auto allowed to recompute under a budget po-f alone cannot meet. CheckRun holds each to
 * the straight-line results bitwise (so to no recompute) and its stash peaks to the
 * predictions; here, every entry is recomputed in the mode asked, and stage 0 (which holds the
 * most entries) needs less than without recompute. */
static void TestRecompute(void) {
  const char* modes[] = {"full", "lean"};
  int32_t i, split;
  for (split = 0; split <= 1; ++split) {
    const po_spec kept = ToySpec("1f1b", "none", 4, 8, 1, split);
    const RunSummary plain = CheckRun(&kept, PO_BACKEND_CPU);
    EXPECT(plain.recompute_ops == 0);
    for (i = 0; i < 2; ++i) {
      po_spec spec = kept;
      RunSummary run;
      spec.recompute = modes[i];
      run = CheckRun(&spec, PO_BACKEND_CPU);
      EXPECT(run.recompute_ops == 4 * 8);
      EXPECT(run.lean_ops == (i == 1 ? 4 * 8 : 0));
      EXPECT(run.peak_bytes[0] < plain.peak_bytes[0]);
      EXPECT(run.offloaded_bytes == 0);
    }
  }
  {
    po_spec spec = ToySpec("interleaved", "none", 2, 4, 2, 0);
    spec.recompute = "lean";
    spec.recompute_chunks = 1; /* chunk 0's entries only */
    EXPECT(CheckRun(&spec, PO_BACKEND_CPU).recompute_ops == 2 * 4);
  }
  {
    /* auto with every choice per entry, under unit costs whose transfers take as long as
     * F + B + W (k = 1) and a budget of 0.4 of 1F1B's peak (2 entries of 1 MiB): the planner
     * mixes offload, lean and full recompute (measured: interleaved v=4, 54 lean and 10 full
     * recomputes, the lean blocks offloaded); the toy then runs that plan. */
    po_spec spec = ToySpec("1f1b", "auto", 2, 8, 1, 0);
    po_cost_options unit;
    po_schedule* schedule = NULL;
    po_spec planned;
    po_cost_options_init(&unit);
    unit.unit_costs = 1;
    unit.offload_ratio = 1.0;
    spec.recompute = "full";
    spec.memory_budget_bytes = (int64_t)(0.4 * 2 * 1048576);
    EXPECT_OK(po_schedule_compile(&spec, &unit, &schedule));
    planned.struct_size = sizeof(planned);
    EXPECT_OK(po_schedule_spec(schedule, &planned));
    EXPECT(planned.num_stages * planned.chunks_per_stage <= kMaxVirtual);
    if (schedule != NULL && planned.num_stages * planned.chunks_per_stage <= kMaxVirtual) {
      const RunSummary run = CheckRunOf(&planned, schedule, PO_BACKEND_CPU);
      EXPECT(run.lean_ops > 0 && run.recompute_ops > run.lean_ops);
      EXPECT(run.offloaded_bytes > 0);
    }
    po_schedule_free(schedule);
  }
}

/* The run of a 2-stage 1F1B pipeline whose stage 1 fails the op (kind, mb=1) with `code` and
 * `message`; expects the run to fail with `expected_code` and exactly `expected`. */
static void CheckFailure(int32_t kind, po_status code, const char* message,
                         po_status expected_code, const char* expected) {
  const po_spec spec = ToySpec("1f1b", "none", 2, 4, 1, 0);
  Rig* rig = (Rig*)malloc(sizeof(Rig));
  po_pipeline_options options;
  po_pipeline* pipeline = NULL;
  po_iteration_stats stats;
  InitRig(rig, 2, 1, 0, PO_BACKEND_CPU);
  rig->toys[1].fail_kind = kind;
  rig->toys[1].fail_mb = 1;
  rig->toys[1].fail_code = code;
  rig->toys[1].fail_message = message;
  po_pipeline_options_init(&options);
  options.spec = &spec;
  options.wait_timeout_seconds = 2.0; /* stage 0 then stops waiting for stage 1 */
  EXPECT_OK(po_pipeline_open(rig->callbacks, 2, &options, &pipeline));
  if (pipeline != NULL) {
    EXPECT_ERROR(po_pipeline_run(pipeline, 1, NULL, NULL), expected_code, expected);
    stats.struct_size = sizeof(stats);
    EXPECT_ERROR(po_pipeline_stats(pipeline, 0, 0, &stats), PO_ERROR_OUT_OF_RANGE,
                 "po_pipeline_stats: iteration (of the last run's finished ones) 0 is out of "
                 "range [0, 0)");
    EXPECT_ERROR(po_pipeline_run(pipeline, 1, NULL, NULL), PO_ERROR_FAILED_PRECONDITION,
                 "po_pipeline_run: an earlier run of this pipeline failed, and messages of "
                 "that iteration may still sit between its stages; free it and open a new one");
  }
  po_pipeline_free(pipeline);
  free(rig);
}

static po_status RefuseIteration(void* user, int32_t iteration, po_callback_error* error) {
  (void)user;
  (void)iteration;
  po_callback_error_set(error, "optimizer diverged");
  return PO_ERROR_FAILED_PRECONDITION;
}

static void TestCallbackFailures(void) {
  const po_spec spec = ToySpec("1f1b", "none", 2, 4, 1, 0);
  Rig rig;
  po_pipeline_options options;
  po_pipeline* pipeline = NULL;
  po_iteration_stats stats;
  CheckFailure(PO_OP_FORWARD, PO_ERROR_INVALID_ARGUMENT, "toy: mb 1 refused",
               PO_ERROR_INVALID_ARGUMENT,
               "po_pipeline_run: iteration 0: stage 1, F1.0: forward callback: toy: mb 1 "
               "refused");
  CheckFailure(PO_OP_BACKWARD, PO_ERROR_RESOURCE_EXHAUSTED, NULL, PO_ERROR_RESOURCE_EXHAUSTED,
               "po_pipeline_run: iteration 0: stage 1, B1.0: backward callback: failed with "
               "RESOURCE_EXHAUSTED and no message (po_callback_error_set gives one)");
  CheckFailure(PO_OP_FORWARD, 1234, "odd", PO_ERROR_UNKNOWN,
               "po_pipeline_run: iteration 0: stage 1, F1.0: forward callback: odd (status "
               "1234, not a po_status)");
  /* on_iteration's error fails the run after iteration 0, whose stats stay readable. */
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  po_pipeline_options_init(&options);
  options.spec = &spec;
  EXPECT_OK(po_pipeline_open(rig.callbacks, 2, &options, &pipeline));
  EXPECT_ERROR(po_pipeline_run(pipeline, 3, RefuseIteration, NULL), PO_ERROR_FAILED_PRECONDITION,
               "po_pipeline_run: iteration 0: on_iteration callback: optimizer diverged");
  stats.struct_size = sizeof(stats);
  EXPECT_OK(po_pipeline_stats(pipeline, 0, 1, &stats));
  EXPECT(rig.toys[1].calls == 8);
  EXPECT_OK(po_pipeline_run(pipeline, 1, NULL, NULL)); /* nothing broke: it may run again */
  po_pipeline_free(pipeline);
}

/* po_pipeline_open of `rig` (2 stages) with `options`: must fail with `code` and `message`. */
static void ExpectOpenError(Rig* rig, int32_t p, const po_pipeline_options* options,
                            po_status code, const char* message, int line) {
  po_pipeline* pipeline = (po_pipeline*)1; /* must come back NULL */
  const po_status got = po_pipeline_open(rig->callbacks, p, options, &pipeline);
  ExpectError(got, code, message, "po_pipeline_open", __FILE__, line);
  EXPECT(pipeline == NULL);
}
#define EXPECT_OPEN_ERROR(rig, p, options, code, message) \
  ExpectOpenError((rig), (p), (options), (code), (message), __LINE__)

/* Lean blocks B reads in place (backward_reads_retained): no recompute call for them, backward
 * gets the retained-block arguments (the toy checks them), the results are the straight
 * line's bit for bit and every stash peak the prediction (CheckRun), and the planner knows:
 * stage 0's peak is lower than with the lean rebuild, and no stage's is higher. With W split the
 * toy says no, and nothing changes. */
static void TestRecomputeInPlace(void) {
  const char* offloads[] = {"none", "po-f"};
  int32_t i, d;
  for (i = 0; i < 2; ++i) {
    po_spec spec = ToySpec("1f1b", offloads[i], 4, 8, 1, 0);
    po_spec interleaved = ToySpec("interleaved", offloads[i], 2, 4, 2, 0);
    RunSummary rebuilt, read;
    spec.recompute = "lean";
    interleaved.recompute = "lean";
    rebuilt = CheckRun(&spec, PO_BACKEND_CPU);
    ToysReadLean = 1;
    read = CheckRun(&spec, PO_BACKEND_CPU);
    CheckRun(&interleaved, PO_BACKEND_CPU);
    ToysReadLean = 0;
    EXPECT(read.lean_ops == 4 * 8 && rebuilt.lean_ops == read.lean_ops);
    EXPECT(read.peak_bytes[0] < rebuilt.peak_bytes[0]);
    for (d = 0; d < 4; ++d) EXPECT(read.peak_bytes[d] <= rebuilt.peak_bytes[d]);
  }
  {
    po_spec split = ToySpec("1f1b", "none", 2, 4, 1, 1);
    RunSummary rebuilt, read;
    split.recompute = "lean";
    rebuilt = CheckRun(&split, PO_BACKEND_CPU);
    ToysReadLean = 1;
    read = CheckRun(&split, PO_BACKEND_CPU);
    ToysReadLean = 0;
    EXPECT(read.peak_bytes[0] == rebuilt.peak_bytes[0] &&
           read.peak_bytes[1] == rebuilt.peak_bytes[1]);
  }
}

/* Recompute the callbacks do not offer: open fails before anything runs, naming what is
 * missing; a table of the first release's size (no recompute fields) reads as not offering. */
static void TestRecomputeRefused(void) {
  po_spec spec = ToySpec("1f1b", "none", 2, 4, 1, 0);
  po_spec one = ToySpec("1f1b", "none", 1, 2, 1, 0);
  po_pipeline_options options;
  Rig rig;
  po_pipeline_options_init(&options);
  options.spec = &spec;
  spec.recompute = "full";
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[1].recompute = NULL;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[1]: set all of retained_bytes, "
                    "forward_retaining and recompute, or none (2 of 3 are set)");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[1].retained_bytes = NULL;
  rig.callbacks[1].forward_retaining = NULL;
  rig.callbacks[1].recompute = NULL;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: stage 0: setup (schedule) failed on every rank: "
                    "recompute full: the cost model offers it for no entry of chunk 0 on stage "
                    "1 (retained_full_bytes is 0 there); give the retained bytes or choose "
                    "another mode");
  ToysReadLean = 1;
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  ToysReadLean = 0;
  rig.callbacks[0].retained_bytes = NULL;
  rig.callbacks[0].forward_retaining = NULL;
  rig.callbacks[0].recompute = NULL;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[0]: backward_reads_retained is set "
                    "without the recompute callbacks (retained_bytes, forward_retaining, "
                    "recompute); it only says how B reads what they keep");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  spec.recompute = "half";
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_spec.recompute: unknown recompute mode \"half\"; "
                    "expected none, lean or full");
  spec.recompute = "lean";
  spec.reserved = 1;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_spec.reserved must be 0 (got 1)");
  /* One stage: the table's stride does not matter, so it can claim the first release's size.
   * A group of one has no other rank to tell apart, so the error says "setup (...) failed:". */
  one.recompute = "lean";
  options.spec = &one;
  InitRig(&rig, 1, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[0].struct_size = 56;
  EXPECT_OPEN_ERROR(&rig, 1, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: stage 0: setup (schedule) failed: "
                    "recompute lean: the cost model offers it for no entry of chunk 0 on stage "
                    "0 (retained_lean_bytes is 0 there); give the retained bytes or choose "
                    "another mode");
  /* A compiled schedule that recomputes (unit costs offer both modes) is refused by the
   * runtime, naming the op. */
  {
    po_cost_options unit;
    po_schedule* schedule = NULL;
    po_pipeline* pipeline = NULL;
    po_cost_options_init(&unit);
    unit.unit_costs = 1;
    EXPECT_OK(po_schedule_compile(&one, &unit, &schedule));
    po_pipeline_options_init(&options);
    options.schedule = schedule;
    EXPECT_ERROR_PREFIX(po_pipeline_open(rig.callbacks, 1, &options, &pipeline),
                        PO_ERROR_FAILED_PRECONDITION,
                        "po_pipeline_open: stage 0: setup (schedule) failed: "
                        "executor: stage 0, op 1 (RECOMPUTE_LEAN0.0): the program recomputes "
                        "chunk 0 with mode lean, but the model's RetainedBytes(chunk 0, lean) "
                        "is -1 (the model does not offer it)");
    EXPECT(pipeline == NULL);
    po_schedule_free(schedule);
  }
}

static void TestBadOptions(void) {
  const po_spec spec = ToySpec("1f1b", "none", 2, 4, 1, 0);
  const po_spec split = ToySpec("1f1b", "none", 2, 4, 1, 1);
  Rig rig;
  po_pipeline_options options;
  po_pipeline* pipeline = NULL;
  po_schedule* schedule = NULL;
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  po_pipeline_options_init(&options);
  options.spec = &spec;
  EXPECT_ERROR(po_pipeline_open(NULL, 2, &options, &pipeline), PO_ERROR_INVALID_ARGUMENT,
               "po_pipeline_open: callbacks is NULL");
  EXPECT_OPEN_ERROR(&rig, 0, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: num_stages must be >= 1 (got 0)");
  EXPECT_OPEN_ERROR(&rig, 4, &options, PO_ERROR_FAILED_PRECONDITION,
                    "po_pipeline_open: the schedule has 2 stages but 4 callback tables were "
                    "given (one per stage)");
  EXPECT_OPEN_ERROR(&rig, 2, NULL, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_pipeline_options: give exactly one of spec, schedule "
                    "and schedule_file (got 0)");
  options.schedule_file = "s.json";
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_pipeline_options: give exactly one of spec, schedule "
                    "and schedule_file (got 2)");
  options.schedule_file = NULL;
  options.struct_size = sizeof(options) + 8;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_pipeline_options.struct_size is 72 but this library "
                    "(" PO_EXPECTED_VERSION ") knows 64 bytes of it: the caller's header is "
                    "newer than the library");
  options.struct_size = sizeof(options);
  options.backend = 7;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_pipeline_options.backend: unknown backend 7; "
                    "expected PO_BACKEND_CPU (0) or PO_BACKEND_CUDA (1)");
  options.backend = PO_BACKEND_CPU;
  rig.callbacks[0].struct_size = rig.callbacks[1].struct_size = 8;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: stage 0: po_stage_callbacks.struct_size is 8, below the "
                    "56 bytes of its first release; call po_stage_callbacks_init (or set it to "
                    "sizeof)");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[1].struct_size = 48;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[1].struct_size is 48 but [0]'s is "
                    "88; every table of the array has the caller's sizeof");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[1].forward = NULL;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[1].forward is NULL");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[0].saved_bytes = NULL;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[0].saved_bytes is NULL");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[1].boundary_bytes = 4;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[1].boundary_bytes is 4 but stage 0's "
                    "is 256; every stage passes activations of one size");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.callbacks[0].reserved = 1;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[0].reserved must be 0 (got 1)");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU);
  rig.toys[1].saved_bytes_answer = -4;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: stage 1: saved_bytes callback returned -4 for chunk 0 "
                    "(split_backward 0); a stash entry must be > 0 bytes");
  InitRig(&rig, 2, 1, 0, PO_BACKEND_CPU); /* no backward_weight, but the schedule splits W */
  options.spec = &split;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_INVALID_ARGUMENT,
                    "po_pipeline_open: po_stage_callbacks[0].backward_weight is NULL, but the "
                    "schedule splits W");
  options.spec = &spec;
  options.arena_budget_bytes = 64;
  EXPECT_ERROR_PREFIX(po_pipeline_open(rig.callbacks, 2, &options, &pipeline),
                      PO_ERROR_RESOURCE_EXHAUSTED, "po_pipeline_open: ");
  options.arena_budget_bytes = 0;
  /* A schedule handle of another stage count; then the right one opens. */
  schedule = NULL;
  {
    po_spec four = ToySpec("1f1b", "none", 4, 4, 1, 0);
    EXPECT_OK(po_schedule_compile(&four, NULL, &schedule));
  }
  options.spec = NULL;
  options.schedule = schedule;
  EXPECT_OPEN_ERROR(&rig, 2, &options, PO_ERROR_FAILED_PRECONDITION,
                    "po_pipeline_open: the schedule has 4 stages but 2 callback tables were "
                    "given (one per stage)");
  po_schedule_free(schedule);
  EXPECT_OK(po_schedule_compile(&spec, NULL, &schedule));
  options.schedule = schedule;
  EXPECT_OK(po_pipeline_open(rig.callbacks, 2, &options, &pipeline));
  po_schedule_free(schedule); /* the pipeline keeps its own copy */
  EXPECT_OK(po_pipeline_run(pipeline, 1, NULL, NULL));
  EXPECT_ERROR(po_pipeline_run(pipeline, 0, NULL, NULL), PO_ERROR_INVALID_ARGUMENT,
               "po_pipeline_run: num_iterations must be >= 1 (got 0)");
  EXPECT_ERROR(po_pipeline_run(NULL, 1, NULL, NULL), PO_ERROR_INVALID_ARGUMENT,
               "po_pipeline_run: pipeline is NULL");
  {
    po_iteration_stats stats;
    stats.struct_size = sizeof(stats);
    EXPECT_ERROR(po_pipeline_stats(pipeline, 0, 2, &stats), PO_ERROR_OUT_OF_RANGE,
                 "po_pipeline_stats: stage 2 is out of range [0, 2)");
    stats.struct_size = 4;
    EXPECT_ERROR_PREFIX(po_pipeline_stats(pipeline, 0, 0, &stats), PO_ERROR_INVALID_ARGUMENT,
                        "po_pipeline_stats: po_iteration_stats.struct_size is 4, below the 96");
  }
  po_pipeline_free(pipeline);
  po_pipeline_free(NULL);
}

/* PO_BACKEND_CUDA: the callbacks compute nothing (C has no kernels here); the run still moves
 * every stash entry through device memory, pinned host memory and back. */
static int RunCuda(void) {
  const po_spec spec = ToySpec("1f1b", "po-f", 4, 8, 1, 0);
  Rig rig;
  po_pipeline_options options;
  po_pipeline* pipeline = NULL;
  po_status status;
  InitRig(&rig, 4, 1, 0, PO_BACKEND_CUDA);
  po_pipeline_options_init(&options);
  options.spec = &spec;
  options.backend = PO_BACKEND_CUDA;
  status = po_pipeline_open(rig.callbacks, 4, &options, &pipeline);
  if (status == PO_ERROR_UNIMPLEMENTED || status == PO_ERROR_FAILED_PRECONDITION) {
    printf("skipped: %s\n", po_last_error_message());
    return 77;
  }
  po_pipeline_free(pipeline);
  (void)CheckRun(&spec, PO_BACKEND_CUDA);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--cuda") == 0) {
    if (RunCuda() == 77) return 77;
  } else {
    TestSchedules();
    TestRecompute();
    TestRecomputeInPlace();
    TestRecomputeRefused();
    TestCallbackFailures();
    TestBadOptions();
  }
  if (failures > 0) {
    fprintf(stderr, "c_api_stage_test: %d failed expectations\n", failures);
    return 1;
  }
  printf("c_api_stage_test: all expectations held\n");
  return 0;
}
