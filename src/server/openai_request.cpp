#include "server/openai_request.h"

#include "image/image.h"
#include "server/http_transport.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>

#include "core/error.h"
#include "runtime/json_schema.h"
#include "runtime/reasoning_budget.h"
#include "server/response_format.h"
#include "server/tool_constraint.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxDepth = 128;  // JSON nesting accepted in a body
constexpr size_t kMaxStops = 16;
constexpr int64_t kMaxTopLogprobs = 20;  // as OpenAI's chat API

ApiError type_error(const std::string& name, const char* expected, const ojson& got) {
    return bad_request("'" + name + "' must be " + expected + ", got " + json_kind(got), name,
                       "invalid_type");
}

std::string num_str(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return buf;
}

// A field, or nullptr when absent or null (clients send explicit nulls for defaults).
const ojson* field(const ojson& body, const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

bool opt_bool(const ojson& body, const char* name, bool dflt) {
    const ojson* v = field(body, name);
    if (!v) return dflt;
    if (!v->is_boolean()) throw type_error(name, "a boolean", *v);
    return v->get<bool>();
}

double opt_number(const ojson& body, const char* name, double dflt, double lo, double hi) {
    const ojson* v = field(body, name);
    if (!v) return dflt;
    if (!v->is_number()) throw type_error(name, "a number", *v);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        throw bad_request("'" + std::string(name) + "' must be between " + num_str(lo) + " and " +
                              num_str(hi) + ", got " + num_str(x),
                          name);
    return x;
}

// Integers; a float with an integral value is taken too (JavaScript clients send 1.0).
int64_t as_int(const ojson& v, const std::string& name) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return int64_t(d);
    }
    throw type_error(name, "an integer", v);
}

int64_t opt_int(const ojson& body, const char* name, int64_t dflt, int64_t lo, int64_t hi) {
    const ojson* v = field(body, name);
    if (!v) return dflt;
    const int64_t x = as_int(*v, name);
    if (x < lo)
        throw bad_request("'" + std::string(name) + "' must be at least " + std::to_string(lo) +
                              ", got " + std::to_string(x),
                          name);
    if (x > hi)
        throw bad_request("'" + std::string(name) + "' must be at most " + std::to_string(hi) +
                              ", got " + std::to_string(x),
                          name);
    return x;
}

ApiError unsupported(const std::string& name, const std::string& why) {
    return bad_request("'" + name + "' is not supported by this server" + why, name,
                       "unsupported_parameter");
}

void check_model(const ojson& body, const ModelContext& mc) {
    const ojson* m = field(body, "model");
    if (!m) return;  // optional: there is one model
    if (!m->is_string()) throw type_error("model", "a string", *m);
    const std::string name = m->get<std::string>();
    if (std::find(mc.names.begin(), mc.names.end(), name) != mc.names.end()) return;
    throw ApiError(404,
                   "The model '" + name + "' does not exist; this server serves '" + mc.id + "'",
                   "model", "model_not_found");
}

// "speculative": false or "off" turns it off for this request; an object
// {"type": "auto"|"mtp"|"ngram"|"off", "draft": N, "pmin": P} overrides the
// server's settings (absent fields keep them).
void parse_speculative(const ojson& body, const ModelContext& mc, GenRequest& g) {
    const ojson* sp = field(body, "speculative");
    if (!sp) return;
    runtime::SpecParams s = mc.spec;
    if (sp->is_boolean()) {
        if (!sp->get<bool>())
            s.type = runtime::DraftType::Off;
        else if (s.type == runtime::DraftType::Off)
            s.type = runtime::DraftType::Auto;
    } else if (sp->is_string() && sp->get<std::string>() == "off") {
        s.type = runtime::DraftType::Off;
    } else if (sp->is_object()) {
        if (const ojson* t = field(*sp, "type")) {
            if (!t->is_string()) throw type_error("speculative.type", "a string", *t);
            const std::string name = t->get<std::string>();
            if (name != "auto" && name != "mtp" && name != "ngram" && name != "off")
                throw bad_request(
                    "'speculative.type' must be auto, mtp, ngram or off, got '" + name + "'",
                    "speculative.type");
            s.type = runtime::parse_draft_type(name);
        } else if (s.type == runtime::DraftType::Off) {
            s.type = runtime::DraftType::Auto;
        }
        s.draft_max = int(opt_int(*sp, "draft", s.draft_max, 1, runtime::VerifyCost::kMaxRows - 1));
        s.p_min = float(opt_number(*sp, "pmin", s.p_min, 0, 1));
    } else {
        throw type_error("speculative", "false, \"off\" or an object {type, draft, pmin}", *sp);
    }
    if (s.type == runtime::DraftType::Auto)
        s.type = mc.can_mtp ? runtime::DraftType::Mtp : runtime::DraftType::Ngram;
    if (s.type == runtime::DraftType::Mtp && !mc.can_mtp)
        throw bad_request(
            "'speculative.type' mtp needs the NextN/MTP block, which this server did not load "
            "(start it with --spec on a glm-dsa file that has one, or use ngram)",
            "speculative.type");
    g.spec = s;
}

