// Importance matrices: per weight matrix, the mean squared activation of each input column,
// which the low-bit quantizers weigh their errors by. Files are llama.cpp's, read and
// written both ways: the GGUF form llama-imatrix writes today (tensors NAME.in_sum2
// [cols, n_mat] and NAME.counts [1, n_mat], keys imatrix.datasets / chunk_count /
// chunk_size) and the legacy .dat form older tools wrote and read.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace glm5::quantize {

// One matrix's statistics as llama-imatrix keeps them: for n_mat blocks of `cols` columns
// (one block per expert or per head slice of a stack, one for a plain matrix), the sum of
// the squared inputs over the rows each block saw, and how many rows those were: one count
// for every block (a plain matrix, per-head slices that all see every row) or one per
// block (routed experts, each seeing the tokens routed to it).
struct ImatrixEntry {
    int64_t cols = 0;
    std::vector<double> sums;     // n_mat * cols
    std::vector<int64_t> counts;  // 1 or n_mat
    int64_t n_mat() const { return cols > 0 ? int64_t(sums.size()) / cols : 0; }
    int64_t count(int64_t mat) const { return counts.size() == 1 ? counts[0] : counts[mat]; }
};

struct Imatrix {
    std::map<std::string, ImatrixEntry> entries;  // by weight name (file order: sorted)
    std::vector<std::string> datasets;            // the calibration files, in order
    uint32_t chunk_count = 0;                     // chunks of chunk_size tokens seen
    uint32_t chunk_size = 0;                      // 0 in a legacy file
    // Read from a legacy file: a sum there is the mean times the call count, and the count
    // is that call count (a count of 0 means the sums are the means).
    bool legacy = false;

    // Reads either form (told apart by the GGUF magic). Throws glm5::Error naming the file
    // and what is wrong with it.
    static Imatrix read(const std::string& path);
    void write_gguf(const std::string& path) const;
    // The legacy form, as llama-imatrix --output-format dat writes it: a block no row
    // reached stores 1s (its sums would otherwise read as zero importance).
    void write_legacy(const std::string& path) const;

    // The entry of matrix `name`, or null.
    const ImatrixEntry* find(const std::string& name) const {
        const auto it = entries.find(name);
        return it == entries.end() ? nullptr : &it->second;
    }

    // What quantizing `name` weighs its columns by: per block, each column's mean squared
    // input (sums / count; 1 for a block no row reached, as llama-quantize does). n_mat *
    // cols values, or nullopt when the file has no entry for the matrix.
    std::optional<std::vector<float>> weights(const std::string& name) const;

    // Adds another run's statistics (a resumed collection, or several files merged): sums
    // and counts add, datasets append, chunk counts add. Both must be in the GGUF form and
    // agree on each shared matrix's shape.
    void merge(const Imatrix& other);
};

// Watches the products of a CPU forward (backend::ProductObserver) and accumulates each
// matrix's squared inputs the way llama-imatrix does: the trunk's matrices ("blk.*", and
// "output.weight" when asked), every row the product sees.
class ImatrixCollector : public backend::ProductObserver {
  public:
    explicit ImatrixCollector(bool include_output = false) : include_output_(include_output) {}
    void dense(const std::string& name, const backend::Weight& w, const float* x, int64_t stride,
               int64_t slice_stride, int64_t n_rows) override;
    void routed(const std::string& name, const backend::Weight& w, int64_t slice, const float* x,
                int64_t stride, int64_t n_rows) override;

    Imatrix& data() { return data_; }
    const Imatrix& data() const { return data_; }

  private:
    bool wanted(const std::string& name) const;
    ImatrixEntry& entry(const std::string& name, const backend::Weight& w, bool per_slice);

    bool include_output_;
    std::mutex mu_;
    Imatrix data_;
};

}  // namespace glm5::quantize
