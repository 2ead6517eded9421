#include "dist/split_model.h"

#include <algorithm>
#include <atomic>

#include "core/log.h"

namespace glm5::dist {

namespace {

// Message tags.
constexpr int kCmd = 11;     // rank 0 -> every other rank: the next command
constexpr int kHidden = 12;  // rank r -> r + 1: the residual rows leaving r's layers
constexpr int kDone = 13;    // rank r -> 0: how r's part of a command went
constexpr int kSetup = 14;   // before the model exists: verdicts, identities, RankInfo
constexpr int kReduce = 15;  // tensor parallel: partial sums, every rank to every rank

// Commands.
enum Op : uint8_t {
    kNewState = 1,
    kDropState,
    kReset,
    kRewind,
    kResize,
    kSnapshot,
    kRestore,
    kDropSnap,
    kForward,
    kCommit,
    kDraft,
    kStats,
    kShutdown,
    kCopyPrefix,
};

void put_info(Wire& w, const RankInfo& r) {
    w.put(r.layer_first).put(r.layer_end).put(uint8_t(r.head)).put(uint8_t(r.can_draft));
    w.put(r.weight_bytes).put(r.mapped_bytes).put(r.copied_bytes);
    w.put(r.cost).put(r.available).put(r.process);
}

RankInfo get_info(Wire& w) {
    RankInfo r;
    r.layer_first = w.get<int64_t>();
    r.layer_end = w.get<int64_t>();
    r.head = w.get<uint8_t>() != 0;
    r.can_draft = w.get<uint8_t>() != 0;
    r.weight_bytes = w.get<uint64_t>();
    r.mapped_bytes = w.get<uint64_t>();
    r.copied_bytes = w.get<uint64_t>();
    r.cost = w.get<model::StateCost>();
    r.available = w.get<uint64_t>();
    r.process = w.get<uint64_t>();
    return r;
}

// A rank's reply: ok, or the reason it failed.
Wire reply(const std::string& error) {
    Wire w;
    w.put(uint8_t(error.empty() ? 1 : 0));
    if (!error.empty()) w.put_string(error);
    return w;
}

// Reads a reply's status; returns the error ("" when ok).
std::string status_of(Wire& w) {
    return w.get<uint8_t>() ? std::string() : w.get_string();
}

// A deadline that ends the job: the rank that missed it is named and every
// rank stops, since a layer split cannot go on without one of its parts.
[[noreturn]] void lost_rank(Comm& comm, const RankError& e) {
    log_info("glm5: rank %d: %s; ending the job\n", e.rank(), e.what());
    comm.abort(3);
}

// Where each micro-batch of a forward's inputs ends: up to `m` contiguous
// groups of sequences with about equal token counts (a token's logits do not
// depend on its batch, so the cut changes no bit).
std::vector<uint32_t> micro_batches(std::span<const model::SeqInput> inputs, int m) {
    size_t total = 0, seqs = 0;
    for (const auto& in : inputs) {
        total += in.tokens.size();
        seqs += !in.tokens.empty();
    }
    const size_t k = std::max<size_t>(1, std::min<size_t>(size_t(std::max(m, 1)), seqs));
    std::vector<uint32_t> ends;
    size_t done = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
        done += inputs[i].tokens.size();
        // Close a group once it holds its share, leaving a sequence for each
        // group still to come.
        if (ends.size() + 1 < k && !inputs[i].tokens.empty() &&
            done * k >= total * (ends.size() + 1))
            ends.push_back(uint32_t(i + 1));
    }
    ends.push_back(uint32_t(inputs.size()));
    return ends;
}

class SplitSnapshot;

class SplitState final : public model::SequenceState {
  public:
    SplitState(SplitModel& m, uint64_t id, std::unique_ptr<model::SequenceState> local)
        : m_(m), id_(id), local_(std::move(local)) {}
    ~SplitState() override { m_.state_op(kDropState, id_, 0, 0, false); }

