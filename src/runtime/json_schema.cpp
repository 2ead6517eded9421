#include "runtime/json_schema.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "text/tokenizer.h"

namespace glm5::runtime {

using ojson = nlohmann::ordered_json;
using namespace grammar;

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& msg) {
    throw Error("json schema: " + msg + " (at " + where + ")");
}

const std::set<std::string> kAlwaysRefused = {"not",          "if",
                                              "then",         "else",
                                              "$dynamicRef",  "$recursiveRef",
                                              "dependencies", "dependentSchemas"};
const std::set<std::string> kNumberRefused = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum", "multipleOf"};
const std::set<std::string> kStringRefused = {"pattern"};
const std::set<std::string> kArrayRefused = {"prefixItems", "contains",         "minContains",
                                             "maxContains", "unevaluatedItems", "additionalItems"};
const std::set<std::string> kObjectRefused = {"patternProperties", "propertyNames",
                                              "dependentRequired"};
// Keywords that restrict what is valid and that this compiler implements.
const std::set<std::string> kValidity = {"type",
                                         "enum",
                                         "const",
                                         "properties",
                                         "required",
                                         "items",
                                         "additionalProperties",
                                         "minLength",
                                         "maxLength",
                                         "minItems",
                                         "maxItems",
                                         "anyOf",
                                         "oneOf",
                                         "allOf",
                                         "$ref",
                                         "minProperties",
                                         "maxProperties",
                                         "uniqueItems",
                                         "unevaluatedProperties"};

enum TypeBit : unsigned {
    T_NULL = 1,
    T_BOOL = 2,
    T_INT = 4,
    T_NUM = 8,
    T_STR = 16,
    T_ARR = 32,
    T_OBJ = 64,
    T_ALL = 127,
};

unsigned type_bit(const std::string& t, const std::string& where) {
    if (t == "null") return T_NULL;
    if (t == "boolean") return T_BOOL;
    if (t == "integer") return T_INT;
    if (t == "number") return T_NUM;
    if (t == "string") return T_STR;
    if (t == "array") return T_ARR;
    if (t == "object") return T_OBJ;
    refuse(where, "unknown type '" + t + "'");
}

// Which type names a JSON value satisfies.
unsigned value_types(const ojson& v) {
    switch (v.type()) {
        case ojson::value_t::null:
            return T_NULL;
        case ojson::value_t::boolean:
            return T_BOOL;
        case ojson::value_t::number_integer:
        case ojson::value_t::number_unsigned:
            return T_INT | T_NUM;
        case ojson::value_t::number_float: {
            const double d = v.get<double>();
            return d == double(int64_t(d)) ? (T_INT | T_NUM) : T_NUM;
        }
        case ojson::value_t::string:
            return T_STR;
        case ojson::value_t::array:
            return T_ARR;
        case ojson::value_t::object:
            return T_OBJ;
        default:
            return 0;
    }
}

class Compiler {
  public:
    Compiler(const ojson& root, const GrammarLimits& lim, Grammar& g)
        : root_(root), lim_(lim), g_(g) {}

    int32_t compile(const ojson& s, const std::string& where, int depth) {
        if (depth > 64) refuse(where, "schema nested too deeply");
        if (s.is_boolean()) {
            if (s.get<bool>()) return any();
            refuse(where, "the schema 'false' accepts nothing");
        }
        if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
        for (const auto& kw : kAlwaysRefused)
            if (s.contains(kw)) refuse(where, "keyword '" + kw + "' is not supported");
        if (const int32_t c = combinator(s, where, depth); c >= 0) return c;
        const unsigned types = schema_types(s, where);
        refuse_unenforced(s, types, where);
        if (s.contains("enum") || s.contains("const")) {
            auto others = [&](std::initializer_list<const char*> except) {
                return first_other(s, except);
            };
            return literals(s, types, where, others);
        }
        if (types == T_ALL && !s.contains("type")) return any();
        return typed(s, types, where, depth);
    }

