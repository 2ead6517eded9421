#include "server/tool_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace glm5::server {

using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const runtime::Grammar> call_grammar(const ToolVocab& v, const ojson& tools,
                                                     const std::string& name, bool after_think) {
    if (!v.has_tool_markers()) throw Error("the vocabulary lacks the tool-call marker tokens");
    if (after_think && v.think_end() < 0) throw Error("the vocabulary has no </think> token");
    std::vector<runtime::ToolSignature> sigs;
    for (const ojson& t : tools) {
        const ojson& fn = t.at("function");
        runtime::ToolSignature s;
        s.name = fn.at("name").get<std::string>();
        if (!name.empty() && s.name != name) continue;
        s.parameters = fn.value("parameters", ojson::object());
        sigs.push_back(std::move(s));
        if (!name.empty()) break;
    }
    if (sigs.empty())
        throw Error(name.empty() ? "there are no tools to call"
                                 : "there is no tool named '" + name + "'");
    return runtime::compile_tool_call(sigs);
}

}  // namespace

bool BanConstraint::allows(int32_t token) const {
    return std::find(banned_.begin(), banned_.end(), token) == banned_.end();
}

ToolCallConstraint::ToolCallConstraint(std::shared_ptr<const ToolVocab> vocab, const ojson& tools,
                                       const std::string& name, bool after_think)
    : GrammarConstraint(call_grammar(*vocab, tools, name, after_think), vocab, after_think) {}

}  // namespace glm5::server
