/* pipeoffload's C ABI: the schedule compiler, schedule files and the simulator, for callers
 * that are not C++ (the Python package binds exactly this header with ctypes; DESIGN.md 5.1).
 * Pure C99; compiles as C and as C++. Implemented in lib/c_api/, shipped as
 * libpipeoffload_c.so, which carries everything it needs (no C++ or Abseil symbols leak out).
 *
 * ABI rules
 *  - Stable within one PO_C_API_VERSION: functions are never removed or changed, enumerators
 *    never renumbered. New functions, enumerators and status codes may be added; a caller
 *    treats any nonzero po_status it does not know as an error.
 *  - Versioned structs (po_spec, po_cost_options, po_load_options, po_prediction_summary,
 *    po_stage_prediction, po_link_traffic, po_pipeline_options, po_stage_callbacks,
 *    po_iteration_stats, po_compute_args) begin with `uint32_t struct_size`, which the caller
 *    sets to sizeof(the struct) as it compiled it; the po_*_init functions do that and fill the
 *    defaults, so always call them first. New fields are only ever appended (each struct is laid
 *    out without implicit padding, so an appended field starts past the old size). The library
 *    reads (or, for results, writes) only the first struct_size bytes; fields past them keep
 *    their defaults. A struct_size smaller than the first release's struct, or larger than the
 *    library knows (a newer header than the library), is PO_ERROR_INVALID_ARGUMENT.
 *  - `reserved` fields must be zero (nonzero is PO_ERROR_INVALID_ARGUMENT), so that they can be
 *    given a meaning later.
 *  - po_op is frozen (arrays of it are handed out): it will never grow.
 *  - Handles (po_schedule, po_predictions, po_pipeline, po_stage) are opaque and owned by the caller
 *    from the call that returns them until its po_*_free. po_schedule and po_predictions are
 *    immutable, so any number of threads may call the const-handle functions on one handle at
 *    once; freeing must not race with use. po_pipeline's calls must not overlap (its section).
 *  - Strings the library returns as `const char*` are either static (names of kinds, families,
 *    policies, status codes, po_version: valid for the life of the process) or owned by a handle
 *    (valid until that handle is freed), as each function says. Text returned through `char**`
 *    (po_schedule_format) is the caller's and is released with po_free, never free().
 *  - Errors: every function that can fail returns a po_status. The message of the last call
 *    that returned a po_status is kept per thread (thread-local, not per handle, so a failed
 *    create, which has no handle yet, still has a message): po_last_error_message() returns it
 *    ("" after a success) and it stays valid until the next such call on the same thread.
 *    Bad input (null pointers, bad specs, out-of-range indices, unreadable files) is always a
 *    status, never an abort; a C++ exception never crosses this boundary.
 *  - On error, out-parameters are left unchanged, except handles, which are set to NULL.
 *
 * Running a pipeline with C callbacks (po_pipeline, at the end of this file) has rules of its
 * own on threads, blocking and buffer lifetimes: read the comment that opens that section. */
#ifndef PIPEOFFLOAD_C_API_H_
#define PIPEOFFLOAD_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define PO_C_API_EXPORT __attribute__((visibility("default")))
#else
#define PO_C_API_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Incremented only by a change that breaks the rules above (never within one release line). */
#define PO_C_API_VERSION 1

/* ---- status ------------------------------------------------------------------------------ */

/* Status codes; the values are the canonical (absl::StatusCode / gRPC) numbers. */
typedef int32_t po_status;
enum {
  PO_OK = 0,
  PO_ERROR_UNKNOWN = 2,
  PO_ERROR_INVALID_ARGUMENT = 3,    /* bad parameters, null pointers, malformed files */
  PO_ERROR_NOT_FOUND = 5,           /* a file that does not exist */
  PO_ERROR_PERMISSION_DENIED = 7,
  PO_ERROR_RESOURCE_EXHAUSTED = 8,  /* out of memory; auto found no plan within the budget */
  PO_ERROR_FAILED_PRECONDITION = 9, /* a schedule that fails validation; no predictions */
  PO_ERROR_OUT_OF_RANGE = 11,       /* stage or op index past the end; buffer too small */
  PO_ERROR_UNIMPLEMENTED = 12,
  PO_ERROR_INTERNAL = 13            /* a bug of ours: please report the message */
};

/* "OK", "INVALID_ARGUMENT", ... (static); "UNKNOWN" for a value it does not know. */
PO_C_API_EXPORT const char* po_status_name(po_status status);

/* The message of the last po_status-returning call on this thread ("" when it succeeded).
 * Never NULL; valid until the next such call on this thread. */
PO_C_API_EXPORT const char* po_last_error_message(void);

/* ---- version ----------------------------------------------------------------------------- */

/* The library's release, e.g. "0.1.0" (static). */
PO_C_API_EXPORT const char* po_version(void);
/* The PO_C_API_VERSION the library was built with; a caller built against another version
 * must not use it. */
PO_C_API_EXPORT int32_t po_c_api_version(void);

