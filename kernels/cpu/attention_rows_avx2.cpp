// Extend attention on 8-lane AVX2 float32 FMAs: for float32 storage on every x86 CPU, and for
// bfloat16 on CPUs without AVX512-BF16 (AMD Zen 2 and 3, most Intel desktop parts), whose
// extends otherwise ran one query token at a time (attend_one in paged_attention.cpp): there
// each token re-read every key it sees, and each score was one horizontal dot product.
//
// The same tasks as attention_rows.cpp (a block of a request's consecutive query tokens against
// one KV head, or a group's shared keys), the same online softmax in base 2 with its slack, and
// the same float32 arithmetic as that file's widened variant, on 8 lanes:
//   scores, lanes = rows: the task's queries (up to 8 * RV rows: token x query head of the
//     group) are transposed once into (dim, row) vectors; a key's 8 row scores are the sum
//     over dims of a query vector times that key's value at the dim, broadcast, a few keys at
//     a time (kSubKeys).
//   values, lanes = dims: six rows (two where the task has fewer than 24) keep 16 of their
//     output dims (or 32) in registers while the block's value rows pass.
//   Float32 blocks of a whole kKeys keys are read in place from the pool; bfloat16 blocks and
//   a task's last, partial block are widened (and zero-padded) into L1 buffers first. The
//   query and value vectors that several FMAs use are held in registers (in_register in
//   simd.h): as memory operands of every FMA they made both products load-bound.
//   On a Zen 3 core the three together took the float32 attention of 256 new tokens after
//   1,500 cached from 56% to 71% of the FMA peak (python -m bench_agent.bench_attention
//   --threads 1), and a 256-token prefill of the default model after 1,500 cached tokens to
//   1.09x the speed (python -m bench_agent.bench_kernel_ab --dtype float32 --prefill 256
//   --cached 1500).
// Probabilities stay float32 (there is no bfloat16 arithmetic to round them for).
//
// Called per task from paged_attention.cpp, which builds the tasks (paged_batch.h) and picks
// this kernel or attention_rows.cpp's.
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "online_softmax.h"
#include "paged_batch.h"
#include "simd.h"

