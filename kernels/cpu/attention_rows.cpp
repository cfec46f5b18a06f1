// Extend attention in bfloat16 on AVX512-BF16 vectors, for requests with several query
// tokens in a step (prompt chunks, new turns, forced grammar text) wherever the AMX kernel
// (attention_amx.cpp) does not take them: FlashAttention's online softmax, both products
// as vdpbf16ps, and no transposes inside the loop over keys.
//
// One task is a block of a request's consecutive query tokens against one KV head. Its rows
// are (token, query head of the group) pairs, up to 16 * RV of them, held as RV vectors of
// 16 rows for the scores:
//   scores, lanes = rows: the queries are transposed once per task into (dim pair, row)
//     words; a key's 16 scores are then the sum over dim pairs of a query-pair vector times
//     that key's pair, broadcast straight from its pool row. The softmax's running maximum,
//     denominator and causal mask are per lane, with no horizontal reductions.
//   values, lanes = dims: each row's probabilities are rounded to bfloat16 pairs of keys and
//     broadcast against value rows interleaved by key pair, which is done once per block of
//     32 keys for all of the task's rows.
// Why: the kernel this replaced (12 rows per task, each task transposing every key block
// itself) ran at ~40% of the vdpbf16ps peak on AMD Zen 4 and spent as many instructions on
// transposes and shuffles as on multiply-adds. Sums, maxima and the normaliser stay float32;
// the probabilities are rounded to bfloat16 as FlashAttention does on GPUs.
//
// The widened variant (WIDE, set by paged_attention_set_widened) does the same with float32
// FMAs: queries by dim, each block's keys and values widened to float32 once for all rows,
// and float32 probabilities, one key per FMA instead of a pair per vdpbf16ps. It wins where
// a CPU retires two 512-bit FMAs per cycle but a vdpbf16ps every other one (an Intel Xeon
// without AMX: 1.5-1.6x faster for head size 64 from a few hundred keys, ~235 against ~150
// GFLOP/s on 2 cores); it should lose on AMD Zen 4, whose 512-bit FMAs run at half width.
//
// The same tasks attend the shared first keys of a group of decode tokens (forks of one
// prompt, attend_shared): the rows are then the group's tokens' heads, every row sees every
// key, and each row's sums, total and maximum are left unnormalised for paged_attention.cpp
// to merge with the token's own keys.
//
// Called per task from paged_attention.cpp, which builds the tasks (paged_batch.h).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "online_softmax.h"
#include "paged_batch.h"
#include "simd.h"