/* Frees text the library returned through a `char**`. NULL is allowed. */
PO_C_API_EXPORT void po_free(void* text);

/* ---- ops --------------------------------------------------------------------------------- */

/* Op kinds, numbered as the IR's OpKind (schedule.h); names are the IR's ("F", "SEND_F"). */
enum {
  PO_OP_FORWARD = 0,          /* "F" */
  PO_OP_BACKWARD = 1,         /* "B": input gradient, or the full backward when W is not split */
  PO_OP_BACKWARD_WEIGHT = 2,  /* "W" */
  PO_OP_SEND_ACTIVATION = 3,  /* "SEND_F" */
  PO_OP_RECV_ACTIVATION = 4,  /* "RECV_F" */
  PO_OP_SEND_GRAD = 5,        /* "SEND_B" */
  PO_OP_RECV_GRAD = 6,        /* "RECV_B" */
  PO_OP_OFFLOAD = 7,          /* "OFFLOAD" */
  PO_OP_RELEASE = 8,          /* "RELEASE" */
  PO_OP_RELOAD = 9,           /* "RELOAD" */
  PO_OP_BARRIER = 10,         /* "BARRIER" */
  PO_OP_RECOMPUTE = 11,       /* "RECOMPUTE": rebuild the stash entry from the chunk's input */
  PO_OP_RECOMPUTE_LEAN = 12   /* "RECOMPUTE_LEAN": rebuild it from the lean layout */
};

/* Recompute modes (po_stage_callbacks.retained_bytes, po_compute_args.recompute), numbered as
 * stage_model.h's Recompute; po_spec.recompute spells them "none", "lean", "full". */
enum {
  PO_RECOMPUTE_NONE = 0,
  PO_RECOMPUTE_LEAN = 1, /* F keeps the lean layout (the expensive parts); RECOMPUTE_LEAN
                            rebuilds the cheap parts */
  PO_RECOMPUTE_FULL = 2  /* F keeps what re-running the chunk needs (normally its input);
                            RECOMPUTE runs the chunk's forward again */
};

/* One instruction of a stage's program (frozen layout). `chunk` is the chunk on the op's own
 * stage; `peer` is the other stage of P2P ops and BARRIER, -1 otherwise; a BARRIER that guards
 * no transfer has mb = chunk = -1. */
typedef struct po_op {
  int32_t kind; /* PO_OP_* */
  int32_t mb;
  int32_t chunk;
  int32_t peer;
} po_op;

/* "F", "B", ..., "BARRIER" (static), or NULL for a kind it does not know. */
PO_C_API_EXPORT const char* po_op_kind_name(int32_t kind);

/* Writes the op's short form as the text format prints it ("F3.1", "SEND_F0.0->1",
 * "RECV_B2.0<-3", "BARRIER1.0~2") and a NUL into `buffer`; *length gets its length without the
 * NUL. Errors: INVALID_ARGUMENT for null pointers or an unknown kind; OUT_OF_RANGE when
 * `capacity` cannot hold text and NUL (*length still says how much is needed; 32 always does). */
PO_C_API_EXPORT po_status po_op_format(const po_op* op, char* buffer, size_t capacity,
                                       size_t* length);

/* ---- specs and cost models --------------------------------------------------------------- */

/* What to compile: PipelineSpec (schedule.h) field for field. */
typedef struct po_spec {
  uint32_t struct_size;
  int32_t num_stages;       /* p; default 8 (as po-schedule) */
  int32_t num_microbatches; /* m; default 32 (as po-schedule) */
  int32_t chunks_per_stage; /* v; default 1 */
  int32_t group_size;       /* g; 0 = the family's default */
  int32_t split_backward;   /* nonzero: separate W ops (zero-bubble style) */
  int32_t offload_chunks;   /* selective: offload chunks [0, n); 0 = use offload_fraction */
  int32_t strict;           /* nonzero: fail when bandwidth cannot carry the requested offload */
  const char* family;       /* "1f1b" | "interleaved" | "group-interleaved"; NULL = "1f1b" */
  const char* offload;      /* "none" | "po-h" | "po-f" | "selective" | "auto"; NULL = "none" */
  double offload_fraction;  /* selective: share of the activation volume, in [0, 1] */
  int64_t memory_budget_bytes; /* auto: per-stage activation budget */
  /* Appended after the first release (a caller with the older struct_size gets the defaults:
   * nothing recomputed). Recompute (issue 15): the chosen entries' F keeps only a retained
   * block and a RECOMPUTE / RECOMPUTE_LEAN op right before their B rebuilds the full entry.
   * Needs offload "none", or "auto", where `recompute` is the most the planner may use per
   * entry ("lean": keep, offload or lean; "full": any of the four). Running it needs stage
   * callbacks that offer the mode (po_stage_callbacks.retained_bytes). */
  const char* recompute;      /* "none" | "lean" | "full"; NULL = "none" */
  double recompute_fraction;  /* share of each stage's entries, longest-lived first, in (0, 1];
                                 default 1 */
  int32_t recompute_chunks;   /* every entry of chunks [0, n) instead, n in [0, v]; 0 = use
                                 recompute_fraction */
  int32_t reserved;
} po_spec;

