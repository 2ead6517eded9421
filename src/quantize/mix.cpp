// llama-quantize's tensor type selection, restated. The facts (which tensor
// category gets which type under which file type, the counters, the block
// size fallbacks) follow llama.cpp's src/llama-quant.cpp so that a generated
// Q4_K_M file has the same per-tensor types llama-quantize would give it;
// tests compare against the fixtures llama-quantize produced.
#include "quantize/mix.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace glm5::quantize {

using quant::Type;

namespace {

struct SchemeEntry {
    const char* name;
    FileType ftype;
    Type base;
};

// llama-quantize's mix names and each mix's default matrix type.
constexpr SchemeEntry kMixes[] = {
    {"F32", FileType::ALL_F32, Type::F32},
    {"F16", FileType::MOSTLY_F16, Type::F16},
    {"BF16", FileType::MOSTLY_BF16, Type::BF16},
    {"Q4_0", FileType::MOSTLY_Q4_0, Type::Q4_0},
    {"Q4_1", FileType::MOSTLY_Q4_1, Type::Q4_1},
    {"Q5_0", FileType::MOSTLY_Q5_0, Type::Q5_0},
    {"Q5_1", FileType::MOSTLY_Q5_1, Type::Q5_1},
    {"Q8_0", FileType::MOSTLY_Q8_0, Type::Q8_0},
    {"Q2_K", FileType::MOSTLY_Q2_K, Type::Q2_K},
    {"Q2_K_S", FileType::MOSTLY_Q2_K_S, Type::Q2_K},
    {"Q3_K_S", FileType::MOSTLY_Q3_K_S, Type::Q3_K},
    {"Q3_K_M", FileType::MOSTLY_Q3_K_M, Type::Q3_K},
    {"Q3_K_L", FileType::MOSTLY_Q3_K_L, Type::Q3_K},
    {"Q4_K_S", FileType::MOSTLY_Q4_K_S, Type::Q4_K},
    {"Q4_K_M", FileType::MOSTLY_Q4_K_M, Type::Q4_K},
    {"Q5_K_S", FileType::MOSTLY_Q5_K_S, Type::Q5_K},
    {"Q5_K_M", FileType::MOSTLY_Q5_K_M, Type::Q5_K},
    {"Q6_K", FileType::MOSTLY_Q6_K, Type::Q6_K},
    {"IQ1_S", FileType::MOSTLY_IQ1_S, Type::IQ1_S},
    {"IQ1_M", FileType::MOSTLY_IQ1_M, Type::IQ1_M},
    {"IQ2_XXS", FileType::MOSTLY_IQ2_XXS, Type::IQ2_XXS},
    {"IQ2_XS", FileType::MOSTLY_IQ2_XS, Type::IQ2_XS},
    {"IQ2_S", FileType::MOSTLY_IQ2_S, Type::IQ2_XS},  // llama.cpp's IQ2_S mix is built on IQ2_XS
    {"IQ2_M", FileType::MOSTLY_IQ2_M, Type::IQ2_S},
    {"IQ3_XXS", FileType::MOSTLY_IQ3_XXS, Type::IQ3_XXS},
    {"IQ3_XS", FileType::MOSTLY_IQ3_XS, Type::IQ3_S},
    {"IQ3_S", FileType::MOSTLY_IQ3_S, Type::IQ3_S},
    {"IQ3_M", FileType::MOSTLY_IQ3_M, Type::IQ3_S},
    {"IQ4_NL", FileType::MOSTLY_IQ4_NL, Type::IQ4_NL},
    {"IQ4_XS", FileType::MOSTLY_IQ4_XS, Type::IQ4_XS},
};

// general.file_type of a pure file: the mix whose default is that type.
FileType pure_ftype(Type t) {
    switch (t) {
        case Type::F32:
            return FileType::ALL_F32;
        case Type::F16:
            return FileType::MOSTLY_F16;
        case Type::BF16:
            return FileType::MOSTLY_BF16;
        case Type::Q4_0:
            return FileType::MOSTLY_Q4_0;
        case Type::Q4_1:
            return FileType::MOSTLY_Q4_1;
        case Type::Q5_0:
            return FileType::MOSTLY_Q5_0;
        case Type::Q5_1:
            return FileType::MOSTLY_Q5_1;
        case Type::Q8_0:
            return FileType::MOSTLY_Q8_0;
        case Type::Q2_K:
            return FileType::MOSTLY_Q2_K;
        case Type::Q3_K:
            return FileType::MOSTLY_Q3_K_S;
        case Type::Q4_K:
            return FileType::MOSTLY_Q4_K_S;
        case Type::Q5_K:
            return FileType::MOSTLY_Q5_K_S;
        case Type::Q6_K:
            return FileType::MOSTLY_Q6_K;
        case Type::IQ1_S:
            return FileType::MOSTLY_IQ1_S;
        case Type::IQ1_M:
            return FileType::MOSTLY_IQ1_M;
        case Type::IQ2_XXS:
            return FileType::MOSTLY_IQ2_XXS;
        case Type::IQ2_XS:
            return FileType::MOSTLY_IQ2_XS;
        case Type::IQ2_S:
            return FileType::MOSTLY_IQ2_M;
        case Type::IQ3_XXS:
            return FileType::MOSTLY_IQ3_XXS;
        case Type::IQ3_S:
            return FileType::MOSTLY_IQ3_S;
        case Type::IQ4_NL:
            return FileType::MOSTLY_IQ4_NL;
        case Type::IQ4_XS:
            return FileType::MOSTLY_IQ4_XS;
        default:
            throw Error(std::string("cannot write weights as ") + quant::name(t));
    }
}

bool is_weight_type(Type t) {
    return quant::traits(t).weight_format;
}

std::string upper(std::string_view s) {
    std::string r;
    for (char c : s) r += char(std::toupper((unsigned char)c));
    return r;
}

// Broad tensor roles, found from the name as llama-quantize finds them.
enum class Cat {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnKvB,
    AttnOut,
    Up,
    Gate,
    Down,
    Other
};

Cat category_of(const std::string& n) {
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (n == "output.weight") return Cat::Output;
    if (n == "token_embd.weight") return Cat::TokenEmbd;
    if (has("attn_qkv.weight")) return Cat::AttnQkv;
    if (has("attn_kv_b.weight")) return Cat::AttnKvB;
    if (has("attn_v.weight")) return Cat::AttnV;
    if (has("attn_k.weight")) return Cat::AttnK;  // includes indexer.attn_k
    if (has("attn_q.weight")) return Cat::AttnQ;
    if (has("attn_output.weight")) return Cat::AttnOut;
    if (has("ffn_up")) return Cat::Up;
    if (has("ffn_gate")) return Cat::Gate;
    if (has("ffn_down")) return Cat::Down;
    return Cat::Other;
}

bool is_v_like(Cat c) {
    return c == Cat::AttnV || c == Cat::AttnQkv || c == Cat::AttnKvB;
}

int n_dims_of(const std::vector<int64_t>& ne) {
    int n = 1;
    for (size_t i = 0; i < ne.size(); ++i)
        if (ne[i] > 1) n = int(i) + 1;
    return n;
}

// Layers that keep more bits in the *_M mixes: the first and last eighth and
// every third layer in between.
bool more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The running state llama-quantize keeps while it walks the tensors.
struct Walk {
    const MixModel& m;
    FileType ft;
    int n_v_like = 0;
    int i_v_like = 0;
    int i_down = 0, i_gate = 0, i_up = 0;
    bool tied = true;

