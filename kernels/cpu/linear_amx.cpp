// Linear layers in bfloat16 on AMX tiles (Intel Xeon from Sapphire Rapids on): out = x W^T
// (+ bias), reading the very packed weight linear_bf16.cpp reads.
//
// Why a second kernel: the vdpbf16ps kernel retires 32 multiply-adds per instruction and
// tops out near 160 GFLOP/s on 2 cores; one AMX tdpbf16ps multiplies a 16 x 32 tile of
// inputs by a 32 x 16 tile of weights (8,192 multiply-adds) into 16 x 16 float32
// accumulators, and oneDNN's bf16 GEMM on these cores reaches 1.6-2.8 TFLOP/s with it. Once
// a product has a few rows the tiles win; at one row the vector kernel reads the weights
// faster. linear_bf16 picks between the two per call by the row count (linear_bf16.cpp).
//
// The packed panel layout (packed[panel][k-pair][column][2], k-pairs padded to a multiple
// of 16) is already the tile layout: the first 16 columns of 16 consecutive k-pairs are 16
// rows of 64 bytes, 128 bytes apart, which is one B tile; the next 16 columns start 64 bytes
// later. A tile of inputs is 16 rows of 32 features read in place from x (stride x_stride)
// when in_features is a multiple of 32; otherwise x is first copied with its rows padded
// by zeros. Each thread takes a contiguous range of panels, then the others' from their back
// (as linear_bf16 does), and runs blocks of 32 rows x 32 columns (four accumulator tiles)
// over the whole input width; a final block of fewer rows overlaps the one before it
// (recomputing the same values; 16 rows high when it has at most 16 new ones, so that at
// most 15 rows are computed twice) or, below 32 rows, reads a zero-padded copy.
// Products of bf16 are exact, sums float32 (in the tile unit's order), the result rounded
// to nearest even once. A block's sums go out (rounded, plus bias, or through silu) a few
// rows at a time between the next block's tile instructions (Epilogue), so that the vector
// units work while the tiles do: prefill 1.06-1.07x (224 and 512 new tokens after 450
// cached, both builds alternating in one process), decode unchanged.
//
// The operating system must grant each process the tile state before its first use
// (arch_prctl ARCH_REQ_XCOMP_PERM); linear_amx_available asks for it once.
#include <cstdint>
#include <cstring>
#include <vector>

#include "aligned.h"
#include "amx.h"
#include "bf16.h"
#include "entries.h"
#include "gemm_panel.h"
#include "simd.h"
#include "row_passes.h"

#if defined(FORKSERVE_AMX_KERNELS)
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

using namespace forkserve;

#if defined(FORKSERVE_AMX_KERNELS)

constexpr int64_t kTileK = 32;     // input features per tile
constexpr int64_t kTileRows = 16;  // rows per tile
constexpr int64_t kBlockRows = 2 * kTileRows;
constexpr int64_t kTileBytes = kTileRows * 2 * kPanel * 2;  // one k-step's weights: two B tiles, 2 KiB

// At decode sizes a block multiplies each weight tile once or twice and then waits on memory
// for the next: the tile loads alone keep too few reads in flight. So a panel's only block
// (a pass of at most 32 rows) asks for the weights this many bytes ahead (in the same panel
// or the next one, which follows it in memory). On a 2-core Xeon (family 6 model 207), all
// the default model's GEMMs of one step: 8 rows 22.9 -> 17.3 ms (1-8 KiB ahead all within
// 3%), 32 rows 31.3 -> 24.6 ms (and, before the scheme below, 128 rows 55.4 -> 49.5 ms).
constexpr int64_t kAheadBytes = 4096;
// With several blocks per panel (prefill sizes) the first block still read its panel from
// memory while the others found it in cache, and waited on it. Now each block of a panel
// asks for its share of the thread's next panel into L2 (_MM_HINT_T1), spread over its
// k-steps, so every panel is in cache before its first block (the last panel asks for
// none). One thread on the same Xeon, weights of 30 layers from memory: 224 rows x 576 ->
// 3072 1,110 -> 1,374 GFLOP/s, 224 x 1536 -> 576 1,289 -> 1,548, 96 x 576 -> 3072 1,101
// -> 1,238.