    // The first validity keyword of `s` other than `except` ("" when none).
    static std::string first_other(const ojson& s, std::initializer_list<const char*> except) {
        for (const auto& [k, v] : s.items()) {
            if (!kValidity.count(k)) continue;
            bool skip = false;
            for (const char* e : except) skip = skip || k == e;
            if (!skip) return k;
        }
        return std::string();
    }

    // $ref, allOf (of one), anyOf or oneOf, each alone in its schema; -1: none of them.
    int32_t combinator(const ojson& s, const std::string& where, int depth) {
        auto alone = [&](const char* kw) {
            const std::string o = first_other(s, {kw});
            if (!o.empty()) refuse(where, "'" + o + "' next to '" + kw + "' is not supported");
        };
        if (s.contains("$ref")) {
            alone("$ref");
            if (!s["$ref"].is_string()) refuse(where, "'$ref' must be a string");
            return ref(s["$ref"].get<std::string>(), where, depth);
        }
        if (s.contains("allOf")) {
            const auto& all = s["allOf"];
            if (!all.is_array() || all.size() != 1)
                refuse(where, "'allOf' with other than one subschema is not supported");
            alone("allOf");
            return compile(all[0], where + "/allOf/0", depth + 1);
        }
        if (!s.contains("anyOf") && !s.contains("oneOf")) return -1;
        const bool one = s.contains("oneOf");
        if (one && s.contains("anyOf")) refuse(where, "'anyOf' with 'oneOf' is not supported");
        const char* kw = one ? "oneOf" : "anyOf";
        alone(kw);
        const auto& alts = s[kw];
        if (!alts.is_array() || alts.empty())
            refuse(where, std::string("'") + kw + "' must be a non-empty array");
        Node u;
        u.kind = Kind::Union;
        u.where = where;
        u.exclusive = one;
        for (size_t i = 0; i < alts.size(); ++i)
            u.alts.push_back(
                compile(alts[i], where + "/" + kw + "/" + std::to_string(i), depth + 1));
        return add(std::move(u));
    }

    // The types a schema may produce: its `type`, else what its keywords imply.
    unsigned schema_types(const ojson& s, const std::string& where) {
        if (s.contains("type")) {
            const auto& t = s["type"];
            if (t.is_string()) return type_bit(t.get<std::string>(), where);
            if (!t.is_array() || t.empty())
                refuse(where, "'type' must be a string or a non-empty array");
            unsigned types = 0;
            for (const auto& x : t) {
                if (!x.is_string()) refuse(where, "'type' must name types");
                types |= type_bit(x.get<std::string>(), where);
            }
            return types;
        }
        if (s.contains("enum") || s.contains("const")) return T_ALL;
        if (s.contains("properties") || s.contains("required") ||
            s.contains("additionalProperties") || s.contains("minProperties") ||
            s.contains("maxProperties"))
            return T_OBJ;
        if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return T_ARR;
        if (s.contains("minLength") || s.contains("maxLength")) return T_STR;
        return T_ALL;
    }

    // Keywords the grammar cannot hold the output to, for the types the schema allows.
    void refuse_unenforced(const ojson& s, unsigned types, const std::string& where) {
        auto check = [&](const std::set<std::string>& kws) {
            for (const auto& kw : kws)
                if (s.contains(kw)) refuse(where, "keyword '" + kw + "' is not supported");
        };
        if (types & (T_INT | T_NUM)) check(kNumberRefused);
        if (types & T_STR) check(kStringRefused);
        if (types & T_ARR) {
            check(kArrayRefused);
            if (s.contains("uniqueItems") && s["uniqueItems"] != false)
                refuse(where, "keyword 'uniqueItems' is not supported");
        }
        if (types & T_OBJ) check(kObjectRefused);
    }

