// A forward split by layers (the contract a layer split across processes
// builds on): running the trunk's layers in two or three spans, passing the
// residual rows between them, gives bitwise the logits of the whole forward,
// for both architectures, in prefill and decode, and keeps doing so on the
// states it leaves; a bad span is refused without touching the states.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <set>

#include "model/layer_split.h"
#include "model/weights.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

// One step for two sequences at once: their inputs, logits for every row.
std::vector<model::SeqInput> step(std::vector<std::unique_ptr<model::SequenceState>>& st,
                                  const std::vector<std::vector<int32_t>>& toks) {
    std::vector<model::SeqInput> in;
    for (size_t i = 0; i < st.size(); ++i) in.push_back({st[i].get(), toks[i], true, true});
    return in;
}

// The forward as `cuts` splits it: spans [0, c1), [c1, c2), ..., [ck, end).
void split_forward(model::Model& m, std::span<const model::SeqInput> in, std::vector<float>& lg,
                   const std::vector<int64_t>& cuts) {
    std::vector<float> h, next;
    int64_t first = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
        model::HostRows rows(h, &next);
        model::LayerSpan s;
        s.first = first;
        s.end = i < cuts.size() ? cuts[i] : -1;
        s.rows_in = s.rows_out = &rows;
        s.commit = i == cuts.size();
        m.forward(in, lg, s);
        h.swap(next);
        first = s.end;
    }
}

}  // namespace

TEST(LayerSpan, SplitForwardsAreBitwiseTheWholeForward) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"})
        for (bool spec : {false, true}) {
            TestModel m(data_path(path), backend::CacheType::F16, 2, spec);
            const int64_t L = m.model->info().n_layer, V = m.n_vocab();
            ASSERT_GE(L, 3) << path;
            std::vector<std::vector<int64_t>> splits;
            std::vector<int64_t> all;
            for (int64_t c = 1; c < L; ++c)
                if (m.model->can_split_before(c)) {
                    splits.push_back({c});
                    all.push_back(c);
                }
            ASSERT_GE(all.size(), 2u) << path;
            splits.push_back(all);  // every cut at once
            for (const auto& cuts : splits) {
                std::vector<std::unique_ptr<model::SequenceState>> whole, parts;
                for (int i = 0; i < 2; ++i) {
                    whole.push_back(m.model->new_state(256));
                    parts.push_back(m.model->new_state(256));
                }
                // A prefill of two prompts (one past the indexer's dense
                // limit of the tiny models), then decode steps.
                std::vector<std::vector<int32_t>> toks = {random_ids(1, 150, V),
                                                          random_ids(2, 37, V)};
                for (int t = 0; t < 4; ++t) {
                    std::vector<float> a, b;
                    const auto ia = step(whole, toks);
                    const auto ib = step(parts, toks);
                    m.model->forward(ia, a);
                    split_forward(*m.model, ib, b, cuts);
                    ASSERT_EQ(a.size(), b.size());
                    for (size_t k = 0; k < a.size(); ++k)
                        ASSERT_EQ(a[k], b[k]) << path << " cut at " << cuts[0] << " step " << t;
                    for (size_t i = 0; i < 2; ++i) {
                        EXPECT_EQ(whole[i]->n_past(), parts[i]->n_past());
                        // The next token: the greedy pick of the row's last logits.
                        const size_t rows_before = i == 0 ? 0 : toks[0].size();
                        const float* row =
                            a.data() + (rows_before + toks[i].size() - 1) * size_t(V);
                        toks[i] = {int32_t(std::max_element(row, row + V) - row)};
                    }
                }
            }
        }
}