namespace forkserve {

namespace {
// Set by paged_attention_set_widened (at start-up, or by tests), read by every task.
std::atomic<bool> widened_rows{false};
}  // namespace

#if defined(FORKSERVE_AVX512_BF16)

namespace {

constexpr int64_t kKeys = 32;  // keys per block
constexpr int kSubKeys = 8;    // keys scored together: kSubKeys * RV accumulators in registers

// Row vectors per task: 3 (48 rows) for head size 64, 2 for 128, so that a task's queries,
// scores, sums and interleaved values stay near L1's 32 KiB (the widened variant's float32
// copies take ~53 KiB at head size 64 and ~80 KiB at 128: L1 and L2).
template <int64_t DIM>
constexpr int kMaxRowVecs = DIM == 64 ? 3 : 2;

template <int64_t DIM, int RV, bool WIDE>
void attend_rows_impl(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache,
                      const RowsJob<Bf16> &job) {
    constexpr int64_t kPairs = DIM / 2, kVecs = DIM / 16;
    constexpr int kRows = 16 * RV;
    constexpr int kChunk = 24 / kVecs;       // rows whose sums stay in registers in the value pass
    constexpr int kRowRoom = kRows + 16;  // the last chunk may run past the real rows; rows stay 64-byte aligned
    static const Bf16 zero_row[DIM] = {};
    const int64_t group = bt.num_heads / bt.kv_heads, rows = job.count * group;
    const int64_t first = job.first, keys = job.keys;
    const int64_t *slots = job.slots;
    const Bf16 *kh = k_cache + job.h * bt.num_slots * DIM, *vh = v_cache + job.h * bt.num_slots * DIM;

    // Queries by dim pair (bf16 pairs), or WIDE by dim (float32 bits).
    alignas(64) int32_t qt[WIDE ? DIM : kPairs][kRows];
    // A block's scores by key; WIDE, then its float32 probabilities in place.
    alignas(64) float s[kKeys][WIDE ? kRowRoom : kRows];
    alignas(64) int32_t pp[WIDE ? 1 : kKeys / 2][kRowRoom];  // probabilities as bf16 pairs of keys, by row
    alignas(64) float kw[WIDE ? kKeys : 1][DIM];             // WIDE: a block's keys as float32
    alignas(64) __m512 vw[WIDE ? kKeys : 1][kVecs];          // WIDE: a block's values as float32
    alignas(64) float acc[kRowRoom][DIM];          // output sums
    alignas(64) float corr[kRowRoom];              // per row, the factor for its sums so far
    alignas(64) float visible[kRows];              // per row, how many keys it sees
    for (int m = 0; m < kRows; m++) {  // padding rows copy the last token's first head
        const bool real = m < rows;
        const int64_t token = real ? m / group : job.count - 1, head = job.h * group + (real ? m % group : 0);
        const auto *words = reinterpret_cast<const int32_t *>(q + (job.token(token) * bt.num_heads + head) * DIM);
        for (int64_t i = 0; i < kPairs; i++) {
            const int32_t w = real ? words[i] : 0;
            if constexpr (WIDE) {
                qt[2 * i][m] = static_cast<int32_t>(static_cast<uint32_t>(w) << 16);
                qt[2 * i + 1][m] = static_cast<int32_t>(static_cast<uint32_t>(w) & 0xFFFF0000u);
            } else {
                qt[i][m] = w;
            }
        }
        visible[m] = static_cast<float>(job.causal ? first + token + 1 : keys);
    }
    std::memset(acc, 0, sizeof(acc));
    std::memset(pp, 0, sizeof(pp));
    if constexpr (WIDE) std::memset(s, 0, sizeof(s));  // the value pass reads past the real rows
    for (int m = 0; m < kRowRoom; m++) corr[m] = 1.f;

    const __m512 scale = _mm512_set1_ps(bt.scale * kLog2e), slack = _mm512_set1_ps(kSlack * kLog2e);
    const __m512 floor = _mm512_set1_ps(-1e30f), one = _mm512_set1_ps(1.f);
    __m512 best[RV], total[RV], limit[RV];
    __mmask16 broken[RV];
    for (int r = 0; r < RV; r++) {
        best[r] = floor;
        total[r] = _mm512_setzero_ps();
        limit[r] = _mm512_load_ps(&visible[16 * r]);
        broken[r] = 0;
    }
    // (p of key 2j, p of key 2j + 1) per row, from cvtne2ps_pbh's [16 of 2j | 16 of 2j + 1].
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i pair_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                             37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i pair_hi = _mm512_add_epi16(pair_lo, _mm512_set1_epi16(16));
    constexpr int kNan = 0x81;  // fpclass: quiet or signalling NaN

    for (int64_t k0 = 0; k0 < keys; k0 += kKeys) {
        const int64_t count = keys - k0 < kKeys ? keys - k0 : kKeys;
        const bool diagonal = k0 + count > first + 1;  // some row sees only part of this block
        auto key_row = [&](const Bf16 *base, int64_t c) { return c < count ? base + slots[k0 + c] * DIM : zero_row; };
        for (int64_t c = k0 + kKeys; c < k0 + 2 * kKeys && c < keys; c++) {  // the next block's rows
            prefetch_row(kh + slots[c] * DIM, DIM);
            prefetch_row<2>(vh + slots[c] * DIM, DIM);
        }
        if constexpr (WIDE)  // the block's keys and values as float32, once for all rows
            for (int64_t c = 0; c < kKeys; c++) {
                const Bf16 *kr = key_row(kh, c), *vr = key_row(vh, c);
                for (int64_t v = 0; v < kVecs; v++) {
                    _mm512_store_ps(&kw[c][16 * v], load16(kr + 16 * v));
                    vw[c][v] = load16(vr + 16 * v);
                }
            }
        // Scores, kSubKeys keys at a time: per dim pair (vdpbf16ps) or per dim (WIDE, FMAs).
        for (int64_t c0 = 0; c0 < count; c0 += kSubKeys) {
            const int32_t *krow[kSubKeys];
            for (int c = 0; c < kSubKeys; c++) krow[c] = reinterpret_cast<const int32_t *>(key_row(kh, c0 + c));
            __m512 sc[kSubKeys][RV];
            for (int c = 0; c < kSubKeys; c++)
                for (int r = 0; r < RV; r++) sc[c][r] = _mm512_setzero_ps();
            for (int64_t i = 0; i < (WIDE ? DIM : kPairs); i++) {
                __m512 qv[RV];
                for (int r = 0; r < RV; r++) qv[r] = _mm512_castsi512_ps(_mm512_load_si512(&qt[i][16 * r]));
                for (int c = 0; c < kSubKeys; c++) {
                    if constexpr (WIDE) {
                        const __m512 kb = _mm512_set1_ps(kw[c0 + c][i]);
                        for (int r = 0; r < RV; r++) sc[c][r] = _mm512_fmadd_ps(qv[r], kb, sc[c][r]);
                    } else {
                        const __m512bh kb = (__m512bh)_mm512_set1_epi32(krow[c][i]);
                        for (int r = 0; r < RV; r++) sc[c][r] = _mm512_dpbf16_ps(sc[c][r], (__m512bh)qv[r], kb);
                    }
                }
            }
            for (int c = 0; c < kSubKeys; c++)
                for (int r = 0; r < RV; r++) _mm512_store_ps(&s[c0 + c][16 * r], sc[c][r]);
        }
        // Online softmax per row, in base 2: `best` is the reference for scale * log2(e) *
        // score, which moves only when a score passes it by kSlack nats (so the sums are rarely
        // rescaled); keys past a row's last get probability exactly 0. The probabilities go
        // straight into bf16 pairs of keys, or WIDE, as float32 over their scores.
        bool rescale = false;
        for (int r = 0; r < RV; r++) {
            auto sees = [&](int64_t c) {
                return _mm512_cmp_ps_mask(_mm512_set1_ps(static_cast<float>(k0 + c)), limit[r], _CMP_LT_OQ);
            };
            __m512 top = floor;  // unscaled: the scale is positive
            for (int64_t c = 0; c < count; c++) {
                const __m512 x = _mm512_load_ps(&s[c][16 * r]);
                const __mmask16 see = diagonal ? sees(c) : static_cast<__mmask16>(0xFFFF);
                broken[r] |= _mm512_mask_fpclass_ps_mask(see, x, kNan);
                top = _mm512_max_ps(_mm512_mask_mov_ps(floor, see, x), top);
            }
            top = _mm512_mul_ps(top, scale);
            const __mmask16 moved = _mm512_cmp_ps_mask(top, _mm512_add_ps(best[r], slack), _CMP_GT_OQ);
            __m512 factor = one;
            if (moved != 0) {
                const __m512 now = _mm512_mask_mov_ps(best[r], moved, top);
                factor = exp2_16(_mm512_sub_ps(best[r], now));
                total[r] = _mm512_mul_ps(total[r], factor);
                best[r] = now;
                rescale = true;
            }
            _mm512_store_ps(&corr[16 * r], factor);
            auto prob = [&](int64_t c) {
                if (c >= count) return _mm512_setzero_ps();
                const __m512 p = exp2_16(_mm512_fmsub_ps(_mm512_load_ps(&s[c][16 * r]), scale, best[r]));
                return diagonal ? _mm512_maskz_mov_ps(sees(c), p) : p;
            };
            for (int64_t j = 0; j < (count + 1) / 2; j++) {
                const __m512 p0 = prob(2 * j), p1 = prob(2 * j + 1);
                total[r] = _mm512_add_ps(total[r], _mm512_add_ps(p0, p1));
                if constexpr (WIDE) {
                    _mm512_store_ps(&s[2 * j][16 * r], p0);
                    _mm512_store_ps(&s[2 * j + 1][16 * r], p1);
                } else {
                    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
                    _mm512_store_si512(&pp[j][16 * r], _mm512_permutexvar_epi16(interleave, both));
                }
            }
        }
        // Values interleaved by key pair (unless WIDE), once for all rows; then sums = sums *
        // corr + p x v, by pairs of keys (vdpbf16ps) or by keys (WIDE, FMAs).
        const int64_t pairs = (count + 1) / 2;
        __m512i vp[WIDE ? 1 : kKeys / 2][kVecs];
        for (int64_t j = 0; j < pairs && !WIDE; j++) {
            const Bf16 *r0 = key_row(vh, 2 * j), *r1 = key_row(vh, 2 * j + 1);
            for (int64_t v = 0; v < kVecs; v += 2) {
                const __m512i a = _mm512_loadu_si512(r0 + 16 * v), c = _mm512_loadu_si512(r1 + 16 * v);
                vp[j][v] = _mm512_permutex2var_epi16(a, pair_lo, c);
                vp[j][v + 1] = _mm512_permutex2var_epi16(a, pair_hi, c);
            }
        }
        for (int64_t m0 = 0; m0 < rows; m0 += kChunk) {
            __m512 o[kChunk][kVecs];
            for (int m = 0; m < kChunk; m++)
                for (int64_t v = 0; v < kVecs; v++) {
                    o[m][v] = _mm512_load_ps(&acc[m0 + m][16 * v]);
                    if (rescale) o[m][v] = _mm512_mul_ps(o[m][v], _mm512_set1_ps(corr[m0 + m]));
                }
            for (int64_t j = 0; j < (WIDE ? 2 * pairs : pairs); j++) {
                __m512i w[kVecs];
                for (int64_t v = 0; v < kVecs; v++) w[v] = WIDE ? _mm512_castps_si512(vw[j][v]) : vp[j][v];
                for (int m = 0; m < kChunk; m++) {
                    for (int64_t v = 0; v < kVecs; v++)
                        if constexpr (WIDE)
                            o[m][v] = _mm512_fmadd_ps(_mm512_set1_ps(s[j][m0 + m]), _mm512_castsi512_ps(w[v]), o[m][v]);
                        else
                            o[m][v] = _mm512_dpbf16_ps(o[m][v], (__m512bh)_mm512_set1_epi32(pp[j][m0 + m]), (__m512bh)w[v]);
                }
            }
            for (int m = 0; m < kChunk; m++)
                for (int64_t v = 0; v < kVecs; v++) _mm512_store_ps(&acc[m0 + m][16 * v], o[m][v]);
        }
    }
    alignas(64) float sums[kRows], bests[kRows];
    for (int r = 0; r < RV; r++) {
        _mm512_store_ps(&sums[16 * r], total[r]);
        _mm512_store_ps(&bests[16 * r], best[r]);
    }
    for (int64_t m = 0; m < rows; m++) {
        // A NaN score (NaN in the query or a visible key) makes the row NaN, as in PyTorch.
        const bool nan = (broken[m / 16] >> (m % 16)) & 1;
        if (job.out == nullptr) {
            job.leave_partial(bt, m, group, acc[m], bests[m] / kLog2e, sums[m], nan);
            continue;
        }
        Bf16 *dst = job.out_row(bt, m, group);
        const __m512 inv = _mm512_set1_ps(nan ? std::numeric_limits<float>::quiet_NaN() : 1.f / sums[m]);
        for (int64_t v = 0; v < kVecs; v++)
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + 16 * v),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(&acc[m][16 * v]), inv)));
    }
}

