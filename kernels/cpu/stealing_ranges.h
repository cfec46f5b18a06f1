// Items [0, count) for an OpenMP team: each thread owns a contiguous range and takes it front
// to back; a thread whose range is used up takes the other threads' items from the back of
// theirs. A thread that another process preempts mid-loop (on 2 cores: the HTTP server, the
// detokenizer, the client) thereby leaves its untaken items to the others instead of making
// them wait for it at the loop's barrier, while an undisturbed team still streams each
// range in address order, as a static split does. One compare-and-swap per item.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace forkserve {

class StealingRanges {
  public:
    StealingRanges(int64_t count, int threads) : ranges_(static_cast<size_t>(threads > 0 ? threads : 1)) {
        const int64_t n = static_cast<int64_t>(ranges_.size());
        for (int64_t t = 0; t < n; t++)
            ranges_[t].bounds.store(pack(count * t / n, count * (t + 1) / n), std::memory_order_relaxed);
    }

    // The next item for thread t: its own, else one taken from another range's back; -1
    // when every item is taken.
    int64_t next(int t) {
        const int64_t n = static_cast<int64_t>(ranges_.size());
        int64_t item = take(ranges_[t % n], true);
        for (int64_t k = 1; item < 0 && k < n; k++) item = take(ranges_[(t + k) % n], false);
        return item;
    }

  private:
    struct alignas(64) Range {
        std::atomic<uint64_t> bounds{0};  // the first untaken item in the high 32 bits, the end in the low
    };

    static uint64_t pack(int64_t front, int64_t end) {
        return static_cast<uint64_t>(front) << 32 | static_cast<uint32_t>(end);
    }

    static int64_t take(Range &r, bool from_front) {
        uint64_t seen = r.bounds.load(std::memory_order_relaxed);
        while (true) {
            const int64_t front = static_cast<int64_t>(seen >> 32), end = static_cast<int64_t>(seen & 0xFFFFFFFFu);
            if (front >= end) return -1;
            const uint64_t want = from_front ? pack(front + 1, end) : pack(front, end - 1);
            if (r.bounds.compare_exchange_weak(seen, want, std::memory_order_acq_rel, std::memory_order_relaxed))
                return from_front ? front : end - 1;
        }
    }

    std::vector<Range> ranges_;
};

}  // namespace forkserve