    int64_t n_past() const override { return local_->n_past(); }
    int64_t n_ctx() const override { return local_->n_ctx(); }
    void reset() override {
        local_->reset();
        m_.state_op(kReset, id_, 0, 0, false);
    }
    bool rewind(int64_t n) override {
        if (!local_->rewind(n)) return false;
        m_.state_op(kRewind, id_, n, 0, false);
        return true;
    }
    std::unique_ptr<model::StateSnapshot> snapshot() const override;
    void restore(const model::StateSnapshot& s) override;
    bool can_rewind(int64_t n) const override { return local_->can_rewind(n); }
    bool copy_prefix(const model::SequenceState& src, int64_t n,
                     const model::StateSnapshot* at) override;
    size_t memory_bytes() const override { return local_->memory_bytes(); }
    int64_t capacity() const override { return local_->capacity(); }
    void save(model::StateWriter&) const override {
        throw Error("saving a sequence is not supported with --layer-split or --tp");
    }
    void load(model::StateReader&) override {
        throw Error("restoring a sequence is not supported with --layer-split or --tp");
    }
    void resize(int64_t rows) override {
        local_->resize(rows);
        m_.state_op(kResize, id_, rows, 0, true);
    }

    uint64_t id() const { return id_; }
    model::SequenceState& local() const { return *local_; }

  private:
    SplitModel& m_;
    uint64_t id_;
    std::unique_ptr<model::SequenceState> local_;
    friend class SplitSnapshot;
};

class SplitSnapshot final : public model::StateSnapshot {
  public:
    SplitSnapshot(SplitModel& m, uint64_t id, const SplitState* owner,
                  std::unique_ptr<model::StateSnapshot> local)
        : m_(m), id_(id), owner_(owner), local_(std::move(local)) {}
    ~SplitSnapshot() override { m_.state_op(kDropSnap, id_, 0, 0, false); }
    int64_t n_past() const override { return local_->n_past(); }

    SplitModel& m_;
    uint64_t id_;
    const SplitState* owner_;
    std::unique_ptr<model::StateSnapshot> local_;
};

std::atomic<uint64_t> g_next_snapshot{uint64_t(1) << 62};  // ids apart from the states'

std::unique_ptr<model::StateSnapshot> SplitState::snapshot() const {
    auto local = local_->snapshot();
    const uint64_t sid = g_next_snapshot++;
    m_.state_op(kSnapshot, id_, int64_t(sid), 0, true);
    return std::make_unique<SplitSnapshot>(m_, sid, this, std::move(local));
}

void SplitState::restore(const model::StateSnapshot& s) {
    auto* snap = dynamic_cast<const SplitSnapshot*>(&s);
    if (!snap || snap->owner_ != this) throw Error("restore: snapshot of another sequence");
    local_->restore(*snap->local_);
    m_.state_op(kRestore, id_, int64_t(snap->id_), 0, false);
}

bool SplitState::copy_prefix(const model::SequenceState& src_, int64_t n,
                             const model::StateSnapshot* at) {
    auto* src = dynamic_cast<const SplitState*>(&src_);
    auto* snap = dynamic_cast<const SplitSnapshot*>(at);
    if (!src || (at && (!snap || snap->owner_ != src))) return false;
    if (!local_->copy_prefix(*src->local_, n, snap ? snap->local_.get() : nullptr)) return false;
    m_.state_op(kCopyPrefix, id_, int64_t(src->id_), n, true, snap ? snap->id_ : 0);
    return true;
}

}  // namespace

RankInfo describe_rank(const model::Model& m, uint64_t available, uint64_t process) {
    const model::ModelInfo& i = m.info();
    RankInfo r;
    r.layer_first = i.layer_first;
    r.layer_end = i.layer_end;
    r.head = i.holds_head;
    r.can_draft = m.can_draft();
    r.weight_bytes = i.weight_bytes;
    r.mapped_bytes = i.mapped_bytes;
    r.copied_bytes = i.copied_bytes;
    r.cost = m.state_cost();
    r.available = available;
    r.process = process;
    return r;
}

