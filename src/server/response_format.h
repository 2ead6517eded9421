// OpenAI's `response_format` to a JSON grammar (runtime/json_schema.h):
// null or {"type": "text"} -> nullptr; {"type": "json_object"} (an optional "schema" is
// honoured); {"type": "json_schema", "json_schema": {...}}. Throws glm5::Error with a
// message fit for a 400 response otherwise.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "runtime/grammar.h"

namespace glm5::server {

std::shared_ptr<const runtime::Grammar> grammar_from_response_format(
    const nlohmann::ordered_json& response_format, const runtime::GrammarLimits& lim = {});
std::shared_ptr<const runtime::Grammar> grammar_from_response_format(
    const nlohmann::json& response_format, const runtime::GrammarLimits& lim = {});

}  // namespace glm5::server