/* Sets struct_size and the defaults above. */
PO_C_API_EXPORT void po_spec_init(po_spec* spec);

/* The cost model to plan and time with, built as po-schedule builds it: a base (the GPT
 * estimate, or unit costs), then the fields of `cost_model_json` on top. */
typedef struct po_cost_options {
  uint32_t struct_size;
  int32_t unit_costs;           /* nonzero: F = B = W = 1, one entry's transfer = 3k units */
  int32_t gpt_hidden;           /* GPT estimate: hidden size h; default 8192 */
  int32_t gpt_sequence;         /* GPT estimate: tokens per microbatch; default 4096 */
  int32_t gpt_layers_per_chunk; /* GPT estimate: layers in one chunk; default 2 */
  int32_t reserved;
  double offload_ratio;         /* unit costs: k; default 0.25 */
  double gpt_tflops;            /* GPT estimate: achieved TFLOP/s; default 600 */
  /* NULL, or a JSON object with any CostModel fields (cost_model.h), e.g.
   * {"forward_time": 2, "activation_bytes": 1048576}; the same keys as po-schedule's
   * --cost-model file. Copied during the call. */
  const char* cost_model_json;
} po_cost_options;

/* Sets struct_size and the defaults above (the GPT estimate, as po-schedule). */
PO_C_API_EXPORT void po_cost_options_init(po_cost_options* options);

/* ---- schedules --------------------------------------------------------------------------- */

typedef struct po_schedule po_schedule;  /* a validated schedule and the cost model it was
                                            compiled or loaded with */

/* Formats, as schedule_io.h and trace.h write them. */
enum {
  PO_FORMAT_JSON = 0,              /* the canonical file, "pipeoffload.schedule/1" */
  PO_FORMAT_TEXT = 1,              /* one row per stage, for humans (write only) */
  PO_FORMAT_PYTORCH_CSV = 2,       /* torch.distributed.pipelining, compute actions only */
  PO_FORMAT_PYTORCH_CSV_COMMS = 3, /* the same with SEND/RECV actions */
  PO_FORMAT_TRACE = 4,             /* Perfetto / Chrome trace of the simulated timeline (write
                                      only; times in us, or 1 unit = 1 ms with unit costs) */
  PO_FORMAT_SVG = 5                /* the simulated timeline as a picture (timeline_svg.h;
                                      write only) */
};

/* Compiles `spec` under `cost` (NULL = po_cost_options_init's defaults), as po-schedule
 * compile does (auto included). *out receives a new handle that carries the predictions.
 * Errors: INVALID_ARGUMENT naming the field (unknown family, p < 1, a spec the family does not
 * accept, bad cost model JSON); RESOURCE_EXHAUSTED when auto finds no plan within the budget;
 * FAILED_PRECONDITION when strict offload cannot be carried. */
PO_C_API_EXPORT po_status po_schedule_compile(const po_spec* spec, const po_cost_options* cost,
                                              po_schedule** out);

/* How to read a schedule. */
typedef struct po_load_options {
  uint32_t struct_size;
  int32_t format;          /* PO_FORMAT_JSON (default), PO_FORMAT_PYTORCH_CSV or _COMMS */
  int32_t num_stages;      /* CSV: the pipeline's ranks (the file does not carry it); default 0,
                              which a CSV load rejects */
  int32_t reserved;
  const char* family;      /* CSV: the family to record; NULL = "1f1b" */
} po_load_options;

/* Sets struct_size and the defaults above. */
PO_C_API_EXPORT void po_load_options_init(po_load_options* options);

/* Reads a schedule from `size` bytes of `data` (need not be NUL-terminated), as po-schedule
 * validate / import do: a CSV without SEND/RECV actions gets them inserted, then the schedule
 * must pass Validate. `options` NULL = JSON; `cost` NULL = the defaults (used by
 * po_schedule_simulate and the trace format). Errors: INVALID_ARGUMENT naming the place in the
 * file (JSON path, or CSV row and column); FAILED_PRECONDITION naming the invariant broken. */
PO_C_API_EXPORT po_status po_schedule_parse(const char* data, size_t size,
                                            const po_load_options* options,
                                            const po_cost_options* cost, po_schedule** out);

/* po_schedule_parse of the file at `path`. Errors also: NOT_FOUND, PERMISSION_DENIED naming
 * the path; messages of parse errors begin with the path. */
PO_C_API_EXPORT po_status po_schedule_load(const char* path, const po_load_options* options,
                                           const po_cost_options* cost, po_schedule** out);

/* Frees a schedule; NULL is allowed. */
PO_C_API_EXPORT void po_schedule_free(po_schedule* schedule);

/* The spec the schedule was built from, group_size resolved. Its strings are static. */
PO_C_API_EXPORT po_status po_schedule_spec(const po_schedule* schedule, po_spec* out);

