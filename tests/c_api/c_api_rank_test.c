/* po_stage from C99 (c_api.h, "one rank's stage"): the toy pipeline of toy_model.h with one
 * stage per MPI rank, under mpirun. Every rank checks its own virtual stages' gradients
 * bitwise against the straight-line computation, its measured stash peak and offloaded bytes
 * against the compiler's predictions, and its callback count, under 1F1B, po-h with W split,
 * po-f and group-interleaved po-f; then a callback failing on the last rank (every rank's run
 * fails, naming that rank and its reason), bad options, and MPI's lifetime.
 *
 * usage: mpirun -np P c_api_rank_test             (P >= 2; this test starts MPI itself, so the
 *                                                  stages leave it running: several open in turn)
 *        mpirun -np P c_api_rank_test --library-mpi  (the library starts MPI at the first open
 *                                                  and finalizes it at its free: a second open
 *                                                  must fail cleanly)
 *        mpirun -np P c_api_rank_test --nccl      (P >= 1 GPUs: po-f over NCCL on the CUDA
 *                                                  backend, one GPU per rank; the callbacks
 *                                                  compute nothing, the runtime's bytes and
 *                                                  peaks are checked; exits 77, "skipped", where
 *                                                  the library has no NCCL or no GPU) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeoffload/c_api.h"
#include "tests/c_api/expect.h"
#include "tests/c_api/toy_model.h"

static int Rank = 0, Ranks = 1;

/* Opens this rank's stage of `spec` (its fields fixed by the caller) over MPI, with `toy`. */
static po_status Open(const po_spec* spec, Toy* toy, po_stage_callbacks* callbacks,
                      double wait_timeout, po_stage** out) {
  po_pipeline_options options;
  ToyInit(toy, Rank, spec->num_stages, spec->chunks_per_stage, spec->split_backward,
          toy->results);
  ToyCallbacks(toy, callbacks);
  po_pipeline_options_init(&options);
  options.spec = spec;
  options.wait_timeout_seconds = wait_timeout;
  return po_stage_open(callbacks, &options, PO_TRANSPORT_MPI, out);
}

/* Two iterations of `spec` on this rank; returns this rank's offloaded bytes per iteration. */
static int64_t CheckRun(const po_spec* spec) {
  const int32_t p = spec->num_stages, v = spec->chunks_per_stage, m = spec->num_microbatches;
  Results* results = (Results*)calloc(1, sizeof(Results));
  Results* expected = (Results*)calloc(1, sizeof(Results));
  Toy toy;
  po_stage_callbacks callbacks;
  po_stage* stage = NULL;
  po_schedule* schedule = NULL;
  po_predictions* predictions = NULL;
  po_stage_prediction predicted;
  int32_t rank = -1, size = -1, it, c, mb;
  int64_t offloaded = -1;
  toy.results = results;
  EXPECT_OK(Open(spec, &toy, &callbacks, 60.0, &stage));
  if (stage == NULL) goto done;
  EXPECT_OK(po_stage_rank(stage, &rank, &size));
  EXPECT(rank == Rank && size == Ranks);
  EXPECT_OK(po_stage_run(stage, 2, NULL, NULL));
  EXPECT_OK(po_stage_schedule(stage, &schedule));
  EXPECT_OK(po_schedule_predictions(schedule, &predictions));
  predicted.struct_size = sizeof(predicted);
  EXPECT_OK(po_predictions_stage(predictions, Rank, &predicted));
  for (it = 0; it < 2; ++it) {
    po_iteration_stats stats;
    stats.struct_size = sizeof(stats);
    EXPECT_OK(po_stage_stats(stage, it, &stats));
    EXPECT(stats.stage == Rank);
    EXPECT(stats.stash_high_water_bytes == predicted.peak_bytes);
    EXPECT(stats.offloaded_bytes == predicted.offloaded_bytes);
    EXPECT(stats.reloaded_bytes == predicted.offloaded_bytes);
  }
  offloaded = predicted.offloaded_bytes;
  EXPECT(toy.calls == 2 * m * v * (spec->split_backward ? 3 : 2));
  EXPECT(toy.streams_seen == 0); /* the CPU backend: callbacks compute on their thread */
  /* This rank's virtual stages (loop placement: chunk c is c * p + rank), bit for bit. */
  ToyReference(p * v, m, expected);
  for (c = 0; c < v; ++c) {
    const int32_t l = c * p + Rank;
    EXPECT(memcmp(expected->weight_grad[l], results->weight_grad[l],
                  sizeof(expected->weight_grad[l])) == 0);
  }
  for (mb = 0; mb < m; ++mb) {
    if (Rank == 0) {
      EXPECT(memcmp(expected->input_grad[mb], results->input_grad[mb],
                    sizeof(expected->input_grad[mb])) == 0);
    }
    if (Rank == p - 1) {
      EXPECT(memcmp(expected->loss_input[mb], results->loss_input[mb],
                    sizeof(expected->loss_input[mb])) == 0);
    }
  }
done:
  po_predictions_free(predictions);
  po_schedule_free(schedule);
  po_stage_free(stage);
  free(expected);
  free(results);
  return offloaded;
}