// Fields of other servers' APIs (llama.cpp's sampling, OpenAI's extras) that this server
// does not implement: accepted at a value that changes nothing (clients such as
// SillyTavern send them at their defaults), a 400 naming the field otherwise.
struct Extension {
    const char* name;
    bool (*neutral)(const ojson& v);
    const char* why;
};
bool equals_number(const ojson& v, double x) {
    return v.is_number() && v.get<double>() == x;
}
const Extension kExtensions[] = {
    {"typical_p", [](const ojson& v) { return equals_number(v, 1) || equals_number(v, 0); },
     "locally typical sampling is not implemented (1: off)"},
    {"tfs_z", [](const ojson& v) { return equals_number(v, 1) || equals_number(v, 0); },
     "tail-free sampling is not implemented (1: off)"},
    {"mirostat", [](const ojson& v) { return equals_number(v, 0); },
     "mirostat sampling is not implemented (0: off)"},
    {"dry_multiplier", [](const ojson& v) { return equals_number(v, 0); },
     "DRY repetition penalty is not implemented (0: off)"},
    {"xtc_probability", [](const ojson& v) { return equals_number(v, 0); },
     "XTC sampling is not implemented (0: off)"},
    {"top_n_sigma", [](const ojson& v) { return v.is_number() && v.get<double>() <= 0; },
     "top-n-sigma sampling is not implemented (-1: off)"},
    {"dynatemp_range", [](const ojson& v) { return equals_number(v, 0); },
     "dynamic temperature is not implemented (0: off)"},
    {"n_probs", [](const ojson& v) { return equals_number(v, 0); },
     "llama.cpp's completion_probabilities are not returned: use OpenAI's 'logprobs'"},
    {"post_sampling_probs", [](const ojson& v) { return v.is_boolean() && !v.get<bool>(); },
     "only the raw distribution's logprobs are returned"},
    {"grammar", [](const ojson& v) { return v.is_string() && v.get<std::string>().empty(); },
     "GBNF grammars are not supported: use 'response_format' or 'json_schema'"},
    {"samplers", [](const ojson&) { return false; },
     "the sampler order is fixed: bias, penalties, top-k, top-p, min-p, temperature"},
    {"t_max_predict_ms", [](const ojson& v) { return equals_number(v, 0); },
     "a time limit on generation is not supported"},
    {"n_indent", [](const ojson& v) { return equals_number(v, 0); },
     "indentation control is not supported"},
    {"lora", [](const ojson& v) { return v.is_array() && v.empty(); },
     "LoRA adapters are not supported"},
    {"penalize_nl", [](const ojson& v) { return v.is_boolean() && !v.get<bool>(); },
     "newlines are penalized like any token"},
    {"functions", [](const ojson&) { return false; }, "the legacy 'functions' API: use 'tools'"},
    {"function_call", [](const ojson&) { return false; },
     "the legacy 'functions' API: use 'tool_choice'"},
    {"modalities", [](const ojson& v) { return v == ojson::array({"text"}); },
     "this server answers with text only"},
    {"audio", [](const ojson&) { return false; }, "this server answers with text only"},
    {"response_fields", [](const ojson&) { return false; },
     "the response's fields cannot be selected"},
};

void check_extensions(const ojson& body) {
    for (const Extension& x : kExtensions) {
        const ojson* v = field(body, x.name);
        if (v && !x.neutral(*v))
            throw bad_request(std::string("'") + x.name + "' is not supported by this server at " +
                                  v->dump() + ": " + x.why,
                              x.name, "unsupported_parameter");
    }
}

// OpenAI's {"token id": bias} (-100..100), or llama.cpp's [[id or text, bias or false]]
// (false bans the token; a text biases each of its tokens). Sorted by id.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const ojson& lb, const ModelContext& mc) {
    std::map<int32_t, float> bias;
    const int32_t n_vocab = mc.tok->n_vocab();
    auto value = [&](const ojson& v, const std::string& where) -> float {
        if (v.is_boolean() && !v.get<bool>()) return -INFINITY;
        if (!v.is_number()) throw type_error(where, "a number (or false, to ban)", v);
        const double b = v.get<double>();
        if (!(b >= -100 && b <= 100))
            throw bad_request("'" + where + "' must be between -100 and 100, got " + num_str(b),
                              "logit_bias");
        return float(b);
    };
    auto add_id = [&](int64_t id, float b) {
        if (id < 0 || id >= n_vocab)
            throw bad_request("logit_bias: token id " + std::to_string(id) +
                                  " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) +
                                  ")",
                              "logit_bias");
        bias[int32_t(id)] += b;
    };
    if (lb.is_object()) {
        for (const auto& [key, v] : lb.items()) {
            char* end = nullptr;
            const long long id = std::strtoll(key.c_str(), &end, 10);
            if (key.empty() || *end != '\0')
                throw bad_request("logit_bias: '" + key + "' is not a token id", "logit_bias");
            add_id(id, value(v, "logit_bias." + key));
        }
    } else if (lb.is_array()) {
        for (size_t i = 0; i < lb.size(); ++i) {
            const ojson& e = lb[i];
            const std::string where = "logit_bias[" + std::to_string(i) + "]";
            if (!e.is_array() || e.size() != 2)
                throw bad_request(where + " must be [token id or text, bias]", "logit_bias");
            const float b = value(e[1], where);
            if (e[0].is_string()) {
                for (int32_t id : mc.tok->encode(e[0].get<std::string>(), false)) add_id(id, b);
            } else {
                add_id(as_int(e[0], where), b);
            }
        }
    } else {
        throw type_error("logit_bias", "an object of token ids or an array of pairs", lb);
    }
    return {bias.begin(), bias.end()};
}

