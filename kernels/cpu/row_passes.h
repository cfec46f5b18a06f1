// How the packed GEMMs (linear_f32.cpp, linear_bf16.cpp) go over a product: its input rows
// in passes of `step` rows (a pass's inputs stay in cache while every weight panel is
// multiplied against them), each pass's rows cut into register tiles by the kernel's own
// rule, and each pass's panels shared out between the OpenMP team by StealingRanges (a
// contiguous range per thread, in address order, its end up for grabs, so that a thread
// another process preempts does not stall the others at the barrier).
#pragma once

#include <cstdint>
#include <vector>

#include "stealing_ranges.h"

namespace forkserve {

// A register tile: rows [start, start + n).
struct RowTile {
    int64_t start, n;
};

class RowPasses {
  public:
    // add_tiles(r0, r1, tiles) appends the register tiles of rows [r0, r1) to `tiles`.
    template <typename AddTiles>
    RowPasses(int64_t rows, int64_t step, int64_t panels, int threads, AddTiles add_tiles) {
        const int64_t passes = (rows + step - 1) / step;
        panels_.reserve(static_cast<size_t>(passes));
        for (int64_t pass = 0; pass < passes; pass++) {
            panels_.emplace_back(panels, threads);
            first_.push_back(static_cast<int64_t>(tiles_.size()));
            add_tiles(pass * step, (pass + 1) * step < rows ? (pass + 1) * step : rows, tiles_);
        }
        first_.push_back(static_cast<int64_t>(tiles_.size()));
    }

    // Every pass's tiles, in order.
    const std::vector<RowTile> &tiles() const { return tiles_; }

    // For thread t of the team, pass after pass: multiply(p, tiles, count) for each panel p
    // the thread takes, with that pass's `count` tiles.
    template <typename Multiply>
    void run(int t, Multiply multiply) {
        for (size_t pass = 0; pass < panels_.size(); pass++) {
            const RowTile *pass_tiles = tiles_.data() + first_[pass];
            const int64_t count = first_[pass + 1] - first_[pass];
            for (int64_t p = panels_[pass].next(t); p >= 0; p = panels_[pass].next(t)) multiply(p, pass_tiles, count);
        }
    }

  private:
    std::vector<StealingRanges> panels_;  // per pass
    std::vector<RowTile> tiles_;
    std::vector<int64_t> first_;  // pass i's tiles: [first_[i], first_[i + 1])
};

}  // namespace forkserve