/* Number of stages (programs), p. */
PO_C_API_EXPORT po_status po_schedule_num_stages(const po_schedule* schedule, int32_t* out);

/* Number of ops in `stage`'s program. Errors: OUT_OF_RANGE for a stage outside [0, p). */
PO_C_API_EXPORT po_status po_schedule_num_ops(const po_schedule* schedule, int32_t stage,
                                              size_t* out);

/* Copies ops [first, first + count) of `stage`'s program into `ops`. Errors: OUT_OF_RANGE
 * when the stage or the range is outside the program. `ops` may be NULL when count is 0. */
PO_C_API_EXPORT po_status po_schedule_ops(const po_schedule* schedule, int32_t stage,
                                          size_t first, size_t count, po_op* ops);

/* The schedule in `format` (PO_FORMAT_*): *text gets a NUL-terminated copy the caller frees
 * with po_free, *size its length without the NUL. The trace and SVG formats simulate with
 * the schedule's cost model. Errors: INVALID_ARGUMENT for an unknown format; those of
 * po_schedule_simulate for the trace. */
PO_C_API_EXPORT po_status po_schedule_format(const po_schedule* schedule, int32_t format,
                                             char** text, size_t* size);

/* po_schedule_format written to the file at `path` (created or truncated). Errors also: those
 * of open(2) and write(2) naming the path. */
PO_C_API_EXPORT po_status po_schedule_write(const po_schedule* schedule, int32_t format,
                                            const char* path);

/* ---- predictions ------------------------------------------------------------------------- */

typedef struct po_predictions po_predictions;  /* what the simulator predicts for a schedule */

/* Simulates the schedule (simulate.h) under `cost`, or under the schedule's own cost model
 * when `cost` is NULL (for a compiled auto plan that is the model re-cut to the plan's v).
 * Errors: INVALID_ARGUMENT for a cost model the simulator cannot time with. */
PO_C_API_EXPORT po_status po_schedule_simulate(const po_schedule* schedule,
                                               const po_cost_options* cost,
                                               po_predictions** out);

/* The predictions the schedule carries: the compiler's (with its planner's warnings) for a
 * compiled schedule, the file's for a loaded one. Errors: FAILED_PRECONDITION when it carries
 * none (a file without them: use po_schedule_simulate). */
PO_C_API_EXPORT po_status po_schedule_predictions(const po_schedule* schedule,
                                                  po_predictions** out);

/* Frees predictions; NULL is allowed. */
PO_C_API_EXPORT void po_predictions_free(po_predictions* predictions);

typedef struct po_prediction_summary {
  uint32_t struct_size;
  int32_t num_stages;
  int32_t num_links;
  int32_t num_warnings;
  int32_t collisions;          /* overlapping transfers in one direction of one link */
  int32_t reserved;
  double step_time;            /* makespan of one iteration, in the cost model's time unit */
  double bubble_ratio;         /* 1 - busy compute / (p * step_time) */
  double step_time_without_offload;
} po_prediction_summary;

typedef struct po_stage_prediction {
  uint32_t struct_size;
  int32_t stage;
  int64_t peak_units;          /* peak stash entries resident on the device */
  int64_t peak_bytes;          /* the same peak in bytes */
  int64_t peak_units_without_offload;
  int64_t peak_bytes_without_offload;
  int64_t host_bytes;          /* pinned host memory the stage needs (peak) */
  int64_t offloaded_bytes;     /* bytes copied D2H per iteration */
  double busy_time;            /* compute time on this stage */
  double end_time;             /* completion of the stage's last op */
} po_stage_prediction;

typedef struct po_link_traffic {
  uint32_t struct_size;
  int32_t reserved;
  const char* name;            /* "host:0", "p2p:0->1"; owned by the predictions handle */
  int64_t bytes_d2h;           /* host links: device-to-host; P2P links: bytes sent */
  int64_t bytes_h2d;
} po_link_traffic;

/* Callers set struct_size (sizeof) before these calls; the library fills the rest. */
PO_C_API_EXPORT po_status po_predictions_summary(const po_predictions* predictions,
                                                 po_prediction_summary* out);
/* Errors: OUT_OF_RANGE for a stage outside [0, num_stages). */
PO_C_API_EXPORT po_status po_predictions_stage(const po_predictions* predictions, int32_t stage,
                                               po_stage_prediction* out);
/* Errors: OUT_OF_RANGE for an index outside [0, num_links). */
PO_C_API_EXPORT po_status po_predictions_link(const po_predictions* predictions, int32_t index,
                                              po_link_traffic* out);
/* *out gets warning `index` (e.g. planned less offload than requested, with numbers), owned by
 * the predictions handle. Errors: OUT_OF_RANGE for an index outside [0, num_warnings). */
PO_C_API_EXPORT po_status po_predictions_warning(const po_predictions* predictions,
                                                 int32_t index, const char** out);

/* ---- running a pipeline with C callbacks ------------------------------------------------- */