// Fields both endpoints share.
void parse_common(const ojson& body, const ModelContext& mc, GenRequest& g) {
    check_model(body, mc);
    g.stream = opt_bool(body, "stream", false);
    if (const ojson* so = field(body, "stream_options")) {
        if (!so->is_object()) throw type_error("stream_options", "an object", *so);
        if (!g.stream)
            throw bad_request("'stream_options' is only allowed when 'stream' is true",
                              "stream_options");
        g.include_usage = opt_bool(*so, "include_usage", false);
    }
    g.n = int(opt_int(body, "n", 1, 1, mc.max_choices));

    g.sampling = mc.sampling;
    g.sampling.temperature = float(opt_number(body, "temperature", g.sampling.temperature, 0, 100));
    g.sampling.top_p = float(opt_number(body, "top_p", g.sampling.top_p, 0, 1));
    g.sampling.top_k = int32_t(opt_int(body, "top_k", g.sampling.top_k, -1, 1 << 30));
    g.sampling.min_p = float(opt_number(body, "min_p", g.sampling.min_p, 0, 1));
    const char* rp = field(body, "repetition_penalty") ? "repetition_penalty" : "repeat_penalty";
    g.sampling.repeat_penalty = float(opt_number(body, rp, g.sampling.repeat_penalty, 0.01, 100));
    if (const ojson* s = field(body, "seed")) {
        const int64_t seed = as_int(*s, "seed");
        if (s->is_number_unsigned()) {
            g.sampling.seed = s->get<uint64_t>();
            g.seed_given = true;
        } else if (seed >= 0) {  // negative: a fresh random seed, as llama.cpp's -1
            g.sampling.seed = uint64_t(seed);
            g.seed_given = true;
        }
    }

    if (const ojson* s = field(body, "stop")) {
        if (s->is_string()) {
            g.stop.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            for (const auto& x : *s) {
                if (!x.is_string()) throw type_error("stop", "a string or an array of strings", x);
                g.stop.push_back(x.get<std::string>());
            }
        } else {
            throw type_error("stop", "a string or an array of strings", *s);
        }
        if (g.stop.size() > kMaxStops)
            throw bad_request("'stop' may hold at most " + std::to_string(kMaxStops) + " strings",
                              "stop");
        for (const auto& x : g.stop)
            if (x.empty()) throw bad_request("'stop' strings must not be empty", "stop");
    }

    g.max_tokens = opt_int(body, "max_tokens", 0, 1, INT64_MAX / 4);
    if (g.endpoint == Endpoint::Chat)
        g.max_tokens = opt_int(body, "max_completion_tokens", g.max_tokens, 1, INT64_MAX / 4);
    g.ignore_eos = opt_bool(body, "ignore_eos", false);
    g.use_prefix_cache = opt_bool(body, "cache_prompt", true);

    g.sampling.presence_penalty =
        float(opt_number(body, "presence_penalty", g.sampling.presence_penalty, -2, 2));
    g.sampling.frequency_penalty =
        float(opt_number(body, "frequency_penalty", g.sampling.frequency_penalty, -2, 2));
    g.sampling.repeat_last_n =
        int32_t(opt_int(body, "repeat_last_n", g.sampling.repeat_last_n, -1, 1 << 30));
    if (const ojson* lb = field(body, "logit_bias"))
        g.sampling.logit_bias = parse_logit_bias(*lb, mc);
    parse_speculative(body, mc, g);
    check_extensions(body);
}

void parse_response_format(const ojson& body, GenRequest& g, const ModelContext& mc) {
    const ojson* rf = field(body, "response_format");
    const ojson* js = field(body, "json_schema");  // llama.cpp's top-level form
    if (!rf && !js) return;
    if (rf && js)
        throw bad_request("'json_schema' and 'response_format' together: give one", "json_schema");
    const char* param = rf ? "response_format" : "json_schema";
    try {
        if (rf) {
            if (!rf->is_object()) throw type_error("response_format", "an object", *rf);
            g.grammar = grammar_from_response_format(*rf);
        } else {
            if (!js->is_object() && !js->is_boolean())
                throw type_error("json_schema", "a JSON schema (an object)", *js);
            g.grammar = runtime::compile_json_schema(*js);
        }
    } catch (const Error& e) {
        throw bad_request(std::string(param) + ": " + e.what(), param);
    }
    if (g.grammar && !mc.json_vocab)
        throw bad_request(std::string(param) + ": this model's vocabulary cannot express JSON",
                          param);
}

void check_total_choices(const GenRequest& g, const ModelContext& mc) {
    if (g.choices() > mc.max_choices)
        throw bad_request(
            "n times the number of prompts must be at most " + std::to_string(mc.max_choices), "n");
}

// The prompt must leave room for at least one generated token. max_tokens is not checked:
// a reply stops at the context's end with "length", as llama-server's does (agent clients
// ask for more than a small context holds and know no other answer).
void check_context(size_t n_prompt, const ModelContext& mc, const char* param) {
    if (n_prompt == 0) throw bad_request("the prompt is empty", param);
    if (int64_t(n_prompt) >= mc.n_ctx)
        throw context_length_exceeded(int64_t(n_prompt), mc.n_ctx, param);
}

// Prompts to run are encoded up to twice the context: a refusal names the length of any
// prompt up to that, and past it a bound the prompt is longer than, so that a huge prompt
// costs no more to refuse than one that fits (encoding stops; see docs/reliability.md).
size_t encode_limit(const ModelContext& mc) {
    return 2 * size_t(mc.n_ctx);
}

