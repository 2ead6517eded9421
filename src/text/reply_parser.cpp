#include "text/reply_parser.h"

#include "text/unicode.h"

namespace glm5::text {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

// Model output is as hostile as a request body: a tool call whose text grows
// past kMaxCallBytes before its close is given up (its text becomes content),
// and an argument value nested deeper than kMaxArgDepth stays the raw string
// (nested JSON is walked recursively when it is written out again).
constexpr size_t kMaxCallBytes = size_t(1) << 20;
constexpr int kMaxArgDepth = 64;

// The JSON a value holds, or a discarded value when it is not JSON or too deep.
nlohmann::ordered_json parse_bounded(std::string_view raw) {
    bool too_deep = false;
    auto v = nlohmann::ordered_json::parse(
        raw.begin(), raw.end(),
        [&](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
            if (depth > kMaxArgDepth) too_deep = true;
            return !too_deep;
        },
        false);
    if (too_deep) return nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
    return v;
}

// Length of the longest proper prefix of `marker` that `s` ends with: the bytes that must
// wait for the next chunk.
size_t partial_marker(std::string_view s, std::string_view marker) {
    for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
    return 0;
}

// Bytes of leading white space (Python's notion, as the templates strip).
size_t leading_space(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        Utf8Unit u = utf8_decode(s, i);
        if (!u.valid || !is_python_space(u.cp)) break;
        i += u.len;
    }
    return i;
}

bool declared_string(const ojson& schema) {
    if (!schema.is_object() || !schema.contains("type")) return false;
    const ojson& t = schema["type"];
    if (t.is_string()) return t.get<std::string>() == "string";
    if (!t.is_array() || t.empty()) return false;
    bool any_string = false;
    for (const ojson& x : t) {
        if (!x.is_string()) return false;
        const std::string& name = x.get_ref<const std::string&>();
        if (name == "string")
            any_string = true;
        else if (name != "null")
            return false;
    }
    return any_string;
}

}  // namespace

ReplyParser::ReplyParser(const ReplyParserOptions& opt)
    : mode_(opt.reasoning_open ? Mode::Reasoning : Mode::Content),
      reply_start_(!opt.reasoning_open) {
    if (!opt.tools.is_array()) return;
    for (const ojson& t : opt.tools) {
        if (!t.is_object()) continue;
        const ojson& fn = t.contains("function") ? t["function"] : t;
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
        auto& params = string_params_[fn["name"].get<std::string>()];
        if (!fn.contains("parameters") || !fn["parameters"].is_object()) continue;
        const ojson& p = fn["parameters"];
        if (!p.contains("properties") || !p["properties"].is_object()) continue;
        for (const auto& [key, schema] : p["properties"].items())
            params[key] = declared_string(schema);
    }
}

ReplyDelta ReplyParser::feed(std::string_view text) {
    ReplyDelta d;
    buf_.append(text);
    step(d, false);
    return d;
}

ReplyDelta ReplyParser::finish() {
    ReplyDelta d;
    step(d, true);
    if (mode_ == Mode::Reasoning) result_.reasoning_unterminated = true;
    return d;
}

void ReplyParser::emit_reasoning(ReplyDelta& d, std::string_view s) {
    if (s.empty()) return;
    d.reasoning.append(s);
    result_.reasoning.append(s);
}

void ReplyParser::emit_content(ReplyDelta& d, std::string_view s) {
    if (s.empty()) return;
    skip_ws_ = false;
    d.content.append(s);
    result_.content.append(s);
}

