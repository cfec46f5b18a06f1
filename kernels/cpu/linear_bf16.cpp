// Linear layers in bfloat16: out = x W^T (+ bias), with W packed once for vdpbf16ps.
//
// Packed layout: output columns in panels of 32; within a panel, for each pair of input
// features (k, k+1), the 32 columns' two weights side by side:
//   packed[panel][k / 2][column][k % 2]
// so one k-pair of a panel is two 16-lane vectors of bf16 pairs, which is exactly the
// operand vdpbf16ps multiplies against a broadcast pair (x[m][k], x[m][k+1]). Columns past
// out_features and input features past in_features are zeros, and each panel has a
// multiple of 16 k-pairs, so that the same layout is also AMX's weight tile layout
// (linear_amx.cpp).
//
// linear_bf16 is the entry point for all three kernels: it multiplies on AMX tiles from
// amx_min_rows rows on (where the build and the CPU have them), below that with the weights
// widened to float32 and FMAs (tile<N, true>) from widen_min_rows rows on, and with vdpbf16ps
// below both. The Python side sets both thresholds from measurements on this machine
// (kernels/cpu/gemm_choice.py).
//
// A tile of up to 12 input rows keeps 24 float32 accumulators (12 rows x 2 vectors) in
// registers over the whole input width, so each weight vector is loaded once per tile and used
// 12 times. The input rows are first regrouped by k-pair (pack_rows), so a tile's broadcasts
// read consecutive words. The threads split the panels into contiguous ranges, so at decode
// sizes (a few rows) each streams its share of the weights once, in address order, and take
// over the ends of each other's ranges when done (row_passes.h), so a thread that another
// process preempts no longer stalls the other (a 600-token prefill beside a process busy 20% of
// a core: 495 instead of 529 ms; alone, the same within noise); with 8 rows or more, the tiles of a
// panel also prefetch (into L2) the panel kAhead places on, so its weights arrive from memory
// while these are multiplied. Below 8 rows the same prefetch, small_ahead panels on, helps on
// some CPUs and hurts on others (an Intel Xeon read the model's decode weights ~20% faster with
// it at one row; on AMD Zen 4 it cost more than it saved), so it is off until the caller
// measures it (kernels/cpu/gemm_choice.py). Products of bf16 are exact and sums are float32;
// the result is rounded to nearest even once.
//
// Why not oneDNN (kernels/cpu/packed_linear.py keeps it for float32 and for CPUs without
// AVX512-BF16): on the default model's decode shapes its bf16 GEMMs read the weights at
// 14-20 GB/s at batch 1, where a plain sequential read reaches ~30 GB/s on the same 2 cores,
// and lose ~25% at batch 32 when the weights come from memory rather than cache.
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "aligned.h"
#include "bf16.h"
#include "entries.h"
#include "gemm_panel.h"
#include "simd.h"
#include "row_passes.h"

#if defined(FORKSERVE_AVX512_BF16)
#include <omp.h>
#endif

