#include "model/moe.h"

#include <algorithm>
#include <regex>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/weights.h"

namespace glm5::model {

namespace {

constexpr const char* kExpertParts[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                        "ffn_down_exps.weight"};

// The block of a routed-expert tensor's name; -1 for any other tensor.
int64_t expert_block(const std::string& name) {
    const int64_t b = tensor_layer(name);
    if (b < 0) return -1;
    const std::string prefix = "blk." + std::to_string(b) + ".";
    for (const char* part : kExpertParts)
        if (name == prefix + part) return b;
    return -1;
}

size_t n_blocks(const gguf::File& f) {
    int64_t n = 0;
    for (const gguf::TensorInfo& t : f.tensors()) n = std::max(n, tensor_layer(t.name) + 1);
    return size_t(n);
}

}  // namespace

std::vector<uint64_t> expert_bytes_by_block(const gguf::File& f) {
    std::vector<uint64_t> bytes(n_blocks(f), 0);
    for (const gguf::TensorInfo& t : f.tensors()) {
        const int64_t b = expert_block(t.name);
        if (b >= 0) bytes[size_t(b)] += t.nbytes;
    }
    return bytes;
}

std::vector<bool> first_expert_blocks(const gguf::File& f, int64_t n) {
    const std::vector<uint64_t> bytes = expert_bytes_by_block(f);
    std::vector<bool> host(bytes.size(), false);
    for (size_t b = 0; b < bytes.size() && int64_t(b) < n; ++b) host[b] = bytes[b] > 0;
    return host;
}

std::vector<bool> expert_blocks_from_overrides(const gguf::File& f, const std::string& list) {
    std::vector<bool> host(n_blocks(f), false);
    size_t at = 0;
    while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string entry = list.substr(at, comma - at);
        at = comma + 1;
        const size_t eq = entry.rfind('=');
        if (entry.empty() || eq == std::string::npos || eq == 0)
            throw Error("--override-tensor: '" + entry + "' is not PATTERN=TYPE");
        const std::string pattern = entry.substr(0, eq), type = entry.substr(eq + 1);
        if (type != "CPU")
            throw Error("--override-tensor " + entry +
                        ": only the CPU buffer type is known here (" +
                        "routed experts in system RAM); '" + type + "' is not");
        std::regex re;
        try {
            re = std::regex(pattern);
        } catch (const std::regex_error& e) {
            throw Error("--override-tensor " + entry + ": '" + pattern +
                        "' is not a regular expression (" + e.what() + ")");
        }
        // Which tensors it selects: whole expert sets of their blocks, nothing else.
        std::vector<int> parts(host.size(), 0);
        bool any = false;
        for (const gguf::TensorInfo& t : f.tensors()) {
            if (!std::regex_search(t.name, re)) continue;
            const int64_t b = expert_block(t.name);
            if (b < 0)
                throw Error("--override-tensor " + entry + ": the pattern selects " + t.name +
                            ", which is not a routed expert; only routed experts (" +
                            "blk.N.ffn_{gate,up,down}_exps) can stay in system RAM");
            ++parts[size_t(b)];
            any = true;
        }
        if (!any)
            throw Error("--override-tensor " + entry + ": the pattern selects no tensor of " +
                        f.path());
        for (size_t b = 0; b < parts.size(); ++b) {
            if (parts[b] == 0) continue;
            if (parts[b] != 3)
                throw Error("--override-tensor " + entry + ": the pattern selects " +
                            std::to_string(parts[b]) + " of block " + std::to_string(b) +
                            "'s three routed-expert tensors; a block's experts move together");
            host[b] = true;
        }
        if (comma == list.size()) break;
    }
    return host;
}

void check_experts_backend(const std::vector<bool>& host, backend::Backend* experts_backend,
                           const std::string& what) {
    if (std::find(host.begin(), host.end(), true) == host.end()) return;
    if (!experts_backend)
        throw Error(what + ": routed experts placed in system RAM, but no backend computes them");
    backend::require<backend::MoeOps>(*experts_backend, what + "'s routed experts");
}

void check_expert_placement(const LoadOptions& opt, const std::string& path) {
    if (opt.experts_backend && (opt.tp_size > 1 || !opt.layers.whole()))
        throw Error(path +
                    ": routed experts in system RAM do not combine with a layer split or "
                    "tensor parallelism yet");
}

void count_experts(ModelInfo& info, const backend::MoeWeights& m, bool host) {
    if (!m.experts) return;
    ++info.moe_blocks;
    if (!host) return;
    ++info.host_expert_blocks;
    info.host_expert_bytes +=
        m.experts.gate.bytes() + m.experts.up.bytes() + m.experts.down.bytes();
}

void moe_ffn(backend::Backend& be, backend::MoeOps& moe, backend::Backend* host,
             const backend::MoeWeights& m, backend::DevPtr<const float> x, int64_t T, int64_t E,
             backend::DevPtr<float> out, bool overlap) {
    const int n_used = m.route.n_used;
    const size_t n_sel = size_t(T) * size_t(n_used), n_rows = size_t(T * E);
    const backend::DevPtr<int32_t> ids = be.scratch_ids(n_sel);
    const backend::DevPtr<float> wts = be.scratch(n_sel);
    moe.moe_route(m.route, x, T, ids, wts);
    if (!host) {
        moe.moe_experts(m.experts, x, T, ids, wts, n_used, m.shared ? &m.shared : nullptr, nullptr,
                        out);
        return;
    }
    // The shared expert where the layer lives; the routed experts where their weights
    // are, fed the rows and the routing (and, taking turns, the shared rows they add).
    backend::Backend& h = *host;
    // Found once at load (check_experts_backend); a lookup, not a refusal, here.
    backend::MoeOps& hm = backend::require<backend::MoeOps>(h, "routed experts in system RAM");
    const backend::DevPtr<float> hx = h.scratch(n_rows), hout = h.scratch(n_rows);
    const backend::DevPtr<int32_t> hids = h.scratch_ids(n_sel);
    const backend::DevPtr<float> hwts = h.scratch(n_sel);
    auto bytes = [](auto p) { return p.template as<const uint8_t>(); };
    h.copy_from(be, bytes(x), hx.as<uint8_t>(), n_rows * sizeof(float));
    h.copy_from(be, bytes(ids), hids.as<uint8_t>(), n_sel * sizeof(int32_t));
    h.copy_from(be, bytes(wts), hwts.as<uint8_t>(), n_sel * sizeof(float));
    backend::DevPtr<float> shared;
    if (m.shared) {
        shared = be.scratch(n_rows);
        moe.moe_shared(m.shared, x, T, shared);  // queued: runs while the host works
    }
    if (overlap || !m.shared) {
        hm.moe_experts(m.experts, hx, T, hids, hwts, n_used, nullptr, nullptr, hout);
        be.copy_from(h, bytes(hout), out.as<uint8_t>(), n_rows * sizeof(float));
        if (m.shared) be.add(out, shared, int64_t(n_rows));
    } else {
        const backend::DevPtr<float> hshared = h.scratch(n_rows);
        h.copy_from(be, bytes(shared), hshared.as<uint8_t>(), n_rows * sizeof(float));
        hm.moe_experts(m.experts, hx, T, hids, hwts, n_used, nullptr, hshared, hout);
        be.copy_from(h, bytes(hout), out.as<uint8_t>(), n_rows * sizeof(float));
    }
    // Copies here are complete when they return: the host's scratch is free again.
    h.reset_scratch();
}

}  // namespace glm5::model