// Where a block sends its prefetches: `bytes` from `from` to L2 (a share of the next panel),
// or, with from == nullptr, kAheadBytes ahead of each k-step's weights into L1.
struct Prefetch {
    const char *from = nullptr;
    int64_t bytes = 0;
};

// Tiles (see amx.h): 0-3 accumulators (rows 0-15 / 16-31 x columns 0-15 / 16-31), 4-5
// inputs (rows 0-15, 16-31), 6-7 weights (columns 0-15, 16-31).

struct AmxGemm {
    const Bf16 *x;       // rows of in_features (padded to k_tiles * 32 when copied)
    int64_t x_stride;    // elements between rows of x
    int64_t rows, k_tiles;
    const uint16_t *packed;
    int64_t panel_pairs;  // k-pairs per panel in the packed layout
    int64_t out_features;
    const Bf16 *bias;
    Bf16 *out;
    int64_t out_stride;
    // 0: out = the product (+ bias). Else out_features = 2 * silu_width (the gate columns,
    // then the up columns, of the MLP's fused gate-up projection), a multiple of 64, no
    // bias, and out = silu(gate) * up, silu_width wide (linear_amx_silu_mul).
    int64_t silu_width;
};

// Rows [row0, row0 + n) of the block's float32 results, plus bias (`epilogue`, of panel p),
// rounded into out.
void store_block(const AmxGemm &g, const PanelEpilogue &epilogue, const float *c, int64_t row0, int64_t n,
                 int64_t first_row_in_c, int64_t p) {
    for (int64_t m = 0; m < n; m++) {
        const float *row = c + (first_row_in_c + m) * kPanel;
        epilogue.store(g.out + (row0 + m) * g.out_stride + p * kPanel, _mm512_loadu_ps(row), _mm512_loadu_ps(row + 16));
    }
}

// As store_block for a product's gate panel p and its up panel: both rounded to bfloat16 (as
// store_block would store them), then silu(gate) * up (silu_mul16, as silu_and_mul) into
// columns [32 p, 32 p + 32) of out.
void store_silu_block(const AmxGemm &g, const PanelEpilogue &epilogue, const float *gate, const float *up,
                      int64_t row0, int64_t n, int64_t first_row_in_c, int64_t p) {
    // The sums rounded exactly as store_block rounds them, the (zero) bias added included: a
    // -0 sum comes out +0 there, so it must here too.
    auto rounded = [&](const float *v) {
        return widen16((__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(v), epilogue.bias0)));
    };
    for (int64_t m = 0; m < n; m++) {
        const int64_t at = (first_row_in_c + m) * kPanel;
        Bf16 *dst = g.out + (row0 + m) * g.out_stride + p * kPanel;
        for (int64_t half = 0; half < kPanel; half += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + half),
                                silu_mul16(rounded(gate + at + half), rounded(up + at + half)));
    }
}

// A block's results waiting to go out: the next block's k-steps store a few rows each
// (Epilogue::rows) between their tile instructions, so that the vector units round, add the
// bias or apply silu while the tiles multiply, instead of the tiles idling through a block's
// epilogue; `finish` stores what is left.
struct Epilogue {
    const AmxGemm *g = nullptr;
    PanelEpilogue panel;                      // panel p's bias (zeros with silu) and masks
    const float *c = nullptr, *c_up = nullptr;  // the block's sums (c_up: its up panel's, with silu)
    int64_t row0 = 0, n = 0, first = 0, p = 0;
    int64_t done = 0, per_step = 0;  // rows stored so far; rows per k-step

    // The next `count` rows (fewer at the end; none when nothing waits).
    void rows(int64_t count) {
        const int64_t end = done + count < n ? done + count : n;
        if (end <= done) return;
        if (c_up != nullptr)
            store_silu_block(*g, panel, c, c_up, row0 + done, end - done, first + done, p);
        else
            store_block(*g, panel, c, row0 + done, end - done, first + done, p);
        done = end;
    }
    void finish() { rows(n); }
};