namespace {

using namespace forkserve;

constexpr int kMaxTile = 12;    // input rows per register tile
// Panels a thread prefetches ahead of the one it multiplies (8+ rows). One panel (36 KiB for
// the default model's 576-wide inputs, 96 KiB for its 1536-wide down projection) is enough:
// on AMD Zen 4, its decode GEMMs with 30 layers' weights from memory took 0.91-0.94x as long
// at 12 and 16 rows as with 3 panels ahead, and 0.98-1.0x at 8, 24, 32 and 64 rows (both
// settings alternating in one process, 20 rounds; 2 panels measured like 1, a T0 hint worse).
constexpr int64_t kAhead = 1;
int64_t small_ahead = 0;        // the same below 8 rows (0: no prefetch); set by the caller

#if defined(FORKSERVE_AVX512_BF16)

struct Gemm {
    const int32_t *x_pairs;  // the input rows regrouped by pack_rows
    int64_t rows, pairs;
    int64_t panel_pairs;     // k-pairs per panel in the packed layout (pairs rounded up to 16)
    const uint16_t *packed;  // [panels][panel_pairs][32][2]
    int64_t out_features;
    const Bf16 *bias;  // [out_features] or null
    Bf16 *out;
    int64_t out_stride;
};

// The register tiles of rows [r0, r1) of a pass: kMaxTile rows each, except that a remainder
// of 1-4 rows shares the last full tile's rows evenly (13 rows: 7 + 6, 16: 8 + 8). A tile of
// a few rows has too few independent accumulator chains to keep vdpbf16ps busy and reads its
// panel again for little work: the default model's decode step at batch 13 took 1.09x as
// long with 12 + 1 rows, at batch 16 1.05x with 12 + 4. Larger remainders keep their own tile
// (splitting 17 rows as 9 + 8 or 32 as 11 + 11 + 10 measured ~3% slower than 12 + 5 and
// 12 + 12 + 8: a full tile uses each weight vector 12 times).
// Appends the tiles of rows [r0, r1) (r0 < r1) to `tiles`.
void add_row_tiles(int64_t r0, int64_t r1, std::vector<RowTile> &tiles) {
    const size_t first = tiles.size();
    for (int64_t r = r0; r < r1; r += kMaxTile) tiles.push_back({r, r1 - r < kMaxTile ? r1 - r : kMaxTile});
    const int64_t rest = tiles.back().n;
    if (tiles.size() - first >= 2 && rest <= 4) {
        RowTile &full = tiles[tiles.size() - 2];
        const int64_t both = kMaxTile + rest;
        full.n = (both + 1) / 2;
        tiles.back() = {full.start + full.n, both / 2};
    }
}

// The input rows regrouped so that a tile's broadcasts for one k-pair are consecutive:
// the tile of rows [r, r + n) starts at x_pairs + r * pairs and holds, for each k-pair, the
// n rows' (x[2 kp], x[2 kp + 1]) as int32; a missing odd feature is zero. WIDENED (for the
// widened tiles): two words per pair, the tile at x_pairs + 2 r pairs holding for each
// k-pair the n rows' x[2 kp], then the n rows' x[2 kp + 1], as float32 bits (exact).
// Whole pairs go 16 at a time: 16 words of each of the tile's rows, transposed, then stored
// as 16 runs of t.n words (a scalar loop over each word took ~3% of a prefill step).
template <bool WIDENED>
void pack_rows(const Bf16 *x, int64_t in_features, int64_t x_stride, int64_t pairs, RowTile t, int32_t *x_pairs) {
    constexpr int64_t kWords = WIDENED ? 2 : 1;  // 32-bit words per pair and row
    int32_t *dst = x_pairs + kWords * t.start * pairs;
    const __mmask16 lanes = static_cast<__mmask16>((1u << t.n) - 1);
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    int64_t kp = 0;
    for (; kp + 16 <= in_features / 2; kp += 16) {
        __m512i r[16];
        for (int64_t m = 0; m < 16; m++)
            r[m] = m < t.n ? _mm512_loadu_si512(x + (t.start + m) * x_stride + 2 * kp) : _mm512_setzero_si512();
        transpose16(r);  // r[k] lane m: row m's pair kp + k
        for (int64_t k = 0; k < 16; k++) {
            int32_t *at = dst + kWords * (kp + k) * t.n;
            if constexpr (WIDENED) {
                _mm512_mask_storeu_epi32(at, lanes, _mm512_slli_epi32(r[k], 16));
                _mm512_mask_storeu_epi32(at + t.n, lanes, _mm512_and_si512(r[k], high));
            } else {
                _mm512_mask_storeu_epi32(at, lanes, r[k]);
            }
        }
    }
    for (int64_t m = 0; m < t.n; m++) {  // the last pairs, and a missing odd feature as zero
        const uint16_t *row = reinterpret_cast<const uint16_t *>(x + (t.start + m) * x_stride);
        for (int64_t k = kp; k < pairs; k++) {
            const uint32_t hi = 2 * k + 1 < in_features ? row[2 * k + 1] : 0;
            const uint32_t word = row[2 * k] | hi << 16;
            int32_t *at = dst + kWords * k * t.n + m;
            if constexpr (WIDENED) {
                at[0] = static_cast<int32_t>(word << 16);
                at[t.n] = static_cast<int32_t>(word & 0xFFFF0000u);
            } else {
                at[0] = static_cast<int32_t>(word);
            }
        }
    }
}

// Which k-pairs of the next panel a tile prefetches: those with kp % count == index, so
// the tiles of a panel spread the next one's memory traffic over the whole panel.
struct Share {
    int64_t index, count;
};

// Rows [row0, row0 + TILE) times panel p; `next` (or null) is prefetched alongside.
// WIDENED: the weights widened to float32 in registers (a shift and an and) and multiplied by
// fused multiply-adds, four per row and k-pair instead of two vdpbf16ps, on inputs from
// pack_rows<true>: on CPUs that retire two 512-bit FMAs per cycle but one vdpbf16ps every
// other cycle (an Intel Xeon without AMX measured 338 against 163 GFLOP/s on 2 cores), twice
// the multiply-adds per cycle. Products of bf16 are exact in float32 either way.
template <int TILE, bool WIDENED>
void tile(const Gemm &g, int64_t row0, int64_t p, const uint16_t *next, Share share) {
    constexpr int64_t kWords = WIDENED ? 2 : 1;  // as in pack_rows
    const uint16_t *panel = g.packed + p * g.panel_pairs * 2 * kPanel;
    const int32_t *x = g.x_pairs + kWords * row0 * g.pairs;
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    __m512 acc[TILE][2];
    for (int m = 0; m < TILE; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t until = share.index + 1;  // k-pairs until the next prefetch
    for (int64_t kp = 0; kp < g.pairs; kp++) {
        const __m512i w0 = _mm512_loadu_si512(panel + kp * 2 * kPanel);
        const __m512i w1 = _mm512_loadu_si512(panel + kp * 2 * kPanel + kPanel);
        if (next != nullptr && --until == 0) {  // kp % share.count == share.index, without a division
            _mm_prefetch(reinterpret_cast<const char *>(next + kp * 2 * kPanel), _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char *>(next + kp * 2 * kPanel + kPanel), _MM_HINT_T1);
            until = share.count;
        }
        const int32_t *xk = x + kWords * kp * TILE;
        if constexpr (WIDENED) {
            // Columns 0-15 and 16-31 for the pair's even feature (low halves) and odd one (high).
            const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
            const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
            const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
            const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
            for (int m = 0; m < TILE; m++) {
                const __m512 xe = _mm512_castsi512_ps(_mm512_set1_epi32(xk[m]));
                const __m512 xo = _mm512_castsi512_ps(_mm512_set1_epi32(xk[TILE + m]));
                acc[m][0] = _mm512_fmadd_ps(xe, e0, acc[m][0]);
                acc[m][1] = _mm512_fmadd_ps(xe, e1, acc[m][1]);
                acc[m][0] = _mm512_fmadd_ps(xo, o0, acc[m][0]);
                acc[m][1] = _mm512_fmadd_ps(xo, o1, acc[m][1]);
            }
        } else {
            for (int m = 0; m < TILE; m++) {
                const __m512bh xb = (__m512bh)_mm512_set1_epi32(xk[m]);
                acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xb, (__m512bh)w0);
                acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xb, (__m512bh)w1);
            }
        }
    }
    const PanelEpilogue epilogue(g.bias, g.out_features, p * kPanel);
    for (int m = 0; m < TILE; m++) epilogue.store(g.out + (row0 + m) * g.out_stride + p * kPanel, acc[m][0], acc[m][1]);
}

