/* The C ABI (include/pipeoffload/c_api.h) from C99: compile, inspect, every format, load,
 * simulate, and the error contract (codes, thread-local messages, NULL handles on failure).
 * Exact expectations come from the golden 1F1B schedule (tests/golden/1f1b_p4_m8.txt) and the
 * unit-cost makespans of reference/pipeoffload.md section 1.2.
 *
 * usage: c_api_test SCRATCH_DIR   (the round-trip files are written there) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeoffload/c_api.h"
#include "tests/c_api/expect.h"

static po_cost_options UnitCosts(void) {
  po_cost_options cost;
  po_cost_options_init(&cost);
  cost.unit_costs = 1;
  cost.offload_ratio = 0.25;
  return cost;
}

static po_schedule* Compile1F1B(int32_t p, int32_t m) {
  po_spec spec;
  po_cost_options cost = UnitCosts();
  po_schedule* schedule = NULL;
  po_spec_init(&spec);
  spec.num_stages = p;
  spec.num_microbatches = m;
  EXPECT_OK(po_schedule_compile(&spec, &cost, &schedule));
  return schedule;
}

/* Every op of every stage of `a` equals `b`'s, in order. */
static int SameOps(const po_schedule* a, const po_schedule* b) {
  int32_t stages_a = 0, stages_b = 0, d;
  if (po_schedule_num_stages(a, &stages_a) != PO_OK ||
      po_schedule_num_stages(b, &stages_b) != PO_OK || stages_a != stages_b) {
    return 0;
  }
  for (d = 0; d < stages_a; ++d) {
    size_t count_a = 0, count_b = 0, i;
    po_op* ops_a;
    po_op* ops_b;
    int same = 1;
    if (po_schedule_num_ops(a, d, &count_a) != PO_OK ||
        po_schedule_num_ops(b, d, &count_b) != PO_OK || count_a != count_b) {
      return 0;
    }
    ops_a = (po_op*)calloc(count_a + 1, sizeof(po_op));
    ops_b = (po_op*)calloc(count_b + 1, sizeof(po_op));
    if (po_schedule_ops(a, d, 0, count_a, ops_a) != PO_OK ||
        po_schedule_ops(b, d, 0, count_b, ops_b) != PO_OK) {
      same = 0;
    }
    for (i = 0; same && i < count_a; ++i) {
      same = ops_a[i].kind == ops_b[i].kind && ops_a[i].mb == ops_b[i].mb &&
             ops_a[i].chunk == ops_b[i].chunk && ops_a[i].peer == ops_b[i].peer;
      if (!same) fprintf(stderr, "stage %d op %zu differs\n", (int)d, i);
    }
    free(ops_a);
    free(ops_b);
    if (!same) return 0;
  }
  return 1;
}

static void TestVersionAndNames(void) {
  EXPECT(strcmp(po_version(), PO_EXPECTED_VERSION) == 0);
  EXPECT(po_c_api_version() == PO_C_API_VERSION);
  EXPECT(strcmp(po_status_name(PO_OK), "OK") == 0);
  EXPECT(strcmp(po_status_name(PO_ERROR_FAILED_PRECONDITION), "FAILED_PRECONDITION") == 0);
  EXPECT(strcmp(po_status_name(12345), "UNKNOWN") == 0);
  EXPECT(strcmp(po_op_kind_name(PO_OP_FORWARD), "F") == 0);
  EXPECT(strcmp(po_op_kind_name(PO_OP_SEND_ACTIVATION), "SEND_F") == 0);
  EXPECT(strcmp(po_op_kind_name(PO_OP_BARRIER), "BARRIER") == 0);
  EXPECT(strcmp(po_op_kind_name(PO_OP_RECOMPUTE), "RECOMPUTE") == 0);
  EXPECT(strcmp(po_op_kind_name(PO_OP_RECOMPUTE_LEAN), "RECOMPUTE_LEAN") == 0);
  EXPECT(po_op_kind_name(13) == NULL);
  EXPECT(po_op_kind_name(-1) == NULL);
}

/* Stage 0 of 1F1B p=4 m=8 (tests/golden/1f1b_p4_m8.txt, [lowered]): four warm-up forwards, each
 * sent on to stage 1, then the steady state starts with RECV_B0 B0 F4. */