// Tools in OpenAI form: [{"type": "function", "function": {"name", "description",
// "parameters"}}]. Null when there are none.
ojson parse_tools(const ojson& body) {
    const ojson* t = field(body, "tools");
    if (!t) return nullptr;
    if (!t->is_array()) throw type_error("tools", "an array", *t);
    if (t->empty()) return nullptr;
    std::vector<std::string> names;
    for (size_t i = 0; i < t->size(); ++i) {
        const ojson& tool = (*t)[i];
        const std::string where = "tools[" + std::to_string(i) + "]";
        if (!tool.is_object()) throw type_error(where, "an object", tool);
        // Absent is taken as "function"; null is not a type.
        if (tool.contains("type") && tool["type"] != "function")
            throw bad_request(where + ".type must be \"function\"", "tools");
        const ojson* fn = field(tool, "function");
        if (!fn || !fn->is_object())
            throw bad_request(where + ".function must be an object", "tools");
        const ojson* name = field(*fn, "name");
        if (!name || !name->is_string() || name->get<std::string>().empty())
            throw bad_request(where + ".function.name must be a non-empty string", "tools");
        const std::string n = name->get<std::string>();
        if (n.find('<') != std::string::npos)
            throw bad_request(where + ".function.name must not contain '<'", "tools");
        if (std::find(names.begin(), names.end(), n) != names.end())
            throw bad_request("two tools are named '" + n + "'", "tools");
        names.push_back(n);
        if (const ojson* p = field(*fn, "parameters")) {
            if (!p->is_object())
                throw bad_request(where + ".function.parameters must be an object", "tools");
            // The same validity as response_format's schemas (OpenAI refuses an invalid
            // function schema too); keywords the call grammar does not enforce are
            // accepted (docs/usage.md says which).
            try {
                runtime::check_json_schema(*p);
            } catch (const Error& e) {
                throw bad_request(where + ".function.parameters: " + e.what(), "tools");
            }
        }
    }
    return *t;
}

void parse_tool_choice(const ojson& body, GenRequest& g) {
    g.parallel_tool_calls = opt_bool(body, "parallel_tool_calls", true);
    const ojson* tc = field(body, "tool_choice");
    if (!tc) return;
    if (tc->is_string()) {
        const std::string s = tc->get<std::string>();
        if (s == "auto")
            g.tool_choice = ToolChoice::Auto;
        else if (s == "none")
            g.tool_choice = ToolChoice::None;
        else if (s == "required")
            g.tool_choice = ToolChoice::Required;
        else
            throw bad_request(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or a function",
                "tool_choice");
    } else if (tc->is_object()) {
        const ojson* fn = field(*tc, "function");
        const ojson* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
        if (!name || !name->is_string())
            throw bad_request(
                "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                "{\"name\": ...}}",
                "tool_choice");
        g.tool_choice = ToolChoice::Named;
        g.tool_name = name->get<std::string>();
    } else {
        throw type_error("tool_choice", "a string or an object", *tc);
    }
    if (g.tool_choice == ToolChoice::Required || g.tool_choice == ToolChoice::Named) {
        if (g.tools.is_null())
            throw bad_request("'tool_choice' asks for a tool call but the request has no tools",
                              "tool_choice");
        if (g.tool_choice == ToolChoice::Named) {
            bool found = false;
            for (const auto& t : g.tools) found |= t["function"]["name"] == g.tool_name;
            if (!found)
                throw bad_request(
                    "'tool_choice' names '" + g.tool_name + "', which is not in 'tools'",
                    "tool_choice");
        }
    }
}

// Message content: a string or a non-empty array of content parts. Parts are
// objects with a "type"; "text" parts carry a string, "refusal" parts (assistant
// only) too; image, audio and file parts need a model that reads them: image_url
// parts are read in user messages when the server has a vision tower.
void check_content(const ojson& c, const std::string& where, bool assistant, bool images) {
    if (c.is_string()) return;
    if (!c.is_array())
        throw bad_request(
            where + ".content must be a string or an array of content parts, got " + json_kind(c),
            "messages", "invalid_type");
    if (c.empty()) throw bad_request(where + ".content must not be an empty array", "messages");
    for (size_t k = 0; k < c.size(); ++k) {
        const ojson& part = c[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object())
            throw bad_request(at + " must be an object, got " + json_kind(part), "messages",
                              "invalid_type");
        const ojson* type = field(part, "type");
        if (!type || !type->is_string())
            throw bad_request(at + ".type must be a string", "messages");
        const std::string t = type->get<std::string>();
        const char* key = t == "text" ? "text" : t == "refusal" && assistant ? "refusal" : nullptr;
        if (t == "image_url" && images) {
            const ojson* u = field(part, "image_url");
            if (u && u->is_object()) u = field(*u, "url");
            if (!u || !u->is_string())
                throw bad_request(at + ".image_url.url must be a string", "messages");
            continue;
        }
        if (!key) {
            if (t == "image_url" || t == "input_audio" || t == "file")
                throw bad_request(at + ": content parts of type '" + t +
                                      "' are not supported: this model reads text only",
                                  "messages", "unsupported_content");
            throw bad_request(at + ": unknown content part type '" + t + "'", "messages");
        }
        const ojson* text = field(part, key);
        if (!text || !text->is_string())
            throw bad_request(at + "." + key + " must be a string", "messages");
    }
}

// The messages as OpenAI's reference defines them, before they are rendered:
// roles, required content (null only for an assistant message with tool
// calls), tool calls with ids, and every tool message answering a call of the
// assistant message it follows.
void check_messages(const ojson& msgs, bool vision) {
    std::vector<std::string> open_calls;  // ids of the last assistant message's calls
    bool after_calls = false;             // only tool messages since those calls
    for (size_t i = 0; i < msgs.size(); ++i) {
        const ojson& m = msgs[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object())
            throw bad_request(where + " must be an object, got " + json_kind(m), "messages",
                              "invalid_type");
        const ojson* r = field(m, "role");
        if (!r) throw bad_request(where + ".role is required", "messages");
        if (!r->is_string())
            throw bad_request(where + ".role must be a string, got " + json_kind(*r), "messages",
                              "invalid_type");
        const std::string role = r->get<std::string>();
        if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
            role != "tool")
            throw bad_request(where + ".role '" + role +
                                  "' is not one of system, developer, user, assistant, tool",
                              "messages");
        if (const ojson* n = field(m, "name"); n && !n->is_string())
            throw bad_request(where + ".name must be a string", "messages", "invalid_type");
        const ojson* content = field(m, "content");
        const bool has_calls = role == "assistant" && field(m, "tool_calls");
        if (content)
            check_content(*content, where, role == "assistant", vision && role == "user");
        else if (!has_calls)
            throw bad_request(
                where + ".content is required" +
                    (role == "assistant" ? " unless the message has tool_calls" : "") +
                    (m.contains("content") ? " (it is null)" : ""),
                "messages");

        if (role == "tool") {
            const ojson* id = field(m, "tool_call_id");
            if (!id || !id->is_string())
                throw bad_request(where + ".tool_call_id must be a string", "messages");
            const std::string want = id->get<std::string>();
            if (!after_calls)
                throw bad_request(where +
                                      ": a message with role 'tool' must answer a tool call of "
                                      "the assistant message before it",
                                  "messages");
            auto it = std::find(open_calls.begin(), open_calls.end(), want);
            if (it == open_calls.end())
                throw bad_request(where + ".tool_call_id '" + want +
                                      "' matches no unanswered tool call of the assistant "
                                      "message before it",
                                  "messages");
            open_calls.erase(it);
            continue;
        }
        after_calls = false;
        open_calls.clear();
        if (role != "assistant") continue;
        if (const ojson* refusal = field(m, "refusal"); refusal && !refusal->is_string())
            throw bad_request(where + ".refusal must be a string", "messages", "invalid_type");
        const ojson* calls = field(m, "tool_calls");
        if (!calls) continue;
        if (!calls->is_array() || calls->empty())
            throw bad_request(where + ".tool_calls must be a non-empty array", "messages");
        for (size_t k = 0; k < calls->size(); ++k) {
            const ojson& tc = (*calls)[k];
            const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
            if (!tc.is_object()) throw bad_request(at + " must be an object", "messages");
            const ojson* id = field(tc, "id");
            if (!id || !id->is_string() || id->get<std::string>().empty())
                throw bad_request(at + ".id must be a non-empty string", "messages");
            if (tc.contains("type") && tc["type"] != "function")
                throw bad_request(at + ".type must be \"function\"", "messages");
            const ojson* fn = field(tc, "function");
            if (!fn || !fn->is_object())
                throw bad_request(at + ".function must be an object", "messages");
            const ojson* name = field(*fn, "name");
            if (!name || !name->is_string() || name->get<std::string>().empty())
                throw bad_request(at + ".function.name must be a non-empty string", "messages");
            const ojson* args = field(*fn, "arguments");
            // OpenAI sends a JSON string; an object is taken as the same thing.
            if (!args || !(args->is_string() || args->is_object()))
                throw bad_request(at + ".function.arguments must be a string of JSON", "messages");
            // The string is parsed again when the prompt is rendered: the body's
            // nesting bound must hold inside it too.
            if (args->is_string()) {
                bool too_deep = false;
                const ojson parsed = ojson::parse(
                    args->get_ref<const std::string&>(),
                    [&](int depth, ojson::parse_event_t, ojson&) {
                        if (depth > kMaxDepth) too_deep = true;
                        return !too_deep;
                    },
                    false);
                (void)parsed;
                if (too_deep)
                    throw bad_request(at + ".function.arguments is nested deeper than " +
                                          std::to_string(kMaxDepth) + " levels",
                                      "messages");
            }
            const std::string cid = id->get<std::string>();
            if (std::find(open_calls.begin(), open_calls.end(), cid) != open_calls.end())
                throw bad_request(at + ".id '" + cid + "' is used twice", "messages");
            open_calls.push_back(cid);
        }
        after_calls = true;
    }
}

