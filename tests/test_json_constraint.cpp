// JSON-constrained sampling: schemas compiled to a token constraint must only ever let
// through outputs that parse and validate, finish within the token budget, end with a stop
// token exactly when complete, and refuse the keywords they do not implement. Random walks
// over the glm-dsa fixture vocabulary (uniform over the allowed tokens and through the
// Sampler with random logits), the trie walk checked token by token against a direct
// simulation on a 32K vocabulary (with its cost per step), the tiny fixture model end to
// end, and the number-length cap JSON output shares with tool calls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "runtime/sampler.h"
#include "runtime/tool_call.h"
#include "server/response_format.h"
#include "synth/vocab.h"
#include "text/tokenizer.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::runtime;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------
// Fixtures.

struct Vocab {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<text::Tokenizer> tok;
    std::shared_ptr<const JsonVocab> jv;
};

const Vocab& fixture() {
    static Vocab v = [] {
        Vocab r;
        r.file = gguf::File::open(std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf");
        r.tok = text::Tokenizer::from_gguf(*r.file);
        r.jv = std::make_shared<const JsonVocab>(*r.tok);
        return r;
    }();
    return v;
}

// The generator's vocabulary padded to 32768 tokens (the bench model's n_vocab).
const Vocab& vocab32k() {
    static Vocab v = [] {
        const auto g = synth::make_vocab(32768);
        text::VocabData d;
        d.tokens = g.tokens;
        for (int32_t t : g.types) d.types.push_back(text::TokenType(t));
        d.merges = g.merges;
        d.special.bos = g.bos;
        d.special.eos = g.eos;
        d.special.eot = g.eot;
        d.special.eom = g.eom;
        d.special.unk = g.unk;
        d.special.pad = g.pad;
        Vocab r;
        r.tok = std::make_unique<text::Tokenizer>(std::move(d));
        r.jv = std::make_shared<const JsonVocab>(*r.tok);
        return r;
    }();
    return v;
}

// A harder vocabulary than the generator's filler words: random byte strings with quotes,
// backslashes, newlines, braces, digits and UTF-8 cut at any byte, so that many tokens are not
// plain string text. Spelled with the GPT-2 byte-to-unicode map, as GGUF vocabularies are.
std::string gpt2_spelling(const std::string& bytes) {
    static const std::vector<std::string> map = [] {
        std::vector<std::string> m(256);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable =
                (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
            std::string u;
            if (cp < 0x80) {
                u += char(cp);
            } else {
                u += char(0xC0 | (cp >> 6));
                u += char(0x80 | (cp & 0x3F));
            }
            m[size_t(b)] = u;
        }
        return m;
    }();
    std::string out;
    for (unsigned char c : bytes) out += map[c];
    return out;
}

std::unique_ptr<Vocab> stress_vocab(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::set<std::string> seen;
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) {
        toks.push_back(std::string(1, char(b)));
        seen.insert(toks.back());
    }
    const std::string letters = "etaoinshrdlucmfwypvbgkqjxz";
    const std::string punct = "\"{}[]:,.\\\n\t -_/'()!?=<>+*#";
    const char* utf8[] = {"\xc3\xa9", "\xe2\x82\xac", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                          "\xd0\xb6"};
    while (toks.size() + 4 < n) {
        std::string t;
        const int kind = int(rng() % 10);
        const int len = 2 + int(rng() % 9);
        if (rng() % 3 == 0) t += ' ';
        while (int(t.size()) < len) {
            const int r = int(rng() % 10);
            if (kind < 6 && r < 8)
                t += letters[rng() % letters.size()];
            else if (kind < 8 && r < 5)
                t += punct[rng() % punct.size()];
            else if (r < 7)
                t += utf8[rng() % 5];
            else
                t += char('0' + rng() % 10);
        }
        if (kind == 9 && t.size() > 2)
            t = t.substr(rng() % 2, t.size() - 1 - rng() % 2);  // cut UTF-8
        if (seen.insert(t).second) toks.push_back(t);
    }
    text::VocabData d;
    for (const auto& t : toks) {
        d.tokens.push_back(gpt2_spelling(t));
        d.types.push_back(text::TokenType::Normal);
    }
    for (const char* sp : {"<|endoftext|>", "<|user|>", "<|observation|>", "</think>"}) {
        d.tokens.push_back(sp);
        d.types.push_back(text::TokenType::Control);
    }
    d.special.eos = int32_t(d.tokens.size() - 4);
    auto r = std::make_unique<Vocab>();
    r->tok = std::make_unique<text::Tokenizer>(std::move(d));
    r->jv = std::make_shared<const JsonVocab>(*r->tok);
    return r;
}

// ---------------------------------------------------------------------------
// A validator for the supported subset, written from the JSON Schema rules (independent of
// the compiler).

size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool is_integer(const json& v) {
    if (v.is_number_integer() || v.is_number_unsigned()) return true;
    if (v.is_number_float()) {
        const double d = v.get<double>();
        return d == double(int64_t(d));
    }
    return false;
}

bool has_type(const json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "integer") return is_integer(v);
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    return false;
}