// ---- rank 0

SplitModel::SplitModel(Comm& comm, std::unique_ptr<model::Model> local, std::vector<RankInfo> ranks,
                       int micro_batches, bool tensor_parallel)
    : Model(&local->backend()),
      comm_(comm),
      local_(std::move(local)),
      ranks_(std::move(ranks)),
      micro_batches_(tensor_parallel ? 1 : std::max(1, micro_batches)),
      tp_(tensor_parallel) {
    info_ = local_->info();
    info_.layer_first = 0;
    info_.layer_end = info_.n_layer;
    info_.holds_head = true;
    info_.nextn_loaded = ranks_.back().can_draft;
    info_.weight_bytes = info_.mapped_bytes = info_.copied_bytes = 0;
    info_.skipped_bytes = 0;
    for (const RankInfo& r : ranks_) {
        info_.weight_bytes += r.weight_bytes;
        // The plan is per rank: the largest any rank maps or copies.
        info_.mapped_bytes = std::max(info_.mapped_bytes, r.mapped_bytes);
        info_.copied_bytes = std::max(info_.copied_bytes, r.copied_bytes);
    }
}

SplitModel::~SplitModel() {
    try {
        Wire w;
        w.put(uint8_t(kShutdown));
        comm_.send_all(workers(), kCmd, w.bytes());
    } catch (const RankError& e) {
        log_info("glm5: could not end rank %d cleanly: %s\n", e.rank(), e.what());
    }
}

std::vector<int> SplitModel::workers() const {
    std::vector<int> w;
    for (int r = 1; r < comm_.size(); ++r) w.push_back(r);
    return w;
}

model::StateCost SplitModel::state_cost() const {
    model::StateCost c;
    for (const RankInfo& r : ranks_) {
        c.per_token = std::max(c.per_token, r.cost.per_token);
        c.per_pool = std::max(c.per_pool, r.cost.per_pool);
        c.pool = std::max(c.pool, r.cost.pool);
        c.fixed = std::max(c.fixed, r.cost.fixed);
        c.snapshot = std::max(c.snapshot, r.cost.snapshot);
        c.per_kept_row = std::max(c.per_kept_row, r.cost.per_kept_row);
    }
    return c;
}

void SplitModel::worst_memory(MemoryAvailable& avail, uint64_t& process) const {
    for (const RankInfo& r : ranks_) {
        if (r.available && (avail.bytes == 0 || r.available < avail.bytes)) {
            avail.bytes = r.available;
            avail.source = "the smallest of the ranks'";
        }
        process = std::max(process, r.process);
    }
}

std::string SplitModel::collect(std::string error) {
    for (int r = 1; r < comm_.size(); ++r) {
        Wire w(comm_.recv(r, kDone, comm_.timeout()));
        const std::string e = status_of(w);
        if (!e.empty() && error.empty()) error = "rank " + std::to_string(r) + ": " + e;
    }
    return error;
}

void SplitModel::finish(const std::string& error, std::span<const model::SeqInput> local,
                        std::vector<float>& logits) {
    if (!error.empty()) {
        logits.clear();
        throw Error(error);
    }
    local_->commit(local);
    Wire c;
    c.put(uint8_t(kCommit));
    comm_.send_all(workers(), kCmd, c.bytes());
}

void SplitModel::wait_acks(const char* what) {
    const std::string first = collect("");
    if (!first.empty()) throw Error(std::string(what) + " failed on " + first);
}

void SplitModel::state_op(uint8_t op, uint64_t id, int64_t a, int64_t b, bool ack, uint64_t c) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Wire w;
    w.put(op).put(id).put(a).put(b).put(c);
    try {
        comm_.send_all(workers(), kCmd, w.bytes());
        if (ack)
            wait_acks(op == kNewState     ? "a new sequence"
                      : op == kResize     ? "resizing a sequence"
                      : op == kCopyPrefix ? "copying a prefix"
                                          : "a snapshot");
    } catch (const RankError& e) {
        lost_rank(comm_, e);
    }
}