// Bytes of message text the prompt holds verbatim (system, user and tool contents; the
// format may strip an assistant's): a bound the rendered prompt cannot be below.
size_t verbatim_bytes(const ojson& msgs) {
    size_t n = 0;
    for (const auto& m : msgs) {
        const std::string role = m.value("role", std::string());
        if (role == "assistant") continue;
        const ojson* c = field(m, "content");
        if (!c) continue;
        if (c->is_string()) n += c->get_ref<const std::string&>().size();
        if (c->is_array())
            for (const auto& part : *c)
                if (const ojson* t =
                        part.value("type", "") == "text" ? field(part, "text") : nullptr)
                    n += t->get_ref<const std::string&>().size();
    }
    return n;
}

bool forced_tool(const GenRequest& g) {
    return g.tool_choice == ToolChoice::Required || g.tool_choice == ToolChoice::Named;
}

void check_combinations(const GenRequest& g) {
    if (g.grammar && forced_tool(g))
        throw bad_request("'response_format' cannot be combined with a forced 'tool_choice'",
                          "response_format");
    if (g.ignore_eos && (g.grammar || forced_tool(g)))
        throw bad_request(
            "'ignore_eos' cannot be combined with 'response_format' or a forced "
            "'tool_choice' (they end with a stop token)",
            "ignore_eos");
}

}  // namespace

ojson parse_body(std::string_view body) {
    // The parser takes a NUL byte for the end of its input; JSON text has none, so one
    // means bytes past the value, which a body may not have.
    if (const size_t nul = body.find('\0'); nul != std::string_view::npos)
        throw ApiError(400,
                       "the body is not valid JSON: a NUL byte at offset " + std::to_string(nul) +
                           " (a body must be one JSON value and nothing after it)",
                       "", "invalid_json");
    ojson j;
    try {
        // The callback caps nesting: deep documents would exhaust the stack later.
        j = ojson::parse(body, [](int depth, ojson::parse_event_t, ojson&) {
            if (depth > kMaxDepth)
                throw ApiError(
                    400,
                    "the JSON body is nested deeper than " + std::to_string(kMaxDepth) + " levels",
                    "", "invalid_json");
            return true;
        });
    } catch (const ojson::exception& e) {
        throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "",
                       "invalid_json");
    }
    if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
    return j;
}

