// Which decode tokens of a step begin with the same keys: requests forked from one prompt
// (tree-of-thought branches, parallel samples) or chats on one system prompt hold their
// common prefix once in the radix cache, so their request-to-token rows start with the same
// pool slots. paged_attention.cpp attends such a prefix once for the whole group
// (attend_shared) instead of once per token.
//
// The rows are sorted lexicographically by slots, so that requests sharing a prefix are
// neighbours and the common prefix of any run of them is the smallest common prefix of its
// neighbouring pairs. A dynamic program then cuts the sorted list into runs of `min_tokens`
// to `max_tokens` requests (enough rows to pay for the group, no more than one task holds)
// or single requests, maximising the key rows saved, (tokens - 1) * shared keys per run:
// this keeps tree-of-thought leaves grouped by their long question rather than lumped with
// other programs over a short system prompt.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "paged_batch.h"

namespace forkserve {

std::vector<SharedRows> find_shared_prefixes(const Batch &bt, const std::vector<int64_t> &reqs, int64_t min_keys,
                                             int64_t min_tokens, int64_t max_tokens) {
    struct Row {
        const int64_t *slots;
        int64_t keys, tok;  // keys before the token's own (the most it can share); its query token
    };
    std::vector<Row> sorted;
    min_keys = std::max<int64_t>(min_keys, 1);
    for (int64_t b : reqs)
        if (bt.prefix[b] >= min_keys) sorted.push_back({bt.req_to_token + bt.rows[b] * bt.r2t_stride, bt.prefix[b], bt.q_start[b]});
    std::vector<SharedRows> groups;
    const int64_t n = static_cast<int64_t>(sorted.size());
    min_tokens = std::max<int64_t>(min_tokens, 2);
    if (n < min_tokens || max_tokens < min_tokens) return groups;
    std::sort(sorted.begin(), sorted.end(), [](const Row &x, const Row &y) {  // by slots, then token
        const int64_t most = std::min(x.keys, y.keys);
        const auto [a, b] = std::mismatch(x.slots, x.slots + most, y.slots);
        if (a != x.slots + most) return *a < *b;
        return x.keys != y.keys ? x.keys < y.keys : x.tok < y.tok;
    });
    // common[i]: how many first keys sorted rows i - 1 and i share.
    std::vector<int64_t> common(static_cast<size_t>(n), 0);
    for (int64_t i = 1; i < n; i++) {
        const Row &x = sorted[i - 1], &y = sorted[i];
        common[i] = std::mismatch(x.slots, x.slots + std::min(x.keys, y.keys), y.slots).first - x.slots;
    }
    // saved[i]: the most key rows saved by grouping the first i rows; start[i]: where the
    // run ending at row i - 1 starts in that grouping (i - 1: row i - 1 alone).
    std::vector<int64_t> saved(static_cast<size_t>(n + 1), 0), start(static_cast<size_t>(n + 1), 0);
    for (int64_t i = 1; i <= n; i++) {
        saved[i] = saved[i - 1];
        start[i] = i - 1;
        int64_t keys = sorted[i - 1].keys;
        for (int64_t j = i - 2; j >= 0 && i - j <= max_tokens; j--) {
            keys = std::min(keys, common[j + 1]);
            if (keys < min_keys) break;
            if (i - j < min_tokens) continue;
            const int64_t gain = saved[j] + (i - j - 1) * keys;
            if (gain > saved[i]) {
                saved[i] = gain;
                start[i] = j;
            }
        }
    }
    for (int64_t i = n; i > 0; i = start[i]) {
        const int64_t j = start[i];
        if (i - j < 2) continue;
        SharedRows group{sorted[j].slots, sorted[j].keys, 1, {}, {}};
        for (int64_t r = j; r < i; r++) {
            group.tokens.push_back(sorted[r].tok);
            if (r > j) group.keys = std::min(group.keys, common[r]);
        }
        groups.push_back(std::move(group));
    }
    return groups;
}

}  // namespace forkserve
