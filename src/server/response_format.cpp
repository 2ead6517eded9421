#include "server/response_format.h"

#include "core/error.h"
#include "runtime/json_schema.h"

namespace glm5::server {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const runtime::Grammar> grammar_from_response_format(
    const ojson& rf, const runtime::GrammarLimits& lim) {
    if (rf.is_null()) return nullptr;
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
        throw Error("response_format must be an object with a \"type\"");
    const std::string type = rf["type"].get<std::string>();
    if (type == "text") return nullptr;
    if (type == "json_object") {
        if (rf.contains("schema")) return runtime::compile_json_schema(rf["schema"], lim);
        return runtime::json_object_grammar(lim);
    }
    if (type == "json_schema") {
        if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
            throw Error("response_format.json_schema must be an object");
        const ojson& js = rf["json_schema"];
        // The wrapper without a schema: any object, as json_object.
        if (!js.contains("schema") && (js.contains("name") || js.contains("strict")) &&
            !js.contains("type") && !js.contains("properties"))
            return runtime::json_object_grammar(lim);
        return runtime::compile_json_schema(js, lim);
    }
    throw Error(
        "response_format.type must be \"text\", \"json_object\" or \"json_schema\", not \"" + type +
        "\"");
}

std::shared_ptr<const runtime::Grammar> grammar_from_response_format(
    const nlohmann::json& rf, const runtime::GrammarLimits& lim) {
    return grammar_from_response_format(ojson::parse(rf.dump()), lim);
}

}  // namespace glm5::server