static void TestSchedules(void) {
  const po_spec plain = ToySpec("1f1b", "none", Ranks, 4, 1, 0);
  const po_spec half_split = ToySpec("1f1b", "po-h", Ranks, 2 * Ranks, 1, 1);
  const po_spec full = ToySpec("1f1b", "po-f", Ranks, 2 * Ranks, 1, 0);
  const po_spec interleaved = ToySpec("group-interleaved", "po-f", Ranks, 2 * Ranks, 2, 0);
  EXPECT(CheckRun(&plain) == 0);
  CheckRun(&half_split);
  /* po-f offloads on every stage but the last, whose entries are used at once. */
  EXPECT((CheckRun(&full) > 0) == (Rank < Ranks - 1));
  EXPECT(CheckRun(&interleaved) > 0);
}

static po_status CountIteration(void* user, int32_t iteration, po_callback_error* error) {
  (void)error;
  EXPECT(iteration == *(int32_t*)user);
  *(int32_t*)user = iteration + 1;
  return PO_OK;
}

/* The last rank fails F of microbatch 1: every rank's run fails with the same text, naming the
 * last rank and its callback's reason; the stage is broken after it. */
static void TestCallbackFailure(void) {
  const po_spec spec = ToySpec("1f1b", "none", Ranks, 4, 1, 0);
  Results* results = (Results*)calloc(1, sizeof(Results));
  Toy toy;
  po_stage_callbacks callbacks;
  po_stage* stage = NULL;
  int32_t seen = 0;
  char expected_reason[256];
  toy.results = results;
  EXPECT_OK(Open(&spec, &toy, &callbacks, 2.0, &stage));
  if (stage != NULL) {
    po_status status;
    const char* message;
    EXPECT_OK(po_stage_run(stage, 1, CountIteration, &seen));
    EXPECT(seen == 1);
    if (Rank == Ranks - 1) {
      toy.fail_kind = PO_OP_FORWARD;
      toy.fail_mb = 1;
      toy.fail_code = PO_ERROR_FAILED_PRECONDITION;
      toy.fail_message = "toy: microbatch 1 is malformed";
    }
    status = po_stage_run(stage, 1, NULL, NULL);
    message = po_last_error_message();
    snprintf(expected_reason, sizeof(expected_reason),
             "rank %d: stage %d, F1.0: forward callback: toy: microbatch 1 is malformed",
             Ranks - 1, Ranks - 1);
    if (Rank == 0) printf("c_api_rank_test: the failure as every rank reports it: %s\n", message);
    EXPECT(status != PO_OK);
    EXPECT(strncmp(message, "po_stage_run: iteration 0 failed on ", 36) == 0);
    if (strstr(message, expected_reason) == NULL) {
      fprintf(stderr, "rank %d: the failure does not name the failing rank's reason: %s\n", Rank,
              message);
      ++failures;
    }
    EXPECT_ERROR(po_stage_run(stage, 1, NULL, NULL), PO_ERROR_FAILED_PRECONDITION,
                 "po_stage_run: an earlier run of this stage failed, and messages of that "
                 "iteration may still sit between the ranks; free it and open a new one");
  }
  po_stage_free(stage);
  free(results);
}

