// Linear layers in float32 whose weights are 4-bit affine blocks, for products of a few rows:
// out = x W^T (+ bias), where along each output row every 32 input features hold weights
// d * q + m with q in 0..15 and d exactly a float16 value (so d * q is exact and one FMA gives
// the float32 weight to the bit). That is what a GGUF Q4_1 tensor dequantizes to, the default
// model's linear layers included; kernels/cpu/linear_q4.py finds such weights and packs them.
//
// Why: a decode step of a few rows reads every weight from memory once, and float32 weights
// are ~5x the bytes of this form (6 bits a weight with the scales). On an AMD Zen 3 (2 cores,
// float32) a decode step of the default model, one row, took ~28 ms on float32 panels
// (linear_f32.cpp), most of it reading ~540 MB of weights; from these blocks ~17 ms (below).
// From ~6 rows on the float32 panels are as fast or faster: widening costs about what the
// FMAs it feeds save in reads, so the layers keep both forms (packed_linear.py) and take
// this one for up to linear_q4_few_rows() rows.
//
// Packed layout: output columns in panels of 16 (as linear_f32.cpp); a panel's input
// features in blocks of 32, each block 384 bytes:
//   float d[16], m[16]        the 16 columns' scales and offsets
//   uint8 q[32][8]            for each k, byte j holds column j (low nibble) and j + 8 (high)
// Columns past out_features are zeros (d = m = q = 0). The register tiles widen one k's
// weights at a time (mask, zero-extend, convert, one FMA with d and m) and add them into
// float32 sums one k after the other, as linear_f32.cpp's tiles do: the same bits.
// Up to 5 rows a tile takes a whole panel (2 x rows FMA chains), 6-8 rows half a panel
// (rows chains; a whole panel's 12-16 accumulators would not fit AVX2's 16 registers);
// more rows go 8 at a time (tests, benchmarks: the layers do not send them). The threads
// split the panels as linear_f32.cpp's do, and each panel's tiles prefetch the next one.
#include <cstdint>

#include "entries.h"
#include "isa.h"
#include "panel_prefetch.h"
#include "simd.h"
#include "stealing_ranges.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <omp.h>
#endif

namespace {

constexpr int64_t kCols = 16;                                        // output columns per panel
constexpr int64_t kBlock = 32;                                       // input features per block
constexpr int64_t kBlockBytes = 2 * 4 * kCols + kBlock * kCols / 2;  // d, m, q: 384

int64_t panels_of(int64_t out_features) { return (out_features + kCols - 1) / kCols; }

#if defined(__AVX2__) && defined(__FMA__)

struct Gemm {
    const float *x;
    int64_t x_stride, in_features;
    const uint8_t *packed;
    int64_t out_features;
    const float *bias;  // [out_features] or null
    float *out;
    int64_t out_stride;
};

using Prefetch = forkserve::PanelPrefetch;

// Rows [row0, row0 + ROWS) times 8 * VECS of panel p's columns: with VECS 2 all 16, with
// VECS 1 the half `half` (0: columns 0-7, 1: 8-15); ROWS * VECS FMA chains. Each k's weights
// are widened in registers as they are used, and `pf`'s lines prefetched alongside.
// GCC keeps the accumulators in registers only with the loops over them unrolled.
template <int ROWS, int VECS>
void tile(const Gemm &g, int64_t row0, const uint8_t *panel, int64_t p, int half, Prefetch pf) {
    const int64_t col0 = p * kCols + 8 * half;
    const int64_t cols = g.out_features - col0 < 8 * VECS ? g.out_features - col0 : 8 * VECS;
    if (cols <= 0) return;
    const float *x = g.x + row0 * g.x_stride;
    __m256 acc[ROWS][VECS];
    const float *xr[ROWS];  // one pointer per row (see linear_f32.cpp)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
        xr[r] = x + r * g.x_stride;
        for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_setzero_ps();
    }
    Prefetch::Stream prefetch = pf.stream(g.in_features);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t b = 0, k = 0; b < g.in_features / kBlock; b++) {
        const uint8_t *block = panel + b * kBlockBytes;
        const float *dm = reinterpret_cast<const float *>(block);
        __m256 d[VECS], m[VECS];
        for (int v = 0; v < VECS; v++) {
            d[v] = _mm256_loadu_ps(dm + 8 * (half + v));
            m[v] = _mm256_loadu_ps(dm + kCols + 8 * (half + v));
        }
        const uint8_t *q = block + 2 * 4 * kCols;  // after d and m
        for (int64_t i = 0; i < kBlock; i++, k++) {
            prefetch.step();
            const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + i * kCols / 2));
            __m256 w[VECS];
            for (int v = 0; v < VECS; v++) {
                const __m128i nibbles = half + v == 0 ? bytes : _mm_srli_epi16(bytes, 4);
                w[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(nibbles, low4))), d[v],
                                       m[v]);
            }
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; r++) {
                const __m256 xm = _mm256_broadcast_ss(xr[r] + k);
                for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_fmadd_ps(xm, w[v], acc[r][v]);
            }
        }
    }
    forkserve::store_rows8<ROWS, VECS>(g.out + row0 * g.out_stride + col0, g.out_stride,
                                       g.bias != nullptr ? g.bias + col0 : nullptr, cols, acc);
}

