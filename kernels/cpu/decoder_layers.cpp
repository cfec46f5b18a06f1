// All decoder layers of a Llama-family model in one call, bfloat16 or float32, for the cpu
// backend.
//
// It runs exactly the kernels the layers' Python modules call, in the same order and on the
// same values (so its output is bit-identical to theirs): per layer
//   h = rms_norm(x + residual)                       (residual updated in place)
//   qkv = h W_qkv^T (+ bias); rotary on q, k; store k, v at the step's slots
//   a = paged attention of q over the layer's pool; x_attn = a W_o^T
//   h = rms_norm(x_attn + residual)
//   x = silu_and_mul(h W_gate_up^T) W_down^T       (on AMX tiles in one kernel, same bits)
// What it saves is the Python between them: on 2 cores the ~300 wrapper and module calls
// of a decode step cost about as much as the batch-1 step's attention, norms and
// activations together. The intermediate tensors live in one buffer, kept for the next call.
//
// Called from runtime/models/cpu_decoder_layers.py, which checks every pointer's tensor once
// when it builds the layer table and the step's tensors on each call. One entry per storage
// type: decoder_layers_bf16 (weights packed for linear_bf16) and decoder_layers_f32 (for
// linear_f32); the tensors' pointers in the tables are of that type.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "aligned.h"
#include "bf16.h"
#include "entries.h"
#include "paged_batch.h"

using forkserve::Bf16;

// The kernels of one storage type, and how its packed weights are stored.
template <typename T>
struct Kernels;
template <>
struct Kernels<Bf16> {
    using Packed = uint16_t;
    static constexpr auto rms_norm = rms_norm_bf16;
    static constexpr auto rotary = rotary_bf16;
    static constexpr auto store_kv = store_kv_bf16;
    static constexpr auto silu_and_mul = silu_and_mul_bf16;
    static constexpr auto linear = linear_bf16;
    static constexpr auto gate_up_silu = linear_bf16_silu_mul;
};
template <>
struct Kernels<float> {
    using Packed = float;
    static constexpr auto rms_norm = rms_norm_f32;
    static constexpr auto rotary = rotary_f32;
    static constexpr auto store_kv = store_kv_f32;
    static constexpr auto silu_and_mul = silu_and_mul_f32;
    static constexpr auto linear = linear_f32;
    // No fused form: always "not done" (the caller runs linear, then silu_and_mul).
    static int gate_up_silu(const float *, int64_t, int64_t, int64_t, const float *, int64_t, float *, int64_t, int) {
        return 1;
    }
};

// The model's sizes and shared tables (field order as in the Python ctypes structure).
struct DecoderShape {
    int64_t hidden, intermediate, num_heads, kv_heads, head_dim, num_slots, max_positions;
    float eps, scale;
    const float *cos, *sin;  // [max_positions, head_dim] float32
};

// One layer's weights (packed for the storage type's GEMM; for float32, those that are
// quantized blocks also packed for linear_blocks, in the format given beside, else null) and
// its K/V pool tensors.
template <typename T>
struct DecoderLayer {
    const T *input_norm, *post_norm, *qkv_bias;  // qkv_bias may be null
    const typename Kernels<T>::Packed *qkv, *o, *gate_up, *down;
    T *k_cache, *v_cache;
    const void *qkv_blocks, *o_blocks, *gate_up_blocks, *down_blocks;  // always null for bfloat16
    int64_t qkv_format, o_format, gate_up_format, down_format;        // of each blocks pointer (entries.h)
};

// out[t, width] = x[t, in] W^T (+ bias) for a layer's weight `packed`: from its `blocks` in
// `format` (linear_blocks.cpp, the same bits) for as few rows as that kernel is the faster
// for.
template <typename T>
static int layer_linear(const typename Kernels<T>::Packed *packed, const void *blocks, int64_t format, const T *x,
                        int64_t t, int64_t in, const T *bias, T *out, int64_t width, int threads) {
    if constexpr (std::is_same_v<T, float>)
        if (blocks != nullptr && t <= linear_blocks_few_rows(static_cast<int>(format)))
            return linear_blocks(static_cast<int>(format), x, t, in, in, blocks, width, bias, out, width, threads);
    return Kernels<T>::linear(x, t, in, in, packed, width, bias, out, width, threads);
}

// The step: which slots each token writes, which keys each token sees (as paged_attention).
struct DecoderStep {
    int64_t tokens;
    const int64_t *positions, *out_cache_loc;
    const int64_t *req_to_token;
    int64_t r2t_stride;
    const int64_t *rows, *prefix, *q_start, *token_req;
    int64_t max_keys;
};

// Values from which the queries' copy out of the QKV rows is split between the threads (one
// thread copying them left the other waiting: ~0.8% of a tree-of-thought run's samples).
constexpr int64_t kParallelCopy = 1 << 14;

// Status codes (the Python side turns them into errors).
enum : int { kOk = 0, kBadPosition = 1, kBadSlot = 2, kBadAttentionShape = 3, kNoGemm = 4, kNoMemory = 5 };

// A buffer of at least `bytes`, 64-byte aligned (aligned.h), reused from call to call (a
// step's intermediates are tens of MiB at prefill sizes; mapping fresh pages for them every
// step costs page faults), or null.
static unsigned char *scratch(size_t bytes) {
    static thread_local void *buffer = nullptr;
    static thread_local size_t size = 0;
    if (bytes > size) {
        std::free(buffer);
        const size_t rounded = forkserve::cache_lines(bytes);
        buffer = std::aligned_alloc(forkserve::kCacheLine, rounded);
        size = buffer != nullptr ? rounded : 0;
    }
    return static_cast<unsigned char *>(buffer);
}