bool validate(const json& v, const ojson& s, const ojson& root, std::string& why) {
    if (s.is_boolean()) {
        if (!s.get<bool>()) why = "false schema";
        return s.get<bool>();
    }
    if (s.contains("$ref")) {
        const std::string r = s["$ref"].get<std::string>();
        const ojson& t = r == "#" ? root : root.at(ojson::json_pointer(r.substr(1)));
        return validate(v, t, root, why);
    }
    if (s.contains("allOf"))
        for (const auto& sub : s["allOf"])
            if (!validate(v, sub, root, why)) return false;
    if (s.contains("anyOf")) {
        bool any = false;
        for (const auto& sub : s["anyOf"]) {
            std::string w;
            any = any || validate(v, sub, root, w);
        }
        if (!any) {
            why = "no anyOf alternative matches " + v.dump();
            return false;
        }
    }
    if (s.contains("oneOf")) {
        int n = 0;
        for (const auto& sub : s["oneOf"]) {
            std::string w;
            n += validate(v, sub, root, w);
        }
        if (n != 1) {
            why = std::to_string(n) + " oneOf alternatives match " + v.dump();
            return false;
        }
    }
    if (s.contains("enum")) {
        bool found = false;
        for (const auto& e : s["enum"]) found = found || json::parse(e.dump()) == v;
        if (!found) {
            why = v.dump() + " is not in the enum";
            return false;
        }
    }
    if (s.contains("const") && json::parse(s["const"].dump()) != v) {
        why = v.dump() + " is not the const";
        return false;
    }
    if (s.contains("type")) {
        bool ok = false;
        if (s["type"].is_string())
            ok = has_type(v, s["type"].get<std::string>());
        else
            for (const auto& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
        if (!ok) {
            why = v.dump() + " does not have type " + s["type"].dump();
            return false;
        }
    }
    if (v.is_string()) {
        const size_t n = code_points(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<size_t>()) {
            why = "string too short";
            return false;
        }
        if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) {
            why = "string too long";
            return false;
        }
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) {
            why = "too few items";
            return false;
        }
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) {
            why = "too many items";
            return false;
        }
        if (s.contains("items"))
            for (const auto& x : v)
                if (!validate(x, s["items"], root, why)) return false;
    }
    if (v.is_object()) {
        if (s.contains("required"))
            for (const auto& r : s["required"])
                if (!v.contains(r.get<std::string>())) {
                    why = "required " + r.dump() + " missing";
                    return false;
                }
        for (const auto& [k, x] : v.items()) {
            if (s.contains("properties") && s["properties"].contains(k)) {
                if (!validate(x, s["properties"][k], root, why)) return false;
            } else if (s.contains("additionalProperties")) {
                if (!validate(x, s["additionalProperties"], root, why)) {
                    why = "additional property " + k + ": " + why;
                    return false;
                }
            }
        }
    }
    return true;
}

// Parses and validates a finished output; the empty string when it does.
std::string check_document(const std::string& text, const ojson& schema) {
    json v;
    try {
        v = json::parse(text);
    } catch (const std::exception& e) {
        return std::string("does not parse: ") + e.what();
    }
    std::string why;
    if (!validate(v, schema, schema, why)) return "does not validate: " + why;
    return "";
}

bool is_stop(const Vocab& v, int32_t id) {
    const auto& s = v.jv->stop_ids();
    return std::find(s.begin(), s.end(), id) != s.end();
}

// ---------------------------------------------------------------------------
// Random walks.

struct Walk {
    std::string text;
    bool stopped = false;
    int tokens = 0;
};

// Picks among the allowed tokens (uniformly, or through a Sampler with random logits when
// `sampler` is set) for at most `budget` tokens, checking at every step that stop tokens are
// allowed exactly when the text so far is a valid document and are then the only choice
// for containers.
Walk walk(const Vocab& v, GrammarConstraint& c, const ojson& schema, int budget, std::mt19937& rng,
          Sampler* sampler = nullptr) {
    Walk w;
    std::vector<int32_t> allowed;
    std::vector<float> logits(size_t(v.tok->n_vocab()));
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (int i = 0; i < budget; ++i) {
        c.set_remaining(budget - i);
        allowed.clear();
        bool stop_ok = false;
        for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
            if (c.allows(id)) {
                allowed.push_back(id);
                stop_ok = stop_ok || is_stop(v, id);
            }
        EXPECT_FALSE(allowed.empty()) << "nothing allowed after " << w.text;
        if (allowed.empty()) return w;
        const bool parses = json::accept(w.text);
        const std::string bad = parses ? check_document(w.text, schema) : "incomplete";
        EXPECT_EQ(stop_ok, bad.empty())
            << "stop allowed: " << stop_ok << " for " << w.text << " (" << bad << ")";
        if (parses && (w.text.back() == '}' || w.text.back() == ']' || w.text.back() == '"')) {
            for (int32_t id : allowed)
                EXPECT_TRUE(is_stop(v, id)) << "token " << id << " allowed after " << w.text;
        }
        int32_t pick;
        if (sampler) {
            for (auto& l : logits) l = nd(rng);
            pick = sampler->sample(logits, {}, [&](int32_t id) { return c.allows(id); });
            EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), pick) != allowed.end());
        } else {
            pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        }
        c.accept(pick);
        if (is_stop(v, pick)) {
            w.stopped = true;
            break;
        }
        w.text += v.tok->token_bytes(pick);
        EXPECT_EQ(c.text(), w.text);
        ++w.tokens;
    }
    return w;
}

GrammarLimits small_limits() {
    GrammarLimits l;
    l.max_string_chars = 12;
    l.max_array_items = 4;
    l.max_object_members = 4;
    l.max_int_digits = 4;
    l.max_frac_digits = 3;
    l.max_exp_digits = 2;
    l.max_depth = 3;
    return l;
}

