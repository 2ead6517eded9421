// A layer split across the ranks of an MPI job. Rank 0 holds a SplitModel: a
// model::Model that runs its own layers and drives the other ranks, which
// hold theirs (model::LoadOptions::layers) and serve rank 0's commands in
// serve_rank(). The engine above sees one model: every state operation is
// mirrored on every rank, and a forward runs the ranks' spans in order, the
// residual rows moving rank to rank, the logits coming back from the last.
// With several sequences, a forward is cut into micro-batches of sequences
// that follow each other through the ranks (a pipeline: rank 1 runs the first
// while rank 0 runs the second).
//
// A forward commits only when every rank's span succeeded: every rank runs
// uncommitted and commits on rank 0's word, so a failed forward changes no
// rank's state. Every wait has a deadline (Comm); a rank that
// misses one ends the job with a message naming it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/memory.h"
#include "dist/comm.h"
#include "model/model.h"

namespace glm5::dist {

// What a rank reports about itself once loaded.
struct RankInfo {
    int64_t layer_first = 0, layer_end = 0;
    bool head = false;
    bool can_draft = false;
    uint64_t weight_bytes = 0, mapped_bytes = 0, copied_bytes = 0;
    model::StateCost cost;
    uint64_t available = 0;  // its MemoryAvailable::bytes (0: unknown)
    uint64_t process = 0;    // its anonymous memory after loading
};
RankInfo describe_rank(const model::Model& m, uint64_t available, uint64_t process);

class SplitModel final : public model::Model {
  public:
    // ranks[r]: what rank r reported (ranks[0] is this process's `local`).
    // micro_batches: a forward's sequences are cut into up to this many
    // groups that follow each other through the ranks, so that the ranks
    // work at once (1: one batch, the ranks take turns).
    // tensor_parallel: every rank holds every layer with a share of its heads
    // (LoadOptions::tp_*) and runs every forward whole, the partial sums
    // meeting in a TensorReducer; otherwise a layer split.
    SplitModel(Comm& comm, std::unique_ptr<model::Model> local, std::vector<RankInfo> ranks,
               int micro_batches, bool tensor_parallel = false);
    ~SplitModel() override;  // tells the other ranks to end

    std::unique_ptr<model::SequenceState> new_state(int64_t n_ctx, int64_t capacity) override;
    // The plan is made for the tightest rank: every cost is the largest any
    // rank has (worst_memory() gives the matching memory figures).
    model::StateCost state_cost() const override;
    model::StateCost layer_cost(int64_t il) const override { return local_->layer_cost(il); }
    size_t scratch_bytes(int64_t rows, int64_t logit_rows, int64_t depth) const override {
        return local_->scratch_bytes(rows, logit_rows, depth);
    }
    // The whole model only (span must be the default LayerSpan).
    void forward(std::span<const model::SeqInput> inputs, std::vector<float>& logits,
                 const model::LayerSpan& span) override;
    void commit(std::span<const model::SeqInput>) override;
    int64_t hidden_width() const override { return local_->hidden_width(); }
    bool can_split_before(int64_t) const override { return false; }
    bool can_draft() const override { return ranks_.back().can_draft; }
    void draft(std::span<model::DraftRequest> reqs) override;

    // The smallest available memory and the largest process size of any rank.
    void worst_memory(MemoryAvailable& avail, uint64_t& process) const;
    const std::vector<RankInfo>& ranks() const { return ranks_; }
    // Every rank's counters since the last reset (rank 0's own first): its
    // exchanges and the weight bytes its kernels read.
    struct RankCounters {
        CommStats comm;
        uint64_t weight_bytes = 0;
    };
    std::vector<RankCounters> counters(bool reset);

    // (SplitState and SplitSnapshot call these.)
    void state_op(uint8_t op, uint64_t id, int64_t a, int64_t b, bool ack, uint64_t c = 0);

  private:
    void wait_acks(const char* what);
    // Every other rank's reply to the last command, in rank order: the first
    // failure (`error`, this rank's, before any), naming its rank; "" if none.
    std::string collect(std::string error);
    // A forward's end: throws `error` (no rank commits), or commits on every rank.
    void finish(const std::string& error, std::span<const model::SeqInput> local,
                std::vector<float>& logits);
    std::vector<int> workers() const;

    Comm& comm_;
    std::unique_ptr<model::Model> local_;
    std::vector<RankInfo> ranks_;
    uint64_t next_id_ = 1;
    int micro_batches_ = 1;
    bool tp_ = false;
    std::recursive_mutex mu_;  // one exchange at a time
};

// The loop of every rank but 0: serves rank 0's commands on `local` until
// rank 0 ends the job; returns the process's exit code.
int serve_rank(Comm& comm, model::Model& local, bool tensor_parallel = false);

// Tensor parallelism's sum: every rank sends its partial rows to every other
// and adds all of them in rank order, so every rank has the same bits and
// the result does not depend on timing (MPI's reductions have no fixed order).
class TensorReducer final : public backend::Reducer {
  public:
    explicit TensorReducer(Comm& comm) : comm_(comm) {}
    void sum(float* x, int64_t n) override;

  private:
    Comm& comm_;
};

// Setup exchanges before the model exists: every rank's verdict on a step
// (empty: fine) reaches rank 0, which answers every rank with the first
// failure (naming its rank) or nothing; all ranks then go on or throw alike.
void agree(Comm& comm, const std::string& mine, const char* step);
// The same for values every rank must share (the file's identity): rank 0
// refuses what differs from its own.
void agree_identity(Comm& comm, const std::string& identity, const std::string& what);
// Workers send their RankInfo; rank 0 receives them all.
std::vector<RankInfo> exchange_rank_info(Comm& comm, const RankInfo& mine);

}  // namespace glm5::dist
