#include "server/tool_constraint.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;
constexpr int64_t kFar = INT64_MAX / 8;

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// JSON number automaton: 0 start, 1 after '-', 2 a leading 0, 3 integer digits, 4 after
// '.', 5 fraction digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits.
constexpr int kNumBad = -1;
int num_step(int s, char c, bool integer) {
    const bool digit = c >= '0' && c <= '9';
    switch (s) {
        case 0:
            if (c == '-') return 1;
            [[fallthrough]];
        case 1:
            if (c == '0') return 2;
            return digit ? 3 : kNumBad;
        case 2:
        case 3:
            if (s == 3 && digit) return 3;
            if (integer) return kNumBad;
            if (c == '.') return 4;
            return c == 'e' || c == 'E' ? 6 : kNumBad;
        case 4:
        case 5:
            if (digit) return 5;
            return s == 5 && (c == 'e' || c == 'E') ? 6 : kNumBad;
        case 6:
            if (c == '+' || c == '-') return 7;
            [[fallthrough]];
        case 7:
        case 8:
            return digit ? 8 : kNumBad;
    }
    return kNumBad;
}
bool num_complete(int s) {
    return s == 2 || s == 3 || s == 5 || s == 8;
}

// Digits allowed in the integer part, the fraction and the exponent: enough for any
// int64 or double the model means, and never a number JSON readers turn into
// infinity or a rounded integer.
int num_cap(int s) {
    return s == 8 ? 2 : 15;
}

// Feeds one character; `digits` counts the digits of the current part.
bool num_advance(int& s, int& digits, char c, bool integer) {
    const int ns = num_step(s, c, integer);
    if (ns == kNumBad) return false;
    if (ns == s) {
        if (++digits > num_cap(s)) return false;
    } else {
        digits = ns == 3 || ns == 5 || ns == 8 ? 1 : 0;
    }
    s = ns;
    return true;
}

ToolCallConstraint::Param param_from_schema(const std::string& name, const ojson& schema) {
    using Kind = ToolCallConstraint::Kind;
    ToolCallConstraint::Param p;
    p.name = name;
    if (schema.is_object()) {
        auto add_choice = [&](const ojson& v) {
            p.choices.push_back(v.is_string()
                                    ? v.get<std::string>()
                                    : v.dump(-1, ' ', false, ojson::error_handler_t::replace));
        };
        if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
            p.kind = Kind::Choice;
            for (const auto& v : *e) add_choice(v);
        } else if (auto c = schema.find("const"); c != schema.end()) {
            p.kind = Kind::Choice;
            add_choice(*c);
        } else if (auto t = schema.find("type"); t != schema.end() && t->is_string()) {
            const std::string type = t->get<std::string>();
            if (type == "number") {
                p.kind = Kind::Number;
            } else if (type == "integer") {
                p.kind = Kind::Integer;
            } else if (type == "boolean") {
                p.kind = Kind::Choice;
                p.choices = {"true", "false"};
            } else if (type == "null") {
                p.kind = Kind::Choice;
                p.choices = {"null"};
            }
        }
    }
    if (p.kind == Kind::Number || p.kind == Kind::Integer) p.min_bytes = 1;
    if (p.kind == Kind::Choice) {
        p.min_bytes = kFar;
        for (const auto& c : p.choices)
            p.min_bytes = std::min<int64_t>(p.min_bytes, int64_t(c.size()));
    }
    return p;
}

}  // namespace

ToolVocab::ToolVocab(const text::Tokenizer& tok) {
    const int32_t n = tok.n_vocab();
    text_.resize(size_t(n));
    for (int32_t id = 0; id < n; ++id) {
        const text::TokenType t = tok.token_type(id);
        if (t == text::TokenType::Normal || t == text::TokenType::Byte ||
            t == text::TokenType::UserDefined || t == text::TokenType::Undefined)
            text_[size_t(id)] = tok.token_bytes(id);
    }
    tool_open = tok.find("<tool_call>");
    tool_close = tok.find("</tool_call>");
    key_open = tok.find("<arg_key>");
    key_close = tok.find("</arg_key>");
    value_open = tok.find("<arg_value>");
    value_close = tok.find("</arg_value>");
    think_end = tok.find("</think>");
    stop_ids = tok.stop_ids();
    // The markers are never plain text, whatever their type says.
    for (int32_t m :
         {tool_open, tool_close, key_open, key_close, value_open, value_close, think_end})
        if (m >= 0) text_[size_t(m)].clear();
    for (int32_t s : stop_ids) text_[size_t(s)].clear();
}