// Runs `n` walks with budgets from the schema's shortest document up to +extra; each must
// end in a valid document.
void run_walks(const ojson& schema, const std::shared_ptr<const Grammar>& g, int n, int extra,
               uint32_t seed, bool with_sampler = false) {
    const Vocab& v = fixture();
    std::mt19937 rng(seed);
    const int minlen = int(min_document_bytes(*g));
    int stopped = 0;
    for (int k = 0; k < n; ++k) {
        GrammarConstraint c(g, v.jv);
        const int budget = minlen + int(rng() % uint32_t(extra + 1));
        SamplerParams sp;
        sp.temperature = 1.0f;
        sp.top_k = 0;
        sp.top_p = 1.0f;
        sp.min_p = 0.0f;
        sp.seed = seed * 1000 + uint64_t(k);
        Sampler sampler(sp);
        const Walk w = walk(v, c, schema, budget, rng, with_sampler ? &sampler : nullptr);
        if (::testing::Test::HasFailure()) return;
        EXPECT_LE(w.tokens, budget);
        EXPECT_TRUE(c.complete()) << w.text;
        const std::string bad = check_document(w.text, schema);
        ASSERT_TRUE(bad.empty()) << "budget " << budget << ": " << w.text << "\n" << bad;
        stopped += w.stopped;
    }
    // Most walks have room to spare and end with a stop token.
    if (extra > 20) {
        EXPECT_GT(stopped, n / 4);
    }
}

const char* kFlat = R"({
  "type": "object",
  "title": "Person", "description": "annotations are ignored", "$schema": "https://json-schema.org/draft/2020-12/schema",
  "properties": {
    "name": {"type": "string", "maxLength": 10, "description": "x"},
    "age": {"type": "integer"},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "nothing": {"type": "null"},
    "color": {"enum": ["red", "green", "blue"]},
    "size": {"type": "integer", "enum": [1, 2, 30, "x"]},
    "tag": {"const": "fixed\"q"},
    "code": {"type": "string", "minLength": 3, "maxLength": 3}
  },
  "required": ["name", "age", "ok", "color", "code"],
  "additionalProperties": false
})";
// The shortest document, written out by hand.
const char* kFlatMin = R"({"name":"","age":0,"ok":true,"color":"red","code":"   "})";

const char* kNested = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "items": {
      "type": "array", "minItems": 1, "maxItems": 3,
      "items": {
        "type": "object",
        "properties": {
          "label": {"type": "string"},
          "dims": {"type": "array", "items": {"type": "number"}, "maxItems": 2},
          "kind": {"enum": ["a", "b", null, 7, true]}
        },
        "required": ["label", "kind"]
      }
    },
    "meta": {
      "type": "object",
      "properties": {"x": {"type": ["integer", "null"]}, "y": {"type": "boolean"}},
      "required": ["y"]
    }
  },
  "required": ["items", "meta"]
})";
const char* kNestedMin = R"({"items":[{"label":"","kind":7}],"meta":{"y":true}})";

const char* kUnions = R"({
  "$defs": {
    "node": {
      "type": "object",
      "properties": {
        "v": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "number"}, {"type": "null"}, {"enum": ["abc", 5, false]}]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
      },
      "required": ["v"]
    }
  },
  "type": "object",
  "properties": {
    "root": {"$ref": "#/$defs/node"},
    "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "array", "items": {"type": "boolean"}}]},
    "wrapped": {"allOf": [{"$ref": "#/$defs/node"}], "description": "pydantic style"},
    "map": {"type": "object", "additionalProperties": {"type": "integer"}},
    "free": {}
  },
  "required": ["root", "pick", "map"]
})";
const char* kUnionsMin = R"({"root":{"v":0},"pick":0,"map":{}})";

}  // namespace

// ---------------------------------------------------------------------------

TEST(JsonConstraint, VocabularyHasEveryByte) {
    // The finish-in-time bound counts bytes as tokens: every byte needs a token.
    EXPECT_EQ(fixture().jv->missing_byte_tokens(), 0);
    EXPECT_EQ(vocab32k().jv->missing_byte_tokens(), 0);
    EXPECT_GE(fixture().jv->think_end(), 0);
    EXPECT_EQ(fixture().jv->stop_ids(), fixture().tok->stop_ids());
}

TEST(JsonConstraint, ShortestDocuments) {
    const GrammarLimits lim = small_limits();
    EXPECT_EQ(min_document_bytes(*compile_json_schema(ojson::parse(kFlat), lim)),
              int64_t(strlen(kFlatMin)));
    EXPECT_EQ(min_document_bytes(*compile_json_schema(ojson::parse(kNested), lim)),
              int64_t(strlen(kNestedMin)));
    EXPECT_EQ(min_document_bytes(*compile_json_schema(ojson::parse(kUnions), lim)),
              int64_t(strlen(kUnionsMin)));
    EXPECT_EQ(min_document_bytes(*json_object_grammar(lim)), 2);
    // The hand-written shortest documents are themselves valid.
    EXPECT_EQ(check_document(kFlatMin, ojson::parse(kFlat)), "");
    EXPECT_EQ(check_document(kNestedMin, ojson::parse(kNested)), "");
    EXPECT_EQ(check_document(kUnionsMin, ojson::parse(kUnions)), "");
}

TEST(JsonConstraint, FlatObjectWalks) {
    const ojson s = ojson::parse(kFlat);
    run_walks(s, compile_json_schema(s, small_limits()), 300, 80, 1);
}

TEST(JsonConstraint, NestedWalks) {
    const ojson s = ojson::parse(kNested);
    run_walks(s, compile_json_schema(s, small_limits()), 250, 100, 2);
}

TEST(JsonConstraint, UnionsRefsAndMapsWalks) {
    const ojson s = ojson::parse(kUnions);
    run_walks(s, compile_json_schema(s, small_limits()), 250, 100, 3);
}

TEST(JsonConstraint, JsonObjectWalks) {
    const ojson s = ojson{{"type", "object"}};
    run_walks(s,
              server::grammar_from_response_format(ojson{{"type", "json_object"}}, small_limits()),
              250, 100, 4);
}