TEST(LayerSpan, BadSpansAreRefusedWithoutTouchingTheStates) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        TestModel m(data_path(path), backend::CacheType::F32, 2);
        const int64_t L = m.model->info().n_layer, W = m.model->hidden_width();
        auto st = m.model->new_state(64);
        const auto toks = random_ids(3, 5, m.n_vocab());
        model::SeqInput in{st.get(), toks, false, true};
        std::vector<float> lg, out, wrong(size_t(4 * W));
        model::HostRows to_out({}, &out), from_wrong(wrong, &out);
        const model::LayerSpan bad[] = {
            {L, -1, nullptr, &to_out, true},      // past the trunk
            {2, 1, &from_wrong, &to_out, true},   // empty
            {1, -1, &from_wrong, &to_out, true},  // 4 rows of hidden input for 5 tokens
            {0, L - 1, nullptr, nullptr, true},   // ends before the head, nowhere to write
        };
        for (const auto& s : bad) {
            EXPECT_THROW(m.model->forward({&in, 1}, lg, s), Error) << path << " " << s.first;
            EXPECT_EQ(st->n_past(), 0);
        }
        // glm-dsa: a span cannot start at a shared-indexer layer.
        for (int64_t l = 1; l < L; ++l)
            if (!m.model->can_split_before(l)) {
                std::vector<float> h(size_t(5 * W));
                model::HostRows from_h(h);
                EXPECT_THROW(
                    m.model->forward({&in, 1}, lg, model::LayerSpan{l, -1, &from_h, nullptr, true}),
                    Error);
                EXPECT_EQ(st->n_past(), 0);
            }
        // A span that does not commit leaves the position where it was.
        m.model->forward({&in, 1}, lg, model::LayerSpan{0, 1, nullptr, &to_out, false});
        EXPECT_EQ(st->n_past(), 0);
        EXPECT_EQ(out.size(), size_t(5 * W));
    }
}

// Processes that each load only their layers (LoadOptions::layers), chained
// the way a layer split across ranks runs them: every part runs uncommitted
// and commits once the last has produced the logits. Bitwise the whole model;
// each part's caches are its own layers' only.
TEST(LayerSpan, PartialModelsChainedAreTheWholeModel) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"})
        for (bool spec : {false, true}) {
            TestModel whole(data_path(path), backend::CacheType::F16, 2, spec);
            const int64_t L = whole.model->info().n_layer, V = whole.n_vocab();
            std::vector<int64_t> cuts;
            for (int64_t c = 1; c < L && cuts.size() < 2; ++c)
                if (whole.model->can_split_before(c)) cuts.push_back(c);
            ASSERT_EQ(cuts.size(), 2u) << path;
            std::vector<std::unique_ptr<TestModel>> parts;
            const int64_t bounds[] = {0, cuts[0], cuts[1], -1};
            for (int p = 0; p < 3; ++p)
                parts.push_back(
                    std::make_unique<TestModel>(data_path(path), backend::CacheType::F16, 2, spec,
                                                model::LayerRange{bounds[p], bounds[p + 1]}));
            size_t per_token = 0;
            for (const auto& p : parts) per_token += p->model->state_cost().per_token;
            EXPECT_EQ(per_token, whole.model->state_cost().per_token) << path;
            EXPECT_FALSE(parts[0]->model->info().holds_head);
            EXPECT_TRUE(parts[2]->model->info().holds_head);
            EXPECT_EQ(parts[1]->model->info().layer_first, cuts[0]);
            EXPECT_EQ(parts[1]->model->info().layer_end, cuts[1]);
            EXPECT_GT(parts[1]->model->info().skipped_bytes, 0u);
            EXPECT_EQ(parts[2]->model->can_draft(), whole.model->can_draft()) << path;
            EXPECT_FALSE(parts[0]->model->can_draft());

            std::vector<std::unique_ptr<model::SequenceState>> ws;
            std::vector<std::vector<std::unique_ptr<model::SequenceState>>> ps(3);
            for (int i = 0; i < 2; ++i) {
                ws.push_back(whole.model->new_state(256));
                for (int p = 0; p < 3; ++p)
                    ps[size_t(p)].push_back(parts[size_t(p)]->model->new_state(256));
            }
            std::vector<std::vector<int32_t>> toks = {random_ids(5, 150, V), random_ids(6, 37, V)};
            for (int t = 0; t < 4; ++t) {
                std::vector<float> a, b, h, next;
                whole.model->forward(step(ws, toks), a);
                for (int p = 0; p < 3; ++p) {
                    model::HostRows rows(h, &next);
                    model::LayerSpan s{bounds[p], bounds[p + 1], &rows, &rows, false};
                    const auto in = step(ps[size_t(p)], toks);
                    parts[size_t(p)]->model->forward(in, b, s);
                    // Uncommitted until every part has succeeded (the head's too).
                    EXPECT_EQ(ps[size_t(p)][0]->n_past(),
                              ws[0]->n_past() - int64_t(toks[0].size()));
                    h.swap(next);
                }
                for (int p = 0; p < 3; ++p)
                    parts[size_t(p)]->model->commit(step(ps[size_t(p)], toks));
                ASSERT_EQ(a.size(), b.size());
                for (size_t k = 0; k < a.size(); ++k)
                    ASSERT_EQ(a[k], b[k]) << path << " step " << t;
                for (int p = 0; p < 3; ++p) EXPECT_EQ(ps[size_t(p)][1]->n_past(), ws[1]->n_past());
                for (size_t i = 0; i < 2; ++i) {
                    const size_t rows_before = i == 0 ? 0 : toks[0].size();
                    const float* row = a.data() + (rows_before + toks[i].size() - 1) * size_t(V);
                    toks[i] = {int32_t(std::max_element(row, row + V) - row)};
                }
            }
            // A part refuses the layers it does not hold.
            std::vector<float> lg, out;
            model::HostRows to_out({}, &out);
            model::SeqInput in{ps[1][0].get(), toks[0], false, true};
            EXPECT_THROW(parts[1]->model->forward({&in, 1}, lg), Error) << path;
            EXPECT_THROW(parts[0]->model->forward(
                             {&in, 1}, lg, model::LayerSpan{0, cuts[1], nullptr, &to_out, false}),
                         Error);
        }
}