template <bool W>
void attend_rows_as(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, const RowsJob<Bf16> &job) {
    const int64_t row_vecs = (job.count * (bt.num_heads / bt.kv_heads) + 15) / 16;
    if (bt.dim == 64) {
        if (row_vecs <= 1)
            attend_rows_impl<64, 1, W>(bt, q, k_cache, v_cache, job);
        else if (row_vecs == 2)
            attend_rows_impl<64, 2, W>(bt, q, k_cache, v_cache, job);
        else
            attend_rows_impl<64, 3, W>(bt, q, k_cache, v_cache, job);
    } else if (row_vecs <= 1) {
        attend_rows_impl<128, 1, W>(bt, q, k_cache, v_cache, job);
    } else {
        attend_rows_impl<128, 2, W>(bt, q, k_cache, v_cache, job);
    }
}

void attend_job(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, const RowsJob<Bf16> &job) {
    if (widened_rows.load(std::memory_order_relaxed))
        attend_rows_as<true>(bt, q, k_cache, v_cache, job);
    else
        attend_rows_as<false>(bt, q, k_cache, v_cache, job);
}

}  // namespace

bool attend_rows_supported(int64_t dim) { return dim == 64 || dim == 128; }

int64_t attend_rows_tokens(int64_t group, int64_t dim) {
    const int64_t rows = 16 * (dim == 64 ? kMaxRowVecs<64> : kMaxRowVecs<128>);
    return group < rows ? rows / group : 1;
}