int64_t PromptInput::expanded_size() const {
    int64_t n = int64_t(tokens.size());
    for (const auto& im : images) n += im.n_tokens - 1;
    return n;
}

namespace {

// RFC 4648 base64 (padding optional, no whitespace).
std::optional<std::vector<uint8_t>> decode_base64(std::string_view s) {
    auto val = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+' || c == '-') return 62;
        if (c == '/' || c == '_') return 63;
        return -1;
    };
    while (!s.empty() && s.back() == '=') s.remove_suffix(1);
    if (s.size() % 4 == 1) return std::nullopt;
    std::vector<uint8_t> out;
    out.reserve(s.size() * 3 / 4);
    uint32_t acc = 0;
    int bits = 0;
    for (char c : s) {
        const int v = val(c);
        if (v < 0) return std::nullopt;
        acc = (acc << 6) | uint32_t(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(uint8_t(acc >> bits));
        }
    }
    return out;
}

}  // namespace

// An image of a chat's user messages, as far as its header: its bytes, size and tokens.
struct ImageSource {
    std::string where;
    std::vector<uint8_t> bytes;
    image::Dims dims;
    image::Size size;
};

// The images of a chat's user messages, read as far as their headers (400 for a remote URL,
// a malformed data URL, bytes that are not an image, or more than max_images): what each
// costs in tokens is known before any is decoded.
static std::vector<ImageSource> message_image_sources(const std::vector<text::ChatMessage>& history,
                                                      const ModelContext& mc) {
    std::vector<ImageSource> out;
    for (size_t i = 0; i < history.size(); ++i)
        for (size_t k = 0; k < history[i].image_urls.size(); ++k) {
            const std::string where =
                "messages[" + std::to_string(i) + "] image " + std::to_string(k + 1);
            if (!mc.vision)
                throw bad_request(where +
                                      ": this model takes no images (the server was started "
                                      "without --mmproj)",
                                  "messages", "images_unsupported");
            if (int(out.size()) >= mc.max_images)
                throw bad_request("a request may hold at most " + std::to_string(mc.max_images) +
                                      " images (--max-images)",
                                  "messages", "too_many_images");
            const std::string& url = history[i].image_urls[k];
            if (url.rfind("data:", 0) != 0)
                throw bad_request(where +
                                      ": only data URLs (data:image/png;base64,... or "
                                      "data:image/jpeg;base64,...) are served: this engine makes "
                                      "no outbound requests",
                                  "messages", "remote_image_url");
            const size_t comma = url.find(',');
            const std::string_view meta = std::string_view(url).substr(5, comma - 5);
            if (comma == std::string::npos || meta.size() < 7 ||
                meta.substr(meta.size() - 7) != ";base64")
                throw bad_request(where + ": a data URL must be base64 (data:MIME;base64,DATA)",
                                  "messages", "invalid_image_url");
            auto bytes = decode_base64(std::string_view(url).substr(comma + 1));
            if (!bytes)
                throw bad_request(where + ": the data URL's payload is not valid base64",
                                  "messages", "invalid_image_url");
            ImageSource src{where, std::move(*bytes), {}, {}};
            try {
                src.dims = image::dimensions(src.bytes, where);
            } catch (const Error& e) {
                throw bad_request(e.what(), "messages", "invalid_image");
            }
            src.size = image::size_for(src.dims.width, src.dims.height);
            out.push_back(std::move(src));
        }
    return out;
}

// The images decoded and normalised, one at a time, their pixels charged to the body budget:
// the image as decoded and resized while it is decoded, its canvas of floats while the request
// lives (`holds`).
static std::vector<runtime::PreparedImage> prepare_images(
    std::vector<ImageSource>& sources, const ModelContext& mc,
    std::vector<std::shared_ptr<BudgetHold>>& holds) {
    std::vector<runtime::PreparedImage> out;
    auto busy = [](const std::string& where) {
        return ApiError(503,
                        where + ": the server holds too much decoded image memory; retry later", "",
                        "server_busy");
    };
    for (ImageSource& src : sources) {
        const size_t canvas = size_t(src.size.canvas_w * src.size.canvas_h) * 3 * sizeof(float);
        auto kept = std::make_shared<BudgetHold>(canvas);
        if (!kept->held()) throw busy(src.where);
        holds.push_back(kept);
        const BudgetHold hold(size_t(src.dims.width * src.dims.height) * 3 +
                              size_t(src.size.content_w * src.size.content_h) * 3);
        if (!hold.held()) throw busy(src.where);
        try {
            out.push_back(runtime::prepare_image(src.bytes, src.where, *mc.vision));
        } catch (const Error& e) {
            throw bad_request(e.what(), "messages", "invalid_image");
        }
        src.bytes = {};
    }
    return out;
}

