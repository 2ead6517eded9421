// The GGUF side of the text layer: tokenizer.ggml.*, the architecture and the chat template
// (kept apart so that code built from plain vectors does not need the GGUF reader).
#include "core/error.h"
#include "gguf/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace glm5::text {

namespace {

TokenId read_id(const gguf::File& file, const char* key) {
    const gguf::Value* v = file.find(key);
    if (!v) return kNoToken;
    auto i = v->as_int();
    if (!i) throw Error(std::string("tokenizer: ") + key + " is not an integer");
    if (*i < 0 || *i > INT32_MAX) return kNoToken;
    return TokenId(*i);
}

// nullptr when an optional key is absent.
const gguf::Value* read_array(const gguf::File& file, const char* key, bool required) {
    const gguf::Value* v = file.find(key);
    if (!v) {
        if (required) throw Error(std::string("tokenizer: missing key ") + key);
        return nullptr;
    }
    if (!v->is_array()) throw Error(std::string("tokenizer: ") + key + " is not an array");
    return v;
}

}  // namespace

VocabData read_vocab(const gguf::File& file) {
    VocabData d;
    const gguf::Value* model = file.find("tokenizer.ggml.model");
    if (!model || !model->as_string()) throw Error("tokenizer: missing key tokenizer.ggml.model");
    if (*model->as_string() != "gpt2")
        throw Error("tokenizer: tokenizer.ggml.model '" + *model->as_string() +
                    "' is not supported (only byte-level BPE, 'gpt2')");
    const gguf::Value* pre = file.find("tokenizer.ggml.pre");
    if (pre && pre->as_string()) d.pre = *pre->as_string();

    const gguf::Value& toks = *read_array(file, "tokenizer.ggml.tokens", true);
    d.tokens.reserve(toks.size());
    for (size_t i = 0; i < toks.size(); ++i) {
        const auto s = toks.string_at(i);
        if (!s)
            throw Error("tokenizer: tokenizer.ggml.tokens[" + std::to_string(i) +
                        "] is not a string");
        d.tokens.emplace_back(*s);
    }
    if (const gguf::Value* types = read_array(file, "tokenizer.ggml.token_type", false)) {
        d.types.reserve(types->size());
        for (size_t i = 0; i < types->size(); ++i) {
            auto t = (*types)[i].as_int();
            if (!t)
                throw Error("tokenizer: tokenizer.ggml.token_type[" + std::to_string(i) +
                            "] is not an integer");
            d.types.push_back(static_cast<TokenType>(*t));
        }
    }
    const gguf::Value& merges = *read_array(file, "tokenizer.ggml.merges", true);
    d.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const auto s = merges.string_at(i);
        if (!s)
            throw Error("tokenizer: tokenizer.ggml.merges[" + std::to_string(i) +
                        "] is not a string");
        d.merges.emplace_back(*s);
    }
    d.special.bos = read_id(file, "tokenizer.ggml.bos_token_id");
    d.special.eos = read_id(file, "tokenizer.ggml.eos_token_id");
    d.special.eot = read_id(file, "tokenizer.ggml.eot_token_id");
    d.special.eom = read_id(file, "tokenizer.ggml.eom_token_id");
    d.special.unk = read_id(file, "tokenizer.ggml.unknown_token_id");
    d.special.pad = read_id(file, "tokenizer.ggml.padding_token_id");
    return d;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
    return std::make_unique<Tokenizer>(read_vocab(file));
}

ChatFormat ChatFormat::from_gguf(const gguf::File& file) {
    const std::string arch = file.get_string("general.architecture", "");
    std::string tmpl;
    if (const gguf::Value* v = file.find("tokenizer.chat_template"); v && v->as_string())
        tmpl = *v->as_string();
    const std::optional<ChatStyle> style = chat_style_for_arch(arch);
    ChatFormat f(style.value_or(ChatStyle::GlmDsa), std::move(tmpl));
    if (!style) {
        std::string w =
            "architecture '" + arch + "' is not glm-dsa or glm5next; using the glm-dsa chat format";
        f.warning_ = f.warning_.empty() ? w : w + "; " + f.warning_;
    }
    return f;
}

}  // namespace glm5::text