std::unique_ptr<model::SequenceState> SplitModel::new_state(int64_t n_ctx, int64_t capacity) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto local = local_->new_state(n_ctx, capacity);
    const uint64_t id = next_id_++;
    try {
        state_op(kNewState, id, n_ctx, capacity, true);
    } catch (const Error&) {
        state_op(kDropState, id, 0, 0, false);  // the ranks that made it drop it
        throw;
    }
    return std::make_unique<SplitState>(*this, id, std::move(local));
}

void SplitModel::forward(std::span<const model::SeqInput> inputs, std::vector<float>& logits,
                         const model::LayerSpan& span) {
    if (span.first != 0 || span.end >= 0 || !span.commit)
        throw Error("a model split across ranks runs whole forwards only");
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<model::SeqInput> local(inputs.begin(), inputs.end());
    const std::vector<uint32_t> ends = micro_batches(inputs, micro_batches_);
    Wire cmd;
    cmd.put(uint8_t(kForward)).put(uint32_t(inputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto* st = dynamic_cast<const SplitState*>(inputs[i].state);
        if (!st) throw Error("layer split: sequence state of another model");
        local[i].state = &st->local();
        const model::SeqInput& in = inputs[i];
        cmd.put(st->id())
            .put(uint8_t((in.all_logits ? 1 : 0) | (in.logits ? 2 : 0)))
            .put(in.logits_from)
            .put_span(in.tokens);
    }
    cmd.put_span(std::span<const uint32_t>(ends));
    try {
        comm_.send_all(workers(), kCmd, cmd.bytes());
        if (tp_) {
            // Every rank runs the whole forward on its heads; the partial sums
            // meet inside it (TensorReducer). Committed once all succeeded.
            std::string error;
            try {
                local_->forward(local, logits, model::LayerSpan{0, -1, nullptr, nullptr, false});
            } catch (const std::exception& e) {
                error = e.what();
            }
            finish(collect(error), local, logits);
            return;
        }
        // This rank's layers for each micro-batch in turn, uncommitted until
        // every rank has succeeded; rank 1 starts on a micro-batch as soon as
        // it has been sent, while this rank goes on with the next.
        std::string error;
        uint32_t begin = 0;
        for (uint32_t end : ends) {
            std::vector<float> hidden, unused;
            if (error.empty()) {
                try {
                    model::HostRows out({}, &hidden);
                    model::LayerSpan mine{0, ranks_[0].layer_end, nullptr, &out, false};
                    local_->forward(std::span(local).subspan(begin, end - begin), unused, mine);
                } catch (const std::exception& e) {
                    error = e.what();
                }
            }
            Wire h = reply(error);
            if (error.empty()) h.put_span(std::span<const float>(hidden));
            comm_.isend(1, kHidden, h.bytes());
            begin = end;
        }
        // Every rank reports each micro-batch (each within the deadline of
        // the report before it, so a rank that stops is the one named); the
        // last brings the logits.
        const int N = comm_.size();
        logits.clear();
        for (size_t mb = 0; mb < ends.size(); ++mb)
            for (int r = 1; r < N; ++r) {
                Wire w(comm_.recv(r, kDone, comm_.timeout()));
                const std::string e = status_of(w);
                if (!e.empty() && error.empty()) error = "rank " + std::to_string(r) + ": " + e;
                if (e.empty() && r == N - 1) {
                    const std::vector<float> part = w.get_vector<float>();
                    logits.insert(logits.end(), part.begin(), part.end());
                }
            }
        comm_.flush();
        finish(error, local, logits);
    } catch (const RankError& e) {
        lost_rank(comm_, e);
    }
}

void SplitModel::commit(std::span<const model::SeqInput>) {
    throw Error("a model split across ranks commits its own forwards");
}

void SplitModel::draft(std::span<model::DraftRequest> reqs) {
    if (!can_draft()) Model::draft(reqs);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Wire cmd;
    cmd.put(uint8_t(kDraft)).put(uint32_t(reqs.size()));
    for (const model::DraftRequest& r : reqs) {
        const auto* st = dynamic_cast<const SplitState*>(r.state);
        if (!st) throw Error("layer split: sequence state of another model");
        cmd.put(st->id()).put(r.token).put(int32_t(r.max_tokens)).put(r.p_min);
    }
    try {
        comm_.send_all(workers(), kCmd, cmd.bytes());
        if (tp_) {
            // Every rank drafts on its heads (the NextN block's attention is
            // split too); this rank's chains are everyone's.
            std::vector<model::DraftRequest> mine(reqs.begin(), reqs.end());
            for (auto& r : mine) r.state = &dynamic_cast<const SplitState*>(r.state)->local();
            std::string error;
            try {
                local_->draft(mine);
            } catch (const std::exception& e) {
                error = e.what();
            }
            error = collect(error);
            if (!error.empty()) throw Error("drafting: " + error);
            for (size_t i = 0; i < reqs.size(); ++i) reqs[i].out = std::move(mine[i].out);
            return;
        }
        Wire w(comm_.recv(comm_.size() - 1, kDone, comm_.timeout()));
        const std::string e = status_of(w);
        if (!e.empty())
            throw Error("drafting on rank " + std::to_string(comm_.size() - 1) + ": " + e);
        for (model::DraftRequest& r : reqs) r.out = w.get_vector<int32_t>();
    } catch (const RankError& e) {
        lost_rank(comm_, e);
    }
}

std::vector<SplitModel::RankCounters> SplitModel::counters(bool reset) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<RankCounters> all(1);
    all[0].comm = comm_.stats();
    all[0].weight_bytes = local_->backend().counters().weight_bytes;
    Wire cmd;
    cmd.put(uint8_t(kStats)).put(uint8_t(reset));
    try {
        comm_.send_all(workers(), kCmd, cmd.bytes());
        for (int r = 1; r < comm_.size(); ++r) {
            Wire w(comm_.recv(r, kDone, comm_.timeout()));
            (void)status_of(w);
            RankCounters c;
            c.comm = w.get<CommStats>();
            c.weight_bytes = w.get<uint64_t>();
            all.push_back(c);
        }
    } catch (const RankError& e) {
        lost_rank(comm_, e);
    }
    if (reset) {
        comm_.reset_stats();
        local_->backend().reset_counters();
    }
    return all;
}

