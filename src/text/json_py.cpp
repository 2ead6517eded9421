#include "text/json_py.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace glm5::text {

std::string py_float_repr(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    // Shortest round-trip digits, then Python's layout: positional while the decimal
    // exponent is in [-4, 16), scientific with a signed two-digit exponent otherwise.
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string s(buf, res.ptr);
    const bool neg = s[0] == '-';
    if (neg) s.erase(0, 1);
    const size_t epos = s.find('e');
    std::string digits = s.substr(0, epos);
    if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
    const int exp10 = std::stoi(s.substr(epos + 1));
    std::string out = neg ? "-" : "";
    if (exp10 >= -5 + 1 && exp10 < 16) {
        if (exp10 >= 0) {
            if (int(digits.size()) <= exp10 + 1) {
                out += digits + std::string(size_t(exp10 + 1 - int(digits.size())), '0') + ".0";
            } else {
                out += digits.substr(0, size_t(exp10 + 1)) + "." + digits.substr(size_t(exp10 + 1));
            }
        } else {
            out += "0." + std::string(size_t(-exp10 - 1), '0') + digits;
        }
    } else {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char e[16];
        std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
        out += e;
    }
    return out;
}

namespace {

void dump_string(const std::string& s, std::string& out) {
    out.push_back('"');
    for (unsigned char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20) {
                    char e[8];
                    std::snprintf(e, sizeof e, "\\u%04x", c);
                    out += e;
                } else {
                    out.push_back(char(c));
                }
        }
    }
    out.push_back('"');
}

}  // namespace

void py_json_dumps(const nlohmann::ordered_json& v, std::string& out) {
    using T = nlohmann::ordered_json::value_t;
    switch (v.type()) {
        case T::null:
            out += "null";
            break;
        case T::boolean:
            out += v.get<bool>() ? "true" : "false";
            break;
        case T::number_integer:
            out += std::to_string(v.get<int64_t>());
            break;
        case T::number_unsigned:
            out += std::to_string(v.get<uint64_t>());
            break;
        case T::number_float:
            out += py_float_repr(v.get<double>());
            break;
        case T::string:
            dump_string(v.get_ref<const std::string&>(), out);
            break;
        case T::array: {
            out.push_back('[');
            bool first = true;
            for (const auto& item : v) {
                if (!first) out += ", ";
                first = false;
                py_json_dumps(item, out);
            }
            out.push_back(']');
            break;
        }
        case T::object: {
            out.push_back('{');
            bool first = true;
            for (const auto& [key, item] : v.items()) {
                if (!first) out += ", ";
                first = false;
                dump_string(key, out);
                out += ": ";
                py_json_dumps(item, out);
            }
            out.push_back('}');
            break;
        }
        default:
            out += "null";
            break;  // binary / discarded: not produced by parsing text
    }
}

std::string py_json_dumps(const nlohmann::ordered_json& v) {
    std::string out;
    py_json_dumps(v, out);
    return out;
}

}  // namespace glm5::text
