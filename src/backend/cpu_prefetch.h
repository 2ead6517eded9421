// Asking for scattered cache rows a few lines at a time from inside compute
// loops. Decode reads its attention rows from DRAM (a layer's weights have
// streamed through every cache since the rows were last read); asked for all
// at once, a block's lines stall the core behind the outstanding misses, while
// a line or a few every few products overlap the reads with the arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>

namespace glm5::backend::cpu {

// Rows: anything with row(j) -> a pointer to row j's first byte.
template <class Rows>
class RowPrefetch {
  public:
    RowPrefetch(const Rows& rows, int64_t n, int64_t bytes)
        : rows_(rows), n_(n), lines_((bytes + 63) / 64) {}
    // Queues rows [j0, j0 + nr) (those below n), asked for over `steps` calls of step().
    void queue(int64_t j0, int64_t nr, int64_t steps) {
        row_ = std::min(j0, n_);
        end_ = std::min(j0 + nr, n_);
        line_ = 0;
        const int64_t total = (end_ - row_) * lines_;
        per_step_ = total > 0 ? (total + steps - 1) / std::max<int64_t>(steps, 1) : 0;
        if (row_ < end_) p_ = reinterpret_cast<const char*>(rows_.row(row_));
    }
    // Asks for the lines due at one step.
    void step() {
        for (int64_t k = 0; k < per_step_ && row_ < end_; ++k) {
            __builtin_prefetch(p_ + line_ * 64, 0, 3);
            if (++line_ == lines_) {
                line_ = 0;
                if (++row_ < end_) p_ = reinterpret_cast<const char*>(rows_.row(row_));
            }
        }
    }

  private:
    const Rows& rows_;
    int64_t n_, lines_;
    int64_t row_ = 0, end_ = 0, line_ = 0, per_step_ = 0;
    const char* p_ = nullptr;
};

}  // namespace glm5::backend::cpu