/* Every stage of a pipeline in this process, driven by the caller's compute callbacks: the C
 * side of LocalPipeline (pipeline.h). Open plans or loads the schedule, sizes each stage's
 * activation stash and device arena exactly from the callbacks' byte sizes, and creates one
 * backend, local transport endpoint and executor per stage; run executes iterations, calling
 * the stage's F / B / W callback for each compute op of its program, while the runtime moves
 * stash entries to host memory and back (OFFLOAD / RELEASE / RELOAD) as the schedule says.
 *
 * Two ways to open: po_pipeline_open runs every stage in this process (a thread per stage:
 * tests, one GPU shared by the stages); po_stage_open (after po_pipeline_free below) runs this
 * process's one stage of a job whose ranks are the stages (mpirun, one rank per GPU or per
 * CPU), over MPI or NCCL. Both take the same callbacks and options and give the same stats;
 * what is said here of a stage's callbacks holds for both.
 *
 * Threads.
 *  - Stage d's callbacks (saved_bytes included) are called on a thread the library runs for
 *    stage d during po_pipeline_open and po_pipeline_run, never on the caller's thread. Calls
 *    of one stage never overlap one another; callbacks of different stages run at the same
 *    time, so state shared between stages' `user` contexts needs the caller's own locking.
 *  - on_iteration (po_pipeline_run) is called on the thread that called po_pipeline_run,
 *    between iterations, while no callback runs: the place for an optimizer step.
 *  - A callback may call the other po_* functions (schedule inspection, its own buffers), but
 *    never po_pipeline_* on its own pipeline. The po_pipeline_* calls on one handle must not
 *    overlap (thread-compatible); different pipelines are independent.
 *  - Callbacks may block, but every wait of the other stages is bounded by
 *    wait_timeout_seconds: a callback that takes longer makes its neighbours fail with
 *    DEADLINE_EXCEEDED (the run's error is then still the first callback failure, if any).
 * Buffers and streams.
 *  - Buffers are the backend's memory: host memory on the CPU backend, device memory on the
 *    CUDA backend. They are valid only during the call: a stash entry may move to host memory
 *    and back to another address between F and B, so never keep a pointer across calls.
 *  - `stream` is the stage's compute queue as an integer: 0 on the CPU backend (the callback
 *    computes on its calling thread and returns when done), the cudaStream_t on the CUDA
 *    backend. A CUDA callback enqueues its kernels on that stream and may return before they
 *    finish; work on any other stream is not ordered against the offload copies (unsafe).
 *  - po_pipeline_run returns once every queue of every stage has finished.
 * Errors from callbacks.
 *  - A compute callback returns PO_OK or an error code; for an error it may first give a
 *    message with po_callback_error_set(error, ...). The run then fails with that code (an
 *    unknown code becomes PO_ERROR_UNKNOWN) and the message "po_pipeline_run: iteration I:
 *    stage D, F3.1: forward callback: <message>". Once a callback has failed, the other stages'
 *    later callbacks are not called, and the run returns when every stage has stopped (the
 *    stages waiting for the failed one stop after wait_timeout_seconds).
 *  - saved_bytes returning <= 0 fails po_pipeline_open naming the stage and chunk.
 *  - After a failed run the pipeline may still be read (stats of the iterations that finished,
 *    its schedule) and freed, but not run again (FAILED_PRECONDITION): messages of the failed
 *    iteration may still sit between the stages. Open a new one.
 *  - Nothing the library or a callback does turns into an abort or an exception across this
 *    boundary; a C++ callback that throws fails the run with PO_ERROR_INTERNAL. */

typedef struct po_pipeline po_pipeline;             /* every stage of one process */
typedef struct po_callback_error po_callback_error; /* where a failing callback says why */

/* Gives the failing callback's reason; the text is copied. Only during the callback that got
 * `error`; a later call replaces the message. NULL `error` or `message` is ignored. */
PO_C_API_EXPORT void po_callback_error_set(po_callback_error* error, const char* message);

/* One compute call (stage_model.h's contract, field for field). Written by the library:
 * struct_size is the library's sizeof, and a caller compiled against an older header reads
 * only the fields it knows (a newer header's fields past struct_size do not exist). */
