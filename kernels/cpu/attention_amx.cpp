// Extend attention in bfloat16 on AMX tiles, for requests with many query tokens in a step
// (prefill chunks, long new turns): FlashAttention's scheme with both products on tiles.
//
// Why: a 2,000-token prompt's causal attention is ~140 GFLOP on the default model, more than
// the vdpbf16ps path (attention_rows.cpp, a few hundred GFLOP/s on 2 cores) should spend a
// second on; each tdpbf16ps does 8,192 multiply-adds.
//
// Per (request, KV head), the request's visible keys and values are first read once from
// the pool through its slot table into tile layouts (phase 1), 32 keys at a time:
//   keys   [16-key block][32-dim tile][16 dim pairs][16 keys] int32 pairs (a B tile of q.k)
//   values [32-key block][16-dim tile][16 key pairs][16 dims][2]          (a B tile of p.v)
// A whole block of 32 keys at the same pool slots in several requests of the step (forks of
// one prompt prefilling their next turns together) is packed once for all of them.
// Then each task is 16 consecutive query tokens of one query head (phase 2), its queries
// in tiles 4-5 (64 dims), its output accumulators in tiles 0-3 (16 tokens x 64 dims, float32)
// for the whole pass over the keys, 32 keys at a time:
//   scores: tile 6 = q k^T for 16 keys (tile 7 holds the keys), twice, stored to memory;
//   softmax in AVX-512 on the 16 x 32 scores (online_softmax.h: scaled, in base 2 as in
//     attention_rows.cpp, masked past each token's last key (blocks that every row sees
//     whole skip the masks), a reference that moves only when a score passes it
//     by kSlack), so the accumulators are rarely rescaled (then: stored, scaled, reloaded);
//     probabilities rounded to bfloat16 into one tile (6);
//   values: tiles 0-3 += p (tile 6) x values (tile 7, 16 dims at a time);
//   the next block's scores are issued before this block's softmax, so the tiles and the
//   vector units work at once (two score buffers).
// The same pass (attend_packed) takes the shared keys of a group of decode tokens (forks of
// one prompt; attend_shared_amx): its rows are the tokens' query heads of one KV head, each
// block packed just before its products, and it leaves unnormalised softmaxes to merge.
// Sums, maxima and the normaliser are float32, as in attention_rows.cpp, whose results these
// equal up to float32 summation order and its exp's last bits. Head size 64 only (the accumulators need DIM / 16 tiles).
//
// Called from paged_attention.cpp for requests with at least amx_min_tokens query tokens,
// and for grouped decode tokens' shared keys.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "aligned.h"
#include "amx.h"
#include "bf16.h"
#include "entries.h"
#include "online_softmax.h"
#include "paged_batch.h"
#include "simd.h"

#if defined(FORKSERVE_AMX_KERNELS)
#include <omp.h>
#endif