// ---- every other rank

namespace {

// Another rank's side of a SplitModel: its states and snapshots by rank 0's ids, and
// rank 0's commands carried out on them, one at a time.
class RankServer {
  public:
    RankServer(Comm& comm, model::Model& local, bool tp)
        : comm_(comm), local_(local), tp_(tp), r_(comm.rank()), last_(r_ == comm.size() - 1) {}

    // Serves until rank 0 says to shut down.
    int run() {
        try {
            while (true) {
                Wire w(comm_.recv(0, kCmd, 0));
                const uint8_t op = w.get<uint8_t>();
                if (op == kShutdown) return 0;
                if (op == kForward)
                    forward(w);
                else if (op == kCommit)
                    commit();
                else if (op == kDraft)
                    draft(w);
                else if (op == kStats)
                    stats(w);
                else
                    state_op(op, w);
            }
        } catch (const RankError& e) {
            lost_rank(comm_, e);
        }
    }

  private:
    model::SequenceState& state(uint64_t id) {
        auto it = states_.find(id);
        if (it == states_.end()) throw Error("no sequence " + std::to_string(id) + " on this rank");
        return *it->second;
    }
    void ack(const std::string& error) { comm_.send(0, kDone, reply(error).bytes()); }

    // A forward's inputs, committed on rank 0's word once every rank has succeeded
    // (nothing to commit when this rank failed).
    void keep_pending(std::vector<std::vector<int32_t>> toks,
                      const std::vector<model::SeqInput>& in, const std::string& error) {
        pending_tokens_ = std::move(toks);
        pending_ = error.empty() ? in : std::vector<model::SeqInput>{};
        for (size_t i = 0; i < pending_.size(); ++i) pending_[i].tokens = pending_tokens_[i];
    }

