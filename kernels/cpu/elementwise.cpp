// The Llama family's elementwise layers, one pass each instead of PyTorch's chain of small
// ops (each a full pass over the tensor, a temporary and a thread-pool wake-up): at decode
// batch sizes those chains cost more than the arithmetic.
//
// Each kernel rounds where the PyTorch layer it replaces stores an intermediate in the
// model dtype (runtime/layers/), so both paths agree to the last bit or nearly so; tests
// compare them (tests/test_cpu_elementwise.py). Arithmetic is float32.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "bf16.h"
#include "entries.h"
#include "simd.h"

namespace {

using namespace forkserve;

// Below this many elements a thread-pool wake-up costs more than the work.
constexpr int64_t kParallelMin = 1 << 14;

#if defined(FORKSERVE_AVX512_BF16)
// One bfloat16 row of rms_norm in AVX-512 intrinsics, 16 values at a time (the last ones
// masked), rounding with vcvtneps2bf16. The scalar loop below is not vectorised for bf16:
// a 512 x 576 norm with its residual took 190 us on 2 threads (408 on one) against 106-117
// (157-204) for this (Intel Xeon with AMX), 60 of them in each 512-token prefill step.
inline void rms_norm_row(const Bf16 *xr, Bf16 *res, const Bf16 *weight, Bf16 *o, int64_t hidden, float eps) {
    auto load = [](const Bf16 *p, __mmask16 m) { return widen16(_mm256_maskz_loadu_epi16(m, p)); };
    auto to_bf16 = [](__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); };
    __m512 squares = _mm512_setzero_ps();
    for (int64_t d = 0; d < hidden; d += 16) {
        const __mmask16 m = first_lanes(hidden - d);
        __m512 v = load(xr + d, m);
        if (res != nullptr) {  // residual += x, rounded to bf16; the norm is of that
            const __m256i sum = to_bf16(_mm512_add_ps(load(res + d, m), v));
            _mm256_mask_storeu_epi16(res + d, m, sum);
            v = widen16(sum);
        }
        squares = _mm512_fmadd_ps(v, v, squares);
    }
    const Bf16 *src = res != nullptr ? res : xr;
    const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(hidden) + eps));
    for (int64_t d = 0; d < hidden; d += 16) {
        const __mmask16 m = first_lanes(hidden - d);
        const __m512 normed = widen16(to_bf16(_mm512_mul_ps(load(src + d, m), inv)));
        _mm256_mask_storeu_epi16(o + d, m, to_bf16(_mm512_mul_ps(load(weight + d, m), normed)));
    }
}
#endif

// runtime/layers/norm.py: y = x / sqrt(mean(x^2) + eps) in float32, rounded to T, times weight.
// With a residual (not null), x is first added to it, in place and rounded to T (the
// decoder layer's "residual = residual + x"), and the norm is taken of that sum.
template <typename T>
void rms_norm(const T *x, T *residual, const T *weight, T *out, int64_t rows, int64_t hidden, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * hidden >= kParallelMin)
    for (int64_t r = 0; r < rows; r++) {
#if defined(FORKSERVE_AVX512_BF16)
        if constexpr (std::is_same_v<T, Bf16>) {
            rms_norm_row(x + r * hidden, residual != nullptr ? residual + r * hidden : nullptr, weight, out + r * hidden,
                         hidden, eps);
            continue;
        }
#endif
        const T *xr = x + r * hidden;
        if (residual != nullptr) {
            T *res = residual + r * hidden;
#pragma omp simd
            for (int64_t d = 0; d < hidden; d++) from_f32(to_f32(res[d]) + to_f32(xr[d]), res + d);
            xr = res;
        }
        T *o = out + r * hidden;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t d = 0; d < hidden; d++) {
            const float v = to_f32(xr[d]);
            sum += v * v;
        }
        const float inv = 1.f / std::sqrt(sum / static_cast<float>(hidden) + eps);
#pragma omp simd
        for (int64_t d = 0; d < hidden; d++) from_f32(to_f32(weight[d]) * rounded<T>(to_f32(xr[d]) * inv), o + d);
    }
}

// runtime/layers/rotary.py, in place: the "rotate half" layout, float32 tables indexed by
// position ([max_positions, dim], cos and sin). Heads of a token are `dim` apart; tokens are
// `stride` apart (q and k may be views into the fused QKV projection).
template <typename T>
void rotate_heads(T *x, int64_t heads, int64_t dim, const float *c, const float *s) {
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        T *xh = x + h * dim;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            const float x1 = to_f32(xh[i]), x2 = to_f32(xh[i + half]);
            from_f32(x1 * c[i] - x2 * s[i], xh + i);
            from_f32(x2 * c[i + half] + x1 * s[i + half], xh + i + half);
        }
    }
}

