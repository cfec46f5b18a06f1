// Vector helpers shared by the CPU kernels. AVX-512: 16-lane loads of either storage type as
// float32, the mask of a row's first lanes, e^x, 2^x and a 16 x 16 transpose of 32-bit words.
// AVX2 with FMA (every x86 CPU of the last decade, AVX-512 or not): 8-lane loads of either
// storage type as float32, 2^x, a NaN test that -ffast-math cannot fold away, and the float32
// GEMMs' masked store of a tile's rows.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "bf16.h"
#include "isa.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace forkserve {

// 8 values as float32 (bfloat16: exact, its bits are the top half of the float's).
inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const Bf16 *p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// v, kept in a register. GCC turns a loaded vector that several FMAs use into a memory operand
// of each of them; a loop of such FMAs is then bound by its loads (Zen 3 does two 256-bit
// loads a cycle against two FMAs), where the loads it writes would leave it bound by the FMAs.
inline __m256 in_register(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

// The float32 GEMMs' epilogue: rows of sums for 8 * VECS output columns (acc[r][v]: row r,
// columns 8v to 8v + 7) plus bias (null: none), stored at out + r * out_stride, masked to the
// first `cols` columns (an output panel may run past out_features).
template <int ROWS, int VECS>
inline void store_rows8(float *out, int64_t out_stride, const float *bias, int64_t cols,
                        const __m256 (&acc)[ROWS][VECS]) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i mask[VECS];
    __m256 add[VECS];
    for (int v = 0; v < VECS; v++) {
        mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - 8 * v)), lane);
        add[v] = bias != nullptr ? _mm256_maskload_ps(bias + 8 * v, mask[v]) : _mm256_setzero_ps();
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < VECS; v++)
            _mm256_maskstore_ps(out + r * out_stride + 8 * v, mask[v], _mm256_add_ps(acc[r][v], add[v]));
}

// 2^t for 8 lanes, as exp2_16 below (the same polynomial, ~2e-6 relative), with 2^n built in
// the exponent bits (AVX2 has no scalef): below -126 it returns ~2^-126; t must stay below 127.
inline __m256 exp2_8(__m256 t) {
    t = _mm256_max_ps(_mm256_set1_ps(-126.f), t);
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.3333558e-3f);
    for (const float c : {9.6181291e-3f, 5.5504109e-2f, 0.24022651f, 0.69314718f, 1.f}) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    const __m256i bias = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(bias, 23)));
}

// All-ones in the lanes of x that hold a NaN: compared as integers, so that -ffast-math,
// which lets the compiler assume no NaN, keeps the test.
inline __m256 nan_lanes8(__m256 x) {
    const __m256i magnitude = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000)));
}

}  // namespace forkserve
#endif

#if defined(FORKSERVE_AVX512)
#include <immintrin.h>

namespace forkserve {

// 16 bfloat16 values as float32 (exact: a bf16's bits are the top half of the float's).
inline __m512 widen16(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

// A row of 16 values as float32.
inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Bf16 *p) { return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }

// The first n of 16 lanes (all 16 from n = 16 on; none for n <= 0): a row's masked tail.
inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// e^x for 16 lanes, to ~1e-7 relative: x = n ln2 + r with |r| <= ln2 / 2, e^r by its
// Taylor series to r^6, times 2^n. Below -87 it returns ~e^-87 (not 0); above ~88, inf.
// Under -ffast-math the compiler may still drop a NaN here: callers that must report NaN
// check for it themselves (the extend kernels do).
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.f), x);  // x second: maxps returns it when it is NaN
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    for (const float c : {1.f / 120, 1.f / 24, 1.f / 6, 1.f / 2, 1.f, 1.f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    return _mm512_scalef_ps(p, n);
}

// 2^t for 16 lanes, to ~2e-6 relative (enough for probabilities rounded to bfloat16 next):
// t = n + f with |f| <= 1/2, 2^f = e^(f ln 2) by its Taylor series to f^5, times 2^n. Below
// -126 it returns ~2^-126 (not 0); a NaN in t may or may not come out (see exp16).
inline __m512 exp2_16(__m512 t) {
    t = _mm512_max_ps(_mm512_set1_ps(-126.f), t);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558e-3f);
    for (const float c : {9.6181291e-3f, 5.5504109e-2f, 0.24022651f, 0.69314718f, 1.f}) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    return _mm512_scalef_ps(p, n);
}

// 16 rows of 16 32-bit words, transposed in place: r[i] lane j <- r[j] lane i.
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // Each 128-bit lane now holds a 4x4 transposed tile; move the tiles into place.
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

}  // namespace forkserve
#endif

#if defined(FORKSERVE_AVX512_BF16)
namespace forkserve {

// The MLP's silu(gate) * up for 16 lanes of bfloat16 values (as float32), as PyTorch's
// bfloat16 layers give it: silu rounded to bfloat16, the product rounded again (returned
// as 16 bfloat16). The one definition for silu_and_mul (elementwise.cpp) and the GEMM that
// applies it to its own tiles (linear_amx.cpp), so that both give the same bits.
// The division is a true one (the rounding-mode form, which -ffast-math leaves alone): as
// a / b, GCC computed a * rcp14(b) refined by Newton, and for gate < ~-87 1 / (1 + e^-gate)
// is subnormal, so the result hung on the calling thread's denormal handling (MXCSR),
// which is not the same on every thread of a process: after a oneDNN product, one element
// in ~15,000 differed between two kernels that split the rows among threads differently.
inline __m256i silu_mul16(__m512 gate, __m512 up) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gate));
    const __m512 silu_f32 = _mm512_div_round_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.f), e),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i silu = (__m256i)_mm512_cvtneps_pbh(silu_f32);
    return (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(widen16(silu), up));
}

}  // namespace forkserve
#endif