    void forward(Wire& w) {
        const uint32_t n = w.get<uint32_t>();
        std::vector<std::vector<int32_t>> toks(n);
        std::vector<model::SeqInput> in(n);
        std::string error = broken_;
        for (uint32_t i = 0; i < n; ++i) {
            const uint64_t id = w.get<uint64_t>();
            const uint8_t flags = w.get<uint8_t>();
            in[i].logits_from = w.get<int64_t>();
            toks[i] = w.get_vector<int32_t>();
            in[i].all_logits = flags & 1;
            in[i].logits = flags & 2;
            in[i].tokens = toks[i];
            try {
                in[i].state = &state(id);
            } catch (const std::exception& e) {
                if (error.empty()) error = e.what();
            }
        }
        const std::vector<uint32_t> ends = w.get_vector<uint32_t>();
        if (tp_) {
            // The whole forward on this rank's heads.
            std::vector<float> logits;
            if (error.empty()) {
                try {
                    local_.forward(in, logits, model::LayerSpan{0, -1, nullptr, nullptr, false});
                } catch (const std::exception& e) {
                    error = e.what();
                }
            }
            ack(error);
        } else {
            forward_span(in, ends, error);
        }
        keep_pending(std::move(toks), in, error);
    }

    // This rank's layers for each micro-batch [begin, end), the rows coming from the rank
    // before and going to the one after (the last rank's logits to rank 0).
    void forward_span(std::vector<model::SeqInput>& in, const std::vector<uint32_t>& ends,
                      std::string& error) {
        const model::ModelInfo& info = local_.info();
        const uint32_t n = uint32_t(in.size());
        uint32_t begin = 0;
        for (uint32_t end : ends) {
            // The rows entering this rank's first layer for this micro-batch, once the rank
            // before has run it.
            Wire h(comm_.recv(r_ - 1, kHidden, comm_.timeout() * double(r_ + 1)));
            const std::string before = status_of(h);
            std::vector<float> hidden_in, hidden_out, logits;
            if (!before.empty() && error.empty())
                error = "rank " + std::to_string(r_ - 1) + " failed";
            if (before.empty()) hidden_in = h.get_vector<float>();
            if (error.empty() && (end < begin || end > n)) error = "malformed micro-batch";
            if (error.empty()) {
                try {
                    model::HostRows rows(hidden_in, &hidden_out);
                    model::LayerSpan span{info.layer_first, last_ ? -1 : info.layer_end, &rows,
                                          &rows, false};
                    local_.forward(std::span(in).subspan(begin, end - begin), logits, span);
                } catch (const std::exception& e) {
                    error = e.what();
                }
            }
            Wire out = reply(error);
            if (!last_) {
                if (error.empty()) out.put_span(std::span<const float>(hidden_out));
                comm_.isend(r_ + 1, kHidden, out.bytes());
                comm_.isend(0, kDone, reply(error).bytes());
            } else {
                if (error.empty()) out.put_span(std::span<const float>(logits));
                comm_.isend(0, kDone, out.bytes());
            }
            begin = end;
        }
        comm_.flush();
    }

    void commit() {
        try {
            local_.commit(pending_);
        } catch (const std::exception& e) {
            broken_ = std::string("commit failed: ") + e.what();
        }
        pending_.clear();
    }