TEST(JsonConstraint, ArraysAndScalarsAtTopLevel) {
    const ojson arr = ojson::parse(
        R"({"type":"array","minItems":2,"maxItems":5,"items":{"type":"string","minLength":2}})");
    run_walks(arr, compile_json_schema(arr, small_limits()), 200, 40, 5);
    // A number can always go on: stop tokens come with digits, and the walk still ends valid.
    const ojson num = ojson::parse(R"({"type":"number"})");
    run_walks(num, compile_json_schema(num, small_limits()), 200, 12, 6);
    const ojson e = ojson::parse(R"({"enum":[1,12,123,"x"]})");
    run_walks(e, compile_json_schema(e, small_limits()), 100, 5, 7);
}

TEST(JsonConstraint, SamplerWalks) {
    const ojson s = ojson::parse(kNested);
    run_walks(s, compile_json_schema(s, small_limits()), 100, 100, 8, true);
    const ojson u = ojson::parse(kUnions);
    run_walks(u, compile_json_schema(u, small_limits()), 100, 100, 9, true);
}

TEST(JsonConstraint, DefaultLimitsFinishInTime) {
    // With the default caps (512-character strings) the budget alone closes the document.
    const ojson s = ojson::parse(kNested);
    run_walks(s, compile_json_schema(s), 60, 150, 10);
    const ojson o = ojson{{"type", "object"}};
    run_walks(o, json_object_grammar(), 60, 150, 11);
}

TEST(JsonConstraint, TightBudgetIsTheShortestDocument) {
    // Budget == the shortest document: every walk must produce exactly a shortest document.
    for (const char* text : {kFlat, kNested, kUnions}) {
        const ojson s = ojson::parse(text);
        const auto g = compile_json_schema(s, small_limits());
        const Vocab& v = fixture();
        std::mt19937 rng(12);
        const int n = int(min_document_bytes(*g));
        for (int k = 0; k < 100; ++k) {
            GrammarConstraint c(g, v.jv);
            const Walk w = walk(v, c, s, n, rng);
            ASSERT_EQ(check_document(w.text, s), "") << w.text;
            EXPECT_LE(w.tokens, n);
        }
        // Too small a budget: the walk never runs out of choices, and while the end is out
        // of reach every token brings it closer.
        for (int k = 0; k < 20; ++k) {
            GrammarConstraint c(g, v.jv);
            const int budget = n / 2;
            for (int i = 0; i < budget && !c.complete(); ++i) {
                c.set_remaining(budget - i);
                std::vector<int32_t> allowed;
                for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
                    if (c.allows(id)) allowed.push_back(id);
                ASSERT_FALSE(allowed.empty());
                const int64_t before = c.min_completion();
                c.accept(allowed[rng() % allowed.size()]);
                if (before > budget - i) {
                    EXPECT_LT(c.min_completion(), before);
                }
            }
        }
    }
}

TEST(JsonConstraint, DeclarationOrderRequiredAndEnums) {
    const ojson s = ojson::parse(kFlat);
    const auto g = compile_json_schema(s, small_limits());
    const Vocab& v = fixture();
    std::mt19937 rng(13);
    std::vector<std::string> order;
    for (const auto& [k, x] : s["properties"].items()) order.push_back(k);
    std::set<std::string> colors;
    for (int k = 0; k < 200; ++k) {
        GrammarConstraint c(g, v.jv);
        const Walk w = walk(v, c, s, 120, rng);
        const ojson doc = ojson::parse(w.text);
        size_t pos = 0;
        for (const auto& [key, x] : doc.items()) {
            while (pos < order.size() && order[pos] != key) ++pos;
            ASSERT_LT(pos, order.size()) << "key " << key << " out of order in " << w.text;
        }
        for (const char* r : {"name", "age", "ok", "color", "code"}) EXPECT_TRUE(doc.contains(r));
        colors.insert(doc["color"].get<std::string>());
        if (doc.contains("tag")) {
            EXPECT_EQ(doc["tag"], "fixed\"q");
            EXPECT_NE(w.text.find(R"("fixed\"q")"), std::string::npos);  // exact spelling
        }
        if (doc.contains("size")) {
            EXPECT_TRUE(doc["size"] == 1 || doc["size"] == 2 || doc["size"] == 30);
        }
    }
    EXPECT_EQ(colors.size(), 3u);  // every enum value is reachable
    // With nlohmann::json the properties come sorted by name.
    GrammarConstraint c(compile_json_schema(json::parse(kFlat), small_limits()), v.jv);
    const Walk w = walk(v, c, s, 120, rng);
    EXPECT_EQ(w.text.rfind("{\"age\":", 0), 0u) << w.text;
}

// An enum of many values, duplicates among them, compiles in time linear in them (each value
// was once looked up among those before it: 200,000 took 51 s of a connection's thread). The
// bound is a fifth of that on the slowest machine this suite runs on.
TEST(JsonConstraint, ManyEnumValuesCompileInLinearTime) {
    ojson values = ojson::array();
    for (int i = 0; i < 200000; ++i) values.push_back("v" + std::to_string(i % 150000));
    const ojson s = {{"enum", values}};
    const auto t0 = std::chrono::steady_clock::now();
    const auto g = compile_json_schema(s);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 10.0);
    const Vocab& v = fixture();
    std::mt19937 rng(17);
    GrammarConstraint c(g, v.jv);
    const Walk w = walk(v, c, s, 40, rng);
    const std::string doc = ojson::parse(w.text).get<std::string>();
    EXPECT_EQ(doc[0], 'v');
    EXPECT_LT(std::stoi(doc.substr(1)), 150000);
}