namespace forkserve {

#if defined(__AVX2__) && defined(__FMA__)

namespace {

constexpr int64_t kKeys = 24;  // keys per block: a multiple of every kSubKeys below

// Row vectors per task: 3 (24 rows: 8 tokens of 3 query heads per KV head, the default
// model's; paged_attention.cpp allows at most 16 query heads per KV head, so one token's
// rows always fit). Keys scored together: RV * kSubKeys sums, RV query vectors and a key broadcast
// stay within AVX2's 16 registers (with 3 row vectors, 3 keys: 13 registers measured ~3%
// faster than 4 keys' 16, which GCC spills by reading the queries from memory per FMA).
constexpr int kMaxRowVecs = 3;
template <int RV>
constexpr int kSubKeys = RV == 3 ? 3 : 12 / RV;
// Value pass: the sums of 6 rows x 2 vectors (16 dims) in registers while the block's keys
// pass (12 FMA chains, as in linear_f32.cpp's tile), 2 rows x 4 vectors where the task has
// fewer than 24 rows (6 does not divide 8 or 16).
template <int RV>
constexpr int kValRowsOf = RV == 3 ? 6 : 2;
template <int RV>
constexpr int kValVecsOf = RV == 3 ? 2 : 4;

template <typename T, int64_t DIM, int RV>
void attend_rows_avx2_impl(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, const RowsJob<T> &job) {
    constexpr int kRows = 8 * RV, kSub = kSubKeys<RV>, kValRows = kValRowsOf<RV>,
                  kValVecs = kValVecsOf<RV>;
    constexpr int64_t kVecs = DIM / 8;
    const int64_t group = bt.num_heads / bt.kv_heads, rows = job.count * group;
    const int64_t first = job.first, keys = job.keys;
    const int64_t *slots = job.slots;
    const T *kh = k_cache + job.h * bt.num_slots * DIM, *vh = v_cache + job.h * bt.num_slots * DIM;

    alignas(32) float qt[DIM][kRows];    // queries by dim, rows as lanes
    alignas(32) float s[kKeys][kRows];   // a block's scores by key, then its probabilities
    alignas(32) float kw[kKeys][DIM];    // a block's keys as float32 (zero past its last)
    alignas(32) float vw[kKeys][DIM];    // a block's values as float32
    alignas(32) float acc[kRows][DIM];   // output sums
    alignas(32) float corr[kRows];       // per row, the factor for its sums so far
    alignas(32) float visible[kRows];    // per row, how many keys it sees
    for (int m = 0; m < kRows; m++) {  // padding rows: zero queries, the last token's keys
        const bool real = m < rows;
        const int64_t token = real ? m / group : job.count - 1, head = job.h * group + (real ? m % group : 0);
        const T *row = q + (job.token(token) * bt.num_heads + head) * DIM;
        for (int64_t d = 0; d < DIM; d++) qt[d][m] = real ? to_f32(row[d]) : 0.f;
        visible[m] = static_cast<float>(job.causal ? first + token + 1 : keys);
    }
    std::memset(acc, 0, sizeof(acc));

    const __m256 scale = _mm256_set1_ps(bt.scale * kLog2e), slack = _mm256_set1_ps(kSlack * kLog2e);
    const __m256 floor = _mm256_set1_ps(-1e30f), all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256 best[RV], total[RV], limit[RV], broken[RV];  // broken: all-ones lanes for rows that saw a NaN
    for (int r = 0; r < RV; r++) {
        best[r] = floor;
        total[r] = _mm256_setzero_ps();
        limit[r] = _mm256_load_ps(&visible[8 * r]);
        broken[r] = _mm256_setzero_ps();
    }

    for (int64_t k0 = 0; k0 < keys; k0 += kKeys) {
        const int64_t count = keys - k0 < kKeys ? keys - k0 : kKeys;
        const bool diagonal = k0 + count > first + 1;  // some row sees only part of this block
        for (int64_t c = k0 + kKeys; c < k0 + 2 * kKeys && c < keys; c++) {  // the next block's rows
            prefetch_row(kh + slots[c] * DIM, DIM);
            prefetch_row<2>(vh + slots[c] * DIM, DIM);
        }
        const float *krow[kKeys], *vrow[kKeys];
        bool in_place = false;
        if constexpr (std::is_same_v<T, float>) {
            in_place = count == kKeys;
            if (in_place)
                for (int64_t c = 0; c < kKeys; c++) {
                    krow[c] = kh + slots[k0 + c] * DIM;
                    vrow[c] = vh + slots[k0 + c] * DIM;
                }
        }
        if (!in_place) {
            for (int64_t c = 0; c < count; c++) {  // the block's keys and values as float32
                const T *kr = kh + slots[k0 + c] * DIM, *vr = vh + slots[k0 + c] * DIM;
                for (int64_t v = 0; v < kVecs; v++) {
                    _mm256_store_ps(&kw[c][8 * v], load8(kr + 8 * v));
                    _mm256_store_ps(&vw[c][8 * v], load8(vr + 8 * v));
                }
            }
            if (count < kKeys) std::memset(kw[count], 0, sizeof(float) * DIM * (kKeys - count));
            for (int64_t c = 0; c < kKeys; c++) {
                krow[c] = kw[c];
                vrow[c] = vw[c];
            }
        }
        // Scores, kSub keys at a time, one dim per step.
        for (int64_t c0 = 0; c0 < count; c0 += kSub) {
            __m256 sc[kSub][RV];
            for (int c = 0; c < kSub; c++)
                for (int r = 0; r < RV; r++) sc[c][r] = _mm256_setzero_ps();
            for (int64_t d = 0; d < DIM; d++) {
                __m256 qv[RV];
                for (int r = 0; r < RV; r++) qv[r] = in_register(_mm256_load_ps(&qt[d][8 * r]));
                for (int c = 0; c < kSub; c++) {
                    const __m256 kb = _mm256_broadcast_ss(krow[c0 + c] + d);
                    for (int r = 0; r < RV; r++) sc[c][r] = _mm256_fmadd_ps(qv[r], kb, sc[c][r]);
                }
            }
            for (int c = 0; c < kSub; c++)
                for (int r = 0; r < RV; r++) _mm256_store_ps(&s[c0 + c][8 * r], sc[c][r]);
        }
        // Online softmax per row (lane), in base 2: `best` is the reference for scale * log2(e) *
        // score and moves only when a score passes it by kSlack nats; keys past a row's last get
        // probability exactly 0. The probabilities replace the scores in `s`.
        bool rescale = false;
        for (int r = 0; r < RV; r++) {
            auto sees = [&](int64_t c) {
                return diagonal ? _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(k0 + c)), limit[r], _CMP_LT_OQ) : all;
            };
            __m256 top = floor;  // unscaled: the scale is positive
            for (int64_t c = 0; c < count; c++) {
                const __m256 x = _mm256_load_ps(&s[c][8 * r]), see = sees(c);
                broken[r] = _mm256_or_ps(broken[r], _mm256_and_ps(see, nan_lanes8(x)));
                top = _mm256_max_ps(_mm256_blendv_ps(floor, x, see), top);
            }
            top = _mm256_mul_ps(top, scale);
            const __m256 moved = _mm256_cmp_ps(top, _mm256_add_ps(best[r], slack), _CMP_GT_OQ);
            __m256 factor = _mm256_set1_ps(1.f);
            if (_mm256_movemask_ps(moved) != 0) {
                const __m256 now = _mm256_blendv_ps(best[r], top, moved);
                factor = exp2_8(_mm256_sub_ps(best[r], now));
                total[r] = _mm256_mul_ps(total[r], factor);
                best[r] = now;
                rescale = true;
            }
            _mm256_store_ps(&corr[8 * r], factor);
            for (int64_t c = 0; c < count; c++) {
                __m256 p = exp2_8(_mm256_fmsub_ps(_mm256_load_ps(&s[c][8 * r]), scale, best[r]));
                if (diagonal) p = _mm256_and_ps(p, sees(c));
                total[r] = _mm256_add_ps(total[r], p);
                _mm256_store_ps(&s[c][8 * r], p);
            }
        }
        // sums = sums * corr + p x v, kValRows rows and kValVecs vectors of their dims at a time.
        for (int64_t m0 = 0; m0 < rows; m0 += kValRows) {
            for (int64_t v0 = 0; v0 < kVecs; v0 += kValVecs) {
                __m256 o[kValRows][kValVecs];
                for (int m = 0; m < kValRows; m++)
                    for (int64_t v = 0; v < kValVecs; v++) {
                        o[m][v] = _mm256_load_ps(&acc[m0 + m][8 * (v0 + v)]);
                        if (rescale) o[m][v] = _mm256_mul_ps(o[m][v], _mm256_broadcast_ss(&corr[m0 + m]));
                    }
                for (int64_t j = 0; j < count; j++) {
                    __m256 w[kValVecs];
                    for (int64_t v = 0; v < kValVecs; v++) w[v] = in_register(_mm256_loadu_ps(vrow[j] + 8 * (v0 + v)));
                    for (int m = 0; m < kValRows; m++) {
                        const __m256 p = _mm256_broadcast_ss(&s[j][m0 + m]);
                        for (int64_t v = 0; v < kValVecs; v++) o[m][v] = _mm256_fmadd_ps(p, w[v], o[m][v]);
                    }
                }
                for (int m = 0; m < kValRows; m++)
                    for (int64_t v = 0; v < kValVecs; v++) _mm256_store_ps(&acc[m0 + m][8 * (v0 + v)], o[m][v]);
            }
        }
    }
    alignas(32) float sums[kRows], bests[kRows];
    int nan_rows[RV];
    for (int r = 0; r < RV; r++) {
        _mm256_store_ps(&sums[8 * r], total[r]);
        _mm256_store_ps(&bests[8 * r], best[r]);
        nan_rows[r] = _mm256_movemask_ps(broken[r]);
    }
    for (int64_t m = 0; m < rows; m++) {
        // A NaN score (NaN in the query or a visible key) makes the row NaN, as in PyTorch.
        const bool broken_row = (nan_rows[m / 8] >> (m % 8)) & 1;
        if (job.out == nullptr) {
            job.leave_partial(bt, m, group, acc[m], bests[m] / kLog2e, sums[m], broken_row);
            continue;
        }
        T *dst = job.out_row(bt, m, group);
        const float inv = broken_row ? std::numeric_limits<float>::quiet_NaN() : 1.f / sums[m];
        for (int64_t d = 0; d < DIM; d++) from_f32(acc[m][d] * inv, dst + d);
    }
}