    // A value of one of `types`: one alternative per type, a union when several.
    int32_t typed(const ojson& s, unsigned types, const std::string& where, int depth) {
        std::vector<int32_t> alts;
        if (types & T_NULL) alts.push_back(lit({"null"}, where));
        if (types & T_BOOL) alts.push_back(lit({"true", "false"}, where));
        if (types & (T_INT | T_NUM)) {
            Node n;
            n.kind = Kind::Num;
            n.where = where;
            n.integer = !(types & T_NUM);
            alts.push_back(add(std::move(n)));
        }
        if (types & T_STR) {
            Node n;
            n.kind = Kind::Str;
            n.where = where;
            n.min_len = count(s, "minLength", 0, where);
            n.max_len = count(s, "maxLength", std::max(n.min_len, lim_.max_string_chars), where);
            if (n.max_len < n.min_len) refuse(where, "maxLength is below minLength");
            alts.push_back(add(std::move(n)));
        }
        if (types & T_ARR) alts.push_back(array(s, where, depth));
        if (types & T_OBJ) alts.push_back(object(s, where, depth));
        if (alts.size() == 1) return alts[0];
        Node u;
        u.kind = Kind::Union;
        u.where = where;
        u.alts = std::move(alts);
        return add(std::move(u));
    }

    // Any JSON value: one shared node.
    int32_t any() {
        if (any_ >= 0) return any_;
        auto node = [](Kind k) {
            Node n;
            n.kind = k;
            n.where = "any value";
            return n;
        };
        any_ = add(node(Kind::Union));  // first: the containers below refer to it
        Node map = node(Kind::Map), arr = node(Kind::Arr), str = node(Kind::Str);
        map.key = key_string();
        map.value = arr.item = any_;
        map.max_members = lim_.max_object_members;
        arr.max_items = lim_.max_array_items;
        str.max_len = lim_.max_string_chars;
        const int32_t m = add(std::move(map)), a = add(std::move(arr)), s = add(std::move(str));
        const int32_t n = add(node(Kind::Num));
        const int32_t l = lit({"true", "false", "null"}, "any value");
        g_.nodes[size_t(any_)].alts = {m, a, s, n, l};
        return any_;
    }

    int32_t add(Node n) {
        g_.nodes.push_back(std::move(n));
        return int32_t(g_.nodes.size() - 1);
    }

  private:
    int32_t key_string() {
        if (key_ >= 0) return key_;
        Node s;
        s.kind = Kind::Str;
        s.where = "object key";
        s.max_len = lim_.max_string_chars;
        key_ = add(std::move(s));
        return key_;
    }

    int32_t lit(std::vector<std::string> values, const std::string& where) {
        Node n;
        n.kind = Kind::Lit;
        n.where = where;
        n.lits = std::move(values);
        return add(std::move(n));
    }