static void TestBadOptions(void) {
  const po_spec spec = ToySpec("1f1b", "none", Ranks, 4, 1, 0);
  const po_spec too_many = ToySpec("1f1b", "none", Ranks + 1, 4, 1, 0);
  Results* results = (Results*)calloc(1, sizeof(Results));
  Toy toy;
  po_stage_callbacks callbacks;
  po_pipeline_options options;
  po_stage* stage = (po_stage*)&toy; /* a failed open must set it to NULL */
  char message[256];
  ToyInit(&toy, Rank, Ranks, 1, 0, results);
  ToyCallbacks(&toy, &callbacks);
  po_pipeline_options_init(&options);
  options.spec = &spec;
  EXPECT_ERROR(po_stage_open(&callbacks, &options, 7, &stage), PO_ERROR_INVALID_ARGUMENT,
               "po_stage_open: unknown transport 7; expected PO_TRANSPORT_MPI (0) or "
               "PO_TRANSPORT_NCCL (1)");
  EXPECT(stage == NULL);
  options.backend = PO_BACKEND_CUDA;
  EXPECT_ERROR(po_stage_open(&callbacks, &options, PO_TRANSPORT_MPI, &stage),
               PO_ERROR_INVALID_ARGUMENT,
               "po_stage_open: PO_TRANSPORT_MPI needs po_pipeline_options.backend = "
               "PO_BACKEND_CPU (got 1): MPI carries host buffers (the Open MPI here is not "
               "CUDA-aware); GPUs talk through PO_TRANSPORT_NCCL");
  options.backend = PO_BACKEND_CPU;
  options.cuda_device = -2;
  EXPECT_ERROR(po_stage_open(&callbacks, &options, PO_TRANSPORT_MPI, &stage),
               PO_ERROR_INVALID_ARGUMENT,
               "po_stage_open: po_pipeline_options.cuda_device must be >= -1 (got -2)");
  options.cuda_device = 0;
  options.spec = &too_many;
  snprintf(message, sizeof(message),
           "po_stage_open: the schedule has %d stages but %d ranks are in the job (one per "
           "stage)",
           Ranks + 1, Ranks);
  EXPECT_ERROR(po_stage_open(&callbacks, &options, PO_TRANSPORT_MPI, &stage),
               PO_ERROR_FAILED_PRECONDITION, message);
  EXPECT_ERROR(po_stage_open(NULL, &options, PO_TRANSPORT_MPI, &stage),
               PO_ERROR_INVALID_ARGUMENT, "po_stage_open: callbacks is NULL");
  EXPECT_ERROR(po_stage_run(NULL, 1, NULL, NULL), PO_ERROR_INVALID_ARGUMENT,
               "po_stage_run: stage is NULL");
  free(results);
}

/* The library starts MPI at the first open and finalizes it at that stage's free; MPI cannot
 * start twice in a process, so the next open fails with the reason. */
static void TestLibraryMpi(void) {
  const po_spec spec = ToySpec("1f1b", "po-f", Ranks, 2 * Ranks, 1, 0);
  Results* results = (Results*)calloc(1, sizeof(Results));
  Toy toy;
  po_stage_callbacks callbacks;
  po_stage* stage = NULL;
  int initialized = 0, finalized = 0;
  toy.results = results;
  CheckRun(&spec);
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  EXPECT(initialized && finalized);
  EXPECT_ERROR(Open(&spec, &toy, &callbacks, 60.0, &stage), PO_ERROR_FAILED_PRECONDITION,
               "po_stage_open: mpi rank group: MPI was already finalized in this process; it "
               "can be started only once (keep one MPI group or transport alive for the whole "
               "job, or initialize MPI yourself)");
  EXPECT(stage == NULL);
  free(results);
}