static void TestOneFOneBOps(void) {
  static const po_op kFirstOps[] = {
      {PO_OP_FORWARD, 0, 0, -1},         {PO_OP_SEND_ACTIVATION, 0, 0, 1},
      {PO_OP_FORWARD, 1, 0, -1},         {PO_OP_SEND_ACTIVATION, 1, 0, 1},
      {PO_OP_FORWARD, 2, 0, -1},         {PO_OP_SEND_ACTIVATION, 2, 0, 1},
      {PO_OP_FORWARD, 3, 0, -1},         {PO_OP_SEND_ACTIVATION, 3, 0, 1},
      {PO_OP_RECV_GRAD, 0, 0, 1},        {PO_OP_BACKWARD, 0, 0, -1},
      {PO_OP_FORWARD, 4, 0, -1},         {PO_OP_SEND_ACTIVATION, 4, 0, 1}};
  const size_t kNumFirst = sizeof(kFirstOps) / sizeof(kFirstOps[0]);
  po_schedule* schedule = Compile1F1B(4, 8);
  po_op ops[12];
  po_op last;
  po_spec spec;
  int32_t stages = 0;
  size_t count = 0, total = 0, i, length = 0;
  char text[32];
  int32_t d;
  if (schedule == NULL) return;

  EXPECT_OK(po_schedule_num_stages(schedule, &stages));
  EXPECT(stages == 4);
  /* Stages 0 and 3 run F, B and one P2P op per F and per B (8 each); stages 1 and 2 two. */
  EXPECT_OK(po_schedule_num_ops(schedule, 0, &count));
  EXPECT(count == 32);
  for (d = 0; d < 4; ++d) {
    size_t n = 0;
    EXPECT_OK(po_schedule_num_ops(schedule, d, &n));
    total += n;
  }
  EXPECT(total == 160);

  memset(ops, 0, sizeof(ops));
  EXPECT_OK(po_schedule_ops(schedule, 0, 0, kNumFirst, ops));
  for (i = 0; i < kNumFirst; ++i) {
    EXPECT(ops[i].kind == kFirstOps[i].kind && ops[i].mb == kFirstOps[i].mb &&
           ops[i].chunk == kFirstOps[i].chunk && ops[i].peer == kFirstOps[i].peer);
  }
  /* The last op of stage 0 is B of the last microbatch; a range may start anywhere. */
  EXPECT_OK(po_schedule_ops(schedule, 0, 31, 1, &last));
  EXPECT(last.kind == PO_OP_BACKWARD && last.mb == 7 && last.chunk == 0 && last.peer == -1);

  EXPECT_OK(po_op_format(&ops[1], text, sizeof(text), &length));
  EXPECT(strcmp(text, "SEND_F0.0->1") == 0 && length == 12);
  EXPECT_OK(po_op_format(&ops[8], text, sizeof(text), &length));
  EXPECT(strcmp(text, "RECV_B0.0<-1") == 0);

  spec.struct_size = sizeof(spec);
  EXPECT_OK(po_schedule_spec(schedule, &spec));
  EXPECT(strcmp(spec.family, "1f1b") == 0 && strcmp(spec.offload, "none") == 0);
  EXPECT(spec.num_stages == 4 && spec.num_microbatches == 8 && spec.chunks_per_stage == 1 &&
         spec.group_size == 0 && spec.split_backward == 0);
  po_schedule_free(schedule);
}

/* 1F1B under unit costs (F = 1, unsplit B = B + W = 2, free P2P): makespan (m + p - 1) * 3,
 * and stage d holds p - d microbatches at its peak (pipeoffload.md section 1.2). */