typedef struct po_compute_args {
  uint32_t struct_size;
  int32_t kind;             /* PO_OP_FORWARD, PO_OP_BACKWARD, PO_OP_BACKWARD_WEIGHT, or
                               PO_OP_RECOMPUTE / PO_OP_RECOMPUTE_LEAN (the recompute callback) */
  int32_t stage;
  int32_t mb;
  int32_t chunk;            /* the chunk on this stage */
  int32_t with_weight_grad; /* B: nonzero = full backward (accumulate weight gradients too);
                               zero = leave in `saved` what W needs. F, W: 0 */
  /* F: the input activation (boundary_bytes), NULL on virtual stage 0 (the model reads its own
   *    data). B: the gradient of the chunk's output, NULL on the last virtual stage (it starts
   *    from the loss). W: NULL. */
  const void* input;
  /* F: where to write the output activation (boundary_bytes), NULL on the last virtual stage
   *    (it computes the loss instead). B: where to write the gradient of the chunk's input,
   *    NULL on virtual stage 0. W: NULL. */
  void* output;
  /* The stash entry of (mb, chunk), saved_bytes long: F fills it, B and W read it (B may
   * leave what W needs in it). */
  void* saved;
  int64_t boundary_bytes;
  int64_t saved_bytes;
  uint64_t stream;          /* 0 on the CPU backend; the cudaStream_t on the CUDA backend */
  /* Appended after the first release: recompute. In every call but forward_retaining and
   * recompute: PO_RECOMPUTE_NONE, NULL and 0. */
  int32_t recompute;        /* PO_RECOMPUTE_LEAN or _FULL: how the entry is recomputed
                               (forward_retaining, recompute; RECOMPUTE_LEAN = lean) */
  int32_t reserved;
  /* forward_retaining: where F writes the retained block (retained_bytes long) instead of the
   * full entry (`saved` is NULL then; saved_bytes still gives the full entry's size).
   * recompute: that block, to read; `saved` is where the full entry is rebuilt. */
  void* retained;
  int64_t retained_bytes;   /* retained_bytes(stage, chunk, recompute, split_backward) */
} po_compute_args;

/* A compute callback: PO_OK, or an error code (and po_callback_error_set for the reason). */
typedef po_status (*po_compute_fn)(void* user, const po_compute_args* args,
                                   po_callback_error* error);

/* One stage's model (StageModel, stage_model.h). The struct is copied at open; `user` must
 * stay valid, and the functions callable, until po_pipeline_free. */
typedef struct po_stage_callbacks {
  uint32_t struct_size;
  int32_t reserved;
  void* user;               /* passed to every callback of this stage, untouched */
  int64_t boundary_bytes;   /* bytes of the activation between virtual stages (> 0) */
  /* Bytes of the stash entry of `chunk` (> 0), the same for every microbatch; with
   * split_backward nonzero it also holds what B leaves for W. Called during open (planning)
   * and run, so it must always give the same answer. */
  int64_t (*saved_bytes)(void* user, int32_t stage, int32_t chunk, int32_t split_backward);
  po_compute_fn forward;          /* F */
  po_compute_fn backward;         /* B */
  po_compute_fn backward_weight;  /* W; may be NULL when the schedule does not split W */
  /* Appended after the first release: recompute (StageModel::RetainedBytes, ForwardRetaining,
   * RecomputeSaved). Optional: all three NULL (a table of the older struct_size reads so) means
   * the stage offers no recompute, and open fails naming the stage, op, chunk and mode when the
   * schedule recomputes one of its entries. Set all three or none. */
  /* Bytes F keeps of an entry of `chunk` recomputed with `mode` (PO_RECOMPUTE_LEAN or _FULL):
   * > 0, or -1 when the stage does not offer `mode` for `chunk` (auto then never picks it; a
   * schedule that asks for it fails open). The same for every microbatch; called during open
   * and run, so it must always give the same answer. */
  int64_t (*retained_bytes)(void* user, int32_t stage, int32_t chunk, int32_t mode,
                            int32_t split_backward);
  /* F of an entry that will be recomputed (args->recompute says how): the same input and
   * output as forward (bitwise the same output), but writes only the retained block
   * (args->retained) instead of the full entry. */
  po_compute_fn forward_retaining;
  /* RECOMPUTE / RECOMPUTE_LEAN, right before the entry's B, on the compute queue: rebuilds the
   * full entry in args->saved (exactly what forward would have written) from args->retained.
   * No side effects beyond `saved` (the loss is not accounted twice, no state advances). */
  po_compute_fn recompute;
  /* Appended after recompute: B reads a retained block itself (StageModel::
   * BackwardReadsRetained). Optional: NULL (or a table of an older struct_size) is "never";
   * set only beside the recompute callbacks. Nonzero for (stage, chunk, mode, split_backward)
   * means that the RECOMPUTE* of such an entry calls no recompute callback and allocates
   * nothing, and that backward (and backward_weight when W is split) get the retained block:
   * args->saved and args->retained both point at it, args->recompute is the mode and
   * args->retained_bytes its size (saved_bytes still gives the full entry's). The planner
   * counts such entries at their retained size until B frees them. The same for every
   * microbatch; called during open and run, so it must always give the same answer. */
  int32_t (*backward_reads_retained)(void* user, int32_t stage, int32_t chunk, int32_t mode,
                                     int32_t split_backward);
} po_stage_callbacks;

/* Sets struct_size, zeroes the rest (every callback NULL, which open rejects). */
PO_C_API_EXPORT void po_stage_callbacks_init(po_stage_callbacks* callbacks);

/* Backends (po_pipeline_options.backend). */
enum {
  PO_BACKEND_CPU = 0,  /* worker threads as copy engines; buffers are host memory */
  PO_BACKEND_CUDA = 1  /* one CUDA backend per stage on cuda_device (its own streams); only
                          when the library was built with CUDA, else PO_ERROR_UNIMPLEMENTED */
};

