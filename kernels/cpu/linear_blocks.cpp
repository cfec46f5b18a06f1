// Linear layers in float32 whose weights are quantized blocks, for products of a few rows:
// out = x W^T (+ bias), where along each output row every 32 input features share a scale d
// (exactly a float16 value) and hold small integers q, so that each float32 weight is
// rebuilt exactly from its block. Two formats (kernels/cpu/linear_blocks.py finds and packs
// them; the format's index, entries.h, is the first argument of every entry point):
//   kFourBitBlocks, 4-bit affine: d * q + m, q in 0..15 (d * q exact, one FMA: one rounding), what a GGUF
//      Q4_1 tensor dequantizes to: the default model's linear layers;
//   kEightBitBlocks, 8-bit scaled: d * q, q in -128..127 (exact), what a GGUF Q8_0 tensor dequantizes
//      to: the default model's embedding, which is also its output layer (tied).
// The tiles sum the rebuilt weights k after k as linear_f32.cpp's do: the same bits.
//
// Why: a decode step of a few rows reads every weight from memory once. Float32 weights are
// ~5x the bytes of the 4-bit form (6 bits a weight with the scales) and ~3.6x those of the
// 8-bit one (1.125 bytes). On an AMD Zen 3 (2 cores, float32) a decode step of the default
// model, one request, took ~26-28 ms on float32 panels (linear_f32.cpp), most of it reading
// ~540 MB of weights; ~16 ms with the layers on 4-bit blocks and ~11 ms with the output
// layer on 8-bit blocks too; eight requests' step 35 -> 25 ms (python -m
// bench_agent.bench_weight_blocks). From 9 rows on the float32 panels are faster (widening
// costs more than the FMAs it feeds save in reads), so the layers keep both forms
// (packed_linear.py) and take these for up to linear_blocks_few_rows() rows.
//
// Packed layout: output columns in panels of 16 (as linear_f32.cpp); a panel's input
// features in blocks of 32, each block its columns' float32 scales, then its integers k
// after k, a k's 16 columns side by side:
//   4-bit, 384 bytes:  float d[16], m[16]; uint8 q[32][8]  (byte j: column j low nibble, j + 8 high)
//   8-bit, 576 bytes:  float d[16];        int8 q[32][16]
// Columns past out_features are zeros. A register tile widens one k's weights at a time (in
// registers) and adds them into float32 sums. Up to 5 rows a tile takes a whole panel
// (2 x rows FMA chains), 6-8 rows half a panel (rows chains: a whole panel's 12-16
// accumulators would not fit AVX2's 16 registers beside the scales); more rows go 8 at a
// time (tests, benchmarks: the layers do not send them). The threads split the panels as
// linear_f32.cpp's do, and each panel's tiles prefetch the next one.
#include <array>
#include <cstdint>
#include <utility>

#include "entries.h"
#include "isa.h"
#include "panel_prefetch.h"
#include "simd.h"
#include "stealing_ranges.h"

#if (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#include <omp.h>
#endif

