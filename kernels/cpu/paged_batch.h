// What the paged-attention kernels share: the step's batch as they read it (which keys each
// query token sees, through the request-to-token table), its tasks, decode tokens sharing
// their first keys and the partial softmaxes they leave, and the row prefetch that keeps
// scattered pool rows coming.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "bf16.h"

namespace forkserve {

// Query token t belongs to request b = token_req[t]; it is token t - q_start[b] of that
// request's new tokens and sees the request's first prefix[b] + (t - q_start[b]) + 1 keys,
// at slots req_to_token[rows[b] * r2t_stride + 0 ..].
struct Batch {
    int64_t num_slots, r2t_stride, num_tokens, num_heads, kv_heads, dim, max_keys;
    const int64_t *req_to_token, *rows, *prefix, *q_start, *token_req;
    float scale;
};

// Decode tokens whose requests begin with the same `keys` pool slots (forks of one prompt,
// chats on one system prompt; `slots` is any member's row). Those keys are attended once for
// all of the tokens' query rows, in `chunks` tasks per KV head (consecutive key ranges), each
// token's own keys separately, and the parts merged: token tokens[i]'s parts are
// first_part[i] + c for chunk c, then first_part[i] + chunks for its own keys.
struct SharedRows {
    const int64_t *slots;
    int64_t keys, chunks;
    std::vector<int64_t> tokens, first_part;
    int64_t chunk_begin(int64_t c) const { return keys * c / chunks; }
};

// Per row r of a part (r = part * num_heads + head), a softmax over some of a query row's
// keys, not yet normalised: acc[r * dim ..] the sum of e^(s - best[r]) * value and total[r]
// that of e^(s - best[r]), for the scaled scores s (a NaN total: a NaN score).
struct PartialRows {
    float *acc, *best, *total;
};

// One task of a step's attention, against KV head h: query tokens [tok, tok + count) of one
// request (count > 0); the one token `tok` (count 0); or, `shared` set, chunk `chunk` of a
// group's shared keys.
struct AttendTask {
    int64_t tok, count, h;
    const SharedRows *shared = nullptr;
    int64_t chunk = 0;
};

// One row-block task of the vector kernels (attention_rows.cpp, attention_rows_avx2.cpp),
// resolved from the batch: query token i of the task is tokens[i] (or first_token + i where
// tokens is null); row m is query head h * group + m % group of token m / group. Its keys are
// at slots[0 ..]: causal, token i sees the first first + i + 1 of them (keys = first + count);
// else every token sees all `keys`. Results: normalised rows into `out`, or, where out is
// null, each row's unnormalised softmax into part parts[i] + chunk of `partial`.
template <typename T>
struct RowsJob {
    int64_t h, count;
    const int64_t *tokens;
    int64_t first_token;
    const int64_t *slots;
    int64_t first, keys;
    bool causal;
    T *out;
    PartialRows partial;
    const int64_t *parts;
    int64_t chunk;
    int64_t token(int64_t i) const { return tokens != nullptr ? tokens[i] : first_token + i; }

    // Where row m's normalised output goes (out set), with `group` query heads per KV head.
    T *out_row(const Batch &bt, int64_t m, int64_t group) const {
        return out + (token(m / group) * bt.num_heads + h * group + m % group) * bt.dim;
    }

    // Row m's softmax so far into its part of `partial` (out null): its unnormalised sums, its
    // reference `best` in nats of scaled scores and its `total`, NaN where the row saw a NaN score.
    void leave_partial(const Batch &bt, int64_t m, int64_t group, const float *sums, float best, float total,
                       bool nan) const {
        const int64_t row = (parts[m / group] + chunk) * bt.num_heads + h * group + m % group;
        std::memcpy(partial.acc + row * bt.dim, sums, sizeof(float) * bt.dim);
        partial.best[row] = best;
        partial.total[row] = nan ? std::numeric_limits<float>::quiet_NaN() : total;
    }

