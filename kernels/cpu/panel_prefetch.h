// How the float32 GEMMs' register tiles (linear_f32.cpp, linear_blocks.cpp) bring in the next
// weight panel while they multiply this one: each of a panel's `tiles` tiles prefetches its
// contiguous share of the next panel's `lines` 64-byte lines, spread evenly over its loop
// over the input features (a line per k and tile where the panel has a line per k).
#pragma once

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace forkserve {

struct PanelPrefetch {
    const char *next;  // the next panel, or null
    int64_t index, tiles, lines;

    // A tile's prefetches: step() once per k issues the line due at that k, if any.
    struct Stream {
        const char *next;
        int64_t line, end, period, countdown = 1;
        void step() {
            if (--countdown != 0) return;
            if (line < end) _mm_prefetch(next + 64 * line, _MM_HINT_T0);
            line++;
            countdown = period;
        }
    };
    Stream stream(int64_t in_features) const {
        const int64_t n = next != nullptr ? lines : 0;
        return {next, index * n / tiles, (index + 1) * n / tiles, n > 0 ? (in_features * tiles + n - 1) / n : 1};
    }
};

}  // namespace forkserve

#endif