// The chat body's messages, tools and reasoning options, checked and rendered in the
// model's chat format (what parse_chat_request encodes and /apply-template returns).
// counting: for count_tokens, which renders a prompt of any length.
static text::RenderedPrompt render_chat(const ojson& body, const ModelContext& mc, GenRequest& g,
                                        std::vector<text::ChatMessage>& history,
                                        bool counting = false) {
    const ojson* msgs = field(body, "messages");
    if (!msgs)
        throw bad_request("'messages' is required", "messages", "missing_required_parameter");
    if (!msgs->is_array()) throw type_error("messages", "an array", *msgs);
    if (msgs->empty()) throw bad_request("'messages' must not be empty", "messages");
    check_messages(*msgs, mc.vision != nullptr);
    // Text that cannot fit is refused before it is copied and rendered.
    if (const size_t least = verbatim_bytes(*msgs) / mc.tok->max_token_bytes();
        !counting && least > encode_limit(mc))
        throw context_length_exceeded(int64_t(least), mc.n_ctx, "messages");
    try {
        // OpenAI's newer "developer" role is the system role under another name.
        bool developer = false;
        for (const auto& m : *msgs)
            developer = developer || (m.is_object() && m.value("role", ojson()) == "developer");
        if (developer) {
            ojson roles = *msgs;
            for (auto& m : roles)
                if (m.is_object() && m.value("role", ojson()) == "developer") m["role"] = "system";
            history = text::messages_from_openai(roles);
        } else {
            history = text::messages_from_openai(*msgs);
        }
    } catch (const Error& e) {
        throw bad_request(std::string("messages: ") + e.what(), "messages");
    }

    g.tools = parse_tools(body);
    parse_tool_choice(body, g);
    parse_response_format(body, g, mc);
    check_combinations(g);

    // Reasoning: think (bool), chat_template_kwargs.enable_thinking, reasoning_effort.
    text::ChatOptions opt;
    std::optional<bool> think;
    if (const ojson* k = field(body, "chat_template_kwargs")) {
        if (!k->is_object()) throw type_error("chat_template_kwargs", "an object", *k);
        if (field(*k, "enable_thinking")) think = opt_bool(*k, "enable_thinking", false);
        if (field(*k, "clear_thinking"))
            opt.keep_past_reasoning = !opt_bool(*k, "clear_thinking", true);
    }
    if (field(body, "think")) think = opt_bool(body, "think", false);
    text::ReasoningEffort effort = text::ReasoningEffort::Default;
    if (const ojson* e = field(body, "reasoning_effort")) {
        if (!e->is_string()) throw type_error("reasoning_effort", "a string", *e);
        try {
            effort = text::parse_reasoning_effort(e->get<std::string>());
        } catch (const Error& err) {
            throw bad_request(std::string("reasoning_effort: ") + err.what(), "reasoning_effort");
        }
    }
    if (effort == text::ReasoningEffort::None) {
        if (think.value_or(false))
            throw bad_request("'think' is true but 'reasoning_effort' is \"none\"",
                              "reasoning_effort");
        think = false;
    }
    opt.thinking = think;
    opt.effort = think == false ? text::ReasoningEffort::Default : effort;
    g.reasoning_budget = opt_int(body, "reasoning_budget", mc.reasoning_budget, -1, INT64_MAX / 4);

    // tool_choice "none": the model is not told about the tools (and cannot call one).
    const ojson prompt_tools = g.tool_choice == ToolChoice::None ? ojson(nullptr) : g.tools;
    text::RenderedPrompt p;
    try {
        p = mc.format->render(history, prompt_tools, opt);
    } catch (const Error& e) {
        throw bad_request(std::string("messages: ") + e.what(), "messages");
    }
    g.reasoning_open = p.reasoning_open;
    g.warnings = p.warnings;
    return p;
}

GenRequest parse_chat_request(const ojson& body, const ModelContext& mc) {
    GenRequest g;
    g.endpoint = Endpoint::Chat;
    parse_common(body, mc, g);
    if (opt_bool(body, "logprobs", false))
        g.logprobs = int(opt_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs));
    else if (field(body, "top_logprobs") &&
             opt_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs) > 0)
        throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");

    std::vector<text::ChatMessage> history;
    text::RenderedPrompt p = render_chat(body, mc, g, history);
    PromptInput in;
    if (!text::encode_prompt(*mc.tok, p, encode_limit(mc), in.tokens))
        throw context_length_exceeded(int64_t(in.tokens.size()), mc.n_ctx, "messages");
    p = {};
    // The images' tokens from their headers: a prompt they take past the context is refused
    // before any pixel is decoded.
    std::vector<ImageSource> sources = message_image_sources(history, mc);
    int64_t expanded = int64_t(in.tokens.size());
    for (const ImageSource& s : sources) expanded += s.size.tokens - 1;
    check_context(size_t(expanded), mc, "messages");
    in.images = prepare_images(sources, mc, g.image_holds);
    check_context(size_t(in.expanded_size()), mc, "messages");
    g.prompts.push_back(std::move(in));
    check_total_choices(g, mc);
    return g;
}

int64_t count_chat_prompt(const ojson& body, const ModelContext& mc) {
    GenRequest g;
    g.endpoint = Endpoint::Chat;
    parse_common(body, mc, g);
    std::vector<text::ChatMessage> history;
    text::RenderedPrompt p = render_chat(body, mc, g, history, true);
    // Counted whole, so encoded whole, charged to the body budget.
    const BudgetHold hold(kEncodeCost * p.text.size());
    if (!hold.held()) throw request_memory_busy();
    int64_t n = int64_t(text::encode_prompt(*mc.tok, p).size());
    // Images count from their headers; none is decoded.
    for (const ImageSource& s : message_image_sources(history, mc)) n += s.size.tokens - 1;
    return n;
}

std::string apply_chat_template(const ojson& body, const ModelContext& mc) {
    GenRequest g;
    g.endpoint = Endpoint::Chat;
    std::vector<text::ChatMessage> history;
    return render_chat(body, mc, g, history).text;
}

