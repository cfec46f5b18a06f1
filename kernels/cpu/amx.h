// The AMX tile configuration and tile instructions the AMX kernels share (linear_amx.cpp,
// attention_amx.cpp and the probe in machine_probe.cpp): palette 1 with all eight tiles at 16
// rows of 64 bytes, i.e. 16 x 16 float32 accumulators or 16 x 32 bfloat16 operands. Tile state
// is per thread: each OpenMP thread loads it before its first tile instruction and releases it
// after its last.
//
// The kernels write tile instructions as TILE_LOADD, TILE_STORED, TILE_ZERO, TILE_DPBF16PS
// and TILE_RELEASE. On a build for a CPU with AMX they are the hardware instructions. Built
// with -DFORKSERVE_AMX_EMULATE (kernels/cpu/build.py does so when FORKSERVE_AMX_EMULATE=1),
// they are plain C++ that follows the instructions' definitions in Intel's manual (below), so
// the kernels' tiling, strides, padding and edge handling are tested on any CPU with
// AVX512-BF16 (tests/test_amx_emulated.py). The emulation is slow and for tests only; it
// checks what the hardware would fault on (a tile used before the configuration is loaded,
// shapes that do not fit a product) and aborts with a message.
//
// FORKSERVE_AMX_KERNELS is defined where the AMX kernels are compiled (real or emulated
// tiles); FORKSERVE_AMX_HARDWARE where the tiles are the CPU's own.
#pragma once

#include "bf16.h"
#include "isa.h"

#if defined(FORKSERVE_AVX512_BF16) && defined(__linux__)
#if defined(FORKSERVE_AMX_EMULATE)
#define FORKSERVE_AMX_KERNELS 1
#elif defined(__AMX_BF16__) && defined(__AMX_TILE__)
#define FORKSERVE_AMX_KERNELS 1
#define FORKSERVE_AMX_HARDWARE 1
#endif
#endif

#if defined(FORKSERVE_AMX_KERNELS)
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace forkserve {

// The 64-byte operand of ldtilecfg: palette, then bytes per row and rows of tiles 0-15.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

#if defined(FORKSERVE_AMX_HARDWARE)

inline void load_tile_config() {
    const TileConfig cfg;
    _tile_loadconfig(&cfg);
}

#define TILE_LOADD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_STORED(t, base, stride) _tile_stored(t, base, stride)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define TILE_RELEASE() _tile_release()

#else  // emulated tiles

namespace amx_emulated {

// One thread's tile registers: eight tiles of up to 16 rows of 64 bytes, and their shapes.
struct Tiles {
    bool configured = false;
    uint8_t rows[8] = {};
    uint16_t colsb[8] = {};
    alignas(64) uint8_t data[8][16][64] = {};
};

inline Tiles &tiles() {
    static thread_local Tiles t;
    return t;
}

[[noreturn]] inline void fault(const char *what, int tile) {
    std::fprintf(stderr, "emulated AMX: %s (tile %d)\n", what, tile);
    std::abort();
}

inline Tiles &configured(int tile) {
    Tiles &t = tiles();
    if (!t.configured) fault("tile instruction before the tile configuration is loaded", tile);
    if (tile < 0 || tile > 7 || t.rows[tile] == 0) fault("tile not configured", tile);
    return t;
}

inline void load_config(const TileConfig &cfg) {
    Tiles &t = tiles();
    if (cfg.palette != 1) fault("palette other than 1", -1);
    for (int i = 0; i < 8; i++) {
        if (cfg.rows[i] > 16 || cfg.colsb[i] > 64 || cfg.colsb[i] % 4 != 0) fault("tile shape past 16 x 64 bytes", i);
        t.rows[i] = cfg.rows[i];
        t.colsb[i] = cfg.colsb[i];
    }
    std::memset(t.data, 0, sizeof t.data);
    t.configured = true;
}

inline void release() { tiles() = Tiles{}; }

// tileloadd: row r of the tile is colsb bytes at base + r * stride.
inline void load(int tile, const void *base, int64_t stride) {
    Tiles &t = configured(tile);
    for (int r = 0; r < t.rows[tile]; r++)
        std::memcpy(t.data[tile][r], static_cast<const uint8_t *>(base) + r * stride, t.colsb[tile]);
}

inline void store(int tile, void *base, int64_t stride) {
    Tiles &t = configured(tile);
    for (int r = 0; r < t.rows[tile]; r++)
        std::memcpy(static_cast<uint8_t *>(base) + r * stride, t.data[tile][r], t.colsb[tile]);
}

inline void zero(int tile) {
    Tiles &t = configured(tile);
    std::memset(t.data[tile], 0, sizeof t.data[tile]);
}


// tdpbf16ps c, a, b: for each row m of c and float32 column n, for each k-pair k of a's row:
// c[m][n] += a[m][2k] * b[k][2n], then += a[m][2k+1] * b[k][2n+1] (float32, round to nearest
// even, denormal results flushed to zero).
inline void dpbf16ps(int c, int a, int b) {
    Tiles &t = configured(c);
    configured(a);
    configured(b);
    if (c == a || c == b || a == b) fault("tdpbf16ps with a tile used twice", c);
    const int m_rows = t.rows[c], n_cols = t.colsb[c] / 4, k_pairs = t.colsb[a] / 4;
    if (t.rows[a] != m_rows || t.rows[b] != k_pairs || t.colsb[b] != t.colsb[c])
        fault("tdpbf16ps shapes do not fit", c);
    for (int m = 0; m < m_rows; m++) {
        float acc[16];
        std::memcpy(acc, t.data[c][m], sizeof acc);
        uint16_t a_row[32], b_row[32];
        std::memcpy(a_row, t.data[a][m], sizeof a_row);
        for (int k = 0; k < k_pairs; k++) {
            std::memcpy(b_row, t.data[b][k], sizeof b_row);
            for (int n = 0; n < n_cols; n++) {
                acc[n] = flush_denormal(acc[n] + to_f32_denormals_as_zero(a_row[2 * k]) * to_f32_denormals_as_zero(b_row[2 * n]));
                acc[n] = flush_denormal(acc[n] + to_f32_denormals_as_zero(a_row[2 * k + 1]) * to_f32_denormals_as_zero(b_row[2 * n + 1]));
            }
        }
        std::memcpy(t.data[c][m], acc, sizeof acc);
    }
}

}  // namespace amx_emulated

inline void load_tile_config() { amx_emulated::load_config(TileConfig{}); }

#define TILE_LOADD(t, base, stride) ::forkserve::amx_emulated::load(t, base, stride)
#define TILE_STORED(t, base, stride) ::forkserve::amx_emulated::store(t, base, stride)
#define TILE_ZERO(t) ::forkserve::amx_emulated::zero(t)
#define TILE_DPBF16PS(c, a, b) ::forkserve::amx_emulated::dpbf16ps(c, a, b)
#define TILE_RELEASE() ::forkserve::amx_emulated::release()

#endif

}  // namespace forkserve
#endif
