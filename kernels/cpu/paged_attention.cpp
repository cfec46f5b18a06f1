// Paged attention on the CPU, read straight from the KV pool through the slot table.
//
// Query token j of request b (absolute position prefix[b] + j) attends to the request's
// first prefix[b] + j + 1 tokens, whose pool slots are req_to_token[rows[b]][0, 1, ...].
// Decode is the case of one query token per request.
//
// Layouts (all contiguous):
//   q, out        [num_tokens, num_heads, dim]   the tokens of request b start at q_start[b]
//   k/v cache     [kv_heads, num_slots, dim]     the pool's HND layout
//   req_to_token  [*, r2t_stride] int64
//   token_req     [num_tokens] int64             the request each query token belongs to
//
// Decode tokens (and every token where no row kernel below applies): one task is one
// (query token, KV head). It scores the group of query heads sharing that KV head against
// every visible key (float32 sums; with AVX-512, 16 keys at a time, see score16), takes the
// softmax in float32 and sums the values (sum_values16: each value row widened once for all
// heads of the group). Reading K/V rows in place avoids the gather copy a batched matmul
// needs, and a query token reads only the keys it may see.
//
// Decode tokens whose requests begin with the same keys (forks of one prompt; found by
// shared_prefix.cpp) attend those keys together where enough of them decode: one task per
// chunk of the shared keys and KV head for all of the group's query rows (on AMX tiles
// where the CPU has them, attention_amx.cpp; else the row kernels' vectors), a per-token
// task for each token's own keys, each leaving an unnormalised softmax, and merge_parts
// combining a token's parts once every task is done.
//
// Extends (a request with several query tokens in the step): one task is a block of the
// request's consecutive tokens for one KV head, as small matrix products with an online
// softmax: bfloat16 on AVX512-BF16 (attention_rows.cpp), float32 and bfloat16 without it on
// AVX2 (attention_rows_avx2.cpp); or, on AMX tiles, the whole request (attention_amx.cpp).
// Tasks run largest first, so the last ones to finish are short.
//
// Built (with the other kernels, into one library) and loaded by kernels/cpu/build.py; called
// from kernels/attention/cpu_backend.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "aligned.h"
#include "bf16.h"
#include "entries.h"
#include "paged_batch.h"
#include "simd.h"

namespace {

using namespace forkserve;

constexpr int64_t kMaxDim = 256;
constexpr int64_t kMaxGroup = 16;

// Slots are scattered in the pool (shared prefixes, freed and reused slots), so the
// hardware prefetcher cannot guess the next row: ask for the row a few keys ahead.
constexpr int64_t kPrefetch = 8;

// Key rows ask for L1 this far ahead of the block being scored, and for L2 three times as far.
constexpr int64_t kKeyAhead = 16;

#if defined(FORKSERVE_AVX512)
// Lane k of the result is the sum of the 16 lanes of v[k]: a transpose-and-add tree, about
// three instructions per vector instead of a full horizontal reduction for each.
inline __m512 sum_each16(const __m512 *v) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) {  // per 128-bit lane: that lane's partial sum of vectors 4j .. 4j+3
        const __m512d x = _mm512_castps_pd(pairs[2 * j]), y = _mm512_castps_pd(pairs[2 * j + 1]);
        quads[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // Add the four 128-bit lanes: even with odd lanes, twice.
    const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88), _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
    const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88), _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, 0x88), _mm512_shuffle_f32x4(lo, hi, 0xDD));
}

// Scores of one query head against up to 16 keys (rows `slots[0 .. count)` of `kh`),
// written to out[0 .. count). Float32: fused multiply-adds on the pre-scaled query.
template <int64_t DIM>
inline void score16(const float *qf, const float *, float, const float *kh, const int64_t *slots, int64_t count,
                    float *out) {
    constexpr int64_t kVecs = DIM / 16;
    __m512 acc[16];
    for (int64_t j = 0; j < 16; j++) {
        acc[j] = _mm512_setzero_ps();
        if (j >= count) continue;
        const float *row = kh + slots[j] * DIM;
        for (int64_t i = 0; i < kVecs; i++)
            acc[j] = _mm512_fmadd_ps(_mm512_load_ps(qf + 16 * i), _mm512_loadu_ps(row + 16 * i), acc[j]);
    }
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << count) - 1), sum_each16(acc));
}