    bool any_of(std::initializer_list<FileType> l) const {
        return std::find(l.begin(), l.end(), ft) != l.end();
    }
    int n_gqa() const { return m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 1; }

    // (layer, layer count) for the per-layer rules: with experts the layer
    // comes from the name, as experts need not be consecutive.
    std::pair<int, int> layer_of(int counter, const std::string& name) const {
        const int n = m.n_layer_all;
        if (std::max(1, m.n_expert) > 1) {
            const int b = block_of(name);
            if (b < 0 || b >= n) throw Error("quant mix: no valid layer in tensor name " + name);
            return {b, n};
        }
        return {counter, n};
    }

    // llama-quantize's type for one tensor of category c, in a mix of type ft
    // whose default is t; the rule per category below.
    Type rule(Type t, Cat c, const std::string& name, int64_t ne0);
    bool low_bit() const;
    bool iq2_s_or_m() const;
    Type output_rule(Type t, int64_t ne0) const;
    Type embd_rule(Type t) const;
    Type low_bit_rule(Type t, Cat c);
    Type v_rule(Type t);
    Type down_rule(Type t, const std::string& name);
    Type attn_out_rule(Type t) const;
};

bool Walk::low_bit() const {
    using F = FileType;
    return any_of({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ1_S, F::MOSTLY_IQ2_S,
                   F::MOSTLY_IQ2_M, F::MOSTLY_IQ1_M});
}

bool Walk::iq2_s_or_m() const {
    return any_of({FileType::MOSTLY_IQ2_S, FileType::MOSTLY_IQ2_M});
}

// The output matrix, and the embeddings when they are tied to it.
Type Walk::output_rule(Type t, int64_t ne0) const {
    using F = FileType;
    if (ne0 % quant::traits(t).block_size != 0) return Type::Q8_0;
    if (any_of({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ3_XXS, F::MOSTLY_IQ1_S,
                F::MOSTLY_IQ2_S, F::MOSTLY_IQ2_M, F::MOSTLY_IQ1_M}))
        return Type::Q5_K;
    return t == Type::Q8_0 ? t : Type::Q6_K;
}

Type Walk::embd_rule(Type t) const {
    using F = FileType;
    if (any_of({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ1_S, F::MOSTLY_IQ1_M}))
        return Type::Q2_K;
    if (iq2_s_or_m() || ft == F::MOSTLY_IQ3_XXS) return Type::IQ3_S;
    return t;
}

// The 1-2 bit mixes: most matrices keep the mix's type.
Type Walk::low_bit_rule(Type t, Cat c) {
    using F = FileType;
    if (is_v_like(c)) {
        ++i_v_like;
        if (n_gqa() >= 4 || m.n_expert >= 4) return Type::Q4_K;
        return iq2_s_or_m() ? Type::IQ3_S : Type::Q2_K;
    }
    if (m.n_expert == 8 && c == Cat::AttnK) return Type::Q4_K;
    if (c == Cat::Down) {
        const bool first = i_down < m.n_layer_all / 8;
        ++i_down;
        if (first) return iq2_s_or_m() ? Type::IQ3_S : Type::Q2_K;
        return t;
    }
    if (c == Cat::AttnOut) {
        if (m.n_expert == 8) return Type::Q5_K;
        if (any_of({F::MOSTLY_IQ1_S, F::MOSTLY_IQ1_M})) return Type::IQ2_XXS;
        if (iq2_s_or_m()) return Type::IQ3_S;
    }
    return t;
}

// The value-like attention matrices (attn_v, attn_qkv, attn_kv_b).
Type Walk::v_rule(Type t) {
    using F = FileType;
    const int gqa = n_gqa();
    if (ft == F::MOSTLY_Q2_K)
        t = gqa >= 4 ? Type::Q4_K : Type::Q3_K;
    else if (ft == F::MOSTLY_Q2_K_S && gqa >= 4)
        t = Type::Q4_K;
    else if (ft == F::MOSTLY_IQ3_XXS)
        t = gqa >= 4 ? Type::Q4_K : (m.has_imatrix ? Type::IQ3_XXS : Type::IQ3_S);
    else if (any_of({F::MOSTLY_IQ3_XS, F::MOSTLY_IQ3_S}) && gqa >= 4)
        t = Type::Q4_K;
    else if (ft == F::MOSTLY_IQ3_M)
        t = Type::Q4_K;
    else if (ft == F::MOSTLY_Q3_K_M)
        t = i_v_like < 2 ? Type::Q5_K : Type::Q4_K;
    else if (ft == F::MOSTLY_Q3_K_L)
        t = Type::Q5_K;
    else if (any_of({F::MOSTLY_IQ4_NL, F::MOSTLY_IQ4_XS}) && gqa >= 4)
        t = Type::Q5_K;
    else if (any_of({F::MOSTLY_Q4_K_M, F::MOSTLY_Q5_K_M}) && more_bits(i_v_like, n_v_like))
        t = Type::Q6_K;
    else if (ft == F::MOSTLY_Q4_K_S && i_v_like < 4)
        t = Type::Q5_K;
    if (m.n_expert == 8) t = Type::Q8_0;
    ++i_v_like;
    return t;
}

Type Walk::down_rule(Type t, const std::string& name) {
    using F = FileType;
    const auto [il, n] = layer_of(i_down, name);
    if (ft == F::MOSTLY_Q2_K)
        t = Type::Q3_K;
    else if (ft == F::MOSTLY_Q2_K_S) {
        if (il < n / 8) t = Type::Q4_K;
    } else if (ft == F::MOSTLY_IQ3_XXS && !m.has_imatrix)
        t = il < n / 8 ? Type::Q4_K : Type::Q3_K;
    else if (ft == F::MOSTLY_Q3_K_M)
        t = il < n / 16 ? Type::Q5_K : Type::Q4_K;
    else if (ft == F::MOSTLY_IQ3_M && (il < n / 8 || (m.n_expert == 8 && more_bits(il, n))))
        t = Type::Q4_K;
    else if (ft == F::MOSTLY_Q3_K_L)
        t = Type::Q5_K;
    else if (ft == F::MOSTLY_Q4_K_M) {
        if (more_bits(il, n)) t = Type::Q6_K;
    } else if (il < n / 8 && any_of({F::MOSTLY_IQ4_NL, F::MOSTLY_IQ4_XS}) && !m.has_imatrix)
        t = Type::Q5_K;
    else if (ft == F::MOSTLY_Q5_K_M && more_bits(il, n))
        t = Type::Q6_K;
    else if (ft == F::MOSTLY_Q4_K_S && il < n / 8)
        t = Type::Q5_K;
    else if (any_of({F::MOSTLY_Q4_0, F::MOSTLY_Q5_0}) && m.has_imatrix && il < n / 8)
        t = ft == F::MOSTLY_Q4_0 ? Type::Q4_1 : Type::Q5_1;
    ++i_down;
    return t;
}

Type Walk::attn_out_rule(Type t) const {
    using F = FileType;
    if (m.n_expert == 8) {
        if (any_of({F::MOSTLY_Q2_K, F::MOSTLY_IQ3_XS, F::MOSTLY_IQ3_XXS, F::MOSTLY_Q3_K_S,
                    F::MOSTLY_Q3_K_M, F::MOSTLY_IQ4_NL, F::MOSTLY_Q4_K_S, F::MOSTLY_Q4_K_M,
                    F::MOSTLY_IQ3_S, F::MOSTLY_IQ3_M, F::MOSTLY_IQ4_XS}))
            return Type::Q5_K;
        return t;
    }
    if (ft == F::MOSTLY_Q2_K) return Type::Q3_K;
    if (ft == F::MOSTLY_IQ3_XXS) return Type::IQ3_S;
    if (ft == F::MOSTLY_Q3_K_M) return Type::Q4_K;
    if (ft == F::MOSTLY_Q3_K_L) return Type::Q5_K;
    if (ft == F::MOSTLY_IQ3_M) return Type::Q4_K;
    return t;
}

Type Walk::rule(Type t, Cat c, const std::string& name, int64_t ne0) {
    using F = FileType;
    if (c == Cat::Output || (tied && c == Cat::TokenEmbd)) return output_rule(t, ne0);
    if (c == Cat::TokenEmbd) return embd_rule(t);
    if (low_bit()) return low_bit_rule(t, c);
    if (is_v_like(c)) return v_rule(t);
    if (c == Cat::AttnK) {
        if (m.n_expert == 8) return Type::Q8_0;
        if (ft == F::MOSTLY_IQ3_XS) return Type::IQ3_XXS;
        if (ft == F::MOSTLY_IQ3_XXS) return Type::IQ2_S;
        return t;
    }
    if (c == Cat::AttnQ) {
        if (ft == F::MOSTLY_IQ3_XS) return Type::IQ3_XXS;
        if (ft == F::MOSTLY_IQ3_XXS) return Type::IQ2_S;
        return t;
    }
    if (c == Cat::Down) return down_rule(t, name);
    if (c == Cat::AttnOut) return attn_out_rule(t);
    if (c == Cat::AttnQkv) {
        if (any_of({F::MOSTLY_Q3_K_M, F::MOSTLY_Q3_K_L, F::MOSTLY_IQ3_M})) return Type::Q4_K;
        if (ft == F::MOSTLY_Q4_K_M) return Type::Q5_K;
        if (ft == F::MOSTLY_Q5_K_M) return Type::Q6_K;
        return t;
    }
    if (c == Cat::Gate || c == Cat::Up) {
        int& counter = c == Cat::Gate ? i_gate : i_up;
        const auto [il, n] = layer_of(counter, name);
        if (ft == F::MOSTLY_IQ3_XS && il >= n / 8 && il < 7 * n / 8) t = Type::IQ3_XXS;
        ++counter;
        return t;
    }
    return t;
}

}  // namespace