template <typename T>
static int decoder_layers(const DecoderShape *shape, const DecoderLayer<T> *layers, int64_t num_layers,
                          const DecoderStep *step, T *residual, T *x_out, int threads) {
    using K = Kernels<T>;
    const DecoderShape &s = *shape;
    const int64_t t = step->tokens, q_size = s.num_heads * s.head_dim, kv_size = s.kv_heads * s.head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    // One buffer for every intermediate: h, qkv, q (contiguous), attention out, gate_up, act,
    // each starting on a cache line.
    constexpr int kParts = 6;
    const int64_t widths[kParts] = {s.hidden, qkv_size, q_size, q_size, 2 * s.intermediate, s.intermediate};
    size_t offsets[kParts + 1] = {0};
    for (int i = 0; i < kParts; i++)
        offsets[i + 1] = offsets[i] + forkserve::cache_lines(sizeof(T) * static_cast<size_t>(t * widths[i]));
    unsigned char *buffer = scratch(offsets[kParts] > 0 ? offsets[kParts] : 1);
    if (buffer == nullptr) return kNoMemory;
    T *part[kParts];
    for (int i = 0; i < kParts; i++) part[i] = reinterpret_cast<T *>(buffer + offsets[i]);
    T *h = part[0], *qkv = part[1], *q = part[2], *attn = part[3], *gate_up = part[4], *act = part[5];

    // The step's batch as paged attention reads it, and its decode tokens' shared-prefix
    // groups, the same in every layer.
    const forkserve::Batch batch{s.num_slots,  step->r2t_stride, t,           s.num_heads,     s.kv_heads,
                                 s.head_dim,   step->max_keys,   step->req_to_token, step->rows, step->prefix,
                                 step->q_start, step->token_req, s.scale};
    const forkserve::SharedPlan plan = forkserve::plan_shared_decodes<T>(batch);
    int status = kOk;
    const T *no_bias = nullptr;
    for (int64_t l = 0; l < num_layers && status == kOk; l++) {
        const DecoderLayer<T> &w = layers[l];
        if (l == 0)
            K::rms_norm(residual, nullptr, w.input_norm, h, t, s.hidden, s.eps, threads);
        else
            K::rms_norm(x_out, residual, w.input_norm, h, t, s.hidden, s.eps, threads);
        if (layer_linear(w.qkv, w.qkv_blocks, w.qkv_format, h, t, s.hidden, w.qkv_bias, qkv, qkv_size, threads)) {
            status = kNoGemm;
            break;
        }
        T *k = qkv + q_size, *v = k + kv_size;
        if (K::rotary(qkv, k, step->positions, s.cos, s.sin, s.max_positions, t, s.num_heads, s.kv_heads,
                      s.head_dim, qkv_size, qkv_size, threads)) {
            status = kBadPosition;
            break;
        }
        if (K::store_kv(k, qkv_size, v, qkv_size, step->out_cache_loc, t, s.kv_heads, s.head_dim, w.k_cache,
                        w.v_cache, s.num_slots, threads)) {
            status = kBadSlot;
            break;
        }
#pragma omp parallel for num_threads(threads) schedule(static) if (t * q_size >= kParallelCopy)
        for (int64_t i = 0; i < t; i++) std::memcpy(q + i * q_size, qkv + i * qkv_size, sizeof(T) * q_size);
        if (forkserve::paged_attention_planned(batch, q, w.k_cache, w.v_cache, attn, threads, plan)) {
            status = kBadAttentionShape;
            break;
        }
        // x_out holds the attention block's output until the MLP overwrites it.
        layer_linear(w.o, w.o_blocks, w.o_format, attn, t, q_size, no_bias, x_out, s.hidden, threads);
        K::rms_norm(x_out, residual, w.post_norm, h, t, s.hidden, s.eps, threads);
        // On AMX tiles the activation comes straight from the gate-up product's tiles
        // (linear_amx_silu_mul); elsewhere the product, then silu_and_mul. Same bits.
        if (K::gate_up_silu(h, t, s.hidden, s.hidden, w.gate_up, s.intermediate, act, s.intermediate, threads) != 0) {
            layer_linear(w.gate_up, w.gate_up_blocks, w.gate_up_format, h, t, s.hidden, no_bias, gate_up,
                         2 * s.intermediate, threads);
            K::silu_and_mul(gate_up, act, t, s.intermediate, threads);
        }
        layer_linear(w.down, w.down_blocks, w.down_format, act, t, s.intermediate, no_bias, x_out, s.hidden, threads);
    }
    return status;
}

// residual: in, the embeddings; out, the skip connection after the last layer. x_out: the
// last layer's MLP output (the caller's final norm adds the two).
extern "C" int decoder_layers_bf16(const DecoderShape *shape, const DecoderLayer<Bf16> *layers, int64_t num_layers,
                                   const DecoderStep *step, Bf16 *residual, Bf16 *x_out, int threads) {
    return decoder_layers(shape, layers, num_layers, step, residual, x_out, threads);
}

extern "C" int decoder_layers_f32(const DecoderShape *shape, const DecoderLayer<float> *layers, int64_t num_layers,
                                  const DecoderStep *step, float *residual, float *x_out, int threads) {
    return decoder_layers(shape, layers, num_layers, step, residual, x_out, threads);
}

// Bytes of one entry of the layer table (the same for both storage types), for callers that
// lay the table out themselves to check theirs against: runtime/models/cpu_decoder_layers.py,
// and bench_agent/bench_kernel_ab.py against another revision's library.
extern "C" int64_t decoder_layer_bytes() {
    static_assert(sizeof(DecoderLayer<float>) == sizeof(DecoderLayer<Bf16>));
    return static_cast<int64_t>(sizeof(DecoderLayer<float>));
}