namespace {

using namespace forkserve;

#if defined(FORKSERVE_AMX_KERNELS)

constexpr int64_t kDim = 64;
constexpr int64_t kQueryRows = 16;
constexpr int64_t kKeys = 32;  // keys per step of the pass
constexpr int64_t kKeyTile = 16 * kDim / 2;  // int32 words (bf16 pairs) of one 16-key block's keys
constexpr int64_t kValueTile = kKeys * kDim;  // bf16 of one 32-key block's values

struct Extend {
    const Bf16 *q;
    Bf16 *out;
    int64_t num_heads, kv_heads;
    float scale;
};

// One request's part of the step: its query tokens start at q_start in the batch, the first
// sees prefix + 1 keys; the packed tiles of its KV head h's 32-key block b are at
// key_blocks / value_blocks[h * blocks32 + b] (its own, or an earlier request's where both
// have the same 32 slots there).
struct Request {
    int64_t q_start, tokens, prefix, blocks32;  // blocks32: 32-key blocks of its last token's keys
    const int32_t *const *key_blocks;
    const Bf16 *const *value_blocks;
};

// Phase 1: keys [k0, k0 + 32) of one request and KV head, from the pool into tile layouts.
void pack_block(const Bf16 *kh, const Bf16 *vh, const int64_t *slots, int64_t keys, int64_t k0, int32_t *key_tiles,
                Bf16 *value_tiles) {
    alignas(64) static const Bf16 zero_row[kDim] = {};
    auto row = [&](const Bf16 *base, int64_t c) { return k0 + c < keys ? base + slots[k0 + c] * kDim : zero_row; };
    // The next block's rows, which the slots scatter beyond the hardware prefetcher's guess.
    for (int64_t c = kKeys; c < 2 * kKeys && k0 + c < keys; c++) {
        prefetch_row(kh + slots[k0 + c] * kDim, kDim);
        prefetch_row(vh + slots[k0 + c] * kDim, kDim);
    }
    for (int64_t half = 0; half < 2; half++)
        for (int64_t dt = 0; dt < kDim / 32; dt++) {
            __m512i tile[16];
            for (int c = 0; c < 16; c++) tile[c] = _mm512_loadu_si512(row(kh, half * 16 + c) + dt * 32);
            transpose16(tile);  // row i: dim pair i of the 16 keys
            int32_t *dst = key_tiles + (half * (kDim / 32) + dt) * 256;
            for (int i = 0; i < 16; i++) _mm512_store_si512(dst + 16 * i, tile[i]);
        }
    const __m512i pair_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                             37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i pair_hi = _mm512_add_epi16(pair_lo, _mm512_set1_epi16(16));
    for (int64_t kp = 0; kp < kKeys / 2; kp++) {
        const Bf16 *r0 = row(vh, 2 * kp), *r1 = row(vh, 2 * kp + 1);
        for (int64_t d0 = 0; d0 < kDim; d0 += 32) {
            const __m512i a = _mm512_loadu_si512(r0 + d0), c = _mm512_loadu_si512(r1 + d0);
            _mm512_store_si512(value_tiles + ((d0 / 16) * 16 + kp) * 32, _mm512_permutex2var_epi16(a, pair_lo, c));
            _mm512_store_si512(value_tiles + ((d0 / 16 + 1) * 16 + kp) * 32, _mm512_permutex2var_epi16(a, pair_hi, c));
        }
    }
}

// One block of up to 16 query rows against a request's packed keys and values: the
// unnormalised softmax of each row, as FlashAttention leaves it before the last division.
struct TileRows {
    alignas(64) float acc[kQueryRows][kDim];  // sums of p x value
    float best[kQueryRows];                   // each row's reference, in log2 units (online_softmax.h)
    float total[kQueryRows];                  // sums of p
    bool broken[kQueryRows];                  // a NaN among the row's visible scores
};

// Rows m = 0-15 of queries (64 bf16 each, q_stride_bytes apart; rows past the first `rows`
// zeros, and left out of the softmax) against `keys` keys and values, row m seeing the first
// seen[m] of them (seen[0] the fewest). blocks(k0) gives the packed tiles of keys [k0, k0 +
// 32): {key tiles, value tiles}, called for k0 = 0, 32, ... in order, each call before the
// values of the block before it are read. Tiles 4-5 hold the queries, 0-3 the sums, 6-7 the
// products' other operands (see the file's comment).
template <typename Blocks>
void attend_packed(const Bf16 *q, int64_t q_stride_bytes, const float *seen, int64_t keys, int64_t rows,
                   Blocks &&blocks, float scale, TileRows &out) {
    TILE_LOADD(4, q, q_stride_bytes);
    TILE_LOADD(5, q + 32, q_stride_bytes);
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);

