// The entry points that one kernel file calls in another (decoder_layers.cpp; and
// linear_bf16.cpp and paged_attention.cpp calling their AMX kernels), declared once. Each
// file that defines one includes this too, so a definition that drifts from its declaration
// here fails to compile instead of being called with the wrong arguments.
#pragma once

#include <cstdint>

#include "bf16.h"

extern "C" {
void rms_norm_bf16(const forkserve::Bf16 *x, forkserve::Bf16 *residual, const forkserve::Bf16 *weight,
                   forkserve::Bf16 *out, int64_t rows, int64_t hidden, float eps, int threads);
int rotary_bf16(forkserve::Bf16 *q, forkserve::Bf16 *k, const int64_t *positions, const float *cos, const float *sin,
                int64_t max_positions, int64_t tokens, int64_t q_heads, int64_t k_heads, int64_t dim,
                int64_t q_stride, int64_t k_stride, int threads);
void silu_and_mul_bf16(const forkserve::Bf16 *gate_up, forkserve::Bf16 *out, int64_t rows, int64_t width,
                       int threads);
int store_kv_bf16(const forkserve::Bf16 *k, int64_t k_stride, const forkserve::Bf16 *v, int64_t v_stride,
                  const int64_t *loc, int64_t tokens, int64_t kv_heads, int64_t dim, forkserve::Bf16 *k_cache,
                  forkserve::Bf16 *v_cache, int64_t num_slots, int threads);
int paged_attention_bf16(const forkserve::Bf16 *q, const forkserve::Bf16 *k_cache, const forkserve::Bf16 *v_cache,
                         int64_t num_slots, const int64_t *req_to_token, int64_t r2t_stride, const int64_t *rows,
                         const int64_t *prefix, const int64_t *q_start, const int64_t *token_req, int64_t num_tokens,
                         int64_t num_heads, int64_t kv_heads, int64_t dim, float scale, int64_t max_keys,
                         forkserve::Bf16 *out, int threads);
int linear_amx_available();
int extend_attention_amx_bf16(const forkserve::Bf16 *q, const forkserve::Bf16 *k_cache, const forkserve::Bf16 *v_cache,
                              int64_t num_slots, const int64_t *req_to_token, int64_t r2t_stride, const int64_t *rows,
                              const int64_t *prefix, const int64_t *q_start, const int64_t *tokens,
                              const int64_t *reqs, int64_t num_reqs, int64_t num_heads, int64_t kv_heads, int64_t dim,
                              float scale, forkserve::Bf16 *out, int num_threads);
int linear_amx(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride, const uint16_t *packed,
               int64_t out_features, const forkserve::Bf16 *bias, forkserve::Bf16 *out, int64_t out_stride,
               int num_threads);
int linear_bf16(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride, const uint16_t *packed,
                int64_t out_features, const forkserve::Bf16 *bias, forkserve::Bf16 *out, int64_t out_stride,
                int num_threads);
int linear_amx_silu_mul(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                        const uint16_t *packed, int64_t width, forkserve::Bf16 *out, int64_t out_stride,
                        int num_threads);
int linear_bf16_silu_mul(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                         const uint16_t *packed, int64_t width, forkserve::Bf16 *out, int64_t out_stride,
                         int num_threads);
// The float32 ones that decoder_layers.cpp calls.
void rms_norm_f32(const float *x, float *residual, const float *weight, float *out, int64_t rows, int64_t hidden,
                  float eps, int threads);
int rotary_f32(float *q, float *k, const int64_t *positions, const float *cos, const float *sin, int64_t max_positions,
               int64_t tokens, int64_t q_heads, int64_t k_heads, int64_t dim, int64_t q_stride, int64_t k_stride,
               int threads);
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t width, int threads);
int store_kv_f32(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *loc, int64_t tokens,
                 int64_t kv_heads, int64_t dim, float *k_cache, float *v_cache, int64_t num_slots, int threads);
int linear_f32(const float *x, int64_t rows, int64_t in_features, int64_t x_stride, const float *packed,
               int64_t out_features, const float *bias, float *out, int64_t out_stride, int num_threads);
int64_t linear_blocks_few_rows(int format);
int linear_blocks(int format, const float *x, int64_t rows, int64_t in_features, int64_t x_stride, const void *packed,
                  int64_t out_features, const float *bias, float *out, int64_t out_stride, int num_threads);
}

namespace forkserve {
// The weight block formats of linear_blocks (its first argument; linear_blocks.cpp).
constexpr int kFourBitBlocks = 0, kEightBitBlocks = 1;
}  // namespace forkserve