void ReplyParser::step(ReplyDelta& d, bool final) {
    for (;;) {
        if (mode_ == Mode::Reasoning) {
            const size_t close = buf_.find(kThinkClose);
            if (close != std::string::npos) {
                emit_reasoning(d, std::string_view(buf_).substr(0, close));
                buf_.erase(0, close + kThinkClose.size());
                mode_ = Mode::Content;
                skip_ws_ = true;
                continue;
            }
            const size_t keep = final ? 0 : partial_marker(buf_, kThinkClose);
            emit_reasoning(d, std::string_view(buf_).substr(0, buf_.size() - keep));
            buf_.erase(0, buf_.size() - keep);
            return;
        }

        if (mode_ == Mode::ToolCall) {
            const size_t close = buf_.find(kCallClose);
            if (close == std::string::npos) {
                if (final) {
                    // Cut off mid-call (max_tokens): the call as far as it came, with the
                    // arguments whose values arrived whole; no call when even its name
                    // did not. Never the markup, which a client would show as text.
                    ToolCall call;
                    if (partial_tool_call(buf_, call)) {
                        d.tool_calls.push_back(call);
                        result_.tool_calls.push_back(std::move(call));
                    }
                    buf_.clear();
                    mode_ = Mode::Content;
                    result_.tool_call_unterminated = true;
                } else if (buf_.size() > kMaxCallBytes) {
                    // Too long to be a call: keep its text as content rather than lose it.
                    emit_content(d, std::string(kCallOpen) + buf_);
                    buf_.clear();
                    mode_ = Mode::Content;
                    result_.tool_call_unterminated = true;
                }
                return;
            }
            ToolCall call;
            const std::string_view body = std::string_view(buf_).substr(0, close);
            if (parse_tool_call(body, call)) {
                d.tool_calls.push_back(call);
                result_.tool_calls.push_back(std::move(call));
            } else {
                emit_content(d,
                             std::string(kCallOpen) + std::string(body) + std::string(kCallClose));
            }
            buf_.erase(0, close + kCallClose.size());
            mode_ = Mode::Content;
            skip_ws_ = true;
            continue;
        }

        // Content.
        if (skip_ws_) {
            buf_.erase(0, leading_space(buf_));
            if (buf_.empty()) return;
            // Half a character could still be white space (U+3000...): wait for the rest.
            if (!final && utf8_incomplete_tail(buf_, 0) > 0) return;
        }
        if (reply_start_) {
            if (std::string_view(buf_).starts_with(kThinkOpen)) {
                buf_.erase(0, kThinkOpen.size());
                reply_start_ = false;
                mode_ = Mode::Reasoning;
                continue;
            }
            if (!final && kThinkOpen.starts_with(buf_)) return;  // maybe "<think>" later
            reply_start_ = false;
        }
        const size_t open = buf_.find(kCallOpen);
        if (open != std::string::npos) {
            emit_content(d, std::string_view(buf_).substr(0, open));
            buf_.erase(0, open + kCallOpen.size());
            mode_ = Mode::ToolCall;
            continue;
        }
        const size_t keep = final ? 0 : partial_marker(buf_, kCallOpen);
        emit_content(d, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
    }
}

bool ReplyParser::parse_tool_call(std::string_view body, ToolCall& call) const {
    size_t name_end = body.find(kKeyOpen);
    if (name_end == std::string_view::npos) name_end = body.size();
    call.name = std::string(python_strip(body.substr(0, name_end)));
    if (call.name.empty()) return false;
    call.arguments = ojson::object();

    const std::map<std::string, bool>* params = nullptr;
    if (auto it = string_params_.find(call.name); it != string_params_.end()) params = &it->second;

    std::string_view rest = body.substr(name_end);
    for (;;) {
        rest.remove_prefix(leading_space(rest));
        if (rest.empty()) return true;
        if (!rest.starts_with(kKeyOpen)) return false;
        rest.remove_prefix(kKeyOpen.size());
        const size_t key_end = rest.find(kKeyClose);
        if (key_end == std::string_view::npos) return false;
        const std::string key(python_strip(rest.substr(0, key_end)));
        rest.remove_prefix(key_end + kKeyClose.size());
        rest.remove_prefix(leading_space(rest));
        if (!rest.starts_with(kValueOpen)) return false;
        rest.remove_prefix(kValueOpen.size());
        const size_t value_end = rest.find(kValueClose);
        if (value_end == std::string_view::npos) return false;
        const std::string_view raw = rest.substr(0, value_end);
        rest.remove_prefix(value_end + kValueClose.size());

        bool keep_string = false;
        if (params) {
            auto p = params->find(key);
            keep_string = p != params->end() && p->second;
        }
        ojson value;
        if (!keep_string) value = parse_bounded(raw);
        if (keep_string || value.is_discarded() || value.is_string())
            call.arguments[key] = std::string(raw);
        else
            call.arguments[key] = std::move(value);
    }
}

bool ReplyParser::partial_tool_call(std::string_view body, ToolCall& call) const {
    // The name is complete when something follows it (names hold no '<'), or when
    // nothing does but it names one of the request's tools.
    const size_t lt = body.find('<');
    if (lt == std::string_view::npos) {
        const std::string name(python_strip(body));
        if (string_params_.find(name) == string_params_.end()) return false;
        return parse_tool_call(name, call);
    }
    // The arguments up to the last value that arrived whole.
    const size_t last = body.rfind(kValueClose);
    const std::string_view whole = last == std::string_view::npos
                                       ? body.substr(0, lt)
                                       : body.substr(0, last + kValueClose.size());
    return parse_tool_call(whole, call);
}

ChatMessage assistant_message(const ParsedReply& reply) {
    ChatMessage m;
    m.role = "assistant";
    m.content = reply.content;
    m.reasoning_content = reply.reasoning;
    m.tool_calls = reply.tool_calls;
    return m;
}

}  // namespace glm5::text