#if defined(FORKSERVE_AVX512_BF16)
// Bfloat16: pairwise dot products straight from the stored rows (vdpbf16ps: exact products,
// float32 sums); the query is the unscaled bf16 row and the scale is applied to the sums.
template <int64_t DIM>
inline void score16(const float *, const Bf16 *q, float scale, const Bf16 *kh, const int64_t *slots, int64_t count,
                    float *out) {
    constexpr int64_t kVecs = DIM / 32;
    __m512bh qv[kVecs];
    for (int64_t i = 0; i < kVecs; i++) qv[i] = (__m512bh)_mm512_loadu_si512(q + 32 * i);
    __m512 acc[16];
    for (int64_t j = 0; j < 16; j++) {
        acc[j] = _mm512_setzero_ps();
        if (j >= count) continue;
        const Bf16 *row = kh + slots[j] * DIM;
        for (int64_t i = 0; i < kVecs; i++) acc[j] = _mm512_dpbf16_ps(acc[j], qv[i], (__m512bh)_mm512_loadu_si512(row + 32 * i));
    }
    const __m512 sums = _mm512_mul_ps(sum_each16(acc), _mm512_set1_ps(scale));
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << count) - 1), sums);
}
constexpr bool kBf16Blocks = true;
#else
constexpr bool kBf16Blocks = false;
#endif

// Whether keys are scored 16 at a time by score16 for this storage type and head size.
template <typename T, int64_t DIM>
constexpr bool kBlockScores = (DIM == 64 || DIM == 128) && (std::is_same_v<T, float> || kBf16Blocks);

// acc[g] = sum over keys t of probs[g * n + t] * V[t], for every query head g of the group.
// The accumulators of up to 16 / (DIM / 16) heads stay in registers while one pass over
// the value rows widens each row once for all of them.
template <typename T, int64_t DIM>
void sum_values16(const T *vh, const int64_t *slots, int64_t n, const float *probs, int64_t group,
                  float (*acc)[kMaxDim]) {
    constexpr int64_t kVecs = DIM / 16, kHeads = 16 / kVecs;
    for (int64_t g0 = 0; g0 < group; g0 += kHeads) {
        const int64_t heads = group - g0 < kHeads ? group - g0 : kHeads;
        __m512 sums[kHeads][kVecs];
        for (int64_t c = 0; c < kHeads; c++)
            for (int64_t i = 0; i < kVecs; i++) sums[c][i] = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t++) {
            if (t + kPrefetch < n) prefetch_row(vh + slots[t + kPrefetch] * DIM, DIM);
            const T *row = vh + slots[t] * DIM;
            __m512 v[kVecs];
            for (int64_t i = 0; i < kVecs; i++) v[i] = load16(row + 16 * i);
            for (int64_t c = 0; c < kHeads && c < heads; c++) {
                const __m512 p = _mm512_set1_ps(probs[(g0 + c) * n + t]);
                for (int64_t i = 0; i < kVecs; i++) sums[c][i] = _mm512_fmadd_ps(p, v[i], sums[c][i]);
            }
        }
        for (int64_t c = 0; c < heads; c++)
            for (int64_t i = 0; i < kVecs; i++) _mm512_store_ps(acc[g0 + c] + 16 * i, sums[c][i]);
    }
}

// Whether the values are summed by sum_values16 for this head size.
template <int64_t DIM>
constexpr bool kBlockValues = DIM == 64 || DIM == 128;
#else
template <typename T, int64_t DIM>
constexpr bool kBlockScores = false;
template <int64_t DIM>
constexpr bool kBlockValues = false;
// Never called without AVX-512 (both flags above are false); declared so that the
// discarded branches of attend_one still name something.
template <int64_t DIM, typename... Args>
void score16(Args...);
template <typename T, int64_t DIM, typename... Args>
void sum_values16(Args...);
#endif