namespace {

// Whether this process has the page at `p` mapped (/proc/self/pagemap's
// "present" bit: a page this process touched, or one the kernel mapped around
// such a touch).
bool page_present(const void* p) {
    static const int fd = ::open("/proc/self/pagemap", O_RDONLY);
    uint64_t e = 0;
    const off_t at = off_t(uintptr_t(p) / 4096 * 8);
    if (fd < 0 || ::pread(fd, &e, 8, at) != 8) throw std::runtime_error("cannot read pagemap");
    return (e >> 63) & 1;
}

}  // namespace

// A part reads its own layers' pages only: after loading (copying what it
// holds) and forwards, no
// page of another part's tensors is mapped in this process, except within
// the 64 KiB windows the kernel maps around a touched page (fault-around).
TEST(LayerSplit, APartNeverTouchesOtherLayersPages) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        TestModel whole(data_path(path), backend::CacheType::F16, 1);
        std::vector<int64_t> cuts;
        const int64_t L = whole.model->info().n_layer;
        for (int64_t c = 1; c < L && cuts.size() < 2; ++c)
            if (whole.model->can_split_before(c)) cuts.push_back(c);
        ASSERT_EQ(cuts.size(), 2u);
        // --no-mmap: the part copies every tensor it holds (and only those).
        TestModel part(data_path(path), backend::CacheType::F16, 1, false,
                       model::LayerRange{cuts[0], cuts[1]}, /*in_memory=*/true);
        const int64_t W = part.model->hidden_width();
        auto st = part.model->new_state(64);
        const auto toks = random_ids(7, 9, part.n_vocab());
        std::vector<float> h(size_t(9 * W)), out, lg;
        for (size_t i = 0; i < h.size(); ++i) h[i] = float(int(i % 13) - 6) * 0.1f;
        model::SeqInput in{st.get(), toks, false, true};
        model::HostRows rows(h, &out);
        part.model->forward({&in, 1}, lg, model::LayerSpan{cuts[0], cuts[1], &rows, &rows, true});
        ASSERT_EQ(st->n_past(), 9);

        // The 64 KiB windows holding any byte of a held tensor.
        const model::HeldLayers held =
            model::resolve_layers(model::LoadOptions{.layers = {cuts[0], cuts[1]}}, L, path);
        std::set<uintptr_t> windows;
        size_t held_present = 0, others = 0;
        // ... and the one holding the end of the header, which every load parses.
        uintptr_t first_data = UINTPTR_MAX;
        for (const auto& t : part.file->tensors())
            first_data = std::min(first_data, uintptr_t(t.data));
        windows.insert((first_data - 1) & ~uintptr_t(65535));
        for (const auto& t : part.file->tensors())
            if (held.holds(t.name))
                for (uintptr_t a = uintptr_t(t.data) & ~uintptr_t(65535);
                     a < uintptr_t(t.data) + t.nbytes; a += 65536)
                    windows.insert(a);
        for (const auto& t : part.file->tensors()) {
            const uintptr_t b = (uintptr_t(t.data) + 4095) & ~uintptr_t(4095);
            for (uintptr_t a = b; a + 4096 <= uintptr_t(t.data) + t.nbytes; a += 4096) {
                if (held.holds(t.name)) {
                    held_present += page_present(reinterpret_cast<const void*>(a));
                    continue;
                }
                if (windows.count(a & ~uintptr_t(65535))) continue;
                ++others;
                ASSERT_FALSE(page_present(reinterpret_cast<const void*>(a)))
                    << path << ": a page of " << t.name << " was touched, at byte "
                    << (a - uintptr_t(t.data)) << " of " << t.nbytes;
            }
        }
        EXPECT_GT(others, 50u) << path;        // the check saw other layers' pages
        EXPECT_GT(held_present, 20u) << path;  // and can tell a touched page
    }
}

