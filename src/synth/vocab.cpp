#include "synth/vocab.h"

#include <string>
#include <unordered_set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "synth/layout.h"

namespace glm5::synth {

namespace {

// "Ġ" (U+0120) is how byte-level BPE spells a leading space.
constexpr const char* kSpace = "\xc4\xa0";

// The i-th pronounceable filler word: consonant-vowel syllables, two
// syllables first (10,000 words), then three, and so on.
std::string filler_word(uint64_t i) {
    static const char kCons[] = "bcdfghjklmnpqrstvwxz";  // 20
    static const char kVow[] = "aeiou";                  // 5
    int n_syl = 2;
    uint64_t count = 10000;  // 100^2
    while (i >= count) {
        i -= count;
        ++n_syl;
        count *= 100;
    }
    std::string w(size_t(2 * n_syl), ' ');
    for (int s = n_syl - 1; s >= 0; --s) {
        const uint64_t syl = i % 100;
        i /= 100;
        w[size_t(2 * s)] = kCons[syl / 5];
        w[size_t(2 * s + 1)] = kVow[syl % 5];
    }
    return w;
}

}  // namespace

// The chat template written into generated models: the GLM-5 layout the
// engine renders (no newline after role tokens, reasoning opt-in through
// enable_thinking), so the engine finds it matching. The fixtures carry a
// shorter template with newlines; only this key differs from them.
const char kGlm5ChatTemplate[] =
    "[gMASK]<sop>"
    "{%- set think = enable_thinking is defined and enable_thinking -%}"
    "{%- if think -%}<|system|>Reasoning Effort: Max{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|system|>{{ m['content'] }}"
    "{%- elif m['role'] == 'user' -%}<|user|>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}<|assistant|><think></think>{{ m['content'] }}"
    "{%- elif m['role'] == 'tool' -%}<|observation|><tool_response>{{ m['content'] "
    "}}</tool_response>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|><think>{%- if not think -%}</think>{%- endif "
    "-%}{%- endif -%}";

Vocab make_vocab(int64_t n_vocab) {
    const BaseVocab& b = glm_dsa_base_vocab();
    if (n_vocab < int64_t(b.n_tokens))
        throw Error("n_vocab " + std::to_string(n_vocab) + " is smaller than the " +
                    std::to_string(b.n_tokens) + " tokens of the GLM vocabulary");
    Vocab v;
    v.tokens.assign(b.tokens, b.tokens + b.n_tokens);
    v.types.assign(b.types, b.types + b.n_tokens);
    v.merges.assign(b.merges, b.merges + b.n_merges);
    v.chat_template = kGlm5ChatTemplate;
    v.bos = b.bos;
    v.eos = b.eos;
    v.eot = b.eot;
    v.eom = b.eom;
    v.unk = b.unk;
    v.pad = b.pad;

    std::unordered_set<std::string> taken(v.tokens.begin(), v.tokens.end());
    v.tokens.reserve(size_t(n_vocab));
    for (uint64_t i = 0; int64_t(v.tokens.size()) < n_vocab; ++i) {
        std::string t = kSpace + filler_word(i);
        if (!taken.insert(t).second) continue;  // a real merged token already
        v.tokens.push_back(std::move(t));
        v.types.push_back(kTokenNormal);
    }
    return v;
}

void append_glm_tokenizer(std::vector<std::pair<std::string, gguf::Value>>& md, int64_t n_vocab) {
    using gguf::Value;
    using gguf::ValueType;
    const Vocab v = make_vocab(n_vocab);
    auto str = [](const std::string& s) { return Value::make_string(s); };
    auto u32 = [](int64_t x) { return Value::make_uint(ValueType::U32, uint64_t(x)); };

    std::vector<Value> tokens, types, merges;
    tokens.reserve(v.tokens.size());
    for (const auto& t : v.tokens) tokens.push_back(str(t));
    types.reserve(v.types.size());
    for (int32_t t : v.types) types.push_back(Value::make_int(ValueType::I32, t));
    merges.reserve(v.merges.size());
    for (const auto& m : v.merges) merges.push_back(str(m));

    md.emplace_back("tokenizer.ggml.model", str("gpt2"));
    md.emplace_back("tokenizer.ggml.pre", str("glm4"));
    md.emplace_back("tokenizer.ggml.tokens",
                    Value::make_array(ValueType::STRING, std::move(tokens)));
    md.emplace_back("tokenizer.ggml.token_type",
                    Value::make_array(ValueType::I32, std::move(types)));
    md.emplace_back("tokenizer.ggml.merges",
                    Value::make_array(ValueType::STRING, std::move(merges)));
    md.emplace_back("tokenizer.ggml.bos_token_id", u32(v.bos));
    md.emplace_back("tokenizer.ggml.eos_token_id", u32(v.eos));
    md.emplace_back("tokenizer.ggml.eot_token_id", u32(v.eot));
    md.emplace_back("tokenizer.ggml.eom_token_id", u32(v.eom));
    md.emplace_back("tokenizer.ggml.unknown_token_id", u32(v.unk));
    md.emplace_back("tokenizer.ggml.padding_token_id", u32(v.pad));
    md.emplace_back("tokenizer.ggml.add_bos_token", Value::make_bool(false));
    md.emplace_back("tokenizer.chat_template", str(v.chat_template));
}

}  // namespace glm5::synth
