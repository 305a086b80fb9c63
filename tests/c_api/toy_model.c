/* The toy pipeline model of the C ABI's run tests (toy_model.h). */
#include "tests/c_api/toy_model.h"

#include <string.h>

static float Weight(int32_t l, int32_t i) { return 1.0f + 0.01f * (float)((l + 1) * (i % 5)); }
static float Input(int32_t mb, int32_t i) { return (float)((mb * 7 + i * 3) % 11) * 0.25f - 1.0f; }
static float Target(int32_t i) { return 0.5f * (float)i / kWidth; }

/* Loop placement: chunk c of stage d is virtual stage c * p + d. */
static int32_t Virtual(const Toy* toy, int32_t chunk) {
  return chunk * toy->num_stages + toy->stage;
}
static int32_t LastVirtual(const Toy* toy) { return toy->num_stages * toy->num_chunks - 1; }

/* The stash entry's layout, in floats: x | y = a_l * x | g = y - t (B's loss residual) and,
 * with W split off, dy, which B leaves for W. B needs only x (and g on the last virtual stage)
 * but checks y and g, so an entry rebuilt wrong by a recompute fails the run. */
enum { kX = 0, kY = kWidth, kG = 2 * kWidth, kDy = 3 * kWidth };

static int64_t SavedBytes(void* user, int32_t stage, int32_t chunk, int32_t split) {
  const Toy* toy = (const Toy*)user;
  (void)stage;
  (void)chunk;
  if (toy->saved_bytes_answer != 0) return toy->saved_bytes_answer;
  return (int64_t)(split ? 4 : 3) * kWidth * (int64_t)sizeof(float);
}

/* Full recompute keeps x (the chunk's input), lean keeps x and y (the "expensive" product) and
 * recomputes only g. */
static int64_t RetainedBytes(void* user, int32_t stage, int32_t chunk, int32_t mode,
                             int32_t split) {
  (void)user;
  (void)stage;
  (void)chunk;
  (void)split;
  if (mode == PO_RECOMPUTE_FULL) return kWidth * (int64_t)sizeof(float);
  if (mode == PO_RECOMPUTE_LEAN) return 2 * kWidth * (int64_t)sizeof(float);
  return -1;
}

/* y and g of the entry from its x (full) or from its y (lean: only g). */
static void Rebuild(float* entry, int32_t l, int32_t from_y) {
  int32_t i;
  for (i = 0; i < kWidth && !from_y; ++i) entry[kY + i] = Weight(l, i) * entry[kX + i];
  for (i = 0; i < kWidth; ++i) entry[kG + i] = entry[kY + i] - Target(i);
}

/* Fails the call when it is the one the test asked to fail. */
static po_status MaybeFail(Toy* toy, const po_compute_args* args, po_callback_error* error) {
  if (args->kind != toy->fail_kind || args->mb != toy->fail_mb) return PO_OK;
  if (toy->fail_message != NULL) po_callback_error_set(error, toy->fail_message);
  return toy->fail_code;
}

/* Whether a compute call's common arguments keep the contract (kind checked by the caller). */
static int32_t ContractHolds(const Toy* toy, const po_compute_args* args) {
  return args->stage == toy->stage && args->struct_size == sizeof(po_compute_args) &&
         args->boundary_bytes == kWidth * (int64_t)sizeof(float) &&
         args->saved_bytes == SavedBytes((void*)toy, toy->stage, args->chunk, toy->split);
}

/* F's work: x and y into `entry` (x | y | g, or the retained block's x | y prefix: `keep`
 * floats of it), the output or the loss's input; g too when the full entry is kept. */
static void ForwardInto(Toy* toy, const po_compute_args* args, float* entry, int32_t keep) {
  const int32_t l = Virtual(toy, args->chunk);
  float x[kWidth], y[kWidth];
  int32_t i;
  for (i = 0; i < kWidth; ++i) x[i] = l == 0 ? Input(args->mb, i) : ((const float*)args->input)[i];
  for (i = 0; i < kWidth; ++i) {
    y[i] = Weight(l, i) * x[i];
    if (args->output != NULL) {
      ((float*)args->output)[i] = y[i];
    } else {
      toy->results->loss_input[args->mb][i] = y[i];
    }
  }
  memcpy(entry + kX, x, sizeof(x));
  if (keep > kY) memcpy(entry + kY, y, sizeof(y));
  if (keep > kG) Rebuild(entry, l, 1);
}