// The cut: contiguous parts that start where a span may start, the last with
// the head, and the largest part (weights + caches) as small as any cut makes
// it (against every cut, tried exhaustively); more parts than the model has
// starts are refused.
TEST(LayerSplit, CutsAreContiguousAllowedAndBalanced) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        TestModel m(data_path(path), backend::CacheType::F16, 1);
        const int64_t L = m.model->info().n_layer, tokens = 4096;
        std::vector<uint64_t> cost(size_t(L), 0);
        uint64_t head = 0;
        for (const auto& t : m.file->tensors()) {
            const int64_t il = model::tensor_layer(t.name);
            if (il >= 0 && il < L)
                cost[size_t(il)] += t.nbytes;
            else if (il < 0 && t.name != "token_embd.weight")
                head += t.nbytes;
        }
        for (int64_t l = 0; l < L; ++l) cost[size_t(l)] += m.model->layer_cost(l).bytes(tokens);
        std::vector<int64_t> starts;
        for (int64_t l = 1; l < L; ++l)
            if (m.model->can_split_before(l)) starts.push_back(l);
        auto largest = [&](const std::vector<int64_t>& b) {  // b: 0, cuts..., L
            uint64_t worst = 0;
            for (size_t i = 0; i + 1 < b.size(); ++i) {
                uint64_t s = i + 2 == b.size() ? head : 0;
                for (int64_t l = b[i]; l < b[i + 1]; ++l) s += cost[size_t(l)];
                worst = std::max(worst, s);
            }
            return worst;
        };
        for (int n = 1; n <= int(starts.size()) + 1; ++n) {
            const model::SplitPlan p =
                model::split_layers(*m.file, *m.be, model::LoadOptions{}, n, tokens);
            ASSERT_EQ(int(p.parts.size()), n);
            std::vector<int64_t> b = {0};
            for (int i = 0; i < n; ++i) {
                const model::LayerRange& r = p.parts[size_t(i)].range;
                EXPECT_EQ(r.first, b.back()) << path;
                if (i > 0) {
                    EXPECT_TRUE(m.model->can_split_before(r.first)) << path;
                }
                EXPECT_EQ(r.end < 0, i == n - 1) << path;
                b.push_back(r.end < 0 ? L : r.end);
            }
            // Every choice of n - 1 starts, by bitmask.
            uint64_t best = UINT64_MAX;
            for (uint32_t mask = 0; mask < (1u << starts.size()); ++mask) {
                if (std::popcount(mask) != n - 1) continue;
                std::vector<int64_t> c = {0};
                for (size_t i = 0; i < starts.size(); ++i)
                    if (mask >> i & 1) c.push_back(starts[i]);
                c.push_back(L);
                best = std::min(best, largest(c));
            }
            EXPECT_EQ(largest(b), best) << path << " in " << n << " parts";
        }
        EXPECT_THROW(model::split_layers(*m.file, *m.be, model::LoadOptions{},
                                         int(starts.size()) + 2, tokens),
                     Error);
    }
}