// Returns 1 (and touches nothing) if a position is outside the tables' `max_positions` rows.
template <typename T>
int rotary(T *q, T *k, const int64_t *positions, const float *cos, const float *sin, int64_t max_positions,
           int64_t tokens, int64_t q_heads, int64_t k_heads, int64_t dim, int64_t q_stride, int64_t k_stride,
           int threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (tokens * (q_heads + k_heads) * dim >= kParallelMin)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + positions[t] * dim, *s = sin + positions[t] * dim;
        rotate_heads(q + t * q_stride, q_heads, dim, c, s);
        rotate_heads(k + t * k_stride, k_heads, dim, c, s);
    }
    return 0;
}

// runtime/models/llama.py's MLP middle: silu(gate) * up, gate and up side by side in one
// row of `2 * width` (the fused gate_up projection). silu(gate) is rounded to T first.
template <typename T>
void silu_and_mul(const T *gate_up, T *out, int64_t rows, int64_t width, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= kParallelMin)
    for (int64_t r = 0; r < rows; r++) {
        const T *gate = gate_up + r * 2 * width, *up = gate + width;
        T *o = out + r * width;
        int64_t d = 0;
#if defined(FORKSERVE_AVX512_BF16)
        if constexpr (std::is_same_v<T, Bf16>) {  // 16 at a time with exp16; the rest below
            for (; d + 16 <= width; d += 16)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + d), silu_mul16(load16(gate + d), load16(up + d)));
        }
#endif
#pragma omp simd
        for (int64_t i = d; i < width; i++) {
            const float g = to_f32(gate[i]);
            from_f32(rounded<T>(g / (1.f + std::exp(-g))) * to_f32(up[i]), o + i);
        }
    }
}

// The first c in [0, n) with is_it(c), or n - 1 if none: the 64-wide chunk that holds it is
// found with vector compares, then searched one by one.
template <typename Pred>
int64_t first_index(int64_t n, Pred is_it) {
    int64_t chunk = 0;
    for (; chunk < n; chunk += 64) {
        const int64_t end = chunk + 64 < n ? chunk + 64 : n;
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (int64_t c = chunk; c < end; c++) hit |= is_it(c);
        if (hit) break;
    }
    if (chunk >= n) return n - 1;
    while (chunk < n - 1 && !is_it(chunk)) chunk++;
    return chunk;
}

// An int32 whose order is the float's order (for non-NaN bits; -0 and +0 share one), so
// the max and the search are integer work that -ffast-math cannot bend around inf.
inline int32_t order_key(uint32_t bits) {
    const int32_t i = static_cast<int32_t>(bits == 0x80000000u ? 0u : bits);
    return i >= 0 ? i : i ^ 0x7fffffff;
}

inline bool is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

// torch.argmax(x, dim=-1) for float32 rows: the first index of the row's maximum, or of its
// first NaN if it has one (NaN counts as the largest, as in PyTorch).
void argmax_rows(const float *x, int64_t rows, int64_t cols, int64_t *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t *bits = reinterpret_cast<const uint32_t *>(x + r * cols);
        int32_t best = order_key(bits[0]);
        int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
        for (int64_t c = 0; c < cols; c++) {
            const int32_t key = order_key(bits[c]);
            best = key > best ? key : best;
            nan |= is_nan(bits[c]);
        }
        out[r] = nan ? first_index(cols, [&](int64_t c) { return is_nan(bits[c]); })
                     : first_index(cols, [&](int64_t c) { return order_key(bits[c]) == best; });
    }
}

}  // namespace

extern "C" void argmax_rows_f32(const float *x, int64_t rows, int64_t cols, int64_t *out, int threads) {
    argmax_rows(x, rows, cols, out, threads);
}

#define FORKSERVE_ELEMENTWISE(SUFFIX, T)                                                                   \
    extern "C" void rms_norm_##SUFFIX(const T *x, T *residual, const T *weight, T *out, int64_t rows,        \
                                      int64_t hidden, float eps, int threads) {                            \
        rms_norm(x, residual, weight, out, rows, hidden, eps, threads);                                    \
    }                                                                                                      \
    extern "C" int rotary_##SUFFIX(T *q, T *k, const int64_t *positions, const float *cos, const float *sin, \
                                   int64_t max_positions, int64_t tokens, int64_t q_heads, int64_t k_heads,  \
                                   int64_t dim, int64_t q_stride, int64_t k_stride, int threads) {           \
        return rotary(q, k, positions, cos, sin, max_positions, tokens, q_heads, k_heads, dim, q_stride,     \
                      k_stride, threads);                                                                    \
    }                                                                                                      \
    extern "C" void silu_and_mul_##SUFFIX(const T *gate_up, T *out, int64_t rows, int64_t width,           \
                                          int threads) {                                                   \
        silu_and_mul(gate_up, out, rows, width, threads);                                                  \
    }

FORKSERVE_ELEMENTWISE(f32, float)
FORKSERVE_ELEMENTWISE(bf16, Bf16)