    int32_t count(const ojson& s, const char* kw, int32_t dflt, const std::string& where) {
        if (!s.contains(kw)) return dflt;
        const auto& v = s[kw];
        if (!v.is_number_integer() && !v.is_number_unsigned() &&
            !(v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))))
            refuse(where, std::string("'") + kw + "' must be a non-negative integer");
        const double d = v.get<double>();
        if (d < 0) refuse(where, std::string("'") + kw + "' must be a non-negative integer");
        return int32_t(std::min(d, 1e6));  // beyond any budget anyway
    }

    template <class Others>
    int32_t literals(const ojson& s, unsigned types, const std::string& where, Others& others) {
        const std::string o = others({"enum", "const", "type"});
        if (!o.empty()) refuse(where, "'" + o + "' next to 'enum' / 'const' is not supported");
        std::vector<ojson> values;
        if (s.contains("enum")) {
            if (!s["enum"].is_array() || s["enum"].empty())
                refuse(where, "'enum' must be a non-empty array");
            for (const auto& v : s["enum"]) values.push_back(v);
        }
        if (s.contains("const")) {
            if (s.contains("enum")) {
                std::vector<ojson> both;
                for (const auto& v : values)
                    if (v == s["const"]) both.push_back(v);
                values = std::move(both);
            } else {
                values.push_back(s["const"]);
            }
        }
        // (A set for the duplicates: an enum of many values costs time linear in them.)
        std::vector<std::string> lits;
        std::unordered_set<std::string> seen;
        for (const auto& v : values) {
            if (!(value_types(v) & types)) continue;
            std::string d = v.dump();
            if (seen.insert(d).second) lits.push_back(std::move(d));
        }
        if (lits.empty()) refuse(where, "no 'enum' / 'const' value has the schema's type");
        return lit(std::move(lits), where);
    }

    int32_t array(const ojson& s, const std::string& where, int depth) {
        Node n;
        n.kind = Kind::Arr;
        n.where = where;
        if (s.contains("items")) {
            if (s["items"].is_array())
                refuse(where, "'items' as an array (tuple validation) is not supported");
            n.item = compile(s["items"], where + "/items", depth + 1);
        } else {
            n.item = any();
        }
        n.min_items = count(s, "minItems", 0, where);
        n.max_items = count(s, "maxItems", std::max(n.min_items, lim_.max_array_items), where);
        if (n.max_items < n.min_items) refuse(where, "maxItems is below minItems");
        return add(std::move(n));
    }

    int32_t object(const ojson& s, const std::string& where, int depth) {
        const bool has_props = s.contains("properties");
        if (has_props && !s["properties"].is_object())
            refuse(where, "'properties' must be an object");
        std::vector<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) refuse(where, "'required' must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) refuse(where, "'required' must list property names");
                required.push_back(r.get<std::string>());
            }
        }
        const int32_t min_props = count(s, "minProperties", 0, where);
        const int32_t max_props = count(s, "maxProperties", 1 << 30, where);

        if (!has_props && required.empty() &&
            !(s.contains("additionalProperties") && s["additionalProperties"] == false)) {
            // An open map: string keys, values of additionalProperties.
            if (min_props > 0) refuse(where, "'minProperties' is not supported here");
            if (s.contains("unevaluatedProperties") && s["unevaluatedProperties"] != true)
                refuse(where, "keyword 'unevaluatedProperties' is not supported");
            Node n;
            n.kind = Kind::Map;
            n.where = where;
            n.key = key_string();
            n.max_members = std::min(lim_.max_object_members, max_props);
            const int32_t value =
                s.contains("additionalProperties")
                    ? compile(s["additionalProperties"], where + "/additionalProperties", depth + 1)
                    : any();
            n.value = value;
            return add(std::move(n));
        }

        Node n;
        n.kind = Kind::Obj;
        n.where = where;
        std::set<std::string> req(required.begin(), required.end());
        if (has_props) {
            for (const auto& [name, sub] : s["properties"].items()) {
                Prop p;
                p.name = name;
                p.key = ojson(name).dump();
                p.required = req.count(name) > 0;
                p.value = compile(sub, where + "/properties/" + name, depth + 1);
                n.props.push_back(std::move(p));
            }
        }
        for (const auto& r : required) {  // required but not declared: any value
            bool found = false;
            for (const auto& p : n.props) found = found || p.name == r;
            if (found) continue;
            Prop p;
            p.name = r;
            p.key = ojson(r).dump();
            p.required = true;
            p.value = any();
            n.props.push_back(std::move(p));
        }
        if (min_props > int32_t(req.size()))
            refuse(where,
                   "'minProperties' above the number of required properties is not "
                   "supported");
        if (max_props < int32_t(n.props.size()))
            refuse(where, "'maxProperties' below the number of properties is not supported");
        return add(std::move(n));
    }

    int32_t ref(const std::string& r, const std::string& where, int depth) {
        if (r.empty() || r[0] != '#')
            refuse(where, "only local '$ref' (\"#/...\") is supported, not \"" + r + "\"");
        if (auto it = refs_.find(r); it != refs_.end()) return it->second;
        Node n;
        n.kind = Kind::Ref;
        n.where = r;
        const int32_t id = add(std::move(n));
        refs_[r] = id;
        const std::string ptr = r.substr(1);
        const ojson* target = &root_;
        if (!ptr.empty()) {
            if (ptr[0] != '/') refuse(where, "'$ref' anchors are not supported: \"" + r + "\"");
            try {
                target = &root_.at(ojson::json_pointer(ptr));
            } catch (const std::exception&) {
                refuse(where, "'$ref' target \"" + r + "\" does not exist");
            }
        }
        const int32_t t = compile(*target, r, depth + 1);
        g_.nodes[size_t(id)].target = t;
        return id;
    }

    const ojson& root_;
    const GrammarLimits& lim_;
    Grammar& g_;
    std::map<std::string, int32_t> refs_;
    int32_t any_ = -1;
    int32_t key_ = -1;
};