    void draft(Wire& w) {
        const uint32_t n = w.get<uint32_t>();
        std::vector<model::DraftRequest> reqs(n);
        std::string error;
        for (uint32_t i = 0; i < n; ++i) {
            const uint64_t id = w.get<uint64_t>();
            reqs[i].token = w.get<int32_t>();
            reqs[i].max_tokens = w.get<int32_t>();
            reqs[i].p_min = w.get<float>();
            if (!last_ && !tp_) continue;
            try {
                reqs[i].state = &state(id);
            } catch (const std::exception& e) {
                error = e.what();
            }
        }
        if (!last_ && !tp_) return;  // the head (and the NextN block) is the last rank's
        if (error.empty()) {
            try {
                local_.draft(reqs);
            } catch (const std::exception& e) {
                error = e.what();
            }
        }
        if (tp_) {  // rank 0 has the same chains
            ack(error);
            return;
        }
        Wire out = reply(error);
        if (error.empty())
            for (const auto& q : reqs) out.put_span(std::span<const int32_t>(q.out));
        comm_.send(0, kDone, out.bytes());
    }

    void stats(Wire& w) {
        const bool reset = w.get<uint8_t>() != 0;
        Wire out = reply("");
        out.put(comm_.stats());
        out.put(uint64_t(local_.backend().counters().weight_bytes));
        comm_.send(0, kDone, out.bytes());
        if (reset) {
            comm_.reset_stats();
            local_.backend().reset_counters();
        }
    }

    // The mirrored state operations. Those whose result rank 0 waits for are acknowledged;
    // a failure of another is kept and reported by the next forward.
    void state_op(uint8_t op, Wire& w) {
        const uint64_t id = w.get<uint64_t>();
        const int64_t a = w.get<int64_t>();
        const int64_t b = w.get<int64_t>();
        const uint64_t c = w.get<uint64_t>();
        std::string error;
        try {
            apply(op, id, a, b, c);
        } catch (const std::exception& e) {
            error = e.what();
        }
        if (op == kNewState || op == kResize || op == kSnapshot || op == kCopyPrefix) {
            ack(error);
        } else if (!error.empty() && broken_.empty()) {
            broken_ = error;
            log_info("glm5: rank %d: %s\n", r_, error.c_str());
        }
    }

    void apply(uint8_t op, uint64_t id, int64_t a, int64_t b, uint64_t c) {
        switch (op) {
            case kNewState:
                states_[id] = local_.new_state(a, b);
                break;
            case kDropState:
                states_.erase(id);
                break;
            case kReset:
                state(id).reset();
                break;
            case kRewind:
                if (!state(id).rewind(a)) throw Error("cannot rewind to " + std::to_string(a));
                break;
            case kResize:
                state(id).resize(a);
                break;
            case kSnapshot:
                snaps_[uint64_t(a)] = state(id).snapshot();
                break;
            case kRestore: {
                auto it = snaps_.find(uint64_t(a));
                if (it == snaps_.end()) throw Error("no such snapshot");
                state(id).restore(*it->second);
                break;
            }
            case kDropSnap:
                snaps_.erase(id);
                break;
            case kCopyPrefix: {  // a: the source state, b: positions, c: its snapshot (0: none)
                const model::StateSnapshot* at = nullptr;
                if (c) {
                    auto it = snaps_.find(c);
                    if (it == snaps_.end()) throw Error("no such snapshot");
                    at = it->second.get();
                }
                if (!state(id).copy_prefix(state(uint64_t(a)), b, at))
                    throw Error("cannot copy " + std::to_string(b) + " positions of a sequence");
                break;
            }
            default:
                throw Error("unknown command " + std::to_string(op));
        }
    }

    Comm& comm_;
    model::Model& local_;
    const bool tp_;
    const int r_;
    const bool last_;
    std::map<uint64_t, std::unique_ptr<model::SequenceState>> states_;
    std::map<uint64_t, std::unique_ptr<model::StateSnapshot>> snaps_;
    // The last forward's inputs, for its commit.
    std::vector<std::vector<int32_t>> pending_tokens_;
    std::vector<model::SeqInput> pending_;
    // A mirrored operation that failed here: later forwards report it.
    std::string broken_;
};

}  // namespace