    // Scores of two blocks: the next block's are computed on the tiles while the vector units
    // take this block's softmax (the two only share the score buffer they do not touch).
    alignas(64) float s[2][kQueryRows][kKeys], total[kQueryRows][16];
    alignas(64) Bf16 p[kQueryRows][kKeys];
    const float scale2 = scale * kLog2e;
    for (int64_t m = 0; m < kQueryRows; m++) {
        out.best[m] = -1e30f;
        out.broken[m] = false;
        out.total[m] = 0.f;
        _mm512_store_ps(total[m], _mm512_setzero_ps());
    }
    if (rows < kQueryRows) std::memset(p[rows], 0, sizeof(p[0]) * (kQueryRows - rows));  // padding rows add nothing
    auto score = [&](const int32_t *kt, float (*dst)[kKeys]) {  // keys 0-15, then 16-31, of a block
        TILE_ZERO(6);
        TILE_LOADD(7, kt, 64);
        TILE_DPBF16PS(6, 4, 7);
        TILE_LOADD(7, kt + 256, 64);
        TILE_DPBF16PS(6, 5, 7);
        TILE_STORED(6, &dst[0][0], kKeys * 4);
        TILE_ZERO(6);
        TILE_LOADD(7, kt + kKeyTile, 64);
        TILE_DPBF16PS(6, 4, 7);
        TILE_LOADD(7, kt + kKeyTile + 256, 64);
        TILE_DPBF16PS(6, 5, 7);
        TILE_STORED(6, &dst[0][16], kKeys * 4);
    };
    auto [first_keys, vt] = blocks(0);
    score(first_keys, s[0]);
    for (int64_t k0 = 0, cur = 0; k0 < keys; k0 += kKeys, cur ^= 1) {
        const Bf16 *next_values = nullptr;
        if (k0 + kKeys < keys) {
            const auto [next_keys, values] = blocks(k0 + kKeys);
            score(next_keys, s[cur ^ 1]);
            next_values = values;
        }
        bool rescale = false;
        float corr[kQueryRows];
        // Every row sees the whole block (row 0 sees the fewest keys): no masks.
        const bool full = seen[0] - static_cast<float>(k0) >= kKeys;
        for (int64_t m = 0; m < rows; m++) {
            const __m512 raw_lo = _mm512_load_ps(&s[cur][m][0]), raw_hi = _mm512_load_ps(&s[cur][m][16]);
            const float visible = seen[m] - static_cast<float>(k0);
            const SoftmaxStep step =
                full ? online_softmax32<true>(raw_lo, raw_hi, visible, scale2, out.best[m], out.broken[m])
                     : online_softmax32<false>(raw_lo, raw_hi, visible, scale2, out.best[m], out.broken[m]);
            corr[m] = step.corr;
            rescale |= step.moved;
            _mm512_store_ps(total[m], _mm512_fmadd_ps(_mm512_load_ps(total[m]), _mm512_set1_ps(step.corr),
                                                      _mm512_add_ps(step.p_lo, step.p_hi)));
            _mm512_store_si512(p[m], (__m512i)_mm512_cvtne2ps_pbh(step.p_hi, step.p_lo));
        }
        if (rescale && k0 > 0) {  // before the first block the accumulators are zero
            TILE_STORED(0, &out.acc[0][0], kDim * 4);
            TILE_STORED(1, &out.acc[0][16], kDim * 4);
            TILE_STORED(2, &out.acc[0][32], kDim * 4);
            TILE_STORED(3, &out.acc[0][48], kDim * 4);
            for (int64_t m = 0; m < rows; m++)
                for (int64_t v = 0; v < kDim; v += 16)
                    _mm512_store_ps(&out.acc[m][v], _mm512_mul_ps(_mm512_load_ps(&out.acc[m][v]), _mm512_set1_ps(corr[m])));
            TILE_LOADD(0, &out.acc[0][0], kDim * 4);
            TILE_LOADD(1, &out.acc[0][16], kDim * 4);
            TILE_LOADD(2, &out.acc[0][32], kDim * 4);
            TILE_LOADD(3, &out.acc[0][48], kDim * 4);
        }
        TILE_LOADD(6, &p[0][0], kKeys * 2);
        TILE_LOADD(7, vt, 64);
        TILE_DPBF16PS(0, 6, 7);
        TILE_LOADD(7, vt + 512, 64);
        TILE_DPBF16PS(1, 6, 7);
        TILE_LOADD(7, vt + 1024, 64);
        TILE_DPBF16PS(2, 6, 7);
        TILE_LOADD(7, vt + 1536, 64);
        TILE_DPBF16PS(3, 6, 7);
        vt = next_values;
    }
    TILE_STORED(0, &out.acc[0][0], kDim * 4);
    TILE_STORED(1, &out.acc[0][16], kDim * 4);
    TILE_STORED(2, &out.acc[0][32], kDim * 4);
    TILE_STORED(3, &out.acc[0][48], kDim * 4);
    for (int64_t m = 0; m < rows; m++) out.total[m] = _mm512_reduce_add_ps(_mm512_load_ps(total[m]));
}