static po_status Forward(void* user, const po_compute_args* args, po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t l = Virtual(toy, args->chunk);
  ++toy->calls;
  toy->streams_seen |= args->stream;
  if (args->kind != PO_OP_FORWARD || !ContractHolds(toy, args) ||
      args->recompute != PO_RECOMPUTE_NONE || args->retained != NULL ||
      (args->input == NULL) != (l == 0) || (args->output == NULL) != (l == LastVirtual(toy))) {
    po_callback_error_set(error, "toy: forward got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  ForwardInto(toy, args, (float*)args->saved, 3 * kWidth);
  return MaybeFail(toy, args, error);
}

static po_status ForwardRetaining(void* user, const po_compute_args* args,
                                  po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t l = Virtual(toy, args->chunk);
  ++toy->calls;
  ++toy->recompute_calls;
  if (args->kind != PO_OP_FORWARD || !ContractHolds(toy, args) || args->saved != NULL ||
      args->retained == NULL ||
      args->retained_bytes !=
          RetainedBytes(user, toy->stage, args->chunk, args->recompute, toy->split) ||
      (args->input == NULL) != (l == 0) || (args->output == NULL) != (l == LastVirtual(toy))) {
    po_callback_error_set(error, "toy: forward_retaining got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  ForwardInto(toy, args, (float*)args->retained,
              (int32_t)(args->retained_bytes / (int64_t)sizeof(float)));
  return MaybeFail(toy, args, error);
}

static po_status Recompute(void* user, const po_compute_args* args, po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t lean = args->kind == PO_OP_RECOMPUTE_LEAN;
  ++toy->calls;
  ++toy->recompute_calls;
  if ((args->kind != PO_OP_RECOMPUTE && !lean) || !ContractHolds(toy, args) ||
      args->recompute != (lean ? PO_RECOMPUTE_LEAN : PO_RECOMPUTE_FULL) ||
      args->saved == NULL || args->retained == NULL || args->input != NULL ||
      args->output != NULL ||
      args->retained_bytes !=
          RetainedBytes(user, toy->stage, args->chunk, args->recompute, toy->split)) {
    po_callback_error_set(error, "toy: recompute got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  memcpy(args->saved, args->retained, (size_t)args->retained_bytes);
  Rebuild((float*)args->saved, Virtual(toy, args->chunk), lean);
  return MaybeFail(toy, args, error);
}

/* dy of (mb, l): the gradient received, or on the last virtual stage the loss residual g (of
 * a lean block, rebuilt here as F computed it). */
static float OutputGrad(const po_compute_args* args, int32_t lean, int32_t i) {
  if (args->input != NULL) return ((const float*)args->input)[i];
  if (lean) return ((const float*)args->saved)[kY + i] - Target(i);
  return ((const float*)args->saved)[kG + i];
}

/* Whether y and g of the entry (of a lean block: y) are, bitwise, what F computed from its x. */
static int32_t EntryIntact(const float* entry, int32_t l, int32_t lean) {
  int32_t i;
  for (i = 0; i < kWidth; ++i) {
    const float y = Weight(l, i) * entry[kX + i];
    if (memcmp(&y, entry + kY + i, sizeof(y)) != 0) return 0;
    if (!lean) {
      const float g = y - Target(i);
      if (memcmp(&g, entry + kG + i, sizeof(g)) != 0) return 0;
    }
  }
  return 1;
}

static void WeightGrad(Toy* toy, int32_t l, int32_t mb, const float* x, const float* dy) {
  int32_t i;
  for (i = 0; i < kWidth; ++i) toy->results->weight_grad[l][mb][i] = dy[i] * x[i];
}

static po_status Backward(void* user, const po_compute_args* args, po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t l = Virtual(toy, args->chunk);
  float* saved = (float*)args->saved;
  /* A lean block read in place comes with the retained-block arguments (c_api.h). */
  const int32_t lean = args->recompute == PO_RECOMPUTE_LEAN;
  float dy[kWidth];
  int32_t i;
  ++toy->calls;
  if (args->kind != PO_OP_BACKWARD || args->with_weight_grad != !toy->split ||
      (args->input == NULL) != (l == LastVirtual(toy)) || (args->output == NULL) != (l == 0) ||
      (lean ? !toy->backward_reads_lean || args->retained != args->saved ||
                  args->retained_bytes != RetainedBytes(user, toy->stage, args->chunk,
                                                        PO_RECOMPUTE_LEAN, toy->split)
            : args->recompute != PO_RECOMPUTE_NONE || args->retained != NULL)) {
    po_callback_error_set(error, "toy: backward got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  if (!EntryIntact(saved, l, lean)) {
    po_callback_error_set(error, "toy: backward found a stash entry unlike the one F wrote");
    return PO_ERROR_INTERNAL;
  }
  for (i = 0; i < kWidth; ++i) dy[i] = OutputGrad(args, lean, i);
  for (i = 0; i < kWidth; ++i) {
    const float dx = Weight(l, i) * dy[i];
    if (args->output != NULL) {
      ((float*)args->output)[i] = dx;
    } else {
      toy->results->input_grad[args->mb][i] = dx;
    }
  }
  if (args->with_weight_grad) {
    WeightGrad(toy, l, args->mb, saved, dy);
  } else {
    memcpy(saved + kDy, dy, sizeof(dy)); /* what W needs */
  }
  return MaybeFail(toy, args, error);
}

static po_status BackwardWeight(void* user, const po_compute_args* args,
                                po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const float* saved = (const float*)args->saved;
  ++toy->calls;
  if (args->kind != PO_OP_BACKWARD_WEIGHT || args->input != NULL || args->output != NULL) {
    po_callback_error_set(error, "toy: backward_weight got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  WeightGrad(toy, Virtual(toy, args->chunk), args->mb, saved + kX, saved + kDy);
  return MaybeFail(toy, args, error);
}

/* Lean blocks only, unsplit: with W split, B writes dy where a lean block has no room. */
static int32_t BackwardReadsRetained(void* user, int32_t stage, int32_t chunk, int32_t mode,
                                     int32_t split) {
  (void)stage;
  (void)chunk;
  return ((const Toy*)user)->backward_reads_lean && mode == PO_RECOMPUTE_LEAN && !split;
}

/* The same model as one straight line: forward through every virtual stage, then backward. */
void ToyReference(int32_t num_virtual, int32_t m, Results* out) {
  int32_t mb, l, i;
  for (mb = 0; mb < m; ++mb) {
    float x[kMaxVirtual + 1][kWidth];
    float dy[kWidth];
    for (i = 0; i < kWidth; ++i) x[0][i] = Input(mb, i);
    for (l = 0; l < num_virtual; ++l) {
      for (i = 0; i < kWidth; ++i) x[l + 1][i] = Weight(l, i) * x[l][i];
    }
    for (i = 0; i < kWidth; ++i) out->loss_input[mb][i] = x[num_virtual][i];
    for (i = 0; i < kWidth; ++i) dy[i] = x[num_virtual][i] - Target(i);
    for (l = num_virtual - 1; l >= 0; --l) {
      for (i = 0; i < kWidth; ++i) {
        out->weight_grad[l][mb][i] = dy[i] * x[l][i];
        dy[i] = Weight(l, i) * dy[i];
      }
    }
    for (i = 0; i < kWidth; ++i) out->input_grad[mb][i] = dy[i];
  }
}

po_spec ToySpec(const char* family, const char* offload, int32_t p, int32_t m, int32_t v,
                int32_t split) {
  po_spec spec;
  po_spec_init(&spec);
  spec.family = family;
  spec.offload = offload;
  spec.num_stages = p;
  spec.num_microbatches = m;
  spec.chunks_per_stage = v;
  spec.split_backward = split;
  return spec;
}

void ToyInit(Toy* toy, int32_t stage, int32_t p, int32_t v, int32_t split, Results* results) {
  memset(toy, 0, sizeof(*toy));
  toy->stage = stage;
  toy->num_stages = p;
  toy->num_chunks = v;
  toy->split = split;
  toy->results = results;
  toy->fail_kind = -1;
}

void ToyCallbacks(Toy* toy, po_stage_callbacks* callbacks) {
  po_stage_callbacks_init(callbacks);
  callbacks->user = toy;
  callbacks->boundary_bytes = kWidth * (int64_t)sizeof(float);
  callbacks->saved_bytes = SavedBytes;
  callbacks->forward = Forward;
  callbacks->backward = Backward;
  callbacks->backward_weight = toy->split ? BackwardWeight : NULL;
  callbacks->retained_bytes = RetainedBytes;
  callbacks->forward_retaining = ForwardRetaining;
  callbacks->recompute = Recompute;
  if (toy->backward_reads_lean) callbacks->backward_reads_retained = BackwardReadsRetained;
}