GenRequest parse_completion_request(const ojson& body, const ModelContext& mc) {
    GenRequest g;
    g.endpoint = Endpoint::Completion;
    parse_common(body, mc, g);
    g.echo = opt_bool(body, "echo", false);
    if (const ojson* s = field(body, "suffix")) {
        if (!s->is_string()) throw type_error("suffix", "a string", *s);
        if (!s->get<std::string>().empty()) throw unsupported("suffix", "");
    }
    if (const ojson* lp = field(body, "logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>())) {
        g.logprobs = int(opt_int(body, "logprobs", 0, 0, kMaxTopLogprobs));
        if (g.echo) throw unsupported("logprobs", " with 'echo' (the prompt's log-probabilities)");
    }
    if (opt_int(body, "best_of", g.n, 1, 1 << 20) != g.n)
        throw unsupported("best_of", " (other than equal to n)");
    parse_response_format(body, g, mc);
    check_combinations(g);

    const ojson* p = field(body, "prompt");
    if (!p) throw bad_request("'prompt' is required", "prompt", "missing_required_parameter");
    const int32_t n_vocab = mc.tok->n_vocab();
    auto token_prompt = [&](const ojson& arr) {
        if (int64_t(arr.size()) >= mc.n_ctx) check_context(arr.size(), mc, "prompt");
        PromptInput in;
        for (const auto& x : arr) {
            if (!x.is_number_integer() && !x.is_number_unsigned())
                throw bad_request("a token prompt must hold integers only", "prompt",
                                  "invalid_type");
            const int64_t id = x.get<int64_t>();
            if (id < 0 || id >= n_vocab)
                throw bad_request("token id " + std::to_string(id) +
                                      " is outside the vocabulary (0.." +
                                      std::to_string(n_vocab - 1) + ")",
                                  "prompt");
            in.tokens.push_back(int32_t(id));
        }
        in.text = mc.tok->decode(in.tokens);
        return in;
    };
    auto text_prompt = [&](const std::string& s) {
        PromptInput in;
        if (!mc.tok->encode_append(s, true, in.tokens, encode_limit(mc)))
            throw context_length_exceeded(int64_t(in.tokens.size()), mc.n_ctx, "prompt");
        in.text = s;
        return in;
    };
    if (p->is_string()) {
        g.prompts.push_back(text_prompt(p->get<std::string>()));
    } else if (p->is_array()) {
        if (p->empty()) throw bad_request("'prompt' must not be empty", "prompt");
        const ojson& first = (*p)[0];
        if (first.is_number()) {
            g.prompts.push_back(token_prompt(*p));
        } else {
            // The number of prompts is refused before any is encoded: each costs its tokens.
            if (int64_t(p->size()) * int64_t(g.n) > int64_t(mc.max_choices))
                throw bad_request("n times the number of prompts (" + std::to_string(p->size()) +
                                      ") must be at most " + std::to_string(mc.max_choices),
                                  "n");
            for (const auto& x : *p) {
                if (x.is_string())
                    g.prompts.push_back(text_prompt(x.get<std::string>()));
                else if (x.is_array())
                    g.prompts.push_back(token_prompt(x));
                else
                    throw type_error("prompt",
                                     "a string, an array of token ids, or an array of those", x);
            }
        }
    } else {
        throw type_error("prompt", "a string, an array of token ids, or an array of those", *p);
    }
    for (const auto& in : g.prompts) check_context(in.tokens.size(), mc, "prompt");
    check_total_choices(g, mc);
    return g;
}

runtime::RequestParams engine_params(const GenRequest& g, int index, const ModelContext& mc) {
    runtime::RequestParams p;
    const int sample = index % g.n;
    const PromptInput& in = g.prompts[size_t(index / g.n)];
    p.prompt = in.tokens;
    p.images = in.images;
    p.sampling = g.sampling;
    if (g.seed_given || mc.seed_fixed) {
        p.sampling.seed = g.sampling.seed + uint64_t(sample);
    } else {
        thread_local std::mt19937_64 rng{std::random_device{}()};
        p.sampling.seed = rng();
    }
    const int64_t room = mc.n_ctx - in.expanded_size();
    int64_t want = g.max_tokens > 0 ? g.max_tokens : mc.default_max_tokens;
    p.max_tokens = want > 0 ? std::min(want, room) : room;
    if (!g.ignore_eos)
        for (int32_t s : mc.tok->stop_ids()) p.stop_ids.insert(s);
    p.use_prefix_cache = g.use_prefix_cache;
    p.spec = g.spec;
    try {
        if (g.grammar) {
            p.constraint =
                runtime::make_json_constraint(g.grammar, mc.json_vocab, g.reasoning_open);
        } else if (forced_tool(g)) {
            p.constraint = std::make_unique<ToolCallConstraint>(
                mc.tool_vocab, g.tools, g.tool_choice == ToolChoice::Named ? g.tool_name : "",
                g.reasoning_open);
        } else if (g.endpoint == Endpoint::Chat &&
                   (g.tools.is_null() || g.tool_choice == ToolChoice::None) && mc.tool_vocab &&
                   mc.tool_vocab->tool_open >= 0) {
            // No tools to call: the marker that would start a call is never sampled.
            p.constraint =
                std::make_unique<BanConstraint>(std::vector<int32_t>{mc.tool_vocab->tool_open});
        }
    } catch (const Error& e) {
        throw bad_request(e.what(), g.grammar ? "response_format" : "tool_choice");
    }
    if (g.reasoning_open && g.reasoning_budget >= 0) {
        const int32_t think_end = mc.tok->find("</think>");
        if (think_end < 0)
            throw bad_request("this model's vocabulary has no </think> token to end reasoning with",
                              "reasoning_budget");
        p.constraint = std::make_unique<runtime::ReasoningBudget>(g.reasoning_budget, think_end,
                                                                  std::move(p.constraint));
    }
    return p;
}

}  // namespace glm5::server