// Phase 2: query tokens [t0, t0 + count) (count <= 16) of one request, query head `head`.
void attend_tile(const Extend &e, const Request &r, int64_t t0, int64_t count, int64_t head) {
    const int64_t group = e.num_heads / e.kv_heads, h = head / group;
    const int64_t q_stride = e.num_heads * kDim;
    alignas(64) Bf16 qbuf[kQueryRows][kDim];
    const Bf16 *q = e.q + (r.q_start + t0) * q_stride + head * kDim;
    int64_t q_stride_bytes = q_stride * 2;
    if (count < kQueryRows) {  // padding rows are zeros
        std::memset(qbuf, 0, sizeof qbuf);
        for (int64_t m = 0; m < count; m++) std::memcpy(qbuf[m], q + m * q_stride, sizeof qbuf[m]);
        q = &qbuf[0][0];
        q_stride_bytes = kDim * 2;
    }
    float seen[kQueryRows];  // keys row m sees (padding rows: as the last real row)
    for (int64_t m = 0; m < kQueryRows; m++) seen[m] = static_cast<float>(r.prefix + t0 + (m < count ? m : count - 1) + 1);
    const int32_t *const *key_blocks = r.key_blocks + h * r.blocks32;
    const Bf16 *const *value_blocks = r.value_blocks + h * r.blocks32;
    TileRows rows;
    attend_packed(q, q_stride_bytes, seen, r.prefix + t0 + count, count, [&](int64_t k0) {
        return std::make_pair(key_blocks[k0 / kKeys], value_blocks[k0 / kKeys]);
    }, e.scale, rows);
    for (int64_t m = 0; m < count; m++) {
        const __m512 inv = _mm512_set1_ps(rows.broken[m] ? std::numeric_limits<float>::quiet_NaN() : 1.f / rows.total[m]);
        Bf16 *dst = e.out + (r.q_start + t0 + m) * q_stride + head * kDim;
        for (int64_t v = 0; v < kDim; v += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + v),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(&rows.acc[m][v]), inv)));
    }
}

#endif

}  // namespace

namespace forkserve {

namespace {
// Set by paged_attention_set_shared_on_tiles (tests turn it off to check the vector path).
std::atomic<bool> shared_on_tiles{true};
// Blocks the last extend_attention_amx_bf16 call read from another request's tiles (tests:
// paged_attention_last_shared_extend_blocks).
std::atomic<int64_t> last_shared_extend_blocks{0};
}  // namespace

bool attend_shared_amx(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache,
                       const SharedRows &shared, int64_t chunk, int64_t h, const PartialRows &partial) {
#if defined(FORKSERVE_AMX_KERNELS)
    if (bt.dim != kDim || !shared_on_tiles.load(std::memory_order_relaxed) || !linear_amx_available()) return false;
    const RowsJob<Bf16> job = RowsJob<Bf16>::shared_keys(shared, chunk, h, partial);
    const int64_t keys = job.keys, group = bt.num_heads / bt.kv_heads;
    const Bf16 *kh = k_cache + h * bt.num_slots * kDim, *vh = v_cache + h * bt.num_slots * kDim;
    // Each block of 32 keys is packed just before its products, into buffers that stay in L1
    // (two: attend_packed scores a block before it takes the values of the one before);
    // pack_block has asked for the next block's rows by then, so memory serves them meanwhile.
    alignas(64) int32_t key_tiles[2][2 * kKeyTile];
    alignas(64) Bf16 value_tiles[2][kValueTile];
    auto blocks = [&](int64_t k0) {
        const int64_t b = (k0 / kKeys) % 2;
        pack_block(kh, vh, job.slots, keys, k0, key_tiles[b], value_tiles[b]);
        return std::make_pair(static_cast<const int32_t *>(key_tiles[b]), static_cast<const Bf16 *>(value_tiles[b]));
    };
    // Rows: (token i, query head g of KV head h) at m = i * group + g, 16 at a time; every
    // row sees every key of the chunk.
    const int64_t rows = static_cast<int64_t>(shared.tokens.size()) * group;
    float seen[kQueryRows];
    for (float &x : seen) x = static_cast<float>(keys);
    load_tile_config();
    for (int64_t m0 = 0; m0 < rows; m0 += kQueryRows) {
        const int64_t count = rows - m0 < kQueryRows ? rows - m0 : kQueryRows;
        alignas(64) Bf16 qbuf[kQueryRows][kDim] = {};
        for (int64_t m = 0; m < count; m++) {
            const int64_t i = (m0 + m) / group, head = h * group + (m0 + m) % group;
            std::memcpy(qbuf[m], q + (shared.tokens[i] * bt.num_heads + head) * kDim, sizeof qbuf[m]);
        }
        TileRows out;
        attend_packed(&qbuf[0][0], kDim * 2, seen, keys, count, blocks, bt.scale, out);
        for (int64_t m = 0; m < count; m++)  // the reference in nats of scaled scores, as merge_parts reads it
            job.leave_partial(bt, m0 + m, group, out.acc[m], out.best[m] / kLog2e, out.total[m], out.broken[m]);
    }
    TILE_RELEASE();
    return true;
#else
    (void)bt, (void)q, (void)k_cache, (void)v_cache, (void)shared, (void)chunk, (void)h, (void)partial;
    return false;
#endif
}

}  // namespace forkserve