constexpr int kWholePanelRows = 5;  // up to this many rows a tile takes a whole panel
constexpr int kFusedRows = 8;       // rows of one tile at most
using TileFn = void (*)(const Gemm &, int64_t, const uint8_t *, int64_t, int, Prefetch);
constexpr TileFn kWhole[kWholePanelRows + 1] = {nullptr, tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>, tile<5, 2>};
constexpr TileFn kHalf[kFusedRows + 1] = {nullptr,       tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>,
                                          tile<5, 1>,    tile<6, 1>, tile<7, 1>, tile<8, 1>};

void gemm(const Gemm &g, int64_t rows, int num_threads) {
    const int64_t panels = panels_of(g.out_features), panel_bytes = g.in_features / kBlock * kBlockBytes;
    const int64_t groups = (rows + kFusedRows - 1) / kFusedRows, lines = panel_bytes / 64;
    forkserve::StealingRanges ranges(panels, num_threads);
#pragma omp parallel num_threads(num_threads)
    {
        const int t = omp_get_thread_num();
        for (int64_t p = ranges.next(t); p >= 0; p = ranges.next(t)) {
            const uint8_t *panel = g.packed + p * panel_bytes;
            const char *next = p + 1 < panels ? reinterpret_cast<const char *>(panel + panel_bytes) : nullptr;
            for (int64_t i = 0; i < groups; i++) {
                const int64_t row0 = i * kFusedRows, n = rows - row0 < kFusedRows ? rows - row0 : kFusedRows;
                if (n <= kWholePanelRows) {
                    kWhole[n](g, row0, panel, p, 0, {next, i, groups, lines});
                } else {
                    for (int half = 0; half < 2; half++)
                        kHalf[n](g, row0, panel, p, half, {next, 2 * i + half, 2 * groups, lines});
                }
            }
        }
    }
}

#endif

}  // namespace

extern "C" {

// 1 when this build has the kernel (the CPU has AVX2 and FMA), else 0.
int linear_q4_available() {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

// Products of up to this many rows run faster here than on linear_f32's float32 panels
// (python -m bench_agent.bench_gemm --dtype float32 --rows 1 2 4 5 6 7 8 16, AMD Zen 3, 2
// cores, the model's shapes, time against float32 panels, two runs: 1 row 0.47x / 0.54x, 2
// 0.61x / 0.64x, 4 0.72x / 0.73x, 5 0.73x / 0.75x, 6 1.01x / 0.88x, 7 1.10x, 8 0.98x, 16
// 1.57x): the packed linear layers keep both forms and take this one for as many rows
// (packed_linear.py, decoder_layers.cpp).
int64_t linear_q4_few_rows() { return 5; }

// Bytes of the packed form of an [out_features, in_features] weight (in_features a multiple
// of 32).
int64_t linear_q4_packed_bytes(int64_t out_features, int64_t in_features) {
    return panels_of(out_features) * (in_features / kBlock) * kBlockBytes;
}

// out[rows, out_features] (row stride out_stride) = x[rows, in_features] (row stride
// x_stride) times the packed weight, plus bias[out_features] when not null. Returns 0, or 1
// when this build has no kernel (see linear_q4_available).
int linear_q4([[maybe_unused]] const float *x, [[maybe_unused]] int64_t rows, [[maybe_unused]] int64_t in_features,
              [[maybe_unused]] int64_t x_stride, [[maybe_unused]] const void *packed,
              [[maybe_unused]] int64_t out_features, [[maybe_unused]] const float *bias, [[maybe_unused]] float *out,
              [[maybe_unused]] int64_t out_stride, [[maybe_unused]] int num_threads) {
#if defined(__AVX2__) && defined(__FMA__)
    const auto *blocks = static_cast<const uint8_t *>(packed);
    if (rows > 0) gemm({x, x_stride, in_features, blocks, out_features, bias, out, out_stride}, rows, num_threads);
    return 0;
#else
    return 1;
#endif
}

}  // extern "C"