namespace {

constexpr int64_t kCols = 16;   // output columns per panel
constexpr int64_t kBlock = 32;  // input features per block
using forkserve::kEightBitBlocks;
using forkserve::kFourBitBlocks;
constexpr int kFormats = 2;
// Bytes of a block in each format (d, m, q; d, q): 384, 576.
constexpr int64_t kBlockBytes[kFormats] = {2 * 4 * kCols + kBlock * kCols / 2, 4 * kCols + kBlock * kCols};
// Products of up to this many rows run faster on the blocks than on linear_f32's float32
// panels (AMD Zen 3, 2 cores, time against float32 panels; python -m bench_agent.bench_gemm):
//   4-bit (--dtype float32 --rows 1 2 4 5 6 7 8 16 and --rows 5 6 7 8 9 10 12 --rounds 9,
//     the layers' shapes): 1 row 0.40x, 2 0.44x, 4 0.50x, 5 0.56x / 0.66x, 6 1.14x (noisy) /
//     0.88x, 7 0.83x / 0.74x, 8 0.79x / 0.77x, 9 1.07x, 10 1.10x, 12 1.14x, 16 1.21x (with
//     each k's nibbles unpacked as below; masking them in 16 bytes first and extending each
//     half after, one instruction more per vector, 5 rows took 0.73x and 8 rows 0.98x);
//   8-bit (--output-layer --rows 1 2 4 5 6 8 9 12 16, the output layer's shape): 1 row
//     0.36x, 2 0.42x, 4 0.53x, 5 0.51x, 6 0.80x, 8 0.73x, 9 0.97x, 12 1.05x, 16 1.20x.
constexpr int64_t kFewRows[kFormats] = {8, 8};

int64_t panels_of(int64_t out_features) { return (out_features + kCols - 1) / kCols; }

bool known(int format) { return format >= 0 && format < kFormats; }

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

// The formats: a Block<VECS> holds one block's scales for a tile's VECS vectors of columns
// (from column 8 * half) in registers across its 32 k, and widen(i, w) gives k = i's weights.
struct FourBitBlocks {
    static constexpr int64_t kBytes = kBlockBytes[kFourBitBlocks];
    template <int VECS>
    struct Block {
        __m256 d[VECS], m[VECS];
        const uint8_t *q;
        int half;
        Block(const uint8_t *block, int half_) : q(block + 2 * 4 * kCols), half(half_) {
            const float *dm = reinterpret_cast<const float *>(block);
            for (int v = 0; v < VECS; v++) {
                d[v] = _mm256_loadu_ps(dm + 8 * (half + v));
                m[v] = _mm256_loadu_ps(dm + kCols + 8 * (half + v));
            }
        }
        // d * q + m: the k's 8 bytes zero-extended to 32 bits each (one load-and-extend),
        // then column j's q is the low nibble (masked) and column j + 8's the high one
        // (shifted: the bits above it are zero), converted, one FMA.
        void widen(int64_t i, __m256 (&w)[VECS]) const {
            const auto *bytes = reinterpret_cast<const __m128i *>(q + i * kCols / 2);
            const __m256i both = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes));
            for (int v = 0; v < VECS; v++) {
                const __m256i nibble = half + v == 0 ? _mm256_and_si256(both, _mm256_set1_epi32(0x0F))
                                                     : _mm256_srli_epi32(both, 4);
                w[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nibble), d[v], m[v]);
            }
        }
    };
};

struct EightBitBlocks {
    static constexpr int64_t kBytes = kBlockBytes[kEightBitBlocks];
    template <int VECS>
    struct Block {
        __m256 d[VECS];
        const int8_t *q;
        Block(const uint8_t *block, int half) : q(reinterpret_cast<const int8_t *>(block + 4 * kCols) + 8 * half) {
            const float *scales = reinterpret_cast<const float *>(block);
            for (int v = 0; v < VECS; v++) d[v] = _mm256_loadu_ps(scales + 8 * (half + v));
        }
        // d * q: sign-extend, convert, multiply.
        void widen(int64_t i, __m256 (&w)[VECS]) const {
            for (int v = 0; v < VECS; v++) {
                const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + i * kCols + 8 * v));
                w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d[v]);
            }
        }
    };
};

using Prefetch = forkserve::PanelPrefetch;

// Rows [row0, row0 + ROWS) times 8 * VECS of panel p's columns: with VECS 2 all 16, with
// VECS 1 the half `half` (0: columns 0-7, 1: 8-15); ROWS * VECS FMA chains. `pf`'s lines
// are prefetched alongside. GCC keeps the accumulators in registers only with the loops over
// them unrolled.
template <class Format, int ROWS, int VECS>
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
    for (int64_t b = 0, k = 0; b < g.in_features / kBlock; b++) {
        const typename Format::template Block<VECS> block(panel + b * Format::kBytes, half);
        for (int64_t i = 0; i < kBlock; i++, k++) {
            prefetch.step();
            __m256 w[VECS];
            block.widen(i, w);
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

// {nullptr, tile<1 row>, ..., tile<N rows>} for N = sizeof...(R).
template <class Format, int VECS, int... R>
constexpr std::array<TileFn, sizeof...(R) + 1> tiles_up_to(std::integer_sequence<int, R...>) {
    return {nullptr, tile<Format, R + 1, VECS>...};
}

template <class Format>
void gemm(const Gemm &g, int64_t rows, int num_threads) {
    static constexpr auto whole = tiles_up_to<Format, 2>(std::make_integer_sequence<int, kWholePanelRows>{});
    static constexpr auto halves = tiles_up_to<Format, 1>(std::make_integer_sequence<int, kFusedRows>{});
    const int64_t panels = panels_of(g.out_features), panel_bytes = g.in_features / kBlock * Format::kBytes;
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
                    whole[n](g, row0, panel, p, 0, {next, i, groups, lines});
                } else {
                    for (int half = 0; half < 2; half++)
                        halves[n](g, row0, panel, p, half, {next, 2 * i + half, 2 * groups, lines});
                }
            }
        }
    }
}