// Accumulates rows [0, 32) (or [0, 16) when TWO_ROW_TILES is false) of `a` times panel
// `panel` into `c` ([32][32] float32), storing `pending.per_step` rows of the block before
// (`pending`) after each k-step's products.
template <bool TWO_ROW_TILES>
void block(const Bf16 *a, int64_t a_stride_bytes, const uint16_t *panel, int64_t k_tiles, float *c,
           Prefetch prefetch, Epilogue &pending) {
    TILE_ZERO(0);
    TILE_ZERO(1);
    if (TWO_ROW_TILES) {
        TILE_ZERO(2);
        TILE_ZERO(3);
    }
    const char *a_bytes = reinterpret_cast<const char *>(a);
    // Lines of the next panel per k-step (whole cache lines, rounded up).
    const int64_t share = (prefetch.bytes + 64 * k_tiles - 1) / (64 * k_tiles) * 64;
    for (int64_t kt = 0; kt < k_tiles; kt++) {
        const uint16_t *b = panel + kt * kTileRows * 2 * kPanel;  // 16 k-pairs of 32 columns
        if (prefetch.from == nullptr) {
            const char *ahead = reinterpret_cast<const char *>(b) + kAheadBytes;  // see kAheadBytes
            for (int64_t line = 0; line < kTileBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
        } else {
            const int64_t end = (kt + 1) * share < prefetch.bytes ? (kt + 1) * share : prefetch.bytes;
            for (int64_t line = kt * share; line < end; line += 64) _mm_prefetch(prefetch.from + line, _MM_HINT_T1);
        }
        TILE_LOADD(6, b, 4 * kPanel);
        TILE_LOADD(7, b + kTileRows * 2, 4 * kPanel);
        TILE_LOADD(4, a_bytes + kt * kTileK * 2, a_stride_bytes);
        TILE_DPBF16PS(0, 4, 6);
        TILE_DPBF16PS(1, 4, 7);
        if (TWO_ROW_TILES) {
            TILE_LOADD(5, a_bytes + kTileRows * a_stride_bytes + kt * kTileK * 2, a_stride_bytes);
            TILE_DPBF16PS(2, 5, 6);
            TILE_DPBF16PS(3, 5, 7);
        }
        pending.rows(pending.per_step);
    }
    TILE_STORED(0, c, 4 * kPanel);
    TILE_STORED(1, c + 16, 4 * kPanel);
    if (TWO_ROW_TILES) {
        TILE_STORED(2, c + kTileRows * kPanel, 4 * kPanel);
        TILE_STORED(3, c + kTileRows * kPanel + 16, 4 * kPanel);
    }
}

// Rows per pass over a thread's panels: the pass's inputs stay in L2 while each panel
// (then in L1/L2) is multiplied against them.
int64_t rows_per_pass(int64_t k_tiles) {
    const int64_t rows = (512 << 10) / (k_tiles * kTileK * 2) / kBlockRows * kBlockRows;
    return rows < kBlockRows ? kBlockRows : rows;
}

void amx_gemm(const AmxGemm &g, int num_threads) {
    const int64_t width = g.k_tiles * kTileK;
    const int64_t a_stride_bytes = g.x_stride * 2, pass = rows_per_pass(g.k_tiles);
    const int64_t panel_elems = g.panel_pairs * 2 * kPanel, panel_bytes = 2 * panel_elems;
    // The threads share out panels; with silu, gate panels, each with its up panel.
    const bool silu = g.silu_width > 0;
    const int64_t up_offset = g.silu_width / kPanel * panel_elems;  // a gate panel's up panel, elements on
    const int64_t panels = silu ? g.silu_width / kPanel : (g.out_features + kPanel - 1) / kPanel;
    // Fewer than 32 rows: a copy of the rows, zeros below them to 16 or 32 rows.
    const int64_t small_rows = g.rows < kBlockRows ? (g.rows <= kTileRows ? kTileRows : kBlockRows) : 0;
    const forkserve::UninitializedBuffer<Bf16> small(static_cast<size_t>(small_rows * width));
    const Bf16 *x = g.x;
    int64_t small_stride_bytes = a_stride_bytes;
    if (small_rows > 0) {
        for (int64_t m = 0; m < g.rows; m++) std::memcpy(small.data() + m * width, x + m * g.x_stride, 2 * static_cast<size_t>(width));
        std::memset(static_cast<void *>(small.data() + g.rows * width), 0, 2 * static_cast<size_t>((small_rows - g.rows) * width));
        x = small.data();
        small_stride_bytes = width * 2;
    }
    // Each pass's rows as blocks of 32 (the last one shorter; fewer than 32 rows: one block).
    RowPasses passes(g.rows, pass, panels, num_threads, [](int64_t r0, int64_t r1, std::vector<RowTile> &blocks) {
        for (int64_t r = r0; r < r1; r += kBlockRows) blocks.push_back({r, r1 - r < kBlockRows ? r1 - r : kBlockRows});
    });
#pragma omp parallel num_threads(num_threads)
    {
        load_tile_config();
        // Two blocks' sums: one being multiplied, the other going out meanwhile (Epilogue).
        alignas(64) float c[2][kBlockRows * kPanel], c_up[2][kBlockRows * kPanel];
        int slot = 0;
        Epilogue pending;
        passes.run(omp_get_thread_num(), [&](int64_t p, const RowTile *blocks, int64_t count) {
            const uint16_t *panel = g.packed + p * panel_elems;
            // One block of `height` (16 or 32) rows from `a` on: the panel's product (and with
            // silu its up panel's), whose rows [row0, row0 + n), from its row `first`, then
            // wait to go out during the next block (the last block's: after the loop).
            auto run = [&](int64_t height, const Bf16 *a, int64_t stride_bytes, int64_t row0, int64_t n, int64_t first,
                           Prefetch ahead, Prefetch ahead_up) {
                const auto multiply = height == kTileRows ? block<false> : block<true>;
                multiply(a, stride_bytes, panel, g.k_tiles, c[slot], ahead, pending);
                if (silu) multiply(a, stride_bytes, panel + up_offset, g.k_tiles, c_up[slot], ahead_up, pending);
                pending.finish();
                const int64_t steps = (silu ? 2 : 1) * g.k_tiles;
                pending = Epilogue{&g, PanelEpilogue(g.bias, g.out_features, p * kPanel), c[slot],
                                   silu ? c_up[slot] : nullptr, row0, n, first, p, 0, (n + steps - 1) / steps};
                slot ^= 1;
            };
            if (g.rows < kBlockRows) {  // one block of the padded copy: one row of tiles, or two
                run(g.rows <= kTileRows ? kTileRows : kBlockRows, x, small_stride_bytes, 0, g.rows, 0, {}, {});
                return;
            }
            // The next panel (this thread's likely next one), in shares, one per block.
            const char *next = p + 1 < panels ? reinterpret_cast<const char *>(panel + panel_elems) : nullptr;
            const int64_t share =
                count > 1 ? static_cast<int64_t>(cache_lines(static_cast<size_t>((panel_bytes + count - 1) / count))) : 0;
            for (int64_t i = 0; i < count; i++) {
                // A short last block ends at the last row, overlapping the previous block: one
                // row of tiles for up to 16 rows, else two.
                const int64_t r = blocks[i].start, n = blocks[i].n;
                const int64_t height = n <= kTileRows ? kTileRows : kBlockRows;
                const int64_t start = r + height <= g.rows ? r : g.rows - height;
                Prefetch ahead, ahead_up;
                if (next != nullptr && share > 0 && i * share < panel_bytes) {
                    const int64_t bytes = panel_bytes - i * share < share ? panel_bytes - i * share : share;
                    ahead = {next + i * share, bytes};
                    ahead_up = {next + 2 * up_offset + i * share, bytes};
                }
                run(height, x + start * g.x_stride, a_stride_bytes, r, n, r - start, ahead, ahead_up);
            }
        });
        pending.finish();
        TILE_RELEASE();
    }
}

// The entries' shared part: x padded with zeros to whole tiles where in_features needs it.
void padded_gemm(AmxGemm g, int64_t in_features, int num_threads) {
    forkserve::AlignedVector<Bf16> padded;
    if (in_features % kTileK != 0) {  // rows padded with zeros to whole tiles
        const int64_t width = g.k_tiles * kTileK;
        padded.assign(static_cast<size_t>(g.rows * width), Bf16{0});
#pragma omp parallel for num_threads(num_threads)
        for (int64_t m = 0; m < g.rows; m++)
            std::memcpy(&padded[m * width], g.x + m * g.x_stride, 2 * static_cast<size_t>(in_features));
        g.x = padded.data();
        g.x_stride = width;
    }
    if (g.rows > 0) amx_gemm(g, num_threads);
}

#endif

}  // namespace

