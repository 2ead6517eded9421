// The flattened form of a forward's inputs, shared by every architecture: the
// tokens of all sequences in one row-major batch, each token's position, the
// rows that want logits, and one segment per sequence.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "model/weights.h"

namespace glm5::model {

template <class State>
struct FlatBatch {
    struct Segment {
        State* state;
        int64_t first;   // index of its first token in the batch
        int64_t n;       // its tokens in this forward
        int64_t n_past;  // its position before this forward
    };
    std::vector<int32_t> tokens;    // every token, sequence after sequence
    std::vector<int32_t> pos;       // every token's position
    std::vector<int32_t> out_rows;  // the tokens whose logits are wanted, in order
    std::vector<Segment> segs;
    // Embedding overrides at batch rows [row, row + n) (SeqInput::embeds).
    struct Embeds {
        int64_t row;
        int64_t n;
        const float* rows;
    };
    std::vector<Embeds> embeds;
    int64_t size() const { return int64_t(tokens.size()); }
};

// Validates and flattens `inputs`: every state must be a State of this model,
// appear once, have room for its tokens, and every id be in the vocabulary.
template <class State>
FlatBatch<State> flatten_batch(std::span<const SeqInput> inputs, int64_t n_vocab,
                               const char* arch) {
    FlatBatch<State> b;
    std::unordered_set<const SequenceState*> seen;
    for (const SeqInput& in : inputs) {
        auto* st = dynamic_cast<State*>(in.state);
        if (!st) throw Error(std::string(arch) + ": sequence state of another model");
        if (in.tokens.empty()) continue;
        if (!seen.insert(st).second)
            throw Error(std::string(arch) + ": a sequence appears twice in one batch");
        const int64_t n = int64_t(in.tokens.size());
        if (st->n_past() + n > st->n_ctx())
            throw Error("context full: " + std::to_string(st->n_past() + n) +
                        " tokens exceed the context size " + std::to_string(st->n_ctx()));
        for (int32_t t : in.tokens)
            if (t < 0 || t >= n_vocab)
                throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" +
                            std::to_string(n_vocab) + ")");
        for (const EmbedRows& e : in.embeds) {
            if (e.n <= 0 || e.at < 0 || e.at + e.n > n || !e.rows)
                throw Error(std::string(arch) + ": embedding rows [" + std::to_string(e.at) + ", " +
                            std::to_string(e.at + e.n) + ") outside the input's " +
                            std::to_string(n) + " tokens");
            b.embeds.push_back({b.size() + e.at, e.n, e.rows});
        }
        b.segs.push_back({st, b.size(), n, st->n_past()});
        for (int64_t i = 0; i < n; ++i) {
            const bool want = in.logits_from >= 0 ? i >= in.logits_from
                                                  : in.logits && (in.all_logits || i == n - 1);
            if (want) b.out_rows.push_back(int32_t(b.size()));
            b.tokens.push_back(in.tokens[size_t(i)]);
            b.pos.push_back(int32_t(st->n_past() + i));
        }
    }
    return b;
}

// A forward's span resolved against the trunk: layers [first, end), and
// whether it ends with the head. Throws on a span outside the trunk or one
// without the channel its rows enter or leave by.
struct SpanRange {
    int64_t first = 0, end = 0;
    bool head = true;
};
inline SpanRange check_span(const LayerSpan& s, const HeldLayers& held, const char* arch) {
    const int64_t n_layer = held.n_layer;
    SpanRange r{s.first, s.end < 0 ? n_layer : s.end, s.end < 0 || s.end == n_layer};
    const std::string what = std::string(arch) + ": layer span [" + std::to_string(r.first) + ", " +
                             std::to_string(r.end) + ")";
    if (r.first < 0 || r.first >= n_layer || r.end <= r.first || r.end > n_layer)
        throw Error(what + " is outside the trunk's " + std::to_string(n_layer) + " layers");
    if (r.first < held.first || r.end > held.end || (r.head && !held.head))
        throw Error(what + " runs layers this process does not hold (it holds [" +
                    std::to_string(held.first) + ", " + std::to_string(held.end) + ")" +
                    (held.head ? " and the head)" : ")"));
    if (r.first > 0 && !s.rows_in) throw Error(what + " starts after layer 0 and has no rows_in");
    if (!r.head && !s.rows_out) throw Error(what + " ends before the head and has no rows_out");
    return r;
}

// Model::commit for an architecture whose states advance(n) on completion:
// every state is checked before any advances.
template <class State>
void commit_inputs(std::span<const SeqInput> inputs, const char* arch) {
    std::vector<std::pair<State*, int64_t>> todo;
    for (const SeqInput& in : inputs) {
        if (in.tokens.empty()) continue;
        auto* st = dynamic_cast<State*>(in.state);
        if (!st) throw Error(std::string(arch) + ": sequence state of another model");
        st->reserve(st->n_past() + int64_t(in.tokens.size()));
        todo.emplace_back(st, int64_t(in.tokens.size()));
    }
    for (auto& [st, n] : todo) st->advance(n);
}

}  // namespace glm5::model