int serve_rank(Comm& comm, model::Model& local, bool tp) {
    return RankServer(comm, local, tp).run();
}

// ---- tensor parallelism

void TensorReducer::sum(float* x, int64_t n) {
    const int N = comm_.size(), me = comm_.rank();
    const auto* p = reinterpret_cast<const uint8_t*>(x);
    const std::vector<uint8_t> mine(p, p + size_t(n) * sizeof(float));
    try {
        for (int r = 0; r < N; ++r)
            if (r != me) comm_.isend(r, kReduce, mine);
        // x = part 0 + part 1 + ... in rank order, on every rank alike.
        for (int r = 0; r < N; ++r) {
            const float* src = reinterpret_cast<const float*>(mine.data());
            std::vector<uint8_t> got;
            if (r != me) {
                got = comm_.recv(r, kReduce, comm_.timeout());
                if (got.size() != mine.size())
                    throw Error("rank " + std::to_string(r) + " sent " +
                                std::to_string(got.size()) + " bytes of partial sums, not " +
                                std::to_string(mine.size()));
                src = reinterpret_cast<const float*>(got.data());
            }
            if (r == 0)
                std::copy(src, src + n, x);
            else
                for (int64_t i = 0; i < n; ++i) x[i] += src[i];
        }
        comm_.flush();
    } catch (const RankError& e) {
        lost_rank(comm_, e);
    }
}

// ---- setup

void agree(Comm& comm, const std::string& mine, const char* step) {
    const double t = comm.timeout() * 30;  // a rank may still be loading a big file
    try {
        if (comm.rank() != 0) {
            comm.send(0, kSetup, reply(mine).bytes());
            Wire w(comm.recv(0, kSetup, t));
            const std::string verdict = status_of(w);
            if (!verdict.empty()) throw Error(verdict);
            return;
        }
        std::string first =
            mine.empty() ? std::string() : std::string(step) + " failed on rank 0: " + mine;
        for (int r = 1; r < comm.size(); ++r) {
            Wire w(comm.recv(r, kSetup, t));
            const std::string e = status_of(w);
            if (!e.empty() && first.empty())
                first = std::string(step) + " failed on rank " + std::to_string(r) + ": " + e;
        }
        std::vector<int> all;
        for (int r = 1; r < comm.size(); ++r) all.push_back(r);
        comm.send_all(all, kSetup, reply(first).bytes());
        if (!first.empty()) throw Error(first);
    } catch (const RankError& e) {
        lost_rank(comm, e);
    }
}

void agree_identity(Comm& comm, const std::string& identity, const std::string& what) {
    std::string verdict;
    try {
        if (comm.rank() != 0) {
            Wire w;
            w.put_string(identity);
            comm.send(0, kSetup, w.bytes());
        } else {
            for (int r = 1; r < comm.size(); ++r) {
                Wire w(comm.recv(r, kSetup, comm.timeout()));
                if (w.get_string() != identity && verdict.empty())
                    verdict = "rank " + std::to_string(r) + "'s " + what +
                              " differs from rank 0's (every rank must open the same file)";
            }
        }
    } catch (const RankError& e) {
        lost_rank(comm, e);
    }
    agree(comm, verdict, "the file check");
}

std::vector<RankInfo> exchange_rank_info(Comm& comm, const RankInfo& mine) {
    std::vector<RankInfo> all = {mine};
    try {
        if (comm.rank() != 0) {
            Wire w;
            put_info(w, mine);
            comm.send(0, kSetup, w.bytes());
            return all;
        }
        for (int r = 1; r < comm.size(); ++r) {
            Wire w(comm.recv(r, kSetup, comm.timeout()));
            all.push_back(get_info(w));
        }
    } catch (const RankError& e) {
        lost_rank(comm, e);
    }
    return all;
}

}  // namespace glm5::dist