// One (query token, KV head), over the token's keys past the first `skip`: `scores` has room
// for group * max_keys floats. The rows go normalised to `out`, or, where `partial` is given,
// unnormalised to its part `part` (to be merged with a shared task's). DIM is the head size
// when known at compile time (the common 64 and 128: fully unrolled rows), else 0.
template <typename T, int64_t DIM>
void attend_one(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, int64_t tok,
                int64_t h, int64_t skip, const PartialRows *partial, int64_t part, float *scores) {
    const int64_t group = bt.num_heads / bt.kv_heads, dim = DIM > 0 ? DIM : bt.dim;
    const int64_t b = bt.token_req[tok];
    const int64_t n = bt.prefix[b] + (tok - bt.q_start[b]) + 1 - skip;
    const int64_t *slots = bt.req_to_token + bt.rows[b] * bt.r2t_stride + skip;
    const T *kh = k_cache + h * bt.num_slots * dim, *vh = v_cache + h * bt.num_slots * dim;
    const int64_t head0 = tok * bt.num_heads + h * group;  // this task's first query head

    alignas(64) float qf[kMaxGroup][kMaxDim], acc[kMaxGroup][kMaxDim], row[kMaxDim];
    float best[kMaxGroup], total[kMaxGroup];
    for (int64_t g = 0; g < group; g++) {
        load_row(q + (head0 + g) * dim, qf[g], dim);
        for (int64_t d = 0; d < dim; d++) qf[g][d] *= bt.scale;
        best[g] = -3.0e38f;
    }
    if constexpr (kBlockScores<T, DIM>) {
        for (int64_t t = 0; t < n; t += 16) {
            const int64_t count = n - t < 16 ? n - t : 16;
            // K rows for the next blocks; and this block's V rows into L2 for the value pass,
            // which then runs from cache while memory serves the key rows further ahead.
            for (int64_t j = t + kKeyAhead; j < t + kKeyAhead + 16 && j < n; j++) prefetch_row(kh + slots[j] * dim, dim);
            for (int64_t j = t + 3 * kKeyAhead; j < t + 3 * kKeyAhead + 16 && j < n; j++)
                prefetch_row<2>(kh + slots[j] * dim, dim);
            for (int64_t j = t; j < t + 16 && j < n; j++) prefetch_row<2>(vh + slots[j] * dim, dim);
            for (int64_t g = 0; g < group; g++)
                score16<DIM>(qf[g], q + (head0 + g) * dim, bt.scale, kh, slots + t, count, scores + g * n + t);
        }
        for (int64_t g = 0; g < group; g++) {
            float m = best[g];
#pragma omp simd reduction(max : m)
            for (int64_t t = 0; t < n; t++) m = scores[g * n + t] > m ? scores[g * n + t] : m;
            best[g] = m;
        }
    } else {
        for (int64_t t = 0; t < n; t++) {
            if (t + kPrefetch < n) prefetch_row(kh + slots[t + kPrefetch] * dim, dim);
            load_row(kh + slots[t] * dim, row, dim);
            for (int64_t g = 0; g < group; g++) {
                float s = 0.f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < dim; d++) s += qf[g][d] * row[d];
                scores[g * n + t] = s;
                best[g] = s > best[g] ? s : best[g];
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float sum = 0.f;
        for (int64_t t = 0; t < n; t++) {
            const float e = std::exp(scores[g * n + t] - best[g]);
            scores[g * n + t] = e;
            sum += e;
        }
        total[g] = sum;
    }
    if constexpr (kBlockValues<DIM>) {
        sum_values16<T, DIM>(vh, slots, n, scores, group, acc);
    } else {
        for (int64_t g = 0; g < group; g++) std::memset(acc[g], 0, sizeof(float) * dim);
        for (int64_t t = 0; t < n; t++) {
            if (t + kPrefetch < n) prefetch_row(vh + slots[t + kPrefetch] * dim, dim);
            load_row(vh + slots[t] * dim, row, dim);
            for (int64_t g = 0; g < group; g++) {
                const float p = scores[g * n + t];
#pragma omp simd
                for (int64_t d = 0; d < dim; d++) acc[g][d] += p * row[d];
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {
        if (partial != nullptr) {
            const int64_t row = part * bt.num_heads + h * group + g;
            std::memcpy(partial->acc + row * dim, acc[g], sizeof(float) * dim);
            partial->best[row] = best[g];
            partial->total[row] = total[g];
            continue;
        }
        const float inv = 1.f / total[g];
        T *dst = out + (head0 + g) * dim;
        for (int64_t d = 0; d < dim; d++) from_f32(acc[g][d] * inv, dst + d);
    }
}

// Head `head` of query token `tok` from its softmaxes over disjoint parts of its keys, parts
// [first, first + count) of `partial`: rescaled to a common reference, summed, normalised.
template <typename T>
void merge_parts(const PartialRows &partial, int64_t first, int64_t count, int64_t tok, int64_t head,
                 const Batch &bt, T *out) {
    alignas(64) float sum[kMaxDim];
    float top = -std::numeric_limits<float>::infinity(), total = 0.f;
    for (int64_t p = first; p < first + count; p++) top = std::max(top, partial.best[p * bt.num_heads + head]);
    std::memset(sum, 0, sizeof(float) * bt.dim);
    for (int64_t p = first; p < first + count; p++) {
        const int64_t r = p * bt.num_heads + head;
        const float w = std::exp(partial.best[r] - top);
        total += partial.total[r] * w;
        const float *x = partial.acc + r * bt.dim;
        for (int64_t d = 0; d < bt.dim; d++) sum[d] += x[d] * w;
    }
    const float inv = 1.f / total;
    T *dst = out + (tok * bt.num_heads + head) * bt.dim;
    for (int64_t d = 0; d < bt.dim; d++) from_f32(sum[d] * inv, dst + d);
}

// Decode tokens whose requests share at least a storage type's minimum of first keys attend
// them together (find_shared_prefixes), in groups of at least shared_min_rows query rows.
// The defaults for bfloat16 K/V, measured on an Intel Xeon without AMX (2 cores, the default
// model, whole decode steps, python -m bench_agent.bench_shared_decode): 8 or 16 forks of a
// 3,000-token prompt decode 1.21x and 1.29x faster; 4 forks of a 3,000-token one (12 rows),
// or 8 of a 440-token one, no faster. With fewer rows a task leaves most of its 16 lanes idle
// (attention_rows.cpp) and per-token tasks do as well. Float32 K/V rows are twice bfloat16's
// bytes and a decode step of forks reads their shared prompt from memory once per fork, so
// grouping pays from shorter prompts there: measured on an AMD Zen 3 (AVX2, 2 cores,
// python -m bench_agent.bench_shared_decode --dtype float32 --prompt P --min-keys K), 16 forks
// of an 800-token prompt 62.2 -> 42.3 ms per step (K 512), 8 forks 47.1 -> 35.9 ms, 16 forks
// of a 400-token prompt 60.4 -> 47.5 ms (K 256); chats with 400 tokens of their own each
// (--own 400), 8 sharing a 300-token prompt 25.8 -> 24.0 ms, but 8 sharing 210 tokens
// 22.4 -> 24.2 ms with K lowered to 128 (slower). Both settable
// (paged_attention_set_shared_min_keys / _rows): where the GEMMs run on AMX tiles attention
// is a larger share of a decode step and smaller groups pay, so the worker lowers both there
// (kernels/cpu/paged_attention.py).
constexpr int64_t kSharedMinKeysBf16 = 1024;
constexpr int64_t kSharedMinKeysF32 = 256;
int64_t shared_min_keys = -1;  // set for both storage types; -1: each type's default
int64_t shared_min_rows = 24;

template <typename T>
int64_t shared_min_keys_for() {
    if (shared_min_keys >= 0) return shared_min_keys;
    return std::is_same_v<T, float> ? kSharedMinKeysF32 : kSharedMinKeysBf16;
}

// Keys per task of a group's shared prefix (about: the prefix is cut into equal chunks).
constexpr int64_t kSharedChunk = 512;

int64_t shared_min_tokens(int64_t group) { return (shared_min_rows + group - 1) / group; }

// Which kernel takes a call's row blocks (extend tasks and groups' shared keys): AVX512-BF16's
// (attention_rows.cpp) for bfloat16 where this build has it, else the AVX2 one
// (attention_rows_avx2.cpp) for either storage type; none: every token attends alone.
enum class RowKernel { none, avx512, avx2 };

// bfloat16 row blocks on the AVX2 kernel even where AVX512-BF16's exists (and shared keys off
// AMX tiles), so that tests run the kernel of CPUs without AVX-512 on any machine; set by
// paged_attention_set_bf16_rows_avx2.
std::atomic<bool> bf16_rows_avx2{false};

template <typename T>
RowKernel row_kernel(int64_t dim) {
    if (std::is_same_v<T, Bf16> && attend_rows_supported(dim) && !bf16_rows_avx2.load(std::memory_order_relaxed))
        return RowKernel::avx512;
    return attend_rows_avx2_supported(dim) ? RowKernel::avx2 : RowKernel::none;
}

// Query tokens per extend task (and most tokens per shared group) of that kernel.
int64_t row_tokens(RowKernel kernel, int64_t group, int64_t dim) {
    return kernel == RowKernel::avx512 ? attend_rows_tokens(group, dim)
           : kernel == RowKernel::avx2 ? attend_rows_avx2_tokens(group)
                                       : 1;
}

// Requests with at least this many query tokens in the step go to the AMX kernel
// (attention_amx.cpp) where it applies; set by paged_attention_set_amx_min_tokens.
int64_t amx_min_tokens = 16;

// Attention of requests with amx_min_tokens query tokens or more on AMX tiles (bfloat16,
// head size 64, where the CPU and OS allow): returns which requests it did (by index b).
template <typename T>
std::vector<bool> attend_on_amx(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out,
                                int num_threads) {
    std::vector<bool> done;
    if constexpr (std::is_same_v<T, Bf16>) {
        if (bt.dim != 64 || bt.num_tokens < amx_min_tokens || !linear_amx_available()) return done;
        int64_t num_reqs = 0;
        for (int64_t t = 0; t < bt.num_tokens; t++) num_reqs = bt.token_req[t] + 1 > num_reqs ? bt.token_req[t] + 1 : num_reqs;
        std::vector<int64_t> tokens(static_cast<size_t>(num_reqs), 0), picked;
        for (int64_t t = 0; t < bt.num_tokens; t++) tokens[bt.token_req[t]]++;
        for (int64_t b = 0; b < num_reqs; b++)
            if (tokens[b] >= amx_min_tokens) picked.push_back(b);
        if (picked.empty()) return done;
        if (extend_attention_amx_bf16(q, k_cache, v_cache, bt.num_slots, bt.req_to_token, bt.r2t_stride, bt.rows,
                                      bt.prefix, bt.q_start, tokens.data(), picked.data(),
                                      static_cast<int64_t>(picked.size()), bt.num_heads, bt.kv_heads, bt.dim, bt.scale,
                                      out, num_threads) != 0)
            return done;
        done.assign(static_cast<size_t>(num_reqs), false);
        for (int64_t b : picked) done[b] = true;
    }
    return done;
}

// A call's groups of decode tokens sharing their first keys (for the row kernel that will
// attend them), chunks and parts laid out.
template <typename T>
SharedPlan plan_shared(const Batch &bt, const std::vector<bool> &on_amx) {
    const RowKernel kernel = row_kernel<T>(bt.dim);
    SharedPlan plan;
    if (bt.kv_heads <= 0 || bt.num_heads % bt.kv_heads != 0) return plan;
    const int64_t group = bt.num_heads / bt.kv_heads;
    if (kernel == RowKernel::none || group > kMaxGroup || bt.dim > kMaxDim) return plan;
    std::vector<int64_t> decodes;  // requests with one query token in the step, off AMX
    for (int64_t t = 0; t < bt.num_tokens; t++) {
        const int64_t b = bt.token_req[t];
        const bool alone = (t == 0 || bt.token_req[t - 1] != b) && (t + 1 == bt.num_tokens || bt.token_req[t + 1] != b);
        if (alone && (on_amx.empty() || !on_amx[b])) decodes.push_back(b);
    }
    plan.groups = find_shared_prefixes(bt, decodes, shared_min_keys_for<T>(), shared_min_tokens(group),
                                       row_tokens(kernel, group, bt.dim));
    for (SharedRows &g : plan.groups) {
        g.chunks = std::max<int64_t>(1, (g.keys + kSharedChunk / 2) / kSharedChunk);
        for (size_t i = 0; i < g.tokens.size(); i++) {
            g.first_part.push_back(plan.parts);
            plan.parts += g.chunks + 1;
        }
    }
    return plan;
}

// Tokens grouped by the last call, and its shared tasks done on AMX tiles (for
// tests: paged_attention_last_grouped_tokens, paged_attention_last_shared_on_tiles).
std::atomic<int64_t> last_grouped_tokens{0}, last_shared_on_tiles{0};

template <typename T>
int paged_attention(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, int num_threads,
                    const SharedPlan *given) {
    const int64_t group = bt.num_heads / bt.kv_heads;
    if (bt.dim > kMaxDim || group > kMaxGroup || group * bt.kv_heads != bt.num_heads) return 1;
    const std::vector<bool> on_amx = attend_on_amx(bt, q, k_cache, v_cache, out, num_threads);
    // Tasks for the rest: (token, KV head) through attend_one (count 0), or, for requests
    // with several query tokens where attend_rows applies, (block of tokens, KV head); and
    // where decode tokens share their first keys, (group, chunk of its keys, KV head).
    std::vector<AttendTask> tasks;
    const RowKernel kernel = row_kernel<T>(bt.dim);
    const bool blocks = kernel != RowKernel::none;
    const int64_t per_block = row_tokens(kernel, group, bt.dim);
    for (int64_t t = 0; t < bt.num_tokens;) {
        int64_t end = t + 1;
        while (end < bt.num_tokens && bt.token_req[end] == bt.token_req[t]) end++;
        if (!on_amx.empty() && on_amx[bt.token_req[t]]) {
            t = end;
            continue;
        }
        const bool block = blocks && end - t > 1;
        for (int64_t j = t; j < end; j += block ? per_block : 1)
            for (int64_t h = 0; h < bt.kv_heads; h++)
                tasks.push_back({j, block ? (end - j < per_block ? end - j : per_block) : 0, h});
        t = end;
    }
    // The caller's plan, unless it groups a token that AMX attended (decode tokens go to AMX
    // only where a test lowers its threshold to one token): then one without those tokens.
    auto on_amx_in = [&](const SharedPlan &p) {
        for (const SharedRows &g : p.groups)
            for (int64_t tok : g.tokens)
                if (!on_amx.empty() && on_amx[bt.token_req[tok]]) return true;
        return false;
    };
    SharedPlan local;
    const SharedPlan *plan = given;
    if (!blocks) {
        plan = &local;  // no extend tasks here: nothing grouped
    } else if (plan == nullptr || on_amx_in(*plan)) {
        local = plan_shared<T>(bt, on_amx);
        plan = &local;
    }
    const std::vector<SharedRows> &shared = plan->groups;
    // skip[t]: how many first keys of decode token t its group's shared tasks attend;
    // own_part[t]: the part its own keys' softmax goes to.
    std::vector<int64_t> skip(shared.empty() ? 0 : static_cast<size_t>(bt.num_tokens), 0), own_part(skip.size(), -1);
    int64_t grouped = 0;
    for (const SharedRows &g : shared) {
        for (size_t i = 0; i < g.tokens.size(); i++) {
            skip[g.tokens[i]] = g.keys;
            own_part[g.tokens[i]] = g.first_part[i] + g.chunks;
        }
        grouped += static_cast<int64_t>(g.tokens.size());
        for (int64_t c = 0; c < g.chunks; c++)
            for (int64_t h = 0; h < bt.kv_heads; h++) tasks.push_back({g.tokens[0], 0, h, &g, c});
    }
    last_grouped_tokens.store(grouped, std::memory_order_relaxed);
    last_shared_on_tiles.store(0, std::memory_order_relaxed);
    // The parts' rows: the shared chunks' and the grouped tokens' own, by (part, head).
    const size_t part_rows = static_cast<size_t>(plan->parts * bt.num_heads);
    AlignedVector<float> partial_buffer(part_rows * static_cast<size_t>(bt.dim + 2));
    const PartialRows partial{partial_buffer.data(), partial_buffer.data() + part_rows * bt.dim,
                              partial_buffer.data() + part_rows * (bt.dim + 1)};
    // Largest first (keys seen times query rows), so that the dynamic schedule ends on short
    // tasks instead of one thread finishing a prompt's last block while the other waits.
    auto cost = [&](const AttendTask &task) {
        if (task.shared != nullptr) {
            const SharedRows &g = *task.shared;
            return (g.chunk_begin(task.chunk + 1) - g.chunk_begin(task.chunk)) * static_cast<int64_t>(g.tokens.size());
        }
        const int64_t last = task.tok + (task.count > 0 ? task.count - 1 : 0), b = bt.token_req[task.tok];
        const int64_t seen = bt.prefix[b] + last - bt.q_start[b] + 1 - (task.count == 0 && !skip.empty() ? skip[task.tok] : 0);
        return seen * (task.count > 0 ? task.count : 1);
    };
    std::stable_sort(tasks.begin(), tasks.end(), [&](const AttendTask &x, const AttendTask &y) { return cost(x) > cost(y); });
    const int64_t num_tasks = static_cast<int64_t>(tasks.size());
    std::vector<std::pair<const SharedRows *, int64_t>> merged;  // (group, member)
    for (const SharedRows &g : shared)
        for (size_t i = 0; i < g.tokens.size(); i++) merged.emplace_back(&g, static_cast<int64_t>(i));
    const int64_t merged_rows = static_cast<int64_t>(merged.size()) * bt.num_heads;
#pragma omp parallel num_threads(num_threads)
    {
        AlignedVector<float> scores(static_cast<size_t>(group * (bt.max_keys > 0 ? bt.max_keys : 1)));
        auto *attend = bt.dim == 64    ? attend_one<T, 64>
                       : bt.dim == 128 ? attend_one<T, 128>
                                       : attend_one<T, 0>;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < num_tasks; i++) {
            const AttendTask &task = tasks[i];
            if (task.count == 0 && task.shared == nullptr) {
                const int64_t part = own_part.empty() ? -1 : own_part[task.tok];
                attend(bt, q, k_cache, v_cache, out, task.tok, task.h, part < 0 ? 0 : skip[task.tok],
                       part < 0 ? nullptr : &partial, part, scores.data());
                continue;
            }
            if constexpr (std::is_same_v<T, Bf16>) {
                if (kernel == RowKernel::avx512) {
                    if (task.shared == nullptr)
                        attend_rows(bt, q, k_cache, v_cache, out, task);
                    else if (attend_shared_amx(bt, q, k_cache, v_cache, *task.shared, task.chunk, task.h, partial))
                        last_shared_on_tiles.fetch_add(1, std::memory_order_relaxed);
                    else
                        attend_shared(bt, q, k_cache, v_cache, *task.shared, task.chunk, task.h, partial);
                    continue;
                }
            }
            if (task.shared == nullptr)
                attend_rows_avx2(bt, q, k_cache, v_cache, out, task);
            else
                attend_shared_avx2(bt, q, k_cache, v_cache, *task.shared, task.chunk, task.h, partial);
        }
        // The grouped tokens' rows, once all of their parts are done (the loop's barrier).
        if (merged_rows > 0)
#pragma omp for schedule(static)
        for (int64_t i = 0; i < merged_rows; i++) {
            const auto &[g, m] = merged[i / bt.num_heads];
            merge_parts(partial, g->first_part[m], g->chunks + 1, g->tokens[m], i % bt.num_heads, bt, out);
        }
    }
    return 0;
}

// Store a step's K and V ([tokens, kv_heads, dim]; a token's heads packed, tokens `*_stride`
// apart, as views into the fused QKV projection are) at pool slots loc[t] of the HND layout.
// Returns 1, writing nothing, if a slot is outside the pool.
template <typename T>
int store_kv(const T *k, int64_t k_stride, const T *v, int64_t v_stride, const int64_t *loc, int64_t tokens,
             int64_t kv_heads, int64_t dim, T *k_cache, T *v_cache, int64_t num_slots, int num_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (loc[t] < 0 || loc[t] >= num_slots) return 1;
    const size_t row = sizeof(T) * static_cast<size_t>(dim);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (tokens * kv_heads * dim >= (1 << 16))
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < kv_heads; h++) {
            std::memcpy(k_cache + (h * num_slots + loc[t]) * dim, k + t * k_stride + h * dim, row);
            std::memcpy(v_cache + (h * num_slots + loc[t]) * dim, v + t * v_stride + h * dim, row);
        }
    return 0;
}

}  // namespace

namespace forkserve {

template <typename T>
SharedPlan plan_shared_decodes(const Batch &bt, const std::vector<bool> &on_amx) {
    return plan_shared<T>(bt, on_amx);
}
template SharedPlan plan_shared_decodes<float>(const Batch &, const std::vector<bool> &);
template SharedPlan plan_shared_decodes<Bf16>(const Batch &, const std::vector<bool> &);

template <typename T>
int paged_attention_planned(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, int num_threads,
                            const SharedPlan &plan) {
    return paged_attention(bt, q, k_cache, v_cache, out, num_threads, &plan);
}
template int paged_attention_planned(const Batch &, const float *, const float *, const float *, float *, int,
                                     const SharedPlan &);
template int paged_attention_planned(const Batch &, const Bf16 *, const Bf16 *, const Bf16 *, Bf16 *, int,
                                     const SharedPlan &);

}  // namespace forkserve

// The C entry points, one per storage dtype; they return 0, or 1 for an unsupported shape.
#define FORKSERVE_ENTRY(NAME, T)                                                                 \
    extern "C" int NAME(const T *q, const T *k_cache, const T *v_cache, int64_t num_slots,         \
                        const int64_t *req_to_token, int64_t r2t_stride, const int64_t *rows,     \
                        const int64_t *prefix, const int64_t *q_start, const int64_t *token_req,  \
                        int64_t num_tokens, int64_t num_heads, int64_t kv_heads, int64_t dim,     \
                        float scale, int64_t max_keys, T *out, int num_threads) {                 \
        const Batch bt{num_slots, r2t_stride, num_tokens, num_heads, kv_heads, dim, max_keys,     \
                       req_to_token, rows, prefix, q_start, token_req, scale};                     \
        return paged_attention(bt, q, k_cache, v_cache, out, num_threads, nullptr);               \
    }

FORKSERVE_ENTRY(paged_attention_f32, float)
FORKSERVE_ENTRY(paged_attention_bf16, Bf16)

// Requests with at least `tokens` query tokens in a step go to the AMX kernel where it
// applies (the initial 16; a very large value keeps them all on AVX-512); returns the
// previous setting.
extern "C" int64_t paged_attention_set_amx_min_tokens(int64_t tokens) {
    const int64_t previous = amx_min_tokens;
    amx_min_tokens = tokens;
    return previous;
}

// bfloat16 row blocks (extend tasks, groups' shared keys) on the AVX2 kernel even where the
// AVX512-BF16 one exists, shared keys off AMX tiles included (for tests); returns the previous setting.
extern "C" int64_t paged_attention_set_bf16_rows_avx2(int64_t on) { return bf16_rows_avx2.exchange(on != 0) ? 1 : 0; }

// Decode tokens whose requests share at least `keys` first keys attend them in one task per
// group (a very large value: never; negative: each storage type's default), for either
// storage type; returns the previous setting.
extern "C" int64_t paged_attention_set_shared_min_keys(int64_t keys) {
    const int64_t previous = shared_min_keys;
    shared_min_keys = keys < 0 ? -1 : keys;
    return previous;
}

// The shared keys from which decode tokens are grouped now, for float32 K/V (`float32`
// nonzero) or bfloat16.
extern "C" int64_t paged_attention_shared_min_keys(int64_t float32) {
    return float32 ? shared_min_keys_for<float>() : shared_min_keys_for<Bf16>();
}

// ... in groups of at least `rows` query rows (tokens times query heads per KV head; at
// least 1); returns the previous setting.
extern "C" int64_t paged_attention_set_shared_min_rows(int64_t rows) {
    const int64_t previous = shared_min_rows;
    shared_min_rows = rows < 1 ? 1 : rows;
    return previous;
}

// Which decode tokens of a bfloat16 batch (the paged_attention arguments that describe it)
// attend their shared first keys together: group_of[t] the group of token t (-1: none) and
// keys[g] the keys group g shares; returns the number of groups (for tests and tools).
extern "C" int64_t paged_attention_shared_groups(int64_t num_slots, const int64_t *req_to_token, int64_t r2t_stride,
                                                 const int64_t *rows, const int64_t *prefix, const int64_t *q_start,
                                                 const int64_t *token_req, int64_t num_tokens, int64_t num_heads,
                                                 int64_t kv_heads, int64_t dim, int64_t *group_of, int64_t *keys) {
    const Batch bt{num_slots, r2t_stride, num_tokens, num_heads, kv_heads, dim, 0,
                   req_to_token, rows, prefix, q_start, token_req, 1.f};
    const SharedPlan plan = plan_shared_decodes<Bf16>(bt);
    for (int64_t t = 0; t < num_tokens; t++) group_of[t] = -1;
    for (size_t g = 0; g < plan.groups.size(); g++) {
        keys[g] = plan.groups[g].keys;
        for (int64_t tok : plan.groups[g].tokens) group_of[tok] = static_cast<int64_t>(g);
    }
    return static_cast<int64_t>(plan.groups.size());
}

// How many decode tokens the last call attended in groups (for tests).
extern "C" int64_t paged_attention_last_grouped_tokens() { return last_grouped_tokens.load(); }

// How many of the last bfloat16 call's shared-key tasks ran on AMX tiles (for tests).
extern "C" int64_t paged_attention_last_shared_on_tiles() { return last_shared_on_tiles.load(); }

#define FORKSERVE_STORE_KV(NAME, T)                                                                          \
    extern "C" int NAME(const T *k, int64_t k_stride, const T *v, int64_t v_stride, const int64_t *loc,       \
                        int64_t tokens, int64_t kv_heads, int64_t dim, T *k_cache, T *v_cache, int64_t num_slots, \
                        int num_threads) {                                                                      \
        return store_kv(k, k_stride, v, v_stride, loc, tokens, kv_heads, dim, k_cache, v_cache, num_slots,    \
                        num_threads);                                                                           \
    }

FORKSERVE_STORE_KV(store_kv_f32, float)
FORKSERVE_STORE_KV(store_kv_bf16, Bf16)