template <typename T, int64_t DIM>
void attend_rows_avx2_dim(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, const RowsJob<T> &job) {
    const int64_t row_vecs = (job.count * (bt.num_heads / bt.kv_heads) + 7) / 8;
    if (row_vecs <= 1)
        attend_rows_avx2_impl<T, DIM, 1>(bt, q, k_cache, v_cache, job);
    else if (row_vecs == 2)
        attend_rows_avx2_impl<T, DIM, 2>(bt, q, k_cache, v_cache, job);
    else
        attend_rows_avx2_impl<T, DIM, 3>(bt, q, k_cache, v_cache, job);
}

template <typename T>
void attend_job_avx2(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, const RowsJob<T> &job) {
    if (bt.dim == 64)
        attend_rows_avx2_dim<T, 64>(bt, q, k_cache, v_cache, job);
    else
        attend_rows_avx2_dim<T, 128>(bt, q, k_cache, v_cache, job);
}

}  // namespace

bool attend_rows_avx2_supported(int64_t dim) { return dim == 64 || dim == 128; }

int64_t attend_rows_avx2_tokens(int64_t group) {
    constexpr int64_t rows = 8 * kMaxRowVecs;
    return group < rows ? rows / group : 1;
}

template <typename T>
void attend_rows_avx2(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, const AttendTask &task) {
    attend_job_avx2(bt, q, k_cache, v_cache, RowsJob<T>::extend(bt, task, out));
}