static void TestPredictions(void) {
  po_schedule* schedule = Compile1F1B(4, 8);
  po_predictions* stored = NULL;
  po_predictions* simulated = NULL;
  po_prediction_summary summary;
  po_stage_prediction stage;
  po_link_traffic link;
  int32_t d;
  if (schedule == NULL) return;
  EXPECT_OK(po_schedule_predictions(schedule, &stored));
  EXPECT_OK(po_schedule_simulate(schedule, NULL, &simulated));
  summary.struct_size = sizeof(summary);
  EXPECT_OK(po_predictions_summary(simulated, &summary));
  EXPECT(summary.num_stages == 4);
  EXPECT(summary.step_time == 33.0);
  EXPECT(summary.step_time_without_offload == 33.0);
  EXPECT(fabs(summary.bubble_ratio - (1.0 - 96.0 / 132.0)) < 1e-12);
  EXPECT(summary.collisions == 0 && summary.num_warnings == 0);
  for (d = 0; d < 4; ++d) {
    stage.struct_size = sizeof(stage);
    EXPECT_OK(po_predictions_stage(stored, d, &stage));
    EXPECT(stage.stage == d && stage.peak_units == 4 - d && stage.offloaded_bytes == 0);
    EXPECT(stage.busy_time == 24.0);
  }
  EXPECT(summary.num_links > 0);
  link.struct_size = sizeof(link);
  EXPECT_OK(po_predictions_link(simulated, 0, &link));
  EXPECT(link.name != NULL && strncmp(link.name, "host:", 5) == 0);
  EXPECT_ERROR(po_predictions_stage(stored, 4, &stage), PO_ERROR_OUT_OF_RANGE,
               "po_predictions_stage: stage 4 is out of range [0, 4)");
  po_predictions_free(simulated);
  po_predictions_free(stored);
  po_schedule_free(schedule);
}

/* Full offload on group-interleaved p=4 m=8 v=2 under unit costs with k = 0.25: the compiler
 * plans OFFLOAD/RELEASE/RELOAD on stage 0, and its peak falls below the peak without offload. */
static void TestOffload(void) {
  po_spec spec;
  po_cost_options cost = UnitCosts();
  po_schedule* schedule = NULL;
  po_predictions* predictions = NULL;
  po_stage_prediction stage;
  size_t count = 0, i, offloads = 0, reloads = 0;
  po_op* ops;
  po_spec_init(&spec);
  spec.family = "group-interleaved";
  spec.offload = "po-f";
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.chunks_per_stage = 2;
  EXPECT_OK(po_schedule_compile(&spec, &cost, &schedule));
  if (schedule == NULL) return;
  EXPECT_OK(po_schedule_num_ops(schedule, 0, &count));
  ops = (po_op*)calloc(count, sizeof(po_op));
  EXPECT_OK(po_schedule_ops(schedule, 0, 0, count, ops));
  for (i = 0; i < count; ++i) {
    offloads += ops[i].kind == PO_OP_OFFLOAD;
    reloads += ops[i].kind == PO_OP_RELOAD;
  }
  free(ops);
  EXPECT(offloads > 0 && offloads == reloads);
  EXPECT_OK(po_schedule_predictions(schedule, &predictions));
  stage.struct_size = sizeof(stage);
  EXPECT_OK(po_predictions_stage(predictions, 0, &stage));
  EXPECT(stage.peak_units < stage.peak_units_without_offload);
  EXPECT(stage.offloaded_bytes > 0 && stage.host_bytes > 0);
  po_predictions_free(predictions);
  po_schedule_free(schedule);
}

static char* Format(const po_schedule* schedule, int32_t format, size_t* size) {
  char* text = NULL;
  EXPECT_OK(po_schedule_format(schedule, format, &text, size));
  return text;
}