void attend_rows(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, Bf16 *out,
                 const AttendTask &task) {
    attend_job(bt, q, k_cache, v_cache, RowsJob<Bf16>::extend(bt, task, out));
}

void attend_shared(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, const SharedRows &shared,
                   int64_t chunk, int64_t h, const PartialRows &partial) {
    attend_job(bt, q, k_cache, v_cache, RowsJob<Bf16>::shared_keys(shared, chunk, h, partial));
}

#else

bool attend_rows_supported(int64_t) { return false; }
int64_t attend_rows_tokens(int64_t, int64_t) { return 1; }
void attend_rows(const Batch &, const Bf16 *, const Bf16 *, const Bf16 *, Bf16 *, const AttendTask &) {}
void attend_shared(const Batch &, const Bf16 *, const Bf16 *, const Bf16 *, const SharedRows &, int64_t, int64_t,
                   const PartialRows &) {}

#endif

}  // namespace forkserve

// Whether bf16 extend tasks take float32 FMAs on widened rows (1) or vdpbf16ps (0); returns
// the previous setting. Chosen by measurement, kernels/cpu/attention_choice.py.
extern "C" int64_t paged_attention_set_widened(int64_t on) {
    return forkserve::widened_rows.exchange(on != 0) ? 1 : 0;
}

// Whether this build has the bf16 extend tasks (AVX512-BF16 and DQ), so a choice to make.
extern "C" int paged_attention_rows_available() { return forkserve::attend_rows_supported(64) ? 1 : 0; }