template <typename T>
void attend_shared_avx2(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, const SharedRows &shared,
                        int64_t chunk, int64_t h, const PartialRows &partial) {
    attend_job_avx2(bt, q, k_cache, v_cache, RowsJob<T>::shared_keys(shared, chunk, h, partial));
}

#else

bool attend_rows_avx2_supported(int64_t) { return false; }
int64_t attend_rows_avx2_tokens(int64_t) { return 1; }
template <typename T>
void attend_rows_avx2(const Batch &, const T *, const T *, const T *, T *, const AttendTask &) {}
template <typename T>
void attend_shared_avx2(const Batch &, const T *, const T *, const T *, const SharedRows &, int64_t, int64_t,
                        const PartialRows &) {}

#endif

template void attend_rows_avx2<float>(const Batch &, const float *, const float *, const float *, float *,
                                      const AttendTask &);
template void attend_rows_avx2<Bf16>(const Batch &, const Bf16 *, const Bf16 *, const Bf16 *, Bf16 *,
                                     const AttendTask &);
template void attend_shared_avx2<float>(const Batch &, const float *, const float *, const float *,
                                        const SharedRows &, int64_t, int64_t, const PartialRows &);
template void attend_shared_avx2<Bf16>(const Batch &, const Bf16 *, const Bf16 *, const Bf16 *, const SharedRows &,
                                       int64_t, int64_t, const PartialRows &);

}  // namespace forkserve
