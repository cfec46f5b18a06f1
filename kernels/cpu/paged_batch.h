// What the paged-attention kernels share: the step's batch as they read it (which keys each
// query token sees, through the request-to-token table), one extend task, and the row
// prefetch that keeps scattered pool rows coming.
#pragma once

#include <cstdint>

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

// Query tokens [tok, tok + count) of one request against KV head h; count 0 means the one
// token `tok` on the per-token path.
struct ExtendTask {
    int64_t tok, count, h;
};

// Locality 3 asks for L1; 2 for L2, where a request can wait longer without crowding L1.
template <int kLocality = 3, typename T>
inline void prefetch_row(const T *row, int64_t n) {
    const char *p = reinterpret_cast<const char *>(row);
    for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off, 0, kLocality);
}

// Extends in bfloat16 by row blocks (attention_rows.cpp): whether this build and head size
// have them, how many of a request's tokens one task takes, and one task.
bool attend_rows_supported(int64_t dim);
int64_t attend_rows_tokens(int64_t group, int64_t dim);
void attend_rows(const Batch &bt, const Bf16 *q, const Bf16 *k_cache, const Bf16 *v_cache, Bf16 *out,
                 const ExtendTask &task);

}  // namespace forkserve