// check_json_schema: the schemas reachable from the root, each with what decides
// whether it has a finite instance, then a least fixed point over them.
class SchemaCheck {
  public:
    explicit SchemaCheck(const ojson& root) : root_(root) {}

    void run() {
        const int32_t r = node(root_, "#", 0);
        // A $ref that leads only to other $refs back to itself has no schema at all, wherever
        // it stands (an optional member's included): refused as the malformed schema it is.
        for (size_t i = 0; i < nodes_.size(); ++i) {
            std::set<int32_t> chain;
            for (int32_t x = int32_t(i); x >= 0 && nodes_[size_t(x)].ref_only >= 0;
                 x = nodes_[size_t(x)].ref_only)
                if (!chain.insert(x).second)
                    refuse(nodes_[i].where,
                           "no finite value satisfies it: its '$ref' leads only to other "
                           "'$ref's and back (a cycle with no schema in it)");
        }
        // Kleene iteration from "no schema has an instance": what stays false has no
        // finite instance (a required recursion, a $ref cycle without content).
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t i = 0; i < nodes_.size(); ++i)
                if (!sat_[i] && satisfiable(nodes_[i])) sat_[i] = changed = true;
        }
        // (A part with no instance is fine where the whole does not need it: an
        // alternative, an optional member.)
        if (!sat_[size_t(r)])
            refuse("#",
                   "no finite value satisfies the schema (a required member or a '$ref' that "
                   "recurses with no way out, or a part that accepts nothing)");
    }

  private:
    struct Node {
        std::string where;
        bool never = false;           // the schema false, or an empty enum
        unsigned types = T_ALL;       // what it may be
        std::vector<int32_t> all;     // every one must have an instance ($ref, allOf)
        std::vector<int32_t> any;     // one must (anyOf / oneOf); empty: none asked
        int32_t items = -1;           // arrays with minItems > 0
        std::vector<int32_t> req;     // members an object must have
        bool req_impossible = false;  // a required member additionalProperties forbids
        int32_t ref_only = -1;        // the $ref target of a schema that is nothing else
    };

    int32_t node(const ojson& s, const std::string& where, int depth) {
        if (auto it = ids_.find(&s); it != ids_.end()) return it->second;
        if (depth > 256) refuse(where, "schema nested too deeply");
        const int32_t id = int32_t(nodes_.size());
        ids_[&s] = id;
        nodes_.push_back({});
        sat_.push_back(false);
        Node n;
        n.where = where;
        if (s.is_boolean()) {
            n.never = !s.get<bool>();
        } else {
            if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
            combinators(s, where, depth, n);
            kinds(s, where, n);
            members(s, where, depth, n);
        }
        nodes_[size_t(id)] = std::move(n);
        return id;
    }

    // $ref, allOf, anyOf, oneOf (and the subschemas checked for their own validity only).
    void combinators(const ojson& s, const std::string& where, int depth, Node& n) {
        auto sub = [&](const ojson& x, const std::string& at) { return node(x, at, depth + 1); };
        if (s.contains("$ref")) {
            if (!s["$ref"].is_string()) refuse(where, "'$ref' must be a string");
            n.all.push_back(sub(resolve(s["$ref"].get<std::string>(), where), where + "/$ref"));
            // A schema that is its $ref and annotations only.
            bool only = true;
            for (const auto& [k, v] : s.items())
                only = only && (k == "$ref" || k == "description" || k == "title" ||
                                k == "$comment" || k == "default" || k == "examples");
            if (only) n.ref_only = n.all.back();
        }
        for (const char* kw : {"allOf", "anyOf", "oneOf"}) {
            if (!s.contains(kw)) continue;
            const ojson& alts = s[kw];
            if (!alts.is_array() || alts.empty())
                refuse(where, std::string("'") + kw + "' must be a non-empty array of schemas");
            std::vector<int32_t> ids;
            for (size_t i = 0; i < alts.size(); ++i)
                ids.push_back(sub(alts[i], where + "/" + kw + "/" + std::to_string(i)));
            if (std::string(kw) == "allOf") {
                n.all.insert(n.all.end(), ids.begin(), ids.end());
            } else if (n.any.empty()) {
                n.any = std::move(ids);
            } else {  // anyOf and oneOf together: one of each
                const int32_t both = int32_t(nodes_.size());
                nodes_.push_back({});
                sat_.push_back(false);
                nodes_[size_t(both)].where = where;
                nodes_[size_t(both)].any = std::move(ids);
                n.all.push_back(both);
            }
        }
        // Subschemas that restrict nothing the grammar holds the output to: checked
        // for their own validity only.
        for (const char* kw : {"not", "if", "then", "else", "contains", "propertyNames"})
            if (s.contains(kw)) (void)sub(s[kw], where + "/" + kw);
    }

    // The types a schema allows, narrowed by its enum or const.
    void kinds(const ojson& s, const std::string& where, Node& n) {
        if (s.contains("type")) {
            const auto& t = s["type"];
            if (t.is_string()) {
                n.types = type_bit(t.get<std::string>(), where);
            } else if (t.is_array() && !t.empty()) {
                n.types = 0;
                for (const auto& x : t) {
                    if (!x.is_string()) refuse(where, "'type' must name types");
                    n.types |= type_bit(x.get<std::string>(), where);
                }
            } else {
                refuse(where, "'type' must be a string or a non-empty array");
            }
        } else if (s.contains("properties") || s.contains("required") ||
                   s.contains("additionalProperties")) {
            n.types = T_OBJ;
        } else if (s.contains("items") || s.contains("minItems")) {
            n.types = T_ARR;
        }
        if (s.contains("enum")) {
            if (!s["enum"].is_array()) refuse(where, "'enum' must be an array");
            unsigned vt = 0;
            for (const auto& v : s["enum"]) vt |= value_types(v);
            n.types &= vt;
            if (n.types == 0) n.never = true;
        }
        if (s.contains("const")) {
            n.types &= value_types(s["const"]);
            if (n.types == 0) n.never = true;
        }
    }

    // Array items, object members (properties, required, additionalProperties), $defs.
    void members(const ojson& s, const std::string& where, int depth, Node& n) {
        auto sub = [&](const ojson& x, const std::string& at) { return node(x, at, depth + 1); };
        if (s.contains("items")) {
            const ojson& it = s["items"];
            if (it.is_array()) {
                for (size_t i = 0; i < it.size(); ++i)
                    (void)sub(it[i], where + "/items/" + std::to_string(i));
            } else {
                const int32_t item = sub(it, where + "/items");
                const ojson* mi = s.contains("minItems") ? &s["minItems"] : nullptr;
                if (mi && mi->is_number() && mi->get<double>() >= 1) n.items = item;
            }
        }
        std::set<std::string> declared;
        if (s.contains("properties")) {
            if (!s["properties"].is_object()) refuse(where, "'properties' must be an object");
            for (const auto& [name, p] : s["properties"].items()) declared.insert(name);
        }
        int32_t additional = -1;
        bool additional_false = false;
        if (s.contains("additionalProperties")) {
            const ojson& ap = s["additionalProperties"];
            if (ap.is_boolean())
                additional_false = !ap.get<bool>();
            else
                additional = sub(ap, where + "/additionalProperties");
        }
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) refuse(where, "'required' must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) refuse(where, "'required' must list property names");
                required.insert(r.get<std::string>());
            }
        }
        if (s.contains("properties"))
            for (const auto& [name, p] : s["properties"].items()) {
                const int32_t pid = sub(p, where + "/properties/" + name);
                if (required.count(name)) n.req.push_back(pid);
            }
        for (const auto& r : required) {
            if (declared.count(r)) continue;
            if (additional_false) n.req_impossible = true;
            if (additional >= 0) n.req.push_back(additional);
        }
        for (const char* defs : {"$defs", "definitions"})
            if (s.contains(defs) && !s[defs].is_object())
                refuse(where, std::string("'") + defs + "' must be an object");
    }

    const ojson& resolve(const std::string& r, const std::string& where) {
        if (r.empty() || r[0] != '#')
            refuse(where, "only local '$ref' (\"#/...\") is allowed, not \"" + r + "\"");
        const std::string ptr = r.substr(1);
        if (ptr.empty()) return root_;
        if (ptr[0] != '/') refuse(where, "'$ref' anchors are not supported: \"" + r + "\"");
        try {
            return root_.at(ojson::json_pointer(ptr));
        } catch (const std::exception&) {
            refuse(where, "'$ref' target \"" + r + "\" does not exist");
        }
    }

    bool satisfiable(const Node& n) const {
        if (n.never) return false;
        for (int32_t a : n.all)
            if (!sat_[size_t(a)]) return false;
        if (!n.any.empty()) {
            bool one = false;
            for (int32_t a : n.any) one = one || sat_[size_t(a)];
            if (!one) return false;
        }
        // One of its types has an instance.
        if (n.types & (T_NULL | T_BOOL | T_INT | T_NUM | T_STR)) return true;
        if ((n.types & T_ARR) && (n.items < 0 || sat_[size_t(n.items)])) return true;
        if (n.types & T_OBJ) {
            bool all = !n.req_impossible;
            for (int32_t r : n.req) all = all && sat_[size_t(r)];
            if (all) return true;
        }
        return false;
    }

    const ojson& root_;
    std::vector<Node> nodes_;
    std::vector<bool> sat_;
    std::map<const ojson*, int32_t> ids_;
};

