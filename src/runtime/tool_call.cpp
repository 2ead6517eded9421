#include "runtime/tool_call.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer.h"

namespace glm5::runtime {

using ojson = nlohmann::ordered_json;
using namespace grammar;

namespace {

struct Param {
    std::string name;
    bool required = false;
    Node value;
};

// The value node a parameter's schema asks for.
Node value_node(const std::string& where, const ojson& schema) {
    Node n;
    n.kind = Kind::Text;
    n.where = where;
    if (!schema.is_object()) return n;
    auto choice = [&](const ojson& v) {
        n.kind = Kind::Lit;
        const std::string s = v.is_string()
                                  ? v.get<std::string>()
                                  : v.dump(-1, ' ', false, ojson::error_handler_t::replace);
        if (std::find(n.lits.begin(), n.lits.end(), s) == n.lits.end()) n.lits.push_back(s);
    };
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
        for (const auto& v : *e) choice(v);
    } else if (auto c = schema.find("const"); c != schema.end()) {
        choice(*c);
    } else if (auto t = schema.find("type"); t != schema.end() && t->is_string()) {
        const std::string type = t->get<std::string>();
        if (type == "number" || type == "integer") {
            n.kind = Kind::Num;
            n.integer = type == "integer";
        } else if (type == "boolean") {
            n.kind = Kind::Lit;
            n.lits = {"true", "false"};
        } else if (type == "null") {
            n.kind = Kind::Lit;
            n.lits = {"null"};
        }
    }
    return n;
}

}  // namespace

std::shared_ptr<const Grammar> compile_tool_call(const std::vector<ToolSignature>& tools,
                                                 const GrammarLimits& lim) {
    if (tools.empty()) throw Error("there are no tools to call");
    auto g = std::make_shared<Grammar>();
    g->lim = lim;
    g->tail = 1;  // the stop token after </tool_call>
    Node call;
    call.kind = Kind::Call;
    call.where = "tool call";
    for (const ToolSignature& t : tools) {
        std::vector<Param> params;
        std::vector<std::string> required;
        const ojson& ps = t.parameters;
        if (ps.is_object()) {
            if (auto r = ps.find("required"); r != ps.end() && r->is_array())
                for (const auto& x : *r)
                    if (x.is_string()) required.push_back(x.get<std::string>());
            if (auto props = ps.find("properties"); props != ps.end() && props->is_object())
                for (const auto& [k, schema] : props->items())
                    params.push_back({k, false, value_node(t.name + "/" + k, schema)});
        }
        for (const auto& r : required) {
            auto it = std::find_if(params.begin(), params.end(),
                                   [&](const Param& p) { return p.name == r; });
            if (it == params.end()) {
                params.push_back({r, false, value_node(t.name + "/" + r, ojson::object())});
                it = params.end() - 1;
            }
            it->required = true;
        }
        // An empty key or name could never be told apart from its closing marker.
        params.erase(std::remove_if(params.begin(), params.end(),
                                    [](const Param& p) { return p.name.empty() && !p.required; }),
                     params.end());
        if (params.size() > 64)
            throw Error("tool '" + t.name + "' has more than 64 parameters; it cannot be forced");
        for (const Param& p : params)
            if (p.name.empty())
                throw Error("tool '" + t.name + "' requires a parameter with an empty name");
        if (t.name.empty()) throw Error("a tool has an empty name");
        // The first of several tools with one name is the one a call can name.
        if (std::find(call.lits.begin(), call.lits.end(), t.name) != call.lits.end()) continue;

        Node tags;
        tags.kind = Kind::Tags;
        tags.where = t.name;
        for (Param& p : params) {
            g->nodes.push_back(std::move(p.value));
            Prop prop;
            prop.name = p.name;
            prop.key = p.name;
            prop.required = p.required;
            prop.value = int32_t(g->nodes.size() - 1);
            tags.props.push_back(std::move(prop));
        }
        g->nodes.push_back(std::move(tags));
        call.lits.push_back(t.name);
        call.alts.push_back(int32_t(g->nodes.size() - 1));
    }
    g->nodes.push_back(std::move(call));
    g->root = int32_t(g->nodes.size() - 1);
    link_grammar(*g);
    return g;
}

namespace {

VocabOptions tool_options(const text::Tokenizer& tok) {
    VocabOptions o;
    o.require_stop = false;  // has_tool_markers() says so instead
    // In grammar::Mark order.
    o.markers = {tok.find("<tool_call>"), tok.find("</tool_call>"), tok.find("<arg_key>"),
                 tok.find("</arg_key>"),  tok.find("<arg_value>"),  tok.find("</arg_value>")};
    o.not_text = {tok.find("</think>")};  // never plain text, whatever its type says
    o.user_defined_text = true;
    return o;
}

}  // namespace

ToolCallVocab::ToolCallVocab(const text::Tokenizer& tok) : TokenVocab(tok, tool_options(tok)) {
    const auto& m = markers();
    tool_open = m[MK_CALL_OPEN - kMarker];
    tool_close = m[MK_CALL_CLOSE - kMarker];
    key_open = m[MK_KEY_OPEN - kMarker];
    key_close = m[MK_KEY_CLOSE - kMarker];
    value_open = m[MK_VALUE_OPEN - kMarker];
    value_close = m[MK_VALUE_CLOSE - kMarker];
}

bool ToolCallVocab::has_tool_markers() const {
    return std::all_of(markers().begin(), markers().end(), [](int32_t m) { return m >= 0; }) &&
           !stop_ids().empty();
}

}  // namespace glm5::runtime