/* How to open a pipeline (StageOptions, pipeline.h). Exactly one of spec, schedule and
 * schedule_file. Pointers are only read during po_pipeline_open. */
typedef struct po_pipeline_options {
  uint32_t struct_size;
  int32_t backend;               /* PO_BACKEND_*; default PO_BACKEND_CPU */
  /* Compiled (with the planner) under nominal costs and the callbacks' exact byte sizes. Its
   * num_stages must equal the number of callback tables. */
  const po_spec* spec;
  const po_schedule* schedule;   /* run as given (validated, re-simulated with those bytes) */
  const char* schedule_file;     /* a pipeoffload.schedule/1 JSON file */
  double nominal_chunk_time;     /* F, B and W time of a chunk to plan with; default 1 */
  double wait_timeout_seconds;   /* bound on every wait of open and run; default 60 */
  int64_t arena_budget_bytes;    /* each stage's arena; 0 (default) = sized from the plan */
  int32_t cuda_device;           /* PO_BACKEND_CUDA: the CUDA ordinal; default 0 */
  int32_t reserved;
} po_pipeline_options;

/* Sets struct_size and the defaults above. */
PO_C_API_EXPORT void po_pipeline_options_init(po_pipeline_options* options);

/* Opens stage d for callbacks[d], d in [0, num_stages), every stage on a thread of its own.
 * The pipeline has num_stages stages, which must be the schedule's stage count.
 * Errors: INVALID_ARGUMENT for null pointers, num_stages < 1, a bad struct_size or nonzero
 * reserved field, not exactly one schedule source, a NULL forward / backward / saved_bytes, a
 * NULL backward_weight under a schedule that splits W, some but not all of retained_bytes /
 * forward_retaining / recompute set, boundary_bytes <= 0 or saved_bytes <= 0 (naming the
 * stage), stages that disagree on boundary_bytes, an unknown backend, a spec whose recompute
 * mode a stage does not offer for a chunk (retained_bytes NULL, or not > 0; the planner's
 * message names the stage, chunk and mode); FAILED_PRECONDITION for a schedule of another stage
 * count, or an invalid one, or a given schedule that recomputes an entry with a mode its stage
 * does not offer (naming the op, chunk and mode);
 * RESOURCE_EXHAUSTED for an arena_budget_bytes the plan does not fit (with the numbers);
 * UNIMPLEMENTED for PO_BACKEND_CUDA in a library built without CUDA; those of
 * po_schedule_compile and po_schedule_load. */
PO_C_API_EXPORT po_status po_pipeline_open(const po_stage_callbacks* callbacks,
                                           int32_t num_stages,
                                           const po_pipeline_options* options,
                                           po_pipeline** out);

/* Called between iterations (see Threads above); nonzero fails the run with its code. */
typedef po_status (*po_iteration_fn)(void* user, int32_t iteration, po_callback_error* error);

/* Runs `num_iterations` (>= 1) iterations, each every stage's program once; after iteration i
 * has finished on every stage, calls on_iteration(user, i, ...) when it is not NULL. Returns
 * when the last has finished on every queue, or at the first error. The stats of each finished
 * iteration stay readable (po_pipeline_stats) until the next run. Errors: INVALID_ARGUMENT for
 * num_iterations < 1; FAILED_PRECONDITION after a failed run; a callback's (see above); the
 * runtime's, naming the stage and op (DEADLINE_EXCEEDED from a stage stuck for
 * wait_timeout_seconds); on_iteration's code with its message. */
PO_C_API_EXPORT po_status po_pipeline_run(po_pipeline* pipeline, int32_t num_iterations,
                                          po_iteration_fn on_iteration, void* user);

/* Number of stages, p. */
PO_C_API_EXPORT po_status po_pipeline_num_stages(const po_pipeline* pipeline, int32_t* out);

/* One stage's measured iteration (IterationStats, runtime.h). Times are seconds on the
 * backend's clock. The stash peak is the quantity the compiler predicts, exactly:
 * po_stage_prediction.peak_bytes of po_pipeline_schedule's predictions. */
typedef struct po_iteration_stats {
  uint32_t struct_size;
  int32_t stage;
  int64_t stash_high_water_bytes;  /* logical stash peak, in program order */
  int64_t stash_physical_high_water_bytes;  /* also counts blocks whose D2H copy still ran */
  int64_t stash_high_water_entries;
  int64_t p2p_high_water_bytes;    /* P2P buffers of the arena */
  int64_t host_high_water_bytes;   /* pinned host pool in use */
  int64_t offloaded_bytes;         /* D2H bytes this iteration */
  int64_t reloaded_bytes;          /* H2D bytes this iteration */
  double start_time;
  double end_time;
  double compute_seconds;          /* inside the callbacks */
  double wait_seconds;             /* blocked on receives, copies, reloads and barriers */
  /* Appended after the first release. */
  double recompute_seconds;        /* of compute_seconds: the recompute callback */
} po_iteration_stats;