using TileFn = void (*)(const Gemm &, int64_t, int64_t, const uint16_t *, Share);
template <bool WIDENED>
constexpr TileFn kTiles[kMaxTile + 1] = {
    nullptr,           tile<1, WIDENED>, tile<2, WIDENED>, tile<3, WIDENED>,  tile<4, WIDENED>,  tile<5, WIDENED>,
    tile<6, WIDENED>,  tile<7, WIDENED>, tile<8, WIDENED>, tile<9, WIDENED>,  tile<10, WIDENED>, tile<11, WIDENED>,
    tile<12, WIDENED>};

// Rows per pass over the weights: with many rows, the pass's inputs stay in L2 (~256 KiB)
// while every panel of the thread's range is multiplied against them.
int64_t rows_per_pass(int64_t row_bytes) {
    int64_t rows = (256 << 10) / (row_bytes > 0 ? row_bytes : 1) / kMaxTile * kMaxTile;
    return rows < kMaxTile ? kMaxTile : rows;
}

// widened: on the widened tiles (inputs as float32, two words per pair).
void gemm(const Bf16 *x, int64_t in_features, int64_t x_stride, Gemm g, bool widened, int num_threads) {
    const int64_t words = widened ? 2 : 1;  // 32-bit words per input pair in x_pairs
    const int64_t panels = (g.out_features + kPanel - 1) / kPanel, step = rows_per_pass(4 * words * g.pairs);
    // Reused across calls: a fresh (zero-filled, often freshly mapped) buffer per product cost
    // ~3% of a prefill step on Zen 4, and pack_rows writes every word that is read.
    static thread_local AlignedVector<int32_t> x_pairs;
    const size_t need = static_cast<size_t>(words * g.rows * g.pairs);
    if (x_pairs.size() < need) x_pairs.resize(need);
    const TileFn *tile_fns = widened ? kTiles<true> : kTiles<false>;
    int32_t *const pairs_buf = x_pairs.data();  // the caller's buffer, shared by the team below
    g.x_pairs = pairs_buf;
    const int64_t ahead = g.rows >= 8 ? kAhead : small_ahead;
    RowPasses passes(g.rows, step, panels, num_threads, add_row_tiles);
    const std::vector<RowTile> &tiles = passes.tiles();
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < tiles.size(); i++)
            (widened ? pack_rows<true> : pack_rows<false>)(x, in_features, x_stride, g.pairs, tiles[i], pairs_buf);
        passes.run(omp_get_thread_num(), [&](int64_t p, const RowTile *pass_tiles, int64_t count) {
            const uint16_t *next =
                ahead > 0 && p + ahead < panels ? g.packed + (p + ahead) * g.panel_pairs * 2 * kPanel : nullptr;
            for (int64_t i = 0; i < count; i++) tile_fns[pass_tiles[i].n](g, pass_tiles[i].start, p, next, Share{i, count});
        });
    }
}

