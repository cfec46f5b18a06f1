// What both bfloat16 GEMM kernels (linear_bf16.cpp, linear_amx.cpp) share about the packed
// weight's 32-column panels: the panel width and the epilogue that adds the bias and
// rounds a row's two 16-column halves into the output, masked past out_features.
#pragma once

#include <cstdint>

#include "bf16.h"
#include "simd.h"

namespace forkserve {

constexpr int64_t kPanel = 32;  // output columns per panel

}  // namespace forkserve

#if defined(FORKSERVE_AVX512_BF16)
namespace forkserve {

struct PanelEpilogue {
    __mmask16 mask0, mask1;  // columns 0-15 and 16-31 that exist
    __m512 bias0, bias1;     // zeros without a bias

    // No columns, no bias (a placeholder until one is assigned).
    PanelEpilogue() : mask0(0), mask1(0), bias0(_mm512_setzero_ps()), bias1(_mm512_setzero_ps()) {}

    // Columns [col0, col0 + 32) of an out_features-wide output; bias may be null.
    PanelEpilogue(const Bf16 *bias, int64_t out_features, int64_t col0) {
        const int64_t cols = out_features - col0 < kPanel ? out_features - col0 : kPanel;
        mask0 = first_lanes(cols);
        mask1 = first_lanes(cols - 16);
        bias0 = bias1 = _mm512_setzero_ps();
        if (bias != nullptr) {
            bias0 = widen16(_mm256_maskz_loadu_epi16(mask0, bias + col0));
            bias1 = widen16(_mm256_maskz_loadu_epi16(mask1, bias + col0 + 16));
        }
    }

    // One row's float32 sums (columns 0-15 in lo, 16-31 in hi) plus bias, rounded to
    // nearest even, at `out` (the row's column col0).
    void store(Bf16 *out, __m512 lo, __m512 hi) const {
        _mm256_mask_storeu_epi16(out, mask0, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(lo, bias0)));
        _mm256_mask_storeu_epi16(out + 16, mask1, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(hi, bias1)));
    }
};

}  // namespace forkserve
#endif