/* Stats of `stage` in iteration `iteration` of the last po_pipeline_run (the caller sets
 * out->struct_size first). Errors: OUT_OF_RANGE for a stage outside [0, p) or an iteration
 * that did not finish in the last run (none before the first run). */
PO_C_API_EXPORT po_status po_pipeline_stats(const po_pipeline* pipeline, int32_t iteration,
                                            int32_t stage, po_iteration_stats* out);

/* A new handle holding the schedule the pipeline runs, with the predictions it was planned
 * (or re-simulated) with under the callbacks' byte sizes, and that cost model
 * (po_schedule_simulate(NULL) uses it). The caller frees it with po_schedule_free. */
PO_C_API_EXPORT po_status po_pipeline_schedule(const po_pipeline* pipeline, po_schedule** out);

/* Drains and frees every stage; NULL is allowed. Must not overlap another call on it. */
PO_C_API_EXPORT void po_pipeline_free(po_pipeline* pipeline);

/* ---- one rank's stage -------------------------------------------------------------------- */

/* A job of several processes (launched by mpirun, or any launcher Open MPI accepts: its
 * environment names the rank) in which rank r runs stage r of the schedule. Every rank opens
 * its stage with po_stage_open, runs it with po_stage_run and frees it; each call that says
 * "collective" must be made by every rank, in the same order, or the others wait for it (up to
 * wait_timeout_seconds, then fail naming what they waited for).
 *  - MPI: the library starts MPI (MPI_Init_thread) when nobody has yet, and finalizes it at
 *    po_stage_free in that case; a caller that started MPI itself keeps it. Only one po_stage
 *    per process.
 *  - The callbacks follow the rules above ("Threads", "Buffers and streams"), with stage =
 *    this rank; they are called on the thread that calls po_stage_open and po_stage_run.
 *  - Failures: after each iteration every rank learns every other's outcome, so all ranks
 *    return the same error from po_stage_run ("iteration I failed on 1 of 4 ranks (rank 2):
 *    <reason>", each failed rank named with its reason, the code that of the lowest failed
 *    rank). A rank whose callback fails reports that failure; the ranks that waited for it
 *    report their timeouts after wait_timeout_seconds. Open fails alike on every rank. */

/* Transports (po_stage_open). */
enum {
  PO_TRANSPORT_MPI = 0, /* MPI point-to-point with host buffers: needs PO_BACKEND_CPU (the Open
                           MPI here is not CUDA-aware) */
  PO_TRANSPORT_NCCL = 1 /* NCCL between GPUs, bootstrapped over MPI: needs PO_BACKEND_CUDA; the
                           GPU is cuda_device, or with cuda_device = -1 the rank's local index
                           on its node (one GPU per rank) */
};

typedef struct po_stage po_stage; /* this process's stage of a job of several ranks */

/* Collective. Joins the job and opens stage r = this rank with `callbacks` (one table) and
 * `options` (as po_pipeline_open's; the schedule's stage count must be the job's size).
 * Errors: those of po_pipeline_open (the same on every rank, naming the ranks that failed);
 * INVALID_ARGUMENT for an unknown transport, or a backend that does not go with it;
 * UNIMPLEMENTED when the library was built without that transport; UNAVAILABLE when MPI or
 * NCCL cannot start; DEADLINE_EXCEEDED when a rank does not arrive in time. */
PO_C_API_EXPORT po_status po_stage_open(const po_stage_callbacks* callbacks,
                                        const po_pipeline_options* options, int32_t transport,
                                        po_stage** out);

/* Collective. Runs `num_iterations` (>= 1) iterations of this stage's program, calling
 * on_iteration(user, i, ...) (when not NULL) after iteration i has finished on every rank.
 * Errors: as po_pipeline_run's, the same on every rank (see "Failures" above). */
PO_C_API_EXPORT po_status po_stage_run(po_stage* stage, int32_t num_iterations,
                                       po_iteration_fn on_iteration, void* user);

/* This rank (= its stage) and the job's size (= the stage count). */
PO_C_API_EXPORT po_status po_stage_rank(const po_stage* stage, int32_t* rank,
                                        int32_t* num_stages);

/* This stage's measured iteration `iteration` of the last po_stage_run (out->struct_size set
 * by the caller). Errors: OUT_OF_RANGE for an iteration that did not finish in the last run. */
PO_C_API_EXPORT po_status po_stage_stats(const po_stage* stage, int32_t iteration,
                                         po_iteration_stats* out);

/* A new handle holding the schedule every rank runs, with its predictions (as
 * po_pipeline_schedule). The caller frees it with po_schedule_free. */
PO_C_API_EXPORT po_status po_stage_schedule(const po_stage* stage, po_schedule** out);

/* Not collective, but every rank should free its stage: it drains the device, leaves the job
 * and, when the library started MPI, finalizes it. NULL is allowed. */
PO_C_API_EXPORT void po_stage_free(po_stage* stage);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* PIPEOFFLOAD_C_API_H_ */