void check_limits(const GrammarLimits& L) {
    if (L.max_string_chars < 0 || L.max_array_items < 0 || L.max_object_members < 0 ||
        L.max_int_digits < 1 || L.max_frac_digits < 1 || L.max_exp_digits < 1 || L.max_depth < 0)
        throw Error("json constraint: invalid limits");
}

// OpenAI's {"name", "schema", "strict"} wrapper, or a bare schema.
const ojson& unwrap(const ojson& s) {
    if (s.is_object() && s.contains("schema") && !s.contains("type") && !s.contains("properties") &&
        (s["schema"].is_object() || s["schema"].is_boolean()))
        return s["schema"];
    return s;
}

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(const ojson& schema, const GrammarLimits& lim) {
    check_limits(lim);
    const ojson& s = unwrap(schema);
    auto g = std::make_shared<Grammar>();
    g->lim = lim;
    Compiler c(s, lim, *g);
    g->root = c.compile(s, "#", 0);
    link_grammar(*g);
    return g;
}

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema,
                                                   const GrammarLimits& lim) {
    return compile_json_schema(ojson::parse(schema.dump()), lim);
}

void check_json_schema(const ojson& schema) {
    SchemaCheck(unwrap(schema)).run();
}

std::shared_ptr<const Grammar> json_object_grammar(const GrammarLimits& lim) {
    return compile_json_schema(ojson{{"type", "object"}}, lim);
}

JsonVocab::JsonVocab(const text::Tokenizer& tok, std::vector<int32_t> stop_ids)
    : TokenVocab(tok, [&] {
          VocabOptions o;
          o.stop_ids = std::move(stop_ids);
          o.json_bytes = true;
          return o;
      }()) {}

std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const Grammar> g,
                                                      std::shared_ptr<const TokenVocab> v,
                                                      bool after_think) {
    return std::make_unique<GrammarConstraint>(std::move(g), std::move(v), after_think);
}

}  // namespace glm5::runtime