bool ToolVocab::is_stop(int32_t id) const {
    return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
}

bool ToolVocab::has_tool_markers() const {
    return tool_open >= 0 && tool_close >= 0 && key_open >= 0 && key_close >= 0 &&
           value_open >= 0 && value_close >= 0 && !stop_ids.empty();
}

bool BanConstraint::allows(int32_t token) const {
    return std::find(banned_.begin(), banned_.end(), token) == banned_.end();
}

ToolCallConstraint::ToolCallConstraint(std::shared_ptr<const ToolVocab> vocab, const ojson& tools,
                                       const std::string& name, bool after_think)
    : v_(std::move(vocab)) {
    if (!v_->has_tool_markers()) throw Error("the vocabulary lacks the tool-call marker tokens");
    if (after_think && v_->think_end < 0) throw Error("the vocabulary has no </think> token");
    for (const ojson& t : tools) {
        const ojson& fn = t.at("function");
        Tool tool;
        tool.name = fn.at("name").get<std::string>();
        if (!name.empty() && tool.name != name) continue;
        const ojson params = fn.value("parameters", ojson::object());
        std::vector<std::string> required;
        if (params.is_object()) {
            if (auto r = params.find("required"); r != params.end() && r->is_array())
                for (const auto& x : *r)
                    if (x.is_string()) required.push_back(x.get<std::string>());
            if (auto props = params.find("properties"); props != params.end() && props->is_object())
                for (const auto& [k, schema] : props->items())
                    tool.params.push_back(param_from_schema(k, schema));
        }
        for (const auto& r : required) {
            auto it = std::find_if(tool.params.begin(), tool.params.end(),
                                   [&](const Param& p) { return p.name == r; });
            if (it == tool.params.end()) {
                tool.params.push_back(param_from_schema(r, ojson::object()));
                it = tool.params.end() - 1;
            }
            it->required = true;
        }
        // An empty key or name could never be told apart from its closing marker.
        tool.params.erase(
            std::remove_if(tool.params.begin(), tool.params.end(),
                           [](const Param& p) { return p.name.empty() && !p.required; }),
            tool.params.end());
        if (tool.params.size() > 64)
            throw Error("tool '" + tool.name +
                        "' has more than 64 parameters; it cannot be forced");
        for (const Param& p : tool.params)
            if (p.name.empty())
                throw Error("tool '" + tool.name + "' requires a parameter with an empty name");
        if (tool.name.empty()) throw Error("a tool has an empty name");
        tools_.push_back(std::move(tool));
        if (!name.empty()) break;
    }
    if (tools_.empty())
        throw Error(name.empty() ? "there are no tools to call"
                                 : "there is no tool named '" + name + "'");
    st_.phase = after_think ? Phase::Think : Phase::Open;
}

ToolCallConstraint::~ToolCallConstraint() = default;

int64_t ToolCallConstraint::value_cost(const Param& p) const {
    // <arg_key> NAME </arg_key> <arg_value> VALUE </arg_value>
    return 4 + int64_t(p.name.size()) + p.min_bytes;
}

int64_t ToolCallConstraint::finish_cost(int tool, uint64_t used) const {
    int64_t c = 2;  // </tool_call> and the stop token
    const Tool& t = tools_[size_t(tool)];
    for (size_t i = 0; i < t.params.size(); ++i)
        if (t.params[i].required && !(used >> i & 1)) c += value_cost(t.params[i]);
    return c;
}

