// Linear layers in float32 on 8-lane AVX2 FMAs: out = x W^T (+ bias), with W packed once.
//
// Packed layout: output columns in panels of 16; within a panel, for each input feature k,
// the 16 columns' weights side by side (one 64-byte line):
//   packed[panel][k][column]
// Columns past out_features are zeros. A register tile of up to 6 input rows x 16 columns
// keeps 12 float32 accumulators over the whole input width (12 FMA chains, two vectors of
// weights, one broadcast input: 15 of AVX2's 16 registers), so each weight line is loaded
// once per tile and used for 12 FMAs.
//
// Why not oneDNN (kernels/cpu/packed_linear.py keeps it for float32 on AVX-512 CPUs): on an
// AMD Zen 3 (AVX2 only, 2 cores), with the default model's weights from memory as in a
// decode step, this kernel ran its products 1.2-1.6x as fast as oneDNN's packed float32 from
// 1 to 17 rows, and about as fast from 32 rows on (python -m bench_agent.bench_gemm;
// docs/benchmarks.md). Float32 sums in a fixed order (one k after the other per output), so
// results differ from F.linear's only by summation order.
//
// The rows go in passes whose inputs fit in 128 KiB (L2), each pass over every panel of the
// thread's range; the threads split the panels into contiguous ranges and take over the ends
// of each other's ranges when done (row_passes.h). The tiles of a panel prefetch the next
// panel, each its share of the lines (panel_prefetch.h), so its weights arrive from memory
// while these are multiplied: without a prefetch, 17-row products ran ~1.6x as long (the
// weights from L3); with the first tile alone prefetching the whole panel, a 600-token
// prefill took 1.12x and a 32-row decode step 1.09x as long on a Zen 3 (python -m
// bench_agent.bench_kernel_ab --dtype float32).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "entries.h"
#include "isa.h"
#include "panel_prefetch.h"
#include "row_passes.h"
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <omp.h>
#endif

