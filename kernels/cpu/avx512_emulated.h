// The AVX-512 intrinsics the kernels use that SIMDe does not alias to their Intel names (see
// isa.h): each is plain C++ on the compiler's 512-bit vector types, following Intel's
// definition of the instruction, so that a build with -DFORKSERVE_AVX512_EMULATE runs the
// AVX-512 kernels on a CPU without AVX-512. vdpbf16ps is here too, rather than SIMDe's, so
// that it reads its inputs and rounds as the hardware does (denormals as zero, the odd
// product of a pair first, denormal results flushed). Included by isa.h only; tests only.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace forkserve::avx512_emulated {

template <typename To, typename From>
inline To bits_as(const From &from) {
    static_assert(sizeof(To) == sizeof(From));
    To to;
    std::memcpy(&to, &from, sizeof to);
    return to;
}

struct F32x16 {
    float v[16];
};
struct U16x32 {
    uint16_t v[32];
};
struct U16x16 {
    uint16_t v[16];
};
struct U32x16 {
    uint32_t v[16];
};

// vcvtneps2bf16 on one lane: as from_f32 (round to nearest even, NaN stays a quiet NaN with
// its sign), but with a denormal input read as zero.
inline uint16_t bf16_out(float f) {
    Bf16 out;
    from_f32(flush_denormal(f), &out);
    return out.bits;
}

inline __m512i cvtepu16_epi32(__m256i a) {
    const auto in = bits_as<U16x16>(a);
    U32x16 out;
    for (int i = 0; i < 16; i++) out.v[i] = in.v[i];
    return bits_as<__m512i>(out);
}

inline __m256bh cvtneps_pbh(__m512 a) {
    const auto in = bits_as<F32x16>(a);
    U16x16 out;
    for (int i = 0; i < 16; i++) out.v[i] = bf16_out(in.v[i]);
    return bits_as<__m256bh>(out);
}

// The low 16 bfloat16 from b, the high 16 from a.
inline __m512bh cvtne2ps_pbh(__m512 a, __m512 b) {
    const auto hi = bits_as<F32x16>(a), lo = bits_as<F32x16>(b);
    U16x32 out;
    for (int i = 0; i < 16; i++) out.v[i] = bf16_out(lo.v[i]), out.v[16 + i] = bf16_out(hi.v[i]);
    return bits_as<__m512bh>(out);
}

inline __m512 dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
    auto acc = bits_as<F32x16>(src);
    const auto x = bits_as<U16x32>(a), y = bits_as<U16x32>(b);
    for (int i = 0; i < 16; i++) {
        float sum = acc.v[i];
        sum += to_f32_denormals_as_zero(x.v[2 * i + 1]) * to_f32_denormals_as_zero(y.v[2 * i + 1]);
        sum += to_f32_denormals_as_zero(x.v[2 * i]) * to_f32_denormals_as_zero(y.v[2 * i]);
        acc.v[i] = flush_denormal(sum);
    }
    return bits_as<__m512>(acc);
}

// vfpclassps under a mask: bit i set where k's bit i is and lane i is of a class imm selects
// (bit 0 quiet NaN, 1 +0, 2 -0, 3 +inf, 4 -inf, 5 denormal, 6 finite negative, 7 signalling NaN).
inline __mmask16 mask_fpclass_ps_mask(__mmask16 k, __m512 a, int imm) {
    const auto in = bits_as<U32x16>(a);
    unsigned out = 0;
    for (int i = 0; i < 16; i++) {
        const uint32_t w = in.v[i], magnitude = w & 0x7fffffffu;
        const bool negative = (w >> 31) != 0, nan = magnitude > 0x7f800000u;
        const bool is[8] = {nan && (w & 0x400000u) != 0,
                            w == 0,
                            w == 0x80000000u,
                            w == 0x7f800000u,
                            w == 0xff800000u,
                            (w & 0x7f800000u) == 0 && (w & 0x7fffffu) != 0,
                            negative && magnitude < 0x7f800000u,
                            nan && (w & 0x400000u) == 0};
        bool hit = false;
        for (int c = 0; c < 8; c++) hit |= ((imm >> c) & 1) && is[c];
        if (hit && ((k >> i) & 1)) out |= 1u << i;
    }
    return static_cast<__mmask16>(out);
}

