// The AMX tile configuration the AMX kernels share (linear_amx.cpp, attention_amx.cpp and the
// probe in machine_probe.cpp): palette 1 with all eight tiles at 16 rows of 64 bytes, i.e.
// 16 x 16 float32 accumulators or 16 x 32 bfloat16 operands. Tile state is per thread: each
// OpenMP thread loads it before its first tile instruction and releases it after its last.
#pragma once

#if defined(__AMX_TILE__)
#include <immintrin.h>

#include <cstdint>

namespace forkserve {

inline void load_tile_config() {
    struct alignas(64) {
        uint8_t palette = 1, start_row = 0;
        uint8_t reserved[14] = {};
        uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
        uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
    } cfg;
    _tile_loadconfig(&cfg);
}

}  // namespace forkserve
#endif
