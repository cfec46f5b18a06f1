// One query row's step of FlashAttention's online softmax over a block of 32 keys, for the AMX
// extend kernel (attention_amx.cpp); the vector kernels (attention_rows.cpp,
// attention_rows_avx2.cpp) do the same per lane, with the same kSlack.
//
// The exponent's reference (`best`) moves only when a score passes it by more than kSlack:
// the probabilities stay below e^kSlack, and most blocks skip the max reduction and the
// rescaling of the sums. Keys past the row's last get probability exactly 0 (their value
// rows, shared with later tokens of the block, then add nothing, unless they hold inf or
// NaN). A NaN score (NaN in the query or a visible key: a broken model upstream) marks the
// row `broken`, whose output the caller makes NaN, as in PyTorch; the max and exp would
// lose it.
#pragma once

#include <cmath>

#include "simd.h"

namespace forkserve {

constexpr float kSlack = 8.f;

constexpr float kLog2e = 1.44269504f;

}  // namespace forkserve

#if defined(FORKSERVE_AVX512)
namespace forkserve {

struct SoftmaxStep {
    __m512 p_lo, p_hi;  // probabilities of keys 0-15 and 16-31 of the block
    float corr;         // factor for the row's earlier sums: e^(old best - new best), or 1
    bool moved;         // whether the reference moved (corr != 1)
};

// raw_lo / raw_hi: the row's unscaled scores against the block's keys 0-15 / 16-31;
// visible: how many of the block's keys the row sees (FULL: all 32, no mask to apply).
// Exponents are base 2, as in attention_rows.cpp: scale2 is the softmax scale times log2(e),
// best2 the row's reference in those units (e^(x scale - b) = 2^(x scale2 - b log2 e)).
template <bool FULL>
inline SoftmaxStep online_softmax32(__m512 raw_lo, __m512 raw_hi, float visible, float scale2, float &best2,
                                    bool &broken) {
    const __m512 lane = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 limit = _mm512_set1_ps(visible), floor = _mm512_set1_ps(-1e30f), s = _mm512_set1_ps(scale2);
    const __mmask16 see_lo = FULL ? 0xFFFF : _mm512_cmp_ps_mask(lane, limit, _CMP_LT_OQ);
    const __mmask16 see_hi = FULL ? 0xFFFF : _mm512_cmp_ps_mask(_mm512_add_ps(lane, _mm512_set1_ps(16.f)), limit, _CMP_LT_OQ);
    const __m512 lo = FULL ? _mm512_mul_ps(raw_lo, s) : _mm512_mask_mul_ps(floor, see_lo, raw_lo, s);
    const __m512 hi = FULL ? _mm512_mul_ps(raw_hi, s) : _mm512_mask_mul_ps(floor, see_hi, raw_hi, s);
    constexpr int kNan = 0x81;  // fpclass: quiet or signalling NaN
    broken |= (_mm512_mask_fpclass_ps_mask(see_lo, raw_lo, kNan) | _mm512_mask_fpclass_ps_mask(see_hi, raw_hi, kNan)) != 0;
    SoftmaxStep step{{}, {}, 1.f, false};
    const __m512 top = _mm512_max_ps(lo, hi);
    if (_mm512_cmp_ps_mask(top, _mm512_set1_ps(best2 + kSlack * kLog2e), _CMP_GT_OQ) != 0) {
        const float now = _mm512_reduce_max_ps(top);
        step.corr = std::exp2(best2 - now);
        step.moved = true;
        best2 = now;
    }
    const __m512 p_lo = exp2_16(_mm512_sub_ps(lo, _mm512_set1_ps(best2)));
    const __m512 p_hi = exp2_16(_mm512_sub_ps(hi, _mm512_set1_ps(best2)));
    step.p_lo = FULL ? p_lo : _mm512_maskz_mov_ps(see_lo, p_lo);
    step.p_hi = FULL ? p_hi : _mm512_maskz_mov_ps(see_hi, p_hi);
    return step;
}

}  // namespace forkserve
#endif