    // An extend task: `task.count` consecutive query tokens of one request, causal.
    static RowsJob extend(const Batch &bt, const AttendTask &task, T *out) {
        const int64_t b = bt.token_req[task.tok];
        const int64_t first = bt.prefix[b] + (task.tok - bt.q_start[b]);  // keys the first token sees, less one
        return {task.h, task.count, nullptr, task.tok, bt.req_to_token + bt.rows[b] * bt.r2t_stride,
                first, first + task.count, true, out, {}, nullptr, 0};
    }

    // Chunk `chunk` of a group's shared keys, for every token of the group, into `partial`.
    static RowsJob shared_keys(const SharedRows &shared, int64_t chunk, int64_t h, const PartialRows &partial) {
        const int64_t begin = shared.chunk_begin(chunk), keys = shared.chunk_begin(chunk + 1) - begin;
        return {h, static_cast<int64_t>(shared.tokens.size()), shared.tokens.data(), 0, shared.slots + begin,
                keys - 1, keys, false, nullptr, partial, shared.first_part.data(), chunk};
    }
};

// Locality 3 asks for L1; 2 for L2, where a request can wait longer without crowding L1.
template <int kLocality = 3, typename T>
inline void prefetch_row(const T *row, int64_t n) {
    const char *p = reinterpret_cast<const char *>(row);
    for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off, 0, kLocality);
}

// Extends in bfloat16 by row blocks on AVX512-BF16 (attention_rows.cpp): whether this build
// and head size have them, how many query tokens one task takes, one extend task, and the
// shared keys of a group of decode tokens (no more tokens than attend_rows_tokens) into
// `partial`.
bool attend_rows_supported(int64_t dim);
int64_t attend_rows_tokens(int64_t group, int64_t dim);
void attend_rows(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, Bf16 *out,
                 const AttendTask &task);
void attend_shared(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, const SharedRows &shared,
                   int64_t chunk, int64_t h, const PartialRows &partial);

// The same on 8-lane AVX2 float32 FMAs (attention_rows_avx2.cpp), for both storage types:
// where bfloat16 has no AVX512-BF16 kernel, and for float32 everywhere. No task takes more
// than attend_rows_avx2_tokens query tokens (or shared tokens).
bool attend_rows_avx2_supported(int64_t dim);
int64_t attend_rows_avx2_tokens(int64_t group);
template <typename T>
void attend_rows_avx2(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, const AttendTask &task);
template <typename T>
void attend_shared_avx2(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, const SharedRows &shared,
                        int64_t chunk, int64_t h, const PartialRows &partial);

// The same shared keys on AMX tiles (attention_amx.cpp): false, having done nothing, where this
// build, process or head size has none (or paged_attention_set_shared_on_tiles turned them off).
bool attend_shared_amx(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache,
                       const SharedRows &shared, int64_t chunk, int64_t h, const PartialRows &partial);

// A step's groups of decode tokens sharing their first keys, chunks and parts laid out, and
// how many parts in all (paged_attention.cpp). The same for every layer of the step, so the
// decoder layers find it once (a layer whose AMX kernel took a grouped token, which only a
// test's one-token AMX threshold makes happen, plans again without it).
struct SharedPlan {
    std::vector<SharedRows> groups;
    int64_t parts = 0;
};
// T: the storage type (float or Bf16), which decides the row kernel and so the group sizes.
template <typename T>
SharedPlan plan_shared_decodes(const Batch &bt, const std::vector<bool> &on_amx = {});
template <typename T>
int paged_attention_planned(const Batch &bt, const T *q, const T *k_cache, const T *v_cache, T *out, int num_threads,
                            const SharedPlan &plan);

// The decode requests `reqs` (one query token each) in groups of `min_tokens` to `max_tokens`
// whose first `min_keys` or more keys are the same slots (shared_prefix.cpp); `tokens`,
// `slots` and `keys` set.
std::vector<SharedRows> find_shared_prefixes(const Batch &bt, const std::vector<int64_t> &reqs, int64_t min_keys,
                                             int64_t min_tokens, int64_t max_tokens);

}  // namespace forkserve