// vshuff32x4: 128-bit blocks 0 and 1 of the result from a, 2 and 3 from b, by imm's 2-bit fields.
inline __m512 shuffle_f32x4(__m512 a, __m512 b, int imm) {
    const auto x = bits_as<F32x16>(a), y = bits_as<F32x16>(b);
    F32x16 out;
    for (int block = 0; block < 4; block++) {
        const F32x16 &from = block < 2 ? x : y;
        const int pick = (imm >> (2 * block)) & 3;
        for (int j = 0; j < 4; j++) out.v[4 * block + j] = from.v[4 * pick + j];
    }
    return bits_as<__m512>(out);
}

// The reductions in the order GCC's own _mm512_reduce_*_ps takes: halves, quarters, pairs.
template <typename Op>
inline float reduce_ps(__m512 a, Op op) {
    const auto in = bits_as<F32x16>(a);
    float eight[8], four[4];
    for (int i = 0; i < 8; i++) eight[i] = op(in.v[8 + i], in.v[i]);
    for (int i = 0; i < 4; i++) four[i] = op(eight[4 + i], eight[i]);
    return op(op(four[0], four[2]), op(four[1], four[3]));
}
inline float reduce_add_ps(__m512 a) {
    return reduce_ps(a, [](float x, float y) { return x + y; });
}
inline float reduce_max_ps(__m512 a) {
    return reduce_ps(a, [](float x, float y) { return x > y ? x : y; });
}

// Masked stores and loads: lanes outside the mask are not touched (stores) or zero (loads).
template <typename Lanes, typename Vector>
inline void mask_store(void *p, unsigned k, Vector a) {
    const auto in = bits_as<Lanes>(a);
    auto *out = static_cast<uint8_t *>(p);
    constexpr int n = sizeof in.v / sizeof in.v[0];
    for (int i = 0; i < n; i++)
        if ((k >> i) & 1) std::memcpy(out + i * sizeof in.v[0], &in.v[i], sizeof in.v[0]);
}
inline void mask_storeu_ps(void *p, __mmask16 k, __m512 a) { mask_store<F32x16>(p, k, a); }
inline void mask_storeu_epi32(void *p, __mmask16 k, __m512i a) { mask_store<U32x16>(p, k, a); }
inline void mask_storeu_epi16(void *p, __mmask16 k, __m256i a) { mask_store<U16x16>(p, k, a); }

inline __m256i maskz_loadu_epi16(__mmask16 k, const void *p) {
    U16x16 out{};
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) std::memcpy(&out.v[i], static_cast<const uint8_t *>(p) + 2 * i, 2);
    return bits_as<__m256i>(out);
}

// vdivps with a rounding mode (SIMDe has no _mm512_div_round_ps): a true division in each
// lane, rounded to nearest even, the one mode the kernels pass. Compiled without
// -ffast-math, which could turn it into a reciprocal and a product.
__attribute__((optimize("no-fast-math"))) inline __m512 div_round_ps(__m512 a, __m512 b, int) {
    auto x = bits_as<F32x16>(a);
    const auto y = bits_as<F32x16>(b);
    for (int i = 0; i < 16; i++) x.v[i] = x.v[i] / y.v[i];
    return bits_as<__m512>(x);
}

}  // namespace forkserve::avx512_emulated

#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps forkserve::avx512_emulated::dpbf16_ps
#define _mm512_cvtepu16_epi32 forkserve::avx512_emulated::cvtepu16_epi32
#define _mm512_cvtneps_pbh forkserve::avx512_emulated::cvtneps_pbh
#define _mm512_cvtne2ps_pbh forkserve::avx512_emulated::cvtne2ps_pbh
#define _mm512_mask_fpclass_ps_mask forkserve::avx512_emulated::mask_fpclass_ps_mask
#define _mm512_shuffle_f32x4 forkserve::avx512_emulated::shuffle_f32x4
#define _mm512_reduce_add_ps forkserve::avx512_emulated::reduce_add_ps
#define _mm512_reduce_max_ps forkserve::avx512_emulated::reduce_max_ps
#define _mm512_mask_storeu_ps forkserve::avx512_emulated::mask_storeu_ps
#define _mm512_mask_storeu_epi32 forkserve::avx512_emulated::mask_storeu_epi32
#define _mm256_mask_storeu_epi16 forkserve::avx512_emulated::mask_storeu_epi16
#define _mm256_maskz_loadu_epi16 forkserve::avx512_emulated::maskz_loadu_epi16
#define _mm512_div_round_ps forkserve::avx512_emulated::div_round_ps
