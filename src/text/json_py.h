// JSON text exactly as Python's json.dumps(obj, ensure_ascii=False) writes it: ", " and
// ": " separators, keys in insertion order, non-ASCII kept as UTF-8, floats as Python's
// repr. This is what the `tojson` filter produces inside GLM chat templates (tool
// declarations, non-string tool-call arguments), so prompts match byte for byte.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace glm5::text {

std::string py_json_dumps(const nlohmann::ordered_json& value);
void py_json_dumps(const nlohmann::ordered_json& value, std::string& out);

// Python's repr() of a float ("1.0", "1e-05", "1e+16", "inf" -> "Infinity" as json.dumps).
std::string py_float_repr(double v);

}  // namespace glm5::text