TEST(JsonConstraint, StringsEscapesAndUtf8) {
    // Only valid strings: random byte tokens must never produce bad UTF-8 or raw controls.
    const ojson s = ojson::parse(
        R"({"type":"object","properties":{"s":{"type":"string","minLength":4,"maxLength":20}},"required":["s"]})");
    const auto g = compile_json_schema(s, small_limits());
    const Vocab& v = fixture();
    std::mt19937 rng(14);
    int escapes = 0, multibyte = 0;
    for (int k = 0; k < 300; ++k) {
        GrammarConstraint c(g, v.jv);
        const Walk w = walk(v, c, s, 90, rng);
        ASSERT_EQ(check_document(w.text, s), "") << w.text;
        const std::string str = json::parse(w.text)["s"].get<std::string>();
        EXPECT_GE(code_points(str), 4u);
        EXPECT_LE(code_points(str), 20u);
        escapes += w.text.find('\\') != std::string::npos;
        for (unsigned char ch : str) multibyte += ch >= 0x80;
    }
    EXPECT_GT(escapes, 0);
    EXPECT_GT(multibyte, 0);

    // Feeding bytes directly: surrogate escapes and overlong / surrogate UTF-8 are refused.
    auto accepts_all = [&](const std::string& bytes) {
        GrammarConstraint c(g, v.jv);
        for (unsigned char ch : bytes) {
            int32_t tokid = -1;
            for (int32_t t = 0; t < v.tok->n_vocab() && tokid < 0; ++t)
                if (v.tok->token_bytes(t) == std::string(1, char(ch)) && !v.tok->is_control(t))
                    tokid = t;
            if (tokid < 0 || !c.allows(tokid)) return false;
            c.accept(tokid);
        }
        return true;
    };
    EXPECT_TRUE(accepts_all("{\"s\":\"ab\\u00e9\\n\\\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"));
    EXPECT_FALSE(accepts_all("{\"s\":\"\\ud800"));
    EXPECT_FALSE(accepts_all("{\"s\":\"\xed\xa0\x80"));  // UTF-8 surrogate
    EXPECT_FALSE(accepts_all("{\"s\":\"\xc0\xaf"));      // overlong
    EXPECT_FALSE(accepts_all("{\"s\":\"\xe0\x80"));      // overlong
    EXPECT_FALSE(accepts_all("{\"s\":\"a\nb"));          // raw control
    EXPECT_FALSE(accepts_all("{\"s\":\"abc\""));         // below minLength
    EXPECT_FALSE(accepts_all("{\"s\": \"abcd\"}x"));     // nothing after the document
    EXPECT_FALSE(accepts_all("{ \"s\""));                // no space after '{'
    EXPECT_TRUE(accepts_all("{\"s\": \"abcd\"}"));
}

TEST(JsonConstraint, ControlTokensNeverInsideTheDocument) {
    const Vocab& v = fixture();
    const auto g = json_object_grammar(small_limits());
    std::mt19937 rng(15);
    for (int k = 0; k < 50; ++k) {
        GrammarConstraint c(g, v.jv);
        for (int i = 0; i < 40 && !c.complete(); ++i) {
            for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
                if (v.tok->is_control(id) && !is_stop(v, id)) {
                    ASSERT_FALSE(c.allows(id));
                }
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
                if (c.allows(id)) allowed.push_back(id);
            c.accept(allowed[rng() % allowed.size()]);
        }
    }
    // accept() refuses what allows() refuses.
    GrammarConstraint c(g, v.jv);
    EXPECT_THROW(c.accept(v.tok->stop_ids()[0]), Error);
    EXPECT_THROW(c.accept(v.tok->encode("x")[0]), Error);
}

TEST(JsonConstraint, ResponseFormats) {
    const GrammarLimits lim = small_limits();
    EXPECT_EQ(server::grammar_from_response_format(ojson(nullptr)), nullptr);
    EXPECT_EQ(server::grammar_from_response_format(ojson{{"type", "text"}}), nullptr);
    const ojson wrapped = ojson::parse(
        std::string(R"({"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":)") +
        kNested + "}}");
    const ojson bare =
        ojson::parse(std::string(R"({"type":"json_schema","json_schema":)") + kNested + "}");
    const auto g1 = server::grammar_from_response_format(wrapped, lim);
    const auto g2 = server::grammar_from_response_format(bare, lim);
    EXPECT_EQ(min_document_bytes(*g1), int64_t(strlen(kNestedMin)));
    EXPECT_EQ(min_document_bytes(*g2), int64_t(strlen(kNestedMin)));
    run_walks(ojson::parse(kNested), g1, 30, 60, 16);
    // The wrapper straight into compile_json_schema, and through nlohmann::json.
    EXPECT_EQ(min_document_bytes(*compile_json_schema(wrapped["json_schema"], lim)),
              int64_t(strlen(kNestedMin)));
    EXPECT_EQ(
        min_document_bytes(*server::grammar_from_response_format(json::parse(wrapped.dump()), lim)),
        int64_t(strlen(kNestedMin)));
    EXPECT_THROW(server::grammar_from_response_format(ojson{{"type", "yaml"}}), Error);
    EXPECT_THROW(server::grammar_from_response_format(ojson{{"type", "json_schema"}}), Error);
    EXPECT_THROW(server::grammar_from_response_format(ojson("json")), Error);
}