int block_of(const std::string& name) {
    int b = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &b) != 1) return -1;
    return b;
}

bool in_nextn(const std::string& name, const MixModel& model) {
    const int b = block_of(name);
    return model.n_nextn > 0 && b >= model.n_layer_all - model.n_nextn;
}

std::vector<size_t> loader_order(size_t n, const std::function<const std::string&(size_t)>& name) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const int ba = block_of(name(a)), bb = block_of(name(b));
        if (ba != bb) return ba < bb;
        return name(a) < name(b);
    });
    return order;
}

Type block_fallback(Type t, int64_t ne0) {
    if (ne0 % quant::traits(t).block_size == 0) return t;
    Type r;
    switch (t) {
        case Type::IQ1_S:
        case Type::IQ1_M:
        case Type::IQ2_XXS:
        case Type::IQ2_XS:
        case Type::IQ2_S:
        case Type::IQ3_XXS:
        case Type::IQ3_S:
        case Type::IQ4_XS:
            r = Type::IQ4_NL;
            break;
        case Type::Q2_K:
        case Type::Q3_K:
            r = Type::Q4_0;
            break;
        case Type::Q4_K:
            r = Type::Q5_0;
            break;
        case Type::Q5_K:
            r = Type::Q5_1;
            break;
        case Type::Q6_K:
            r = Type::Q8_0;
            break;
        // llama-quantize gives up here; a row that is not a multiple of 32
        // cannot hold any block format, so F16 is the only choice left.
        default:
            r = Type::F16;
            break;
    }
    if (ne0 % quant::traits(r).block_size != 0) r = Type::F16;
    return r;
}