// Tensor parallelism reads each rank's share: a decoded token costs a rank the
// bytes one process reads, less (1 - 1/N) of the split tensors (every layer's
// attn_q_b / attn_k_b / attn_v_b / attn_output, and the used experts' strips)
// and, off rank 0, the shared experts. Counted by the kernels; the values are
// not summed across ranks here (no reducer), which changes no byte count.
TEST(TensorParallel, EachRankReadsTheReplicatedWeightsAndItsShare) {
    const std::string path = data_path("glm-dsa/tiny.gguf");
    const auto file = gguf::File::open(path);
    const int64_t n_layer = int64_t(file->get_uint("glm-dsa.block_count")) -
                            int64_t(file->get_uint("glm-dsa.nextn_predict_layers", 0));
    const int64_t n_dense = int64_t(file->get_uint("glm-dsa.leading_dense_block_count"));
    const int64_t n_used = int64_t(file->get_uint("glm-dsa.expert_used_count"));
    const int64_t n_expert = int64_t(file->get_uint("glm-dsa.expert_count"));
    auto bytes = [&](int64_t il, const char* t) {
        const auto* ti = file->find_tensor("blk." + std::to_string(il) + "." + t);
        return ti ? uint64_t(ti->nbytes) : 0;
    };
    uint64_t split = 0, shared = 0;
    for (int64_t il = 0; il < n_layer; ++il) {
        for (const char* t :
             {"attn_q_b.weight", "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight"})
            split += bytes(il, t);
        if (il < n_dense) continue;
        for (const char* t : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
            split += bytes(il, t) / uint64_t(n_expert) * uint64_t(n_used);
        for (const char* t :
             {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
            shared += bytes(il, t);
    }
    ASSERT_GT(split, 0u);
    ASSERT_GT(shared, 0u);
    const auto prompt = random_ids(11, 12, 768);
    auto decode_bytes = [&](int rank, int size) {
        TestModel m(path, backend::CacheType::F32, 1);
        if (size > 1) {
            model::LoadOptions lo;
            lo.cache_type = backend::CacheType::F32;
            lo.tp_rank = rank;
            lo.tp_size = size;
            m.model = model::load_model(*m.file, *m.be, lo);
        }
        auto st = m.model->new_state(64);
        std::vector<float> lg;
        model::SeqInput in{st.get(), prompt, false, true};
        m.model->forward({&in, 1}, lg);
        const std::vector<int32_t> one = {5};
        model::SeqInput next{st.get(), one, false, true};
        m.be->reset_counters();
        m.model->forward({&next, 1}, lg);
        return m.be->counters().weight_bytes;
    };
    const uint64_t whole = decode_bytes(0, 1);
    for (int N : {2}) {  // 4 heads, 32 expert hidden units
        for (int r = 0; r < N; ++r) {
            const uint64_t want = whole - split + split / uint64_t(N) - (r ? shared : 0);
            EXPECT_EQ(decode_bytes(r, N), want) << "rank " << r << " of " << N;
        }
    }
}