#endif

// k-pairs per panel in the packed layout: the input's pairs rounded up to a whole AMX tile.
int64_t panel_pairs_of(int64_t in_features) { return (in_features + 31) / 32 * 16; }

// Rows from which linear_bf16 multiplies on AMX tiles (where it can); set by the caller.
int64_t amx_min_rows = INT64_MAX;
// Whether linear_bf16 multiplies a product of `rows` rows on AMX tiles.
bool on_amx(int64_t rows) { return rows >= amx_min_rows && linear_amx_available(); }

// Rows from which the vector kernel widens the weights to float32 (tile<N, true>); set by
// the caller from a measurement (kernels/cpu/gemm_choice.py).
int64_t widen_min_rows = INT64_MAX;

}  // namespace

extern "C" {

// 1 when this build has the kernel (the CPU has AVX512-BF16), else 0.
int linear_bf16_available() {
#if defined(FORKSERVE_AVX512_BF16)
    return 1;
#else
    return 0;
#endif
}

// Products of at least `rows` rows go to the AMX kernel where linear_amx_available(); returns
// the previous setting. INT64_MAX (the initial value) keeps every product on vdpbf16ps.
int64_t linear_bf16_set_amx_min_rows(int64_t rows) {
    const int64_t previous = amx_min_rows;
    amx_min_rows = rows;
    return previous;
}

// Products of fewer than 8 rows prefetch the weights `panels` panels ahead (0: not at all);
// returns the previous setting.
int64_t linear_bf16_set_small_prefetch(int64_t panels) {
    const int64_t previous = small_ahead;
    small_ahead = panels < 0 ? 0 : panels;
    return previous;
}

// Products of at least `rows` rows on the vector kernel multiply with widened weights and
// float32 FMAs; returns the previous setting. INT64_MAX (the initial value): never.
int64_t linear_bf16_set_widen_min_rows(int64_t rows) {
    const int64_t previous = widen_min_rows;
    widen_min_rows = rows;
    return previous;
}

// Bytes of the packed form of an [out_features, in_features] weight.
int64_t linear_bf16_packed_bytes(int64_t out_features, int64_t in_features) {
    const int64_t panels = (out_features + kPanel - 1) / kPanel;
    return panels * panel_pairs_of(in_features) * kPanel * 2 * static_cast<int64_t>(sizeof(uint16_t));
}

// weight: row-major [out_features, in_features] bf16 bits; packed: linear_bf16_packed_bytes.
void linear_bf16_pack(const uint16_t *weight, int64_t out_features, int64_t in_features, uint16_t *packed) {
    const int64_t panels = (out_features + kPanel - 1) / kPanel, pairs = panel_pairs_of(in_features);
#pragma omp parallel for
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kp = 0; kp < pairs; kp++)
            for (int64_t c = 0; c < kPanel; c++)
                for (int64_t e = 0; e < 2; e++) {
                    const int64_t row = p * kPanel + c, col = 2 * kp + e;
                    const bool inside = row < out_features && col < in_features;
                    packed[((p * pairs + kp) * kPanel + c) * 2 + e] = inside ? weight[row * in_features + col] : 0;
                }
}

