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

static int64_t SavedBytes(void* user, int32_t stage, int32_t chunk, int32_t split) {
  const Toy* toy = (const Toy*)user;
  (void)stage;
  (void)chunk;
  if (toy->saved_bytes_answer != 0) return toy->saved_bytes_answer;
  /* x; with W split off, also dy, which B leaves for W. */
  return (int64_t)(split ? 2 : 1) * kWidth * (int64_t)sizeof(float);
}

/* Fails the call when it is the one the test asked to fail. */
static po_status MaybeFail(Toy* toy, const po_compute_args* args, po_callback_error* error) {
  if (args->kind != toy->fail_kind || args->mb != toy->fail_mb) return PO_OK;
  if (toy->fail_message != NULL) po_callback_error_set(error, toy->fail_message);
  return toy->fail_code;
}

static po_status Forward(void* user, const po_compute_args* args, po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t l = Virtual(toy, args->chunk);
  float* x = (float*)args->saved;
  int32_t i;
  ++toy->calls;
  toy->streams_seen |= args->stream;
  if (args->kind != PO_OP_FORWARD || args->stage != toy->stage ||
      args->struct_size != sizeof(po_compute_args) ||
      args->boundary_bytes != kWidth * (int64_t)sizeof(float) ||
      args->saved_bytes != SavedBytes(user, toy->stage, args->chunk, toy->split) ||
      (args->input == NULL) != (l == 0) || (args->output == NULL) != (l == LastVirtual(toy))) {
    po_callback_error_set(error, "toy: forward got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  for (i = 0; i < kWidth; ++i) x[i] = l == 0 ? Input(args->mb, i) : ((const float*)args->input)[i];
  for (i = 0; i < kWidth; ++i) {
    const float y = Weight(l, i) * x[i];
    if (args->output != NULL) {
      ((float*)args->output)[i] = y;
    } else {
      toy->results->loss_input[args->mb][i] = y;
    }
  }
  return MaybeFail(toy, args, error);
}

/* dy of (mb, l): from the loss on the last virtual stage, else the gradient received. */
static float OutputGrad(const po_compute_args* args, int32_t l, int32_t i) {
  if (args->input != NULL) return ((const float*)args->input)[i];
  return Weight(l, i) * ((const float*)args->saved)[i] - Target(i);
}

static void WeightGrad(Toy* toy, int32_t l, int32_t mb, const float* x, const float* dy) {
  int32_t i;
  for (i = 0; i < kWidth; ++i) toy->results->weight_grad[l][mb][i] = dy[i] * x[i];
}

static po_status Backward(void* user, const po_compute_args* args, po_callback_error* error) {
  Toy* toy = (Toy*)user;
  const int32_t l = Virtual(toy, args->chunk);
  float* saved = (float*)args->saved;
  float dy[kWidth];
  int32_t i;
  ++toy->calls;
  if (args->kind != PO_OP_BACKWARD || args->with_weight_grad != !toy->split ||
      (args->input == NULL) != (l == LastVirtual(toy)) || (args->output == NULL) != (l == 0)) {
    po_callback_error_set(error, "toy: backward got arguments against the contract");
    return PO_ERROR_INTERNAL;
  }
  if (toy->device_buffers) return MaybeFail(toy, args, error);
  for (i = 0; i < kWidth; ++i) dy[i] = OutputGrad(args, l, i);
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
    memcpy(saved + kWidth, dy, sizeof(dy)); /* what W needs */
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
  WeightGrad(toy, Virtual(toy, args->chunk), args->mb, saved, saved + kWidth);
  return MaybeFail(toy, args, error);
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
}