std::optional<QuantScheme> parse_scheme(std::string_view name, bool force_pure) {
    const std::string up = upper(name);
    if (up.rfind("DYN-", 0) == 0) {
        const auto t = quant::type_from_name(up.substr(4));
        if (!t || !is_weight_type(*t) || !quant::traits(*t).quantized) return std::nullopt;
        QuantScheme s{up, pure_ftype(*t), *t, false};
        s.dynamic = true;
        return s;
    }
    for (const auto& e : kMixes) {
        if (up != e.name) continue;
        QuantScheme s{up, e.ftype, e.base, false};
        if (force_pure && quant::traits(e.base).quantized) {
            // A pure file of the named type (IQ2_S means the IQ2_S type here).
            const auto t = quant::type_from_name(up);
            if (t && is_weight_type(*t)) s.base = *t;
            s.ftype = pure_ftype(s.base);
            s.pure = true;
        }
        return s;
    }
    const auto t = quant::type_from_name(up);
    if (!t || !is_weight_type(*t)) return std::nullopt;
    return QuantScheme{up, pure_ftype(*t), *t, quant::traits(*t).quantized};
}

std::vector<std::string> scheme_names() {
    std::vector<std::string> r;
    for (const auto& e : kMixes) r.push_back(e.name);
    for (const char* p : {"Q3_K", "Q4_K", "Q5_K"}) r.push_back(p);
    for (const char* p : {"DYN-IQ1_S", "DYN-IQ1_M", "DYN-IQ2_XXS", "DYN-IQ2_XS", "DYN-IQ2_S",
                          "DYN-IQ3_XXS", "DYN-Q2_K", "DYN-Q3_K", "DYN-Q4_K"})
        r.push_back(p);
    return r;
}