static void TestFormats(void) {
  po_schedule* schedule = Compile1F1B(2, 2);
  size_t size = 0;
  char* text;
  if (schedule == NULL) return;
  /* torch.distributed.pipelining: one row per rank, actions "<virtual stage><TYPE><mb>". */
  text = Format(schedule, PO_FORMAT_PYTORCH_CSV, &size);
  EXPECT(text != NULL && strcmp(text, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n") == 0);
  EXPECT(text != NULL && size == strlen(text));
  po_free(text);
  text = Format(schedule, PO_FORMAT_TEXT, &size);
  EXPECT(text != NULL && strstr(text, "stage 1 | RECV_F0.0<-0 F0.0") != NULL);
  po_free(text);
  text = Format(schedule, PO_FORMAT_JSON, &size);
  EXPECT(text != NULL && strstr(text, "\"format\": \"pipeoffload.schedule/1\"") != NULL);
  po_free(text);
  text = Format(schedule, PO_FORMAT_PYTORCH_CSV_COMMS, &size);
  EXPECT(text != NULL && strstr(text, "SEND_F") != NULL);
  po_free(text);
  text = Format(schedule, PO_FORMAT_TRACE, &size);
  EXPECT(text != NULL && strstr(text, "\"traceEvents\"") != NULL);
  po_free(text);
  /* timeline_svg.h: one group of rows per stage. */
  text = Format(schedule, PO_FORMAT_SVG, &size);
  EXPECT(text != NULL && strncmp(text, "<?xml", 5) == 0 && strstr(text, "\n<svg ") != NULL &&
         strstr(text, "<g id=\"stage-1\">") != NULL);
  po_free(text);
  po_free(NULL);
  po_schedule_free(schedule);
}

/* Write every readable format, read it back, and compare op by op. */
static void TestRoundTrips(const char* scratch) {
  po_schedule* original = Compile1F1B(4, 8);
  po_schedule* loaded = NULL;
  po_load_options load;
  po_predictions* predictions = NULL;
  char path[4096];
  char* text = NULL;
  size_t size = 0;
  if (original == NULL) return;

  snprintf(path, sizeof(path), "%s/c_api_round_trip.json", scratch);
  EXPECT_OK(po_schedule_write(original, PO_FORMAT_JSON, path));
  EXPECT_OK(po_schedule_load(path, NULL, NULL, &loaded));
  EXPECT(loaded != NULL && SameOps(original, loaded));
  /* The file carries the compiler's predictions. */
  EXPECT_OK(po_schedule_predictions(loaded, &predictions));
  po_predictions_free(predictions);
  po_schedule_free(loaded);
  loaded = NULL;

  /* A compute-only CSV comes back with the same comm lowering the compiler applied. */
  po_load_options_init(&load);
  load.format = PO_FORMAT_PYTORCH_CSV;
  load.num_stages = 4;
  snprintf(path, sizeof(path), "%s/c_api_round_trip.csv", scratch);
  EXPECT_OK(po_schedule_write(original, PO_FORMAT_PYTORCH_CSV, path));
  EXPECT_OK(po_schedule_load(path, &load, NULL, &loaded));
  EXPECT(loaded != NULL && SameOps(original, loaded));
  po_schedule_free(loaded);
  loaded = NULL;

  /* The CSV with comm actions, parsed from memory, keeps them as they are. */
  load.format = PO_FORMAT_PYTORCH_CSV_COMMS;
  EXPECT_OK(po_schedule_format(original, PO_FORMAT_PYTORCH_CSV_COMMS, &text, &size));
  EXPECT_OK(po_schedule_parse(text, size, &load, NULL, &loaded));
  EXPECT(loaded != NULL && SameOps(original, loaded));
  /* A CSV file has no predictions in it. */
  EXPECT_ERROR(po_schedule_predictions(loaded, &predictions), PO_ERROR_FAILED_PRECONDITION,
               "po_schedule_predictions: the schedule carries no predictions (its file had "
               "none); call po_schedule_simulate");
  EXPECT(predictions == NULL);
  po_free(text);
  po_schedule_free(loaded);
  po_schedule_free(original);
}

static void TestBadInput(const char* scratch) {
  po_spec spec;
  po_cost_options cost = UnitCosts();
  po_load_options load;
  po_schedule* schedule = (po_schedule*)&spec; /* must come back NULL */
  po_schedule* good = Compile1F1B(4, 8);
  po_op op;
  size_t count = 0;
  char small[4];
  char path[4096];
  static const char kMissingB[] =
      "{\"format\": \"pipeoffload.schedule/1\", \"spec\": {\"family\": \"1f1b\", \"stages\": 1, "
      "\"microbatches\": 1, \"chunks\": 1}, \"stages\": [{\"stage\": 0, \"ops\": "
      "[{\"op\": \"F\", \"mb\": 0, \"chunk\": 0}]}]}";
  static const char kBadKind[] =
      "{\"format\": \"pipeoffload.schedule/1\", \"spec\": {\"family\": \"1f1b\", \"stages\": 1, "
      "\"microbatches\": 1, \"chunks\": 1}, \"stages\": [{\"stage\": 0, \"ops\": "
      "[{\"op\": \"X\", \"mb\": 0, \"chunk\": 0}]}]}";

  po_spec_init(&spec);
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, NULL), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: out is NULL");
  spec.family = "2f2b";
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_spec.family: unknown family \"2f2b\"; expected 1f1b, "
               "interleaved or group-interleaved");
  EXPECT(schedule == NULL);
  po_spec_init(&spec);
  spec.offload = "most";
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_spec.offload: unknown offload policy \"most\"; expected "
               "none, po-h, po-f, selective or auto");
  /* The compiler's own checks come through with their messages. */
  po_spec_init(&spec);
  spec.family = "interleaved";
  spec.num_stages = 4;
  spec.num_microbatches = 6;
  spec.chunks_per_stage = 2;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: interleaved needs num_microbatches % num_stages == 0 (m=6, "
               "p=4); use m=4 or 8, or group-interleaved, which takes any m");
  po_spec_init(&spec);
  spec.num_stages = 0;
  EXPECT_ERROR_PREFIX(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
                      "po_schedule_compile: num_stages must be in [1, ");
  po_spec_init(&spec);
  spec.struct_size = 8;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_spec.struct_size is 8, below the 64 bytes of its first "
               "release; call po_spec_init (or set it to sizeof)");
  spec.struct_size = sizeof(spec) + 8;
  EXPECT_ERROR_PREFIX(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
                      "po_schedule_compile: po_spec.struct_size is 96 but this library");
  po_spec_init(&spec);
  cost.cost_model_json = "{\"forward_tme\": 1}";
  EXPECT_ERROR_PREFIX(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
                      "po_schedule_compile: po_cost_options.cost_model_json: ");
  cost = UnitCosts();
  cost.reserved = 1;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_cost_options.reserved must be 0 (got 1)");
  cost = UnitCosts();
  cost.offload_ratio = -1;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_cost_options.offload_ratio must be finite and >= 0 (got "
               "-1)");
  EXPECT(schedule == NULL);

  /* Files: missing, unparsable, parsable but invalid, unreadable formats. */
  EXPECT_ERROR(po_schedule_load("/nonexistent/s.json", NULL, NULL, &schedule),
               PO_ERROR_NOT_FOUND,
               "po_schedule_load: cannot open '/nonexistent/s.json': No such file or directory");
  EXPECT_ERROR(po_schedule_load(NULL, NULL, NULL, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_load: path is NULL");
  EXPECT_ERROR(po_schedule_parse(kBadKind, strlen(kBadKind), NULL, NULL, &schedule),
               PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_parse: stages[0].ops[0].op: unknown op kind \"X\"; expected one of "
               "F, B, W, SEND_F, RECV_F, SEND_B, RECV_B, OFFLOAD, RELEASE, RELOAD, BARRIER, "
               "RECOMPUTE, RECOMPUTE_LEAN");
  EXPECT_ERROR_PREFIX(po_schedule_parse(kMissingB, strlen(kMissingB), NULL, NULL, &schedule),
                      PO_ERROR_FAILED_PRECONDITION,
                      "po_schedule_parse: Validate: invariant 2 (completeness) violated at "
                      "stage 0, op 0 (F0.0): missing B: B0.0 never runs on this stage");
  EXPECT(schedule == NULL);
  snprintf(path, sizeof(path), "%s/c_api_invalid.json", scratch);
  {
    FILE* file = fopen(path, "w");
    EXPECT(file != NULL);
    if (file != NULL) {
      fputs(kMissingB, file);
      fclose(file);
    }
  }
  EXPECT_ERROR_PREFIX(po_schedule_load(path, NULL, NULL, &schedule),
                      PO_ERROR_FAILED_PRECONDITION, "po_schedule_load: ");
  EXPECT(strstr(po_last_error_message(), "c_api_invalid.json: Validate: invariant 2") != NULL);
  po_load_options_init(&load);
  load.format = PO_FORMAT_PYTORCH_CSV;
  EXPECT_ERROR(po_schedule_parse("0F0\n", 4, &load, NULL, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_parse: po_load_options.num_stages must be >= 1 for a PyTorch CSV, "
               "which does not record the pipeline's ranks (got 0)");
  load.format = PO_FORMAT_TEXT;
  EXPECT_ERROR(po_schedule_parse("x", 1, &load, NULL, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_parse: po_load_options.format 1 is written for humans and tools and "
               "cannot be read back; load PO_FORMAT_JSON or a PyTorch CSV");
  EXPECT_ERROR(po_schedule_parse(NULL, 3, NULL, NULL, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_parse: data is NULL");

  /* Handles and indices. */
  EXPECT_ERROR(po_schedule_num_stages(NULL, NULL), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_num_stages: schedule is NULL");
  if (good != NULL) {
    EXPECT_ERROR(po_schedule_num_ops(good, 4, &count), PO_ERROR_OUT_OF_RANGE,
                 "po_schedule_num_ops: stage 4 is out of range [0, 4)");
    EXPECT_ERROR(po_schedule_num_ops(good, -1, &count), PO_ERROR_OUT_OF_RANGE,
                 "po_schedule_num_ops: stage -1 is out of range [0, 4)");
    EXPECT_ERROR(po_schedule_ops(good, 0, 30, 3, &op), PO_ERROR_OUT_OF_RANGE,
                 "po_schedule_ops: ops [30, 30 + 3) are outside stage 0's 32 ops");
    EXPECT_ERROR(po_schedule_ops(good, 0, 0, 1, NULL), PO_ERROR_INVALID_ARGUMENT,
                 "po_schedule_ops: ops is NULL");
    EXPECT_ERROR(po_schedule_format(good, 99, NULL, NULL), PO_ERROR_INVALID_ARGUMENT,
                 "po_schedule_format: text is NULL");
    {
      char* text = NULL;
      size_t size = 0;
      EXPECT_ERROR(po_schedule_format(good, 99, &text, &size), PO_ERROR_INVALID_ARGUMENT,
                   "po_schedule_format: unknown format 99; expected PO_FORMAT_JSON (0), _TEXT "
                   "(1), _PYTORCH_CSV (2), _PYTORCH_CSV_COMMS (3), _TRACE (4) or _SVG (5)");
      EXPECT(text == NULL);
    }
    EXPECT_ERROR(po_schedule_write(good, PO_FORMAT_JSON, "/nonexistent/out.json"),
                 PO_ERROR_NOT_FOUND,
                 "po_schedule_write: cannot create '/nonexistent/out.json': No such file or "
                 "directory");
  }
  op.kind = 42;
  op.mb = op.chunk = op.peer = 0;
  EXPECT_ERROR(po_op_format(&op, small, sizeof(small), &count), PO_ERROR_INVALID_ARGUMENT,
               "po_op_format: op kind 42 is unknown; kinds are 0..12");
  op.kind = PO_OP_FORWARD;
  op.mb = 12;
  op.chunk = 0;
  op.peer = -1;
  EXPECT_ERROR(po_op_format(&op, small, sizeof(small), &count), PO_ERROR_OUT_OF_RANGE,
               "po_op_format: buffer of 4 bytes cannot hold \"F12.0\" and its NUL");
  EXPECT(count == 5);

  /* A success clears the message. */
  EXPECT_OK(po_schedule_num_ops(good, 0, &count));
  EXPECT(strcmp(po_last_error_message(), "") == 0);
  po_schedule_free(good);
  po_schedule_free(NULL);
  po_predictions_free(NULL);
}

/* auto picks a plan within the budget, or says why none fits. */
/* Recompute in the spec (issue 15): the fields round-trip through po_schedule_spec and the JSON
 * file, the ops come out as PO_OP_RECOMPUTE / _LEAN with their names, a first-release spec
 * (struct_size 64) reads them as their defaults, and bad values name the field. */
static void TestRecomputeSpec(const char* scratch) {
  po_spec spec, back;
  po_cost_options cost = UnitCosts();
  po_schedule* schedule = NULL;
  po_schedule* loaded = NULL;
  po_op op;
  char path[4096], text[32];
  size_t count = 0, i, length = 0;
  int32_t d, lean = 0, full = 0;
  po_spec_init(&spec);
  EXPECT(spec.recompute == NULL && spec.recompute_fraction == 1.0 &&
         spec.recompute_chunks == 0 && spec.reserved == 0);
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.recompute = "lean";
  spec.recompute_fraction = 0.5;
  EXPECT_OK(po_schedule_compile(&spec, &cost, &schedule));
  if (schedule == NULL) return;
  for (d = 0; d < 4; ++d) {
    EXPECT_OK(po_schedule_num_ops(schedule, d, &count));
    for (i = 0; i < count; ++i) {
      EXPECT_OK(po_schedule_ops(schedule, d, i, 1, &op));
      lean += op.kind == PO_OP_RECOMPUTE_LEAN;
      full += op.kind == PO_OP_RECOMPUTE;
      if (d == 0 && lean == 1 && op.kind == PO_OP_RECOMPUTE_LEAN) {
        EXPECT_OK(po_op_format(&op, text, sizeof(text), &length));
        EXPECT(strncmp(text, "RECOMPUTE_LEAN", 14) == 0 && op.peer == -1);
      }
    }
  }
  EXPECT(lean == 4 * 8 / 2 && full == 0); /* half of each stage's 8 entries */
  back.struct_size = sizeof(back);
  EXPECT_OK(po_schedule_spec(schedule, &back));
  EXPECT(strcmp(back.recompute, "lean") == 0 && back.recompute_fraction == 0.5 &&
         back.recompute_chunks == 0);
  snprintf(path, sizeof(path), "%s/c_api_recompute.json", scratch);
  EXPECT_OK(po_schedule_write(schedule, PO_FORMAT_JSON, path));
  EXPECT_OK(po_schedule_load(path, NULL, NULL, &loaded));
  EXPECT(loaded != NULL && SameOps(schedule, loaded));
  EXPECT_OK(po_schedule_spec(loaded, &back));
  EXPECT(strcmp(back.recompute, "lean") == 0 && back.recompute_fraction == 0.5);
  po_schedule_free(loaded);
  po_schedule_free(schedule);
  schedule = NULL;

  /* An older caller's struct ends before the recompute fields: they keep their defaults. */
  spec.recompute = "bogus";
  spec.struct_size = 64;
  EXPECT_OK(po_schedule_compile(&spec, &cost, &schedule));
  back.struct_size = sizeof(back);
  EXPECT_OK(po_schedule_spec(schedule, &back));
  EXPECT(strcmp(back.recompute, "none") == 0 && back.recompute_fraction == 1.0);
  po_schedule_free(schedule);
  schedule = NULL;

  spec.struct_size = sizeof(spec);
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: po_spec.recompute: unknown recompute mode \"bogus\"; "
               "expected none, lean or full");
  spec.recompute = "full";
  spec.recompute_fraction = 0;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: recompute_fraction must be in (0, 1], got 0");
  spec.recompute_fraction = 1;
  spec.recompute_chunks = 3;
  EXPECT_ERROR(po_schedule_compile(&spec, &cost, &schedule), PO_ERROR_INVALID_ARGUMENT,
               "po_schedule_compile: recompute_chunks must be in [0, v] = [0, 1], got 3");
  EXPECT(schedule == NULL);

  /* Beside po-f, what a recomputed entry keeps (its input) is offloaded before its RECOMPUTE. */
  spec.recompute_chunks = 0;
  spec.offload = "po-f";
  EXPECT_OK(po_schedule_compile(&spec, &cost, &schedule));
  if (schedule == NULL) return;
  full = 0;
  lean = 0; /* here: OFFLOADs */
  for (d = 0; d < 4; ++d) {
    EXPECT_OK(po_schedule_num_ops(schedule, d, &count));
    for (i = 0; i < count; ++i) {
      EXPECT_OK(po_schedule_ops(schedule, d, i, 1, &op));
      full += op.kind == PO_OP_RECOMPUTE;
      lean += op.kind == PO_OP_OFFLOAD;
    }
  }
  EXPECT(full == 4 * 8 && lean > 0);
  po_schedule_free(schedule);
  schedule = NULL;
}

static void TestAuto(void) {
  po_spec spec;
  po_cost_options cost = UnitCosts();
  po_schedule* schedule = NULL;
  po_spec_init(&spec);
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.offload = "auto";
  spec.memory_budget_bytes = 1;
  EXPECT_ERROR_PREFIX(po_schedule_compile(&spec, &cost, &schedule),
                      PO_ERROR_RESOURCE_EXHAUSTED,
                      "po_schedule_compile: auto offload: no plan fits memory_budget_bytes=1 "
                      "per stage; the smallest peak found is ");
  EXPECT(schedule == NULL);
}

int main(int argc, char** argv) {
  const char* scratch = argc > 1 ? argv[1] : ".";
  TestVersionAndNames();
  TestOneFOneBOps();
  TestPredictions();
  TestOffload();
  TestFormats();
  TestRoundTrips(scratch);
  TestBadInput(scratch);
  TestAuto();
  TestRecomputeSpec(scratch);
  if (failures > 0) {
    fprintf(stderr, "c_api_test: %d failed expectations\n", failures);
    return 1;
  }
  printf("c_api_test: all expectations held\n");
  return 0;
}