#endif

// Packing (linear_blocks_pack): finding a weight's blocks and laying them out in one pass.
// Each block's scale is found as the quantizers choose it (Q4_1: a fifteenth of the block's
// range, its offset the smallest value; Q8_0: its largest magnitude over 127), rounded to
// float16, and every value is checked to come back bit for bit from the block's integers.
// -ffast-math lets the compiler divide by multiplying with the reciprocal, an ulp off the
// quotient at most; for a block the quantizer made, the quotient lies within a few float32
// ulps of a float16 value (its scale), far from where float16 rounding could go either way,
// so it rounds to the same scale (tests/test_cpu_linear_blocks.py compares this packing
// with linear_blocks.py's PyTorch reference, byte for byte).
#if defined(__F16C__)

bool finite(float v) {
    uint32_t bits;
    __builtin_memcpy(&bits, &v, 4);
    return (bits & 0x7f800000u) != 0x7f800000u;
}

bool same_bits(float a, float b) { return __builtin_memcmp(&a, &b, 4) == 0; }

float half_round(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

// One block's integers for scale d (and offset m) if they give back all 32 values `w`.
template <int FORMAT>
bool block_integers(const float *w, float d, float m, int (&q)[kBlock]) {
    if (!(d >= 0.f) || !finite(d)) return false;
    const float inverse = d > 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < kBlock; i++) {
        const float steps = FORMAT == kFourBitBlocks ? (w[i] - m) * inverse : w[i] * inverse;
        int n = static_cast<int>(__builtin_lrintf(steps));
        if (FORMAT == kFourBitBlocks) n = n < 0 ? 0 : n > 15 ? 15 : n;
        else n = n < -128 ? -128 : n > 127 ? 127 : n;
        const float steps_back = static_cast<float>(n);
        const float again = FORMAT == kFourBitBlocks ? __builtin_fmaf(d, steps_back, m) : d * steps_back;
        if (!same_bits(again, w[i])) return false;
        q[i] = n;
    }
    return true;
}

// Finds one block's scale, offset and integers; false when the block is not of this form.
template <int FORMAT>
bool find_block(const float *w, float &d, float &m, int (&q)[kBlock]) {
    float lo = w[0], hi = w[0], magnitude = 0.f;
    for (int i = 0; i < kBlock; i++) {
        if (!finite(w[i])) return false;
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
        const float a = w[i] < 0.f ? -w[i] : w[i];
        magnitude = a > magnitude ? a : magnitude;
    }
    m = FORMAT == kFourBitBlocks ? lo : 0.f;
    d = half_round(FORMAT == kFourBitBlocks ? (hi - lo) / 15.f : magnitude / 127.f);
    return block_integers<FORMAT>(w, d, m, q);
}

// Packs one panel (output columns [16 p, 16 p + 16)); false when a block is not of this form.
template <int FORMAT>
bool pack_panel(const float *weight, int64_t out_features, int64_t in_features, int64_t p, uint8_t *panel) {
    for (int64_t b = 0; b < in_features / kBlock; b++) {
        uint8_t *block = panel + b * kBlockBytes[FORMAT];
        auto *scales = reinterpret_cast<float *>(block);
        uint8_t *ints = block + (FORMAT == kFourBitBlocks ? 2 : 1) * 4 * kCols;
        __builtin_memset(block, 0, kBlockBytes[FORMAT]);
        for (int64_t c = 0; c < kCols && p * kCols + c < out_features; c++) {
            float d, m;
            int q[kBlock];
            if (!find_block<FORMAT>(weight + (p * kCols + c) * in_features + b * kBlock, d, m, q)) return false;
            scales[c] = d;
            if (FORMAT == kFourBitBlocks) {
                scales[kCols + c] = m;
                // byte c % 8 of each k: column c in the low nibble, or c (8..15) in the high one
                for (int i = 0; i < kBlock; i++)
                    ints[i * kCols / 2 + c % 8] |= static_cast<uint8_t>(q[i] << (c < 8 ? 0 : 4));
            } else {
                for (int i = 0; i < kBlock; i++) ints[i * kCols + c] = static_cast<uint8_t>(static_cast<int8_t>(q[i]));
            }
        }
    }
    return true;
}