namespace {

constexpr int64_t kCols = 16;  // output columns per panel
constexpr int kMaxRows = 6;    // input rows per register tile

// Panels of an out_features-wide output.
int64_t panels_of(int64_t out_features) { return (out_features + kCols - 1) / kCols; }

#if defined(__AVX2__) && defined(__FMA__)

using forkserve::RowPasses;
using forkserve::RowTile;

struct Gemm {
    const float *x;
    int64_t x_stride, in_features;
    const float *packed;  // [panels][in_features][16]
    int64_t out_features;
    const float *bias;  // [out_features] or null
    float *out;
    int64_t out_stride;
};

using Prefetch = forkserve::PanelPrefetch;

// Rows [row0, row0 + ROWS) times panel p, prefetching `pf`'s lines alongside.
// GCC keeps the accumulator array in registers only with the loops over it unrolled; left
// to itself it stored all 12 to the stack after every k (~2.5x slower).
template <int ROWS>
void tile(const Gemm &g, int64_t row0, int64_t p, Prefetch pf) {
    const float *panel = g.packed + p * g.in_features * kCols;
    const float *x = g.x + row0 * g.x_stride;
    __m256 acc[ROWS][2];
#pragma GCC unroll 8
    for (int m = 0; m < ROWS; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    // One pointer per row, so each broadcast is that row's register plus k: with the address
    // x + m * x_stride + k written in the loop GCC computed five of them per k, and the loop
    // was bound by issuing its instructions rather than by the FMAs (on a Zen 3, 2 cores,
    // 256-row products of the model's shapes went from ~156 to ~168 GFLOP/s, python -m
    // bench_agent.bench_gemm --dtype float32; a whole 256-token prefill 1.11x as fast,
    // python -m bench_agent.bench_kernel_ab --dtype float32 --prefill 256 --decode 16).
    const float *xr[ROWS];
#pragma GCC unroll 8
    for (int m = 0; m < ROWS; m++) xr[m] = x + m * g.x_stride;
    Prefetch::Stream prefetch = pf.stream(g.in_features);
    for (int64_t k = 0; k < g.in_features; k++) {
        prefetch.step();
        const __m256 w0 = _mm256_loadu_ps(panel + k * kCols), w1 = _mm256_loadu_ps(panel + k * kCols + 8);
#pragma GCC unroll 8
        for (int m = 0; m < ROWS; m++) {
            const __m256 xm = _mm256_broadcast_ss(xr[m] + k);
            acc[m][0] = _mm256_fmadd_ps(xm, w0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(xm, w1, acc[m][1]);
        }
    }
    // The epilogue: plus bias, stored masked past out_features.
    const int64_t col0 = p * kCols, cols = g.out_features - col0 < kCols ? g.out_features - col0 : kCols;
    forkserve::store_rows8<ROWS, 2>(g.out + row0 * g.out_stride + col0, g.out_stride,
                                    g.bias != nullptr ? g.bias + col0 : nullptr, cols, acc);
}

using TileFn = void (*)(const Gemm &, int64_t, int64_t, Prefetch);
constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Rows [r0, r1) as ceil(n / 6) tiles of near-equal size (13 rows: 5 + 4 + 4, 17: 6 + 6 + 5),
// so no tile is left with a row or two and too few FMA chains to fill the pipes.
void add_row_tiles(int64_t r0, int64_t r1, std::vector<RowTile> &tiles) {
    const int64_t rows = r1 - r0, count = (rows + kMaxRows - 1) / kMaxRows;
    for (int64_t i = 0, start = r0; i < count; i++) {
        const int64_t n = rows / count + (i < rows % count ? 1 : 0);
        tiles.push_back({start, n});
        start += n;
    }
}

void gemm(const Gemm &g, int64_t rows, int num_threads) {
    const int64_t panels = panels_of(g.out_features);
    const int64_t row_bytes = 4 * (g.in_features > 0 ? g.in_features : 1);
    const int64_t step = std::max<int64_t>(kMaxRows, (128 << 10) / row_bytes / kMaxRows * kMaxRows);
    RowPasses passes(rows, step, panels, num_threads, add_row_tiles);
#pragma omp parallel num_threads(num_threads)
    passes.run(omp_get_thread_num(), [&](int64_t p, const RowTile *tiles, int64_t count) {
        const float *next = p + 1 < panels ? g.packed + (p + 1) * g.in_features * kCols : nullptr;
        // Each tile prefetches its part of the next panel, so the next panel streams in
        // over all of this panel's tiles rather than during the first alone.
        for (int64_t i = 0; i < count; i++)
            kTiles[tiles[i].n](g, tiles[i].start, p, {reinterpret_cast<const char *>(next), i, count, g.in_features});
    });
}

#endif

}  // namespace

extern "C" {

// 1 when this build has the kernel (the CPU has AVX2 and FMA), else 0.
int linear_f32_available() {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

// 1 when this build's CPU has AVX-512F, where oneDNN's float32 GEMM multiplies 16 lanes at a
// time and this 8-lane kernel has not been measured against it.
int linear_f32_cpu_has_avx512() {
#if defined(FORKSERVE_AVX512)
    return 1;
#else
    return 0;
#endif
}

// Floats of the packed form of an [out_features, in_features] weight.
int64_t linear_f32_packed_numel(int64_t out_features, int64_t in_features) {
    return panels_of(out_features) * kCols * in_features;
}

// weight: row-major [out_features, in_features]; packed: linear_f32_packed_numel floats.
void linear_f32_pack(const float *weight, int64_t out_features, int64_t in_features, float *packed) {
    const int64_t panels = panels_of(out_features);
#pragma omp parallel for
    for (int64_t p = 0; p < panels; p++)
        for (int64_t k = 0; k < in_features; k++)
            for (int64_t c = 0; c < kCols; c++) {
                const int64_t row = p * kCols + c;
                packed[(p * in_features + k) * kCols + c] = row < out_features ? weight[row * in_features + k] : 0.f;
            }
}

// out[rows, out_features] (row stride out_stride) = x[rows, in_features] (row stride
// x_stride) times the packed weight, plus bias[out_features] when not null. Returns 0, or 1
// when this build has no kernel (see linear_f32_available).
int linear_f32([[maybe_unused]] const float *x, [[maybe_unused]] int64_t rows, [[maybe_unused]] int64_t in_features,
               [[maybe_unused]] int64_t x_stride, [[maybe_unused]] const float *packed,
               [[maybe_unused]] int64_t out_features, [[maybe_unused]] const float *bias, [[maybe_unused]] float *out,
               [[maybe_unused]] int64_t out_stride, [[maybe_unused]] int num_threads) {
#if defined(__AVX2__) && defined(__FMA__)
    if (rows > 0) gemm({x, x_stride, in_features, packed, out_features, bias, out, out_stride}, rows, num_threads);
    return 0;
#else
    return 1;
#endif
}

}  // extern "C"