Type step_up(Type t) {
    switch (t) {
        case Type::IQ1_S:
        case Type::IQ1_M:
            return Type::IQ2_XXS;
        case Type::IQ2_XXS:
            return Type::IQ2_XS;
        case Type::IQ2_XS:
            return Type::IQ2_S;
        case Type::IQ2_S:
            return Type::IQ3_XXS;
        case Type::IQ3_XXS:
            return Type::IQ3_S;
        case Type::IQ3_S:
            return Type::IQ4_XS;
        case Type::IQ4_XS:
        case Type::IQ4_NL:
        case Type::Q4_K:
            return Type::Q5_K;
        case Type::Q2_K:
            return Type::Q3_K;
        case Type::Q3_K:
            return Type::Q4_K;
        case Type::Q5_K:
            return Type::Q6_K;
        case Type::Q4_0:
        case Type::Q4_1:
            return Type::Q5_0;
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::Q6_K:
            return Type::Q8_0;
        default:
            return t;
    }
}

bool glm5next_keeps_f32(const std::string& name) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    return has("hc_attn_fn.") || has("hc_ffn_fn.") || has("indexer_compressor_ape.") ||
           has("ssm_conv1d");
}

namespace {

double bits_per_value(Type t) {
    return 8.0 * double(quant::traits(t).type_size) / double(quant::traits(t).block_size);
}

// The type of the two that keeps more bits.
Type wider(Type a, Type b) {
    return bits_per_value(a) >= bits_per_value(b) ? a : b;
}

}  // namespace