TEST(JsonConstraint, RefusesWhatItDoesNotImplement) {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {R"({"type":"string","pattern":"^a"})", "pattern"},
        {R"({"type":"integer","minimum":0})", "minimum"},
        {R"({"type":"number","maximum":3})", "maximum"},
        {R"({"type":"number","multipleOf":2})", "multipleOf"},
        {R"({"not":{"type":"string"}})", "not"},
        {R"({"if":{"type":"string"},"then":{"minLength":2}})", "if"},
        {R"({"allOf":[{"type":"object"},{"required":["a"]}]})", "allOf"},
        {R"({"anyOf":[{"type":"object","properties":{"a":{"type":"string"}}},{"type":"object"}]})",
         "'{'"},
        {R"({"oneOf":[{"type":"integer"},{"type":"number"}]})", "oneOf"},
        {R"({"oneOf":[{"type":"string"},{"enum":["a"]}]})", "oneOf"},
        {R"({"anyOf":[{"type":"string","maxLength":2},{"enum":["abcdef"]}]})", "anyOf"},
        {R"({"type":"array","prefixItems":[{"type":"string"}]})", "prefixItems"},
        {R"({"type":"array","items":[{"type":"string"}]})", "tuple"},
        {R"({"type":"array","contains":{"type":"string"}})", "contains"},
        {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
        {R"({"type":"object","patternProperties":{"^a":{}}})", "patternProperties"},
        {R"({"type":"object","propertyNames":{"maxLength":3}})", "propertyNames"},
        {R"({"type":"object","properties":{"a":{}},"dependentRequired":{"a":["b"]}})",
         "dependentRequired"},
        {R"({"type":"object","properties":{"a":{},"b":{}},"maxProperties":1})", "maxProperties"},
        {R"({"$ref":"http://example.com/s.json"})", "local"},
        {R"({"$ref":"#/$defs/missing"})", "does not exist"},
        {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "cycle"},
        {R"({"$defs":{"n":{"type":"object","properties":{"k":{"$ref":"#/$defs/n"}},"required":["k"]}},"$ref":"#/$defs/n"})",
         "finite"},
        {R"({"type":"strng"})", "strng"},
        {R"({"type":"string","enum":[1,2]})", "enum"},
        {R"({"type":"string","minLength":5,"maxLength":2})", "maxLength"},
        {R"(false)", "false"},
        {R"({"type":"object","properties":{"a":false},"required":["a"]})", "false"},
    };
    for (const auto& [schema, needle] : cases) {
        try {
            compile_json_schema(ojson::parse(schema));
            ADD_FAILURE() << "accepted " << schema;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
                << schema << " -> " << e.what();
        }
    }
    // Annotations and type-irrelevant keywords are fine.
    EXPECT_NO_THROW(compile_json_schema(ojson::parse(
        R"({"type":"string","minimum":3,"format":"date-time","title":"t","default":"x","examples":["a"],"x-vendor":1})")));
    EXPECT_NO_THROW(compile_json_schema(ojson::parse(
        R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false,"required":["a","b"]})")));
    // Recursion through optional parts is fine.
    EXPECT_NO_THROW(compile_json_schema(
        ojson::parse(R"({"type":"object","properties":{"child":{"$ref":"#"}}})")));
}

TEST(JsonConstraint, ThinkingComesFirst) {
    const Vocab& v = fixture();
    const ojson s = ojson::parse(kNested);
    const auto g = compile_json_schema(s, small_limits());
    const int32_t think_end = v.jv->think_end();
    const int minlen = int(min_document_bytes(*g));
    std::mt19937 rng(17);
    for (int k = 0; k < 60; ++k) {
        auto c = make_json_constraint(g, v.jv, true);
        const int budget = minlen + 1 + int(rng() % 80);
        std::string reply;
        bool thinking = true, stopped = false;
        for (int i = 0; i < budget && !stopped; ++i) {
            c->set_remaining(budget - i);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
                if (c->allows(id)) allowed.push_back(id);
            ASSERT_FALSE(allowed.empty());
            if (thinking) {
                for (int32_t id : v.tok->stop_ids()) EXPECT_FALSE(c->allows(id));
                EXPECT_TRUE(c->allows(think_end));
                // Exactly when the rest of the budget only holds </think> + the document.
                if (budget - i <= minlen + 1) {
                    EXPECT_EQ(allowed.size(), 1u);
                } else {
                    EXPECT_GT(allowed.size(), 700u);
                }
            }
            // Mostly reasoning tokens: </think> comes when the budget forces it.
            const int32_t pick = allowed[rng() % allowed.size()];
            c->accept(pick);
            if (thinking) {
                thinking = pick != think_end;
            } else if (is_stop(v, pick)) {
                stopped = true;
            } else {
                reply += v.tok->token_bytes(pick);
            }
        }
        EXPECT_FALSE(thinking);
        ASSERT_EQ(check_document(reply, s), "") << reply;
    }
}

TEST(JsonConstraint, TrieWalkMatchesDirectCheck) {
    // The trie walk and the plain-text shortcut give the same answer as feeding every token
    // to a copy of the state, with and without a tight budget, on both vocabularies.
    const ojson s = ojson::parse(kUnions);
    const auto stress = stress_vocab(20000, 21);
    for (const Vocab* v : {&fixture(), &vocab32k(), static_cast<const Vocab*>(stress.get())}) {
        // Small caps, and the default ones (long strings, where the string cache is used).
        const std::shared_ptr<const Grammar> grammars[] = {
            compile_json_schema(s, small_limits()), json_object_grammar(small_limits()),
            compile_json_schema(ojson::parse(kNested))};
        std::mt19937 rng(18);
        const int walks = v == &fixture() ? 45 : 9;
        for (int k = 0; k < walks; ++k) {
            GrammarConstraint c(grammars[k % 3], v->jv);
            const int budget = 20 + int(rng() % 80);
            for (int i = 0; i < budget; ++i) {
                if (k % 4 != 3) c.set_remaining(budget - i);
                std::vector<int32_t> allowed;
                for (int32_t id = 0; id < v->tok->n_vocab(); ++id) {
                    const bool a = c.allows(id);
                    ASSERT_EQ(a, c.allows_uncached(id))
                        << "token " << id << " '" << v->tok->token_bytes(id) << "' after "
                        << c.text();
                    if (a) allowed.push_back(id);
                }
                ASSERT_FALSE(allowed.empty());
                const int32_t pick = allowed[rng() % allowed.size()];
                if (is_stop(*v, pick)) break;
                c.accept(pick);
            }
        }
    }
}

// Times the allowed-set computation over random walks, by where the walk is; prints the
// median and 99th percentile per step (the mean would mostly show this shared machine's
// scheduling noise).
void measure_steps(const Vocab& v, const char* label) {
    const ojson s = ojson::parse(kNested);
    GrammarLimits lim;
    lim.max_string_chars = 24;
    const auto g = compile_json_schema(s, lim);
    std::mt19937 rng(19);
    using clock = std::chrono::steady_clock;
    std::vector<double> t[3];
    size_t total_allowed = 0;
    for (int k = 0; k < 20; ++k) {
        GrammarConstraint c(g, v.jv);
        const int budget = k % 2 ? 150 : int(min_document_bytes(*g)) + 12;
        for (int i = 0; i < budget; ++i) {
            c.set_remaining(budget - i);
            // Inside a string value, or elsewhere (keys, numbers, punctuation)?
            bool in_string = false, esc = false, is_key = false;
            std::vector<char> nest;
            char prev = 0;
            for (char ch : c.text()) {
                if (in_string) {
                    if (esc)
                        esc = false;
                    else if (ch == '\\')
                        esc = true;
                    else if (ch == '"')
                        in_string = false;
                } else if (ch == '"') {
                    in_string = true;
                    is_key = !nest.empty() && nest.back() == '{' && (prev == '{' || prev == ',');
                } else if (ch == '{' || ch == '[') {
                    nest.push_back(ch);
                } else if (ch == '}' || ch == ']') {
                    nest.pop_back();
                }
                if (ch != ' ' && !in_string) prev = ch;
            }
            const int where = budget - i <= c.min_completion() + 8 ? 2
                              : in_string && !is_key               ? 0
                                                                   : 1;
            const auto t0 = clock::now();
            const size_t na = c.allowed_count();
            t[where].push_back(
                std::chrono::duration<double, std::micro>(clock::now() - t0).count());
            total_allowed += na;
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < v.tok->n_vocab(); ++id)
                if (c.allows(id)) allowed.push_back(id);
            ASSERT_EQ(allowed.size(), na);
            const int32_t pick = allowed[rng() % allowed.size()];
            if (is_stop(v, pick)) break;
            c.accept(pick);
        }
        ASSERT_EQ(check_document(c.text(), s), "") << c.text();
    }
    auto pct = [](std::vector<double> x, double q) {
        if (x.empty()) return 0.0;
        std::sort(x.begin(), x.end());
        return x[std::min(x.size() - 1, size_t(q * double(x.size())))];
    };
    const size_t steps = t[0].size() + t[1].size() + t[2].size();
    std::printf(
        "[ json ] %s: %d tokens, %zu trie nodes; allowed set per step, median / p99: "
        "string values %.1f / %.0f us (%zu steps), keys and structure %.1f / %.0f us (%zu), near "
        "the budget %.1f / %.0f us (%zu); %.0f tokens allowed on average\n",
        label, v.tok->n_vocab(), v.jv->trie_nodes(), pct(t[0], 0.5), pct(t[0], 0.99), t[0].size(),
        pct(t[1], 0.5), pct(t[1], 0.99), t[1].size(), pct(t[2], 0.5), pct(t[2], 0.99), t[2].size(),
        double(total_allowed) / double(steps));
    EXPECT_FALSE(t[0].empty());
    EXPECT_FALSE(t[1].empty());
    EXPECT_FALSE(t[2].empty());
}

TEST(JsonConstraint, CostPerStep) {
    // Informational (no pass/fail on time): the bench model's 32K vocabulary, and a 150K
    // vocabulary where many tokens hold quotes, newlines, braces or cut UTF-8.
    measure_steps(vocab32k(), "32K bench vocabulary");
    const auto stress = stress_vocab(150000, 22);
    const auto t0 = std::chrono::steady_clock::now();
    const JsonVocab again(*stress->tok);
    std::printf(
        "[ json ] JsonVocab for 150K tokens built in %.0f ms\n",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_EQ(again.trie_nodes(), stress->jv->trie_nodes());
    measure_steps(*stress, "150K stress vocabulary");
}

TEST(JsonConstraint, TinyModelEndToEnd) {
    // The fixture model (random weights) at temperature 1 through the engine: the
    // constrained reply must be valid JSON for a nested schema, thinking off and on.
    const Vocab& v = fixture();
    glm5::test::TestModel tm(std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf",
                             backend::CacheType::F32, /*threads=*/1);
    const ojson s = ojson::parse(kNested);
    const auto g = compile_json_schema(s, small_limits());
    int stopped = 0;
    for (int think = 0; think < 2; ++think) {
        const std::string prompt_text =
            std::string("[gMASK]<sop><|user|>Describe a shelf as JSON.<|assistant|><think>") +
            (think ? "" : "</think>");
        const std::vector<int32_t> prompt = v.tok->encode(prompt_text);
        for (uint64_t seed = 1; seed <= 4; ++seed) {
            runtime::EngineOptions eo;
            eo.n_parallel = 1;
            eo.n_ctx = 512;
            runtime::Engine engine(*tm.model, eo);
            runtime::RequestParams rp;
            rp.prompt = prompt;
            rp.sampling.temperature = 1.0f;
            rp.sampling.top_k = 0;
            rp.sampling.top_p = 1.0f;
            rp.sampling.min_p = 0.0f;
            rp.sampling.seed = seed;
            rp.max_tokens = 160;
            rp.constraint = make_json_constraint(g, v.jv, think != 0);
            for (int32_t t : v.tok->stop_ids()) rp.stop_ids.insert(t);
            const runtime::RequestResult r = engine.submit(std::move(rp))->wait();
            ASSERT_NE(r.finish_reason, "error") << r.error;
            if (r.finish_reason == "stop") ++stopped;
            const std::vector<int32_t>& out = r.tokens;
            std::string text = v.tok->decode(out);
            if (think) {
                const size_t p = text.find("</think>");
                ASSERT_NE(p, std::string::npos) << text;
                text = text.substr(p + 8);
            }
            ASSERT_EQ(check_document(text, s), "") << "seed " << seed << ": " << text;
        }
    }
    EXPECT_GT(stopped, 0);
}

TEST(GrammarLimits, OneNumberCapForJsonAndToolCalls) {
    // Both front ends take 15 digits in an integer part and in a fraction (the digits a
    // double always keeps), and refuse a 16th, with the default limits.
    const Vocab& v = fixture();
    auto tok_of = [&](const char* s) {
        const int32_t id = v.tok->find(s);
        EXPECT_GE(id, 0) << s;
        return id;
    };
    const int32_t one = tok_of("1"), dot = tok_of(".");
    // Feeds `prefix`, then digits while they are allowed; the digits taken.
    auto digits_taken = [&](GrammarConstraint& c, const std::vector<int32_t>& prefix) {
        for (int32_t t : prefix) c.accept(t);
        int n = 0;
        while (n < 40 && c.allows(one)) {
            EXPECT_TRUE(c.allows_uncached(one));
            c.accept(one);
            ++n;
        }
        EXPECT_FALSE(c.allows_uncached(one));
        EXPECT_THROW(c.accept(one), Error);
        return n;
    };

    const auto integer = compile_json_schema(ojson{{"type", "integer"}});
    const auto number = compile_json_schema(ojson{{"type", "number"}});
    GrammarConstraint j_int(integer, v.jv), j_frac(number, v.jv);
    EXPECT_EQ(digits_taken(j_int, {}), 15);
    EXPECT_TRUE(j_int.complete());
    EXPECT_EQ(digits_taken(j_frac, {one, dot}), 15);

    auto tv = std::make_shared<const ToolCallVocab>(*v.tok);
    ASSERT_TRUE(tv->has_tool_markers());
    const auto call = compile_tool_call(
        {{"f",
          ojson::parse(R"({"properties": {"n": {"type": "integer"}, "x": {"type": "number"}}})")}});
    const std::vector<int32_t> open_n = {tv->tool_open, tok_of("f"),   tv->key_open,
                                         tok_of("n"),   tv->key_close, tv->value_open};
    const std::vector<int32_t> open_x = {tv->tool_open, tok_of("f"),    tv->key_open, tok_of("x"),
                                         tv->key_close, tv->value_open, one,          dot};
    GrammarConstraint t_int(call, tv), t_frac(call, tv);
    EXPECT_EQ(digits_taken(t_int, open_n), 15);
    EXPECT_TRUE(t_int.allows(tv->value_close));
    EXPECT_EQ(digits_taken(t_frac, open_x), 15);
}

// Tool parameters are checked as a whole without being compiled: invalid schemas are
// refused, keywords the call grammar does not enforce are not.
TEST(JsonSchemaCheck, RefusesInvalidSchemasAndAcceptsUnenforcedKeywords) {
    auto ok = [](const char* s) { EXPECT_NO_THROW(check_json_schema(ojson::parse(s))) << s; };
    auto refused = [](const char* s, const char* why) {
        try {
            check_json_schema(ojson::parse(s));
            ADD_FAILURE() << "accepted: " << s;
        } catch (const glm5::Error& e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        }
    };
    refused(R"({"type":"nonsense"})", "unknown type 'nonsense'");
    refused(R"({"type":"object","properties":{"a":{"type":["string","thing"]}}})", "unknown type");
    refused(R"({"$ref":"#"})", "no finite value");
    refused(R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
            "no finite value");
    refused(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})",
            "no finite value");
    // A $ref cycle with no schema in it is malformed even where nothing needs an instance.
    refused(
        R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"}}})",
        "a cycle with no schema in it");
    refused(R"({"type":"object","properties":{"a":{"$ref":"#/nowhere"}}})", "does not exist");
    refused(R"({"type":"object","properties":{"a":{"$ref":"http://x/s.json"}}})", "only local");
    refused(R"({"type":"object","properties":{"a":{"anyOf":[]}}})", "non-empty array");
    refused(R"({"type":"object","required":["a"],"additionalProperties":false})", "no finite");
    refused(R"({"type":"object","properties":{"a":false},"required":["a"]})", "no finite");
    refused(
        R"({"type":"object","properties":{"a":{"type":"integer","enum":["x"]}},"required":["a"]})",
        "no finite");
    refused(R"({"type":"array","items":{"$ref":"#"},"minItems":1})", "no finite");
    refused(R"({"type":"object","properties":{"a":{"not":{"type":"bogus"}}}})", "unknown type");

    // Recursion through optional members, alternatives or empty arrays is fine.
    ok(R"({"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}}},"required":["name"]})");
    ok(R"({"type":"object","properties":{"next":{"$ref":"#"}}})");
    ok(R"({"$defs":{"n":{"anyOf":[{"type":"null"},{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},"required":["n"]}]}},"type":"object","properties":{"list":{"$ref":"#/$defs/n"}},"required":["list"]})");
    ok(R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"$ref":"#/properties/a"}},"required":["b"]}}})");
    // What the call grammar does not hold the output to is still a valid schema.
    ok(R"({"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9},"s":{"type":"string","pattern":"^a+$","format":"date"},"x":{"not":{"type":"null"}}},"required":["n"],"$schema":"https://json-schema.org/draft/2020-12/schema"})");
    ok(R"({"type":"object","properties":{}})");
    ok("{}");
}
