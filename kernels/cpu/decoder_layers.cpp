// All decoder layers of a Llama-family model in one call, bfloat16, for the cpu backend.
//
// It runs exactly the kernels the layers' Python modules call, in the same order and on the
// same values (so its output is bit-identical to theirs): per layer
//   h = rms_norm(x + residual)                       (residual updated in place)
//   qkv = h W_qkv^T (+ bias); rotary on q, k; store k, v at the step's slots
//   a = paged attention of q over the layer's pool; x_attn = a W_o^T
//   h = rms_norm(x_attn + residual)
//   x = silu_and_mul(h W_gate_up^T) W_down^T
// What it saves is the Python between them: on 2 cores the ~300 wrapper and module calls
// of a decode step cost about as much as the batch-1 step's attention, norms and
// activations together. The intermediate tensors live in one buffer, kept for the next call.
//
// Called from runtime/models/cpu_decoder_layers.py, which checks every pointer's tensor once
// when it builds the layer table and the step's tensors on each call.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "bf16.h"
#include "entries.h"
#include "paged_batch.h"

using forkserve::Bf16;

// The model's sizes and shared tables (field order as in the Python ctypes structure).
struct DecoderShape {
    int64_t hidden, intermediate, num_heads, kv_heads, head_dim, num_slots, max_positions;
    float eps, scale;
    const float *cos, *sin;  // [max_positions, head_dim] float32
};

// One layer's weights (packed for linear_bf16) and its K/V pool tensors.
struct DecoderLayer {
    const Bf16 *input_norm, *post_norm, *qkv_bias;  // qkv_bias may be null
    const uint16_t *qkv, *o, *gate_up, *down;
    Bf16 *k_cache, *v_cache;
};

// The step: which slots each token writes, which keys each token sees (as paged_attention).
struct DecoderStep {
    int64_t tokens;
    const int64_t *positions, *out_cache_loc;
    const int64_t *req_to_token;
    int64_t r2t_stride;
    const int64_t *rows, *prefix, *q_start, *token_req;
    int64_t max_keys;
};

// Status codes (the Python side turns them into errors).
enum : int { kOk = 0, kBadPosition = 1, kBadSlot = 2, kBadAttentionShape = 3, kNoGemm = 4, kNoMemory = 5 };

// A buffer of at least `n` values, reused from call to call (a step's intermediates are tens of
// MiB at prefill sizes; mapping fresh pages for them every step costs page faults), or null.
static Bf16 *scratch(size_t n) {
    static thread_local Bf16 *buffer = nullptr;
    static thread_local size_t size = 0;
    if (n > size) {
        std::free(buffer);
        buffer = static_cast<Bf16 *>(std::malloc(sizeof(Bf16) * n));
        size = buffer != nullptr ? n : 0;
    }
    return buffer;
}

// residual: in, the embeddings; out, the skip connection after the last layer. x_out: the
// last layer's MLP output (the caller's final norm adds the two).
extern "C" int decoder_layers_bf16(const DecoderShape *shape, const DecoderLayer *layers, int64_t num_layers,
                                   const DecoderStep *step, Bf16 *residual, Bf16 *x_out, int threads) {
    const DecoderShape &s = *shape;
    const int64_t t = step->tokens, q_size = s.num_heads * s.head_dim, kv_size = s.kv_heads * s.head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    // One buffer for every intermediate: h, qkv, q (contiguous), attention out, gate_up, act.
    const int64_t sizes[] = {s.hidden, qkv_size, q_size, q_size, 2 * s.intermediate, s.intermediate};
    int64_t total = 0;
    for (int64_t n : sizes) total += t * n;
    Bf16 *buffer = scratch(static_cast<size_t>(total > 0 ? total : 1));
    if (buffer == nullptr) return kNoMemory;
    Bf16 *h = buffer, *qkv = h + t * s.hidden, *q = qkv + t * qkv_size, *attn = q + t * q_size;
    Bf16 *gate_up = attn + t * q_size, *act = gate_up + t * 2 * s.intermediate;

    // The step's batch as paged attention reads it, and its decode tokens' shared-prefix
    // groups, the same in every layer.
    const forkserve::Batch batch{s.num_slots,  step->r2t_stride, t,           s.num_heads,     s.kv_heads,
                                 s.head_dim,   step->max_keys,   step->req_to_token, step->rows, step->prefix,
                                 step->q_start, step->token_req, s.scale};
    const forkserve::SharedPlan plan = forkserve::plan_shared_decodes(batch);
    int status = kOk;
    for (int64_t l = 0; l < num_layers && status == kOk; l++) {
        const DecoderLayer &w = layers[l];
        if (l == 0)
            rms_norm_bf16(residual, nullptr, w.input_norm, h, t, s.hidden, s.eps, threads);
        else
            rms_norm_bf16(x_out, residual, w.input_norm, h, t, s.hidden, s.eps, threads);
        if (linear_bf16(h, t, s.hidden, s.hidden, w.qkv, qkv_size, w.qkv_bias, qkv, qkv_size, threads)) {
            status = kNoGemm;
            break;
        }
        Bf16 *k = qkv + q_size, *v = k + kv_size;
        if (rotary_bf16(qkv, k, step->positions, s.cos, s.sin, s.max_positions, t, s.num_heads, s.kv_heads,
                        s.head_dim, qkv_size, qkv_size, threads)) {
            status = kBadPosition;
            break;
        }
        if (store_kv_bf16(k, qkv_size, v, qkv_size, step->out_cache_loc, t, s.kv_heads, s.head_dim, w.k_cache,
                          w.v_cache, s.num_slots, threads)) {
            status = kBadSlot;
            break;
        }
        for (int64_t i = 0; i < t; i++) std::memcpy(q + i * q_size, qkv + i * qkv_size, sizeof(Bf16) * q_size);
        if (forkserve::paged_attention_planned(batch, q, w.k_cache, w.v_cache, attn, threads, plan)) {
            status = kBadAttentionShape;
            break;
        }
        // x_out holds the attention block's output until the MLP overwrites it.
        linear_bf16(attn, t, q_size, q_size, w.o, s.hidden, nullptr, x_out, s.hidden, threads);
        rms_norm_bf16(x_out, residual, w.post_norm, h, t, s.hidden, s.eps, threads);
        linear_bf16(h, t, s.hidden, s.hidden, w.gate_up, 2 * s.intermediate, nullptr, gate_up, 2 * s.intermediate,
                    threads);
        silu_and_mul_bf16(gate_up, act, t, s.intermediate, threads);
        linear_bf16(act, t, s.intermediate, s.intermediate, w.down, s.hidden, nullptr, x_out, s.hidden, threads);
    }
    return status;
}