Type dynamic_type(const QuantScheme& scheme, const MixModel& model, const std::string& name) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    const Type base = scheme.base;
    if (name == "token_embd.weight" || name == "output.weight") return wider(base, Type::Q6_K);
    const bool nextn = in_nextn(name, model);
    if (has("_exps.")) {
        const Type t = has("ffn_down_exps.") ? step_up(base) : base;
        return nextn ? wider(t, Type::Q4_K) : t;
    }
    if (nextn) return wider(base, Type::Q8_0);
    if (has("_shexp.") || has("ffn_gate.") || has("ffn_up.") || has("ffn_down."))
        return wider(base, Type::Q6_K);
    return wider(base, Type::Q8_0);
}

bool is_quantizable(const std::string& name, const std::vector<int64_t>& ne) {
    if (n_dims_of(ne) < 2) return false;
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
    if (name.find("_norm.weight") != std::string::npos) return false;
    if (name.find("ffn_gate_inp.weight") != std::string::npos) return false;
    if (name.find("ssm_conv1d") != std::string::npos) return false;
    return true;
}

bool type_requires_imatrix(const std::string& name, Type t, FileType ftype) {
    if (name == "token_embd.weight" || name == "output.weight") return false;
    switch (t) {
        case Type::IQ3_XXS:
        case Type::IQ2_XXS:
        case Type::IQ2_XS:
        case Type::IQ2_S:
        case Type::IQ1_M:
        case Type::IQ1_S:
            return true;
        case Type::Q2_K:
            return ftype == FileType::MOSTLY_Q2_K_S;
        default:
            return false;
    }
}

std::vector<Type> assign_types(const QuantScheme& scheme, const MixModel& model,
                               const std::vector<MixTensor>& tensors) {
    std::vector<Type> out(tensors.size(), Type::F32);
    const bool quantized = quant::traits(scheme.base).quantized;

    // Float files follow the converter: matrices in the float type, the rest F32.
    if (!quantized) {
        for (size_t i = 0; i < tensors.size(); ++i) {
            const MixTensor& t = tensors[i];
            if (t.override_type)
                out[i] = *t.override_type;
            else if (is_quantizable(t.name, t.ne) && !t.f32_in_float_files)
                out[i] = scheme.base;
        }
        return out;
    }

    const std::vector<size_t> order = loader_order(
        tensors.size(), [&](size_t i) -> const std::string& { return tensors[i].name; });

    Walk w{model, scheme.ftype};
    for (const MixTensor& t : tensors) {
        const Cat c = category_of(t.name);
        if (is_v_like(c)) ++w.n_v_like;
        if (c == Cat::Output) w.tied = false;
    }
    for (size_t i : order) {
        const MixTensor& t = tensors[i];
        if (!is_quantizable(t.name, t.ne)) continue;  // stays F32
        Type ty = scheme.base;
        if (t.override_type)
            ty = *t.override_type;
        else if (scheme.dynamic)
            ty = dynamic_type(scheme, model, t.name);
        else if (!scheme.pure)
            ty = w.rule(ty, category_of(t.name), t.name, t.ne[0]);
        out[i] = quant::traits(ty).quantized ? block_fallback(ty, t.ne[0]) : ty;
    }
    return out;
}

}  // namespace glm5::quantize