extern "C" {

// 1 when this build has the AMX kernel and the operating system lets this process use the
// tiles (asked once), else 0. Emulated tiles (amx.h) need no permission.
int linear_amx_available() {
#if defined(FORKSERVE_AMX_HARDWARE)
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    static const int granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0 ? 1 : 0;
    return granted;
#elif defined(FORKSERVE_AMX_KERNELS)
    return 1;
#else
    return 0;
#endif
}

// As linear_bf16 (same packed weight), on AMX tiles. Returns 0, or 1 when unavailable.
int linear_amx(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride, const uint16_t *packed,
               int64_t out_features, const forkserve::Bf16 *bias, forkserve::Bf16 *out, int64_t out_stride,
               int num_threads) {
#if defined(FORKSERVE_AMX_KERNELS)
    if (!linear_amx_available()) return 1;
    const int64_t k_tiles = (in_features + kTileK - 1) / kTileK, panel_pairs = k_tiles * kTileK / 2;
    padded_gemm({x, x_stride, rows, k_tiles, packed, panel_pairs, out_features, bias, out, out_stride, 0}, in_features,
                num_threads);
    return 0;
#else
    (void)x, (void)rows, (void)in_features, (void)x_stride, (void)packed, (void)out_features, (void)bias, (void)out,
        (void)out_stride, (void)num_threads;
    return 1;
#endif
}

// The MLP's middle straight from the tiles: out[rows, width] = silu(gate) * up, where the
// packed weight is the fused gate-up projection (2 * width outputs: gate, then up) and
// gate, up its product with x. The same bits as linear_amx then silu_and_mul_bf16, without
// the gate-up rows in memory and the second pass over them: each thread multiplies a gate
// panel and its up panel (width / 32 panels on) for the same rows and applies silu_mul16
// (simd.h) to the two blocks of sums while they are in L1, and the vector units' work for
// the activation overlaps the tiles' for the next block. Returns 0, or 1 when unavailable
// or width is not a multiple of 32 (then the caller runs the two).
int linear_amx_silu_mul(const forkserve::Bf16 *x, int64_t rows, int64_t in_features, int64_t x_stride,
                        const uint16_t *packed, int64_t width, forkserve::Bf16 *out, int64_t out_stride,
                        int num_threads) {
#if defined(FORKSERVE_AMX_KERNELS)
    if (!linear_amx_available() || in_features <= 0 || width <= 0 || width % kPanel != 0) return 1;
    const int64_t k_tiles = (in_features + kTileK - 1) / kTileK, panel_pairs = k_tiles * kTileK / 2;
    padded_gemm({x, x_stride, rows, k_tiles, packed, panel_pairs, 2 * width, nullptr, out, out_stride, width},
                in_features, num_threads);
    return 0;
#else
    (void)x, (void)rows, (void)in_features, (void)x_stride, (void)packed, (void)width, (void)out, (void)out_stride,
        (void)num_threads;
    return 1;
#endif
}

}  // extern "C"
