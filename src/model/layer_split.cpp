#include "model/layer_split.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "gguf/gguf.h"
#include "model/weights.h"

namespace glm5::model {

std::string SplitPlan::describe(size_t i) const {
    const LayerPart& p = parts[i];
    const int64_t end = p.range.end < 0 ? n_layer : p.range.end;
    std::string s = "layers " + std::to_string(p.range.first) + "-" + std::to_string(end - 1) +
                    " (" + std::to_string(end - p.range.first) + " of " + std::to_string(n_layer) +
                    ")";
    if (p.range.end < 0) s += " and the head";
    s += ", " + human_bytes(double(p.weight_bytes)) + " of weights";
    return s;
}

SplitPlan split_layers(const gguf::File& file, backend::Backend& be, const LoadOptions& opt,
                       int n_parts, int64_t tokens) {
    LoadOptions po = opt;
    po.plan_only = true;
    po.in_memory = po.repack = false;
    const std::unique_ptr<Model> m = load_model(file, be, po);
    const int64_t L = m->info().n_layer;
    if (n_parts < 1) throw Error("a layer split needs at least one part");

    // Each layer's bytes: its tensors, and its caches for `tokens` positions.
    std::vector<uint64_t> cost(size_t(L), 0), weights(size_t(L), 0);
    uint64_t head = 0;
    const bool tied = file.find_tensor("output.weight") == nullptr;
    for (const auto& t : file.tensors()) {
        const int64_t il = tensor_layer(t.name);
        if (il >= 0 && il < L) {
            weights[size_t(il)] += t.nbytes;
            continue;
        }
        if (il >= 0) {
            if (opt.load_nextn) head += t.nbytes;  // the NextN block
        } else if (t.name == "token_embd.weight") {
            if (tied) head += t.nbytes;
        } else {
            head += t.nbytes;
        }
    }
    for (int64_t l = 0; l < L; ++l)
        cost[size_t(l)] = weights[size_t(l)] + m->layer_cost(l).bytes(tokens);
    std::vector<int64_t> starts;  // where a part may begin
    for (int64_t l = 1; l < L; ++l)
        if (m->can_split_before(l)) starts.push_back(l);
    if (int64_t(starts.size()) + 1 < n_parts)
        throw Error(
            file.path() + ": " + std::to_string(L) + " trunk layers can be cut in at most " +
            std::to_string(starts.size() + 1) + " parts" +
            (int64_t(starts.size()) + 1 < L ? " (a part must start at a layer with its own indexer)"
                                            : "") +
            ", not " + std::to_string(n_parts));

    // Cut points b[0] = 0 < b[1] < ... < b[n] = L minimising the largest part
    // (the last part carries the head): best[k][j] over the first j layers in
    // k parts, j a possible start or L.
    std::vector<int64_t> pts = {0};
    pts.insert(pts.end(), starts.begin(), starts.end());
    pts.push_back(L);
    const size_t P = pts.size();
    std::vector<uint64_t> prefix(size_t(L) + 1, 0);
    for (int64_t l = 0; l < L; ++l) prefix[size_t(l) + 1] = prefix[size_t(l)] + cost[size_t(l)];
    auto part = [&](size_t a, size_t b) {
        return prefix[size_t(pts[b])] - prefix[size_t(pts[a])] + (b == P - 1 ? head : 0);
    };
    const uint64_t inf = std::numeric_limits<uint64_t>::max();
    std::vector<std::vector<uint64_t>> best(size_t(n_parts) + 1, std::vector<uint64_t>(P, inf));
    std::vector<std::vector<size_t>> from(size_t(n_parts) + 1, std::vector<size_t>(P, 0));
    best[0][0] = 0;
    for (int k = 1; k <= n_parts; ++k)
        for (size_t j = 1; j < P; ++j)
            for (size_t i = 0; i < j; ++i) {
                if (best[size_t(k - 1)][i] == inf) continue;
                const uint64_t v = std::max(best[size_t(k - 1)][i], part(i, j));
                if (v < best[size_t(k)][j]) {  // strict: the earliest cut wins ties
                    best[size_t(k)][j] = v;
                    from[size_t(k)][j] = i;
                }
            }
    SplitPlan plan;
    plan.n_layer = L;
    plan.parts.resize(size_t(n_parts));
    size_t j = P - 1;
    for (int k = n_parts; k >= 1; --k) {
        const size_t i = from[size_t(k)][j];
        LayerPart& p = plan.parts[size_t(k - 1)];
        p.range.first = pts[i];
        p.range.end = j == P - 1 ? -1 : pts[j];
        for (int64_t l = pts[i]; l < pts[j]; ++l) p.weight_bytes += weights[size_t(l)];
        if (j == P - 1) p.weight_bytes += head;
        j = i;
    }
    return plan;
}

void HostRows::receive(float* host, size_t n) {
    if (in_.size() != n)
        throw Error("layer span: " + std::to_string(in_.size()) +
                    " hidden values in, the batch needs " + std::to_string(n));
    std::copy(in_.begin(), in_.end(), host);
}

void HostRows::send(const float* host, size_t n) {
    if (!out_) throw Error("layer span: nowhere to send the hidden rows");
    out_->assign(host, host + n);
}

}  // namespace glm5::model