int64_t ToolCallConstraint::need(const State& s) const {
    switch (s.phase) {
        case Phase::Done:
            return 1;
        case Phase::AfterValue:
            return finish_cost(s.tool, s.used);
        case Phase::Value: {
            const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
            int64_t rest = 0;
            if (p.kind == Kind::Number || p.kind == Kind::Integer) {
                rest = num_complete(s.num) ? 0 : 1;
            } else if (p.kind == Kind::Choice) {
                rest = kFar;
                for (const auto& c : p.choices)
                    if (starts_with(c, s.buf))
                        rest = std::min<int64_t>(rest, int64_t(c.size() - s.buf.size()));
            }
            return rest + 1 + finish_cost(s.tool, s.used | uint64_t(1) << s.param);
        }
        case Phase::ValueOpen: {
            const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
            return 2 + p.min_bytes + finish_cost(s.tool, s.used | uint64_t(1) << s.param);
        }
        case Phase::Key: {
            const Tool& t = tools_[size_t(s.tool)];
            int64_t best = kFar;
            for (size_t i = 0; i < t.params.size(); ++i) {
                const Param& p = t.params[i];
                if (s.used >> i & 1 || !starts_with(p.name, s.buf)) continue;
                best = std::min(best, int64_t(p.name.size() - s.buf.size()) + 3 + p.min_bytes +
                                          finish_cost(s.tool, s.used | uint64_t(1) << i));
            }
            return best;
        }
        case Phase::Name: {
            int64_t best = kFar;
            for (size_t i = 0; i < tools_.size(); ++i)
                if (starts_with(tools_[i].name, s.buf))
                    best = std::min(best, int64_t(tools_[i].name.size() - s.buf.size()) +
                                              finish_cost(int(i), 0));
            return best;
        }
        case Phase::Open:
        case Phase::Think: {
            State open;
            open.phase = Phase::Name;
            return (s.phase == Phase::Think ? 2 : 1) + need(open);
        }
    }
    return kFar;
}

bool ToolCallConstraint::next(const State& s, int32_t token, State& out) const {
    if (token < 0 || token >= v_->n_vocab() || v_->is_stop(token)) return false;
    const std::string& text = v_->text(token);
    out = s;
    switch (s.phase) {
        case Phase::Think:
            if (token == v_->think_end) out.phase = Phase::Open;
            return true;
        case Phase::Open:
            if (token != v_->tool_open) return false;
            out.phase = Phase::Name;
            out.buf.clear();
            return true;
        case Phase::Name: {
            if (!text.empty()) {
                out.buf += text;
                for (const Tool& t : tools_)
                    if (starts_with(t.name, out.buf)) return true;
                return false;
            }
            if (token != v_->key_open && token != v_->tool_close) return false;
            for (size_t i = 0; i < tools_.size(); ++i) {
                const Tool& t = tools_[i];
                if (t.name != s.buf) continue;
                if (token == v_->key_open && t.params.empty()) continue;
                if (token == v_->tool_close && finish_cost(int(i), 0) > 2) continue;
                out.tool = int(i);
                out.buf.clear();
                out.phase = token == v_->key_open ? Phase::Key : Phase::Done;
                return true;
            }
            return false;
        }
        case Phase::Key: {
            const Tool& t = tools_[size_t(s.tool)];
            if (!text.empty()) {
                out.buf += text;
                for (size_t i = 0; i < t.params.size(); ++i)
                    if (!(s.used >> i & 1) && starts_with(t.params[i].name, out.buf)) return true;
                return false;
            }
            if (token != v_->key_close) return false;
            for (size_t i = 0; i < t.params.size(); ++i) {
                if (s.used >> i & 1 || t.params[i].name != s.buf) continue;
                out.param = int(i);
                out.phase = Phase::ValueOpen;
                out.buf.clear();
                return true;
            }
            return false;
        }
        case Phase::ValueOpen:
            if (token != v_->value_open) return false;
            out.phase = Phase::Value;
            out.buf.clear();
            out.num = 0;
            out.digits = 0;
            return true;
        case Phase::Value: {
            const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
            if (token == v_->value_close) {
                bool ok = true;
                if (p.kind == Kind::Number || p.kind == Kind::Integer) ok = num_complete(s.num);
                if (p.kind == Kind::Choice)
                    ok = std::find(p.choices.begin(), p.choices.end(), s.buf) != p.choices.end();
                if (!ok) return false;
                out.used |= uint64_t(1) << s.param;
                out.param = -1;
                out.buf.clear();
                out.phase = Phase::AfterValue;
                return true;
            }
            if (text.empty()) return false;
            if (p.kind == Kind::Text) return true;
            if (p.kind == Kind::Choice) {
                out.buf += text;
                for (const auto& c : p.choices)
                    if (starts_with(c, out.buf)) return true;
                return false;
            }
            for (char c : text)
                if (!num_advance(out.num, out.digits, c, p.kind == Kind::Integer)) return false;
            return true;
        }
        case Phase::AfterValue: {
            const Tool& t = tools_[size_t(s.tool)];
            if (token == v_->key_open) {
                for (size_t i = 0; i < t.params.size(); ++i)
                    if (!(s.used >> i & 1)) {
                        out.phase = Phase::Key;
                        out.buf.clear();
                        return true;
                    }
                return false;
            }
            if (token == v_->tool_close && finish_cost(s.tool, s.used) == 2) {
                out.phase = Phase::Done;
                return true;
            }
            return false;
        }
        case Phase::Done:
            return false;
    }
    return false;
}