extern "C" {

// How many of its requests' 32-key blocks (each standing for all KV heads) the last AMX
// extend call took from an earlier request of its step instead of packing them (tests).
int64_t paged_attention_last_shared_extend_blocks() { return forkserve::last_shared_extend_blocks.load(); }

// Whether decode tokens' shared keys are attended on AMX tiles where the tiles are there (1,
// the default) or on vectors (0); returns the previous setting.
int64_t paged_attention_set_shared_on_tiles(int64_t on) {
    return forkserve::shared_on_tiles.exchange(on != 0) ? 1 : 0;
}

// Attention of every query token of requests reqs[0 .. num_reqs) of a step (the batch as in
// paged_attention_bf16, plus each request's query token count `tokens[b]`), on AMX tiles.
// Returns 0; 1 when this build or process has no AMX, or the head size is not 64.
int extend_attention_amx_bf16(const forkserve::Bf16 *q, const forkserve::Bf16 *k_cache, const forkserve::Bf16 *v_cache,
                              int64_t num_slots, const int64_t *req_to_token, int64_t r2t_stride, const int64_t *rows,
                              const int64_t *prefix, const int64_t *q_start, const int64_t *tokens,
                              const int64_t *reqs, int64_t num_reqs, int64_t num_heads, int64_t kv_heads, int64_t dim,
                              float scale, forkserve::Bf16 *out, int num_threads) {
#if defined(FORKSERVE_AMX_KERNELS)
    if (dim != kDim || !linear_amx_available()) return 1;
    std::vector<Request> requests(static_cast<size_t>(num_reqs));
    // Per request, where its blocks start in the (block, KV head) tables below.
    std::vector<int64_t> first_block(static_cast<size_t>(num_reqs) + 1, 0);
    for (int64_t i = 0; i < num_reqs; i++) {
        const int64_t b = reqs[i], blocks = (prefix[b] + tokens[b] + kKeys - 1) / kKeys;
        requests[i] = {q_start[b], tokens[b], prefix[b], blocks, nullptr, nullptr};
        first_block[i + 1] = first_block[i] + blocks;
    }
    // Blocks packed once for several requests: where two requests of the step have the same
    // 32 slots for a whole block (forks of one prompt, calls of one conversation: their
    // shared prefix), the later one reads the earlier one's tiles. Requests sharing a first
    // block have the same first slot, so only those are compared, block by block from the
    // first until their slots differ. owner[t]: the block whose tiles block t reads (itself
    // when packed here).
    const int64_t total_blocks = first_block[num_reqs];
    std::vector<int64_t> owner(static_cast<size_t>(total_blocks));
    for (int64_t t = 0; t < total_blocks; t++) owner[t] = t;
    auto slots_of = [&](int64_t i) { return req_to_token + rows[reqs[i]] * r2t_stride; };
    auto full_blocks = [&](int64_t i) { return (requests[i].prefix + requests[i].tokens) / kKeys; };
    std::vector<std::pair<int64_t, int64_t>> by_first_slot;  // (first slot, request), whole first block
    for (int64_t i = 0; i < num_reqs; i++)
        if (full_blocks(i) > 0) by_first_slot.emplace_back(slots_of(i)[0], i);
    std::sort(by_first_slot.begin(), by_first_slot.end());
    for (size_t lo = 0, hi; lo < by_first_slot.size(); lo = hi) {
        for (hi = lo + 1; hi < by_first_slot.size() && by_first_slot[hi].first == by_first_slot[lo].first; hi++) {
        }
        for (size_t a = lo + 1; a < hi; a++)  // each member against the earlier ones of its group
            for (size_t m = lo; m < a; m++) {
                const int64_t i = by_first_slot[a].second, j = by_first_slot[m].second;
                const int64_t whole = std::min(full_blocks(i), full_blocks(j));
                for (int64_t blk = 0; blk < whole; blk++) {
                    if (std::memcmp(slots_of(i) + blk * kKeys, slots_of(j) + blk * kKeys, kKeys * sizeof(int64_t)) != 0)
                        break;
                    int64_t &mine = owner[first_block[i] + blk];
                    if (mine == first_block[i] + blk) mine = owner[first_block[j] + blk];
                }
            }
    }
    // The blocks packed here, numbered in order (pack_index[t] for owner[t] == t), and their
    // tile buffers on cache lines; pack_block writes every word of them (zero rows past a
    // request's last key), so they are not zeroed first.
    std::vector<int64_t> pack_index(static_cast<size_t>(total_blocks), -1);
    int64_t num_packed = 0;
    for (int64_t t = 0; t < total_blocks; t++)
        if (owner[t] == t) pack_index[t] = num_packed++;
    forkserve::last_shared_extend_blocks.store(total_blocks - num_packed, std::memory_order_relaxed);
    const forkserve::UninitializedBuffer<int32_t> key_buf(static_cast<size_t>(num_packed * kv_heads * 2 * kKeyTile));
    const forkserve::UninitializedBuffer<Bf16> value_buf(static_cast<size_t>(num_packed * kv_heads * kValueTile));
    auto key_tiles = [&](int64_t n, int64_t h) { return key_buf.data() + (n * kv_heads + h) * 2 * kKeyTile; };
    auto value_tiles = [&](int64_t n, int64_t h) { return value_buf.data() + (n * kv_heads + h) * kValueTile; };
    // Each request's tile pointers, by KV head then block (Request::key_blocks).
    std::vector<const int32_t *> key_blocks(static_cast<size_t>(total_blocks * kv_heads));
    std::vector<const Bf16 *> value_blocks(key_blocks.size());
    struct PackTask {
        int64_t req, block, n;  // the request's block, packed n-th
    };
    struct QueryTask {
        int64_t req, t0, count, head, keys;
    };
    std::vector<PackTask> packs;
    std::vector<QueryTask> queries;
    for (int64_t i = 0; i < num_reqs; i++) {
        Request &r = requests[i];
        r.key_blocks = key_blocks.data() + first_block[i] * kv_heads;
        r.value_blocks = value_blocks.data() + first_block[i] * kv_heads;
        for (int64_t blk = 0; blk < r.blocks32; blk++) {
            const int64_t t = first_block[i] + blk, n = pack_index[owner[t]];
            if (owner[t] == t) packs.push_back({i, blk, n});
            for (int64_t h = 0; h < kv_heads; h++) {
                key_blocks[first_block[i] * kv_heads + h * r.blocks32 + blk] = key_tiles(n, h);
                value_blocks[first_block[i] * kv_heads + h * r.blocks32 + blk] = value_tiles(n, h);
            }
        }
        for (int64_t t0 = 0; t0 < r.tokens; t0 += kQueryRows)
            for (int64_t head = 0; head < num_heads; head++) {
                const int64_t count = r.tokens - t0 < kQueryRows ? r.tokens - t0 : kQueryRows;
                queries.push_back({i, t0, count, head, r.prefix + t0 + count});
            }
    }
    // The longest tasks first, so that the last ones to finish are short.
    std::stable_sort(queries.begin(), queries.end(), [](const QueryTask &a, const QueryTask &b) { return a.keys > b.keys; });
    const Extend e{q, out, num_heads, kv_heads, scale};
    const int64_t num_packs = static_cast<int64_t>(packs.size()) * kv_heads;
    const int64_t num_queries = static_cast<int64_t>(queries.size());
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < num_packs; i++) {  // (KV head, pack task), a head's blocks in order
            const int64_t h = i / static_cast<int64_t>(packs.size());
            const PackTask &t = packs[i % static_cast<int64_t>(packs.size())];
            const Request &r = requests[t.req];
            pack_block(k_cache + h * num_slots * kDim, v_cache + h * num_slots * kDim, slots_of(t.req),
                       r.prefix + r.tokens, t.block * kKeys, key_tiles(t.n, h), value_tiles(t.n, h));
        }
        load_tile_config();
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < num_queries; i++) {
            const QueryTask &t = queries[i];
            attend_tile(e, requests[t.req], t.t0, t.count, t.head);
        }
        TILE_RELEASE();
    }
    return 0;
#else
    (void)q, (void)k_cache, (void)v_cache, (void)num_slots, (void)req_to_token, (void)r2t_stride, (void)rows,
        (void)prefix, (void)q_start, (void)tokens, (void)reqs, (void)num_reqs, (void)num_heads, (void)kv_heads,
        (void)dim, (void)scale, (void)out, (void)num_threads;
    return 1;
#endif
}

}  // extern "C"