template <int FORMAT>
bool pack(const float *weight, int64_t out_features, int64_t in_features, uint8_t *packed, int threads) {
    const int64_t panels = panels_of(out_features), panel_bytes = in_features / kBlock * kBlockBytes[FORMAT];
    // The first panel alone first: other weights fail there, before the threads start.
    if (!pack_panel<FORMAT>(weight, out_features, in_features, 0, packed)) return false;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 1; p < panels; p++) {
        if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) continue;
        if (!pack_panel<FORMAT>(weight, out_features, in_features, p, packed + p * panel_bytes))
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
    }
    return !failed;
}

#endif

}  // namespace

extern "C" {

// 1 when this build has the kernel (the CPU has AVX2 and FMA), else 0.
int linear_blocks_available() {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

// Up to how many rows the packed layers take format `format`'s blocks (kFewRows); 0 for an
// unknown format.
int64_t linear_blocks_few_rows(int format) { return known(format) ? kFewRows[format] : 0; }

// Bytes of the packed form of an [out_features, in_features] weight (in_features a multiple
// of 32) in format `format`; 0 for an unknown format.
int64_t linear_blocks_packed_bytes(int format, int64_t out_features, int64_t in_features) {
    return known(format) ? panels_of(out_features) * (in_features / kBlock) * kBlockBytes[format] : 0;
}

// weight: row-major float32 [out_features, in_features] (out_features >= 1, in_features a
// positive multiple of 32); packed: linear_blocks_packed_bytes bytes. Returns 1 when every
// value is a block value of format `format` and `packed` now holds the weight in that
// format, 0 when it is not such blocks (`packed` then holds nothing useful), 2 for an
// unknown format or shape, 3 when this build cannot pack (no F16C: linear_blocks.py packs
// in PyTorch instead).
int linear_blocks_pack([[maybe_unused]] int format, [[maybe_unused]] const float *weight,
                       [[maybe_unused]] int64_t out_features, [[maybe_unused]] int64_t in_features,
                       [[maybe_unused]] void *packed, [[maybe_unused]] int threads) {
    if (!known(format) || out_features < 1 || in_features < kBlock || in_features % kBlock) return 2;
#if defined(__F16C__)
    auto *bytes = static_cast<uint8_t *>(packed);
    const bool found = format == kFourBitBlocks
                           ? pack<kFourBitBlocks>(weight, out_features, in_features, bytes, threads)
                           : pack<kEightBitBlocks>(weight, out_features, in_features, bytes, threads);
    return found ? 1 : 0;
#else
    return 3;
#endif
}

// out[rows, out_features] (row stride out_stride) = x[rows, in_features] (row stride
// x_stride) times the weight packed in format `format`, plus bias[out_features] when not
// null. Returns 0; 1 when this build has no kernel (see linear_blocks_available); 2 for an
// unknown format.
int linear_blocks(int format, [[maybe_unused]] const float *x, [[maybe_unused]] int64_t rows,
                  [[maybe_unused]] int64_t in_features, [[maybe_unused]] int64_t x_stride,
                  [[maybe_unused]] const void *packed, [[maybe_unused]] int64_t out_features,
                  [[maybe_unused]] const float *bias, [[maybe_unused]] float *out,
                  [[maybe_unused]] int64_t out_stride, [[maybe_unused]] int num_threads) {
    if (!known(format)) return 2;
#if defined(__AVX2__) && defined(__FMA__)
    if (rows <= 0) return 0;
    const Gemm g{x, x_stride, in_features, static_cast<const uint8_t *>(packed), out_features, bias, out, out_stride};
    if (format == kFourBitBlocks)
        gemm<FourBitBlocks>(g, rows, num_threads);
    else
        gemm<EightBitBlocks>(g, rows, num_threads);
    return 0;
#else
    return 1;
#endif
}

}  // extern "C"