void ToolCallConstraint::compute() const {
    const int32_t n = v_->n_vocab();
    allowed_.assign(size_t(n), 0);
    if (st_.phase == Phase::Done) {
        for (int32_t s : v_->stop_ids) allowed_[size_t(s)] = 1;
        dirty_ = false;
        return;
    }
    const int64_t threshold = remaining_ - 1;
    const int64_t now = need(st_);
    // Reasoning and free-text values keep the state (and so the cost) for every text
    // token: decide those once instead of per token.
    const bool text_keeps = st_.phase == Phase::Think ||
                            (st_.phase == Phase::Value &&
                             tools_[size_t(st_.tool)].params[size_t(st_.param)].kind == Kind::Text);
    std::vector<int64_t> cost(size_t(n), -1);  // -1: not allowed at all
    State ns, open;
    open.phase = Phase::Open;
    for (int32_t t = 0; t < n; ++t) {
        if (text_keeps && !v_->text(t).empty()) {
            cost[size_t(t)] = now;
            continue;
        }
        if (st_.phase == Phase::Think && !v_->is_stop(t)) {
            // Any other token in reasoning is reasoning text, except </think>.
            cost[size_t(t)] = t == v_->think_end ? need(open) : now;
            continue;
        }
        if (next(st_, t, ns)) cost[size_t(t)] = need(ns);
    }
    // Within budget; else whatever gets strictly closer to the end; else anything valid.
    for (int pass = 0; pass < 3; ++pass) {
        bool any = false;
        for (int32_t t = 0; t < n; ++t) {
            const int64_t c = cost[size_t(t)];
            const bool ok = c >= 0 && (pass == 0 ? c <= threshold : pass == 1 ? c < now : true);
            allowed_[size_t(t)] = ok;
            any |= ok;
        }
        if (any) break;
    }
    dirty_ = false;
}

bool ToolCallConstraint::allows(int32_t token) const {
    if (token < 0 || token >= v_->n_vocab()) return false;
    if (dirty_) compute();
    return allowed_[size_t(token)] != 0;
}

void ToolCallConstraint::accept(int32_t token) {
    State ns;
    // The engine only accepts tokens allows() let through; anything else leaves the
    // state alone rather than throwing on the engine thread.
    if (next(st_, token, ns)) st_ = std::move(ns);
    dirty_ = true;
}

void ToolCallConstraint::set_remaining(int64_t n_tokens) {
    if (n_tokens != remaining_) dirty_ = true;
    remaining_ = n_tokens;
}

bool ToolCallConstraint::complete() const {
    return st_.phase == Phase::Done;
}

int64_t ToolCallConstraint::min_completion() const {
    return need(st_);
}

}  // namespace glm5::server