/* po-f over NCCL, one GPU per rank (cuda_device -1: the rank's local index). */
static int RunNccl(void) {
  const po_spec spec = ToySpec("1f1b", "po-f", Ranks, 4 * Ranks, 1, 0);
  Toy toy;
  po_stage_callbacks callbacks;
  po_pipeline_options options;
  po_stage* stage = NULL;
  po_schedule* schedule = NULL;
  po_predictions* predictions = NULL;
  po_stage_prediction predicted;
  po_iteration_stats stats;
  po_status status;
  ToyInit(&toy, Rank, Ranks, 1, 0, NULL);
  toy.device_buffers = 1;
  ToyCallbacks(&toy, &callbacks);
  po_pipeline_options_init(&options);
  options.spec = &spec;
  options.backend = PO_BACKEND_CUDA;
  options.cuda_device = -1;
  status = po_stage_open(&callbacks, &options, PO_TRANSPORT_NCCL, &stage);
  if (status == PO_ERROR_UNIMPLEMENTED || status == PO_ERROR_FAILED_PRECONDITION) {
    printf("skipped: %s\n", po_last_error_message());
    return 77;
  }
  EXPECT(status == PO_OK);
  if (stage == NULL) {
    fprintf(stderr, "po_stage_open: %s\n", po_last_error_message());
    return 1;
  }
  EXPECT_OK(po_stage_run(stage, 2, NULL, NULL));
  EXPECT_OK(po_stage_schedule(stage, &schedule));
  EXPECT_OK(po_schedule_predictions(schedule, &predictions));
  predicted.struct_size = sizeof(predicted);
  EXPECT_OK(po_predictions_stage(predictions, Rank, &predicted));
  stats.struct_size = sizeof(stats);
  EXPECT_OK(po_stage_stats(stage, 1, &stats));
  EXPECT(stats.stash_high_water_bytes == predicted.peak_bytes);
  EXPECT(stats.offloaded_bytes == predicted.offloaded_bytes);
  EXPECT(toy.calls == 2 * spec.num_microbatches * 2);
  EXPECT(toy.streams_seen != 0); /* the CUDA backend hands the compute stream over */
  printf("c_api_rank_test --nccl: rank %d of %d: stash peak %lld B (predicted %lld), "
         "offloaded %lld B (predicted %lld)\n",
         Rank, Ranks, (long long)stats.stash_high_water_bytes, (long long)predicted.peak_bytes,
         (long long)stats.offloaded_bytes, (long long)predicted.offloaded_bytes);
  po_predictions_free(predictions);
  po_schedule_free(schedule);
  po_stage_free(stage);
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* rank_text = getenv("OMPI_COMM_WORLD_RANK");
  const char* size_text = getenv("OMPI_COMM_WORLD_SIZE");
  const int library_mpi = argc > 1 && strcmp(argv[1], "--library-mpi") == 0;
  const int nccl = argc > 1 && strcmp(argv[1], "--nccl") == 0;
  int finalized = 0;
  if (library_mpi || nccl) {
    if (rank_text == NULL || size_text == NULL) {
      fprintf(stderr, "c_api_rank_test %s: run it under Open MPI's mpirun\n", argv[1]);
      return 2;
    }
    Rank = atoi(rank_text);
    Ranks = atoi(size_text);
  } else {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &Rank);
    MPI_Comm_size(MPI_COMM_WORLD, &Ranks);
  }
  if (nccl) return RunNccl();
  if (Ranks < 2 || Ranks > kMaxStages) {
    fprintf(stderr, "c_api_rank_test: run it with 2 to %d ranks (got %d)\n", kMaxStages, Ranks);
    return 2;
  }
  if (library_mpi) {
    TestLibraryMpi();
  } else {
    TestSchedules();
    TestCallbackFailure();
    TestBadOptions();
    MPI_Finalized(&finalized);
    EXPECT(!finalized); /* the stages left the caller's MPI running */
    MPI_Finalize();
  }
  if (failures != 0) {
    fprintf(stderr, "c_api_rank_test: rank %d: %d expectation(s) failed\n", Rank, failures);
    return 1;
  }
  printf("c_api_rank_test: rank %d of %d: all expectations held%s\n", Rank, Ranks,
         library_mpi ? " (library-started MPI)" : "");
  return 0;
}
