/* The toy pipeline model of the C ABI's run tests (c_api_stage_test: every stage in one process;
 * c_api_rank_test: one stage per MPI rank): virtual stage l computes y = a_l * x elementwise,
 * with a loss 0.5 * |y - t|^2 at the end. It offers recompute (full keeps x of the entry
 * x | y | y - t, lean keeps x | y) through its callbacks, which check the arguments against c_api.h's
 * contract and record every gradient by (virtual stage, microbatch), so a check does not depend
 * on the order a schedule runs microbatches in; ToyReference computes the same in a straight
 * line, bit for bit (the same float operations in the same order). */
#ifndef PIPEOFFLOAD_TESTS_C_API_TOY_MODEL_H_
#define PIPEOFFLOAD_TESTS_C_API_TOY_MODEL_H_

#include <stdint.h>

#include "pipeoffload/c_api.h"

enum { kWidth = 64, kMaxVirtual = 8, kMaxMicrobatches = 8, kMaxStages = 4 };

/* What the stages' callbacks write. */
typedef struct Results {
  float weight_grad[kMaxVirtual][kMaxMicrobatches][kWidth]; /* dL/da_l of microbatch mb */
  float input_grad[kMaxMicrobatches][kWidth];               /* dL/dx of virtual stage 0 */
  float loss_input[kMaxMicrobatches][kWidth];               /* y of the last virtual stage */
} Results;

/* One stage's `user` context. */
typedef struct Toy {
  int32_t stage, num_stages, num_chunks, split;
  Results* results;
  int32_t calls;              /* compute callbacks seen (this stage's thread only) */
  int32_t recompute_calls;    /* of them, forward_retaining and recompute */
  int32_t fail_kind, fail_mb; /* the op to fail (fail_kind -1: none) ... */
  po_status fail_code;        /* ... with this code */
  const char* fail_message;   /* ... and message (NULL: none given) */
  int32_t saved_bytes_answer; /* 0: the real size; else this (a bad answer) */
  uint64_t streams_seen;      /* OR of every args->stream */
  /* Nonzero: the buffers are device memory (PO_BACKEND_CUDA), which C code on the host must
   * not touch: the callbacks then check their arguments and count, and compute nothing. */
  int32_t device_buffers;
  /* Nonzero: B reads lean blocks as they are (backward_reads_retained, unsplit only): its
   * rebuild of g moves into backward, and no recompute callback comes for lean entries. */
  int32_t backward_reads_lean;
} Toy;

/* Sets up stage `stage` of p stages with v chunks each (`split`: W is separate), writing into
 * `results`, failing nothing; and its callback table (user = toy). */
void ToyInit(Toy* toy, int32_t stage, int32_t p, int32_t v, int32_t split, Results* results);
/* Sets backward_reads_retained only when toy->backward_reads_lean (set it before). */
void ToyCallbacks(Toy* toy, po_stage_callbacks* callbacks);

/* The straight-line computation of `num_virtual` virtual stages and m microbatches. */
void ToyReference(int32_t num_virtual, int32_t m, Results* out);

/* po_spec_init's spec with these fields set. */
po_spec ToySpec(const char* family, const char* offload, int32_t p, int32_t m, int32_t v,
                int32_t split);

#endif /* PIPEOFFLOAD_TESTS_C_API_TOY_MODEL_H_ */