// out[rows, out_features] (row stride out_stride) = x[rows, in_features] (row stride
// x_stride) times the packed weight, plus bias[out_features] when not null, always on the
// vdpbf16ps kernel. Returns 0, or 1 when this build has no kernel (see linear_bf16_available).
int linear_bf16_vector(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                       const uint16_t *packed, int64_t out_features, const forkserve::Bf16 *bias, forkserve::Bf16 *out,
                       int64_t out_stride, int num_threads) {
#if defined(FORKSERVE_AVX512_BF16)
    const Gemm g{nullptr, rows, (in_features + 1) / 2, panel_pairs_of(in_features), packed, out_features, bias, out,
                 out_stride};
    gemm(x, in_features, x_stride, g, rows >= widen_min_rows, num_threads);
    return 0;
#else
    (void)x, (void)rows, (void)in_features, (void)x_stride, (void)packed, (void)out_features, (void)bias, (void)out,
        (void)out_stride, (void)num_threads;
    return 1;
#endif
}

// As linear_bf16_vector, on AMX tiles from amx_min_rows rows on where this process can use them.
int linear_bf16(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                const uint16_t *packed, int64_t out_features, const forkserve::Bf16 *bias, forkserve::Bf16 *out,
                int64_t out_stride, int num_threads) {
    if (on_amx(rows))
        return linear_amx(x, rows, in_features, x_stride, packed, out_features, bias, out, out_stride, num_threads);
    return linear_bf16_vector(x, rows, in_features, x_stride, packed, out_features, bias, out, out_stride,
                              num_threads);
}

// silu(gate) * up of the MLP's fused gate-up product (linear_amx_silu_mul) where linear_bf16
// would multiply on AMX tiles. Returns 0, or 1 where it would not or cannot (then the caller
// runs linear_bf16 and silu_and_mul_bf16, which give the same bits).
int linear_bf16_silu_mul(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                         const uint16_t *packed, int64_t width, forkserve::Bf16 *out, int64_t out_stride,
                         int num_threads) {
    if (!on_amx(rows)) return 1;
    return linear_amx_silu_mul(x, rows, in_features, x_stride, packed, width, out, out_stride, num_threads);
}

}  // extern "C"
