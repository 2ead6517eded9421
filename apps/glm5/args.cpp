#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace glm5::app {

Args::Args(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

Args& Args::flag(const std::string& name, const std::string& help, bool dflt) {
    Spec s;
    s.name = name;
    s.help = help;
    s.is_flag = true;
    s.dflt = dflt ? "true" : "false";
    specs_.push_back(s);
    values_[name] = s.dflt;
    return *this;
}

Args& Args::option(const std::string& name, const std::string& value_name, const std::string& dflt,
                   const std::string& help, const std::string& short_name) {
    Spec s;
    s.name = name;
    s.short_name = short_name;
    s.value_name = value_name;
    s.dflt = dflt;
    s.help = help;
    specs_.push_back(s);
    values_[name] = dflt;
    return *this;
}

Args& Args::alias(const std::string& name, const std::string& token) {
    for (auto& s : specs_)
        if (s.name == name) {
            s.aliases.push_back(token);
            return *this;
        }
    throw std::logic_error("alias of undeclared flag " + name);
}

Args& Args::ignored(const std::string& token, bool takes_value, const std::string& why) {
    compat_.push_back({token, why, takes_value, false});
    return *this;
}

Args& Args::refused(const std::string& token, const std::string& why) {
    compat_.push_back({token, why, false, true});
    return *this;
}

Args& Args::positional(const std::string& name, const std::string& help, bool required) {
    Spec s;
    s.name = name;
    s.help = help;
    s.is_flag = required;  // reused: required positional
    positionals_.push_back(s);
    return *this;
}

const Args::Spec* Args::find(const std::string& token) const {
    for (const auto& s : specs_) {
        if (token == "--" + s.name) return &s;
        if (!s.short_name.empty() && token == s.short_name) return &s;
        if (s.is_flag && s.dflt == "true" && token == "--no-" + s.name) return &s;
        for (const auto& a : s.aliases)
            if (token == a) return &s;
    }
    return nullptr;
}

bool Args::parse(int argc, char** argv, int first) {
    size_t npos = 0;
    for (int i = first; i < argc; ++i) {
        std::string tok = argv[i];
        if (tok == "--help" || tok == "-h") {
            std::fputs(help().c_str(), stdout);
            return false;
        }
        if (tok.size() > 1 && tok[0] == '-' &&
            !(tok.size() > 1 && (std::isdigit((unsigned char)tok[1]) || tok[1] == '.'))) {
            std::string value;
            bool has_inline = false;
            if (auto eq = tok.find('='); eq != std::string::npos && tok.rfind("--", 0) == 0) {
                value = tok.substr(eq + 1);
                tok = tok.substr(0, eq);
                has_inline = true;
            }
            const Spec* s = find(tok);
            if (!s) {
                const Compat* c = nullptr;
                for (const auto& x : compat_)
                    if (x.token == tok) c = &x;
                if (!c) throw UsageError("unknown flag '" + tok + "' for '" + command_ + "'");
                if (c->refuse) throw UsageError(tok + ": " + c->why);
                if (c->takes_value && !has_inline) {
                    if (i + 1 >= argc) throw UsageError("flag " + tok + " needs a value");
                    ++i;
                }
                std::fprintf(stderr, "glm5: %s means nothing here: %s\n", tok.c_str(),
                             c->why.c_str());
                continue;
            }
            if (s->is_flag) {
                if (has_inline) throw UsageError("flag --" + s->name + " takes no value");
                values_[s->name] = (tok == "--no-" + s->name) ? "false" : "true";
            } else {
                if (!has_inline) {
                    if (i + 1 >= argc)
                        throw UsageError("flag --" + s->name + " needs a value (" + s->value_name +
                                         ")");
                    value = argv[++i];
                }
                values_[s->name] = value;
                all_values_[s->name].push_back(value);
            }
            given_[s->name] = true;
            continue;
        }
        if (npos >= positionals_.size())
            throw UsageError("unexpected argument '" + tok + "' for '" + command_ + "'");
        pos_values_[positionals_[npos++].name] = tok;
    }
    for (size_t k = npos; k < positionals_.size(); ++k)
        if (positionals_[k].is_flag)
            throw UsageError("missing " + positionals_[k].name + " for '" + command_ + "'");
    return true;
}

bool Args::is_set(const std::string& name) const {
    return given_.count(name) > 0;
}

bool Args::get_flag(const std::string& name) const {
    return get(name) == "true";
}

const std::string& Args::get(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw std::logic_error("undeclared flag " + name);
    return it->second;
}

std::vector<std::string> Args::get_all(const std::string& name) const {
    get(name);  // declared?
    auto it = all_values_.find(name);
    return it == all_values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t min, int64_t max) const {
    const std::string& v = get(name);
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE)
        throw UsageError("--" + name + " expects an integer, got '" + v + "'");
    if (x < min || x > max)
        throw UsageError("--" + name + " must be in [" + std::to_string(min) + ", " +
                         std::to_string(max) + "], got " + v);
    return x;
}

double Args::get_double(const std::string& name, double min, double max) const {
    const std::string& v = get(name);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x))
        throw UsageError("--" + name + " expects a number, got '" + v + "'");
    if (x < min || x > max) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "--%s must be in [%g, %g], got %s", name.c_str(), min, max,
                      v.c_str());
        throw UsageError(buf);
    }
    return x;
}

const std::string& Args::positional_value(const std::string& name) const {
    static const std::string empty;
    auto it = pos_values_.find(name);
    return it == pos_values_.end() ? empty : it->second;
}

bool Args::has_positional(const std::string& name) const {
    return pos_values_.count(name) > 0;
}

std::string Args::help() const {
    std::string h = "usage: glm5 " + command_;
    for (const auto& p : positionals_) h += p.is_flag ? " " + p.name : " [" + p.name + "]";
    h += " [flags]\n\n" + summary_ + "\n";
    if (!positionals_.empty()) {
        h += "\narguments:\n";
        for (const auto& p : positionals_)
            h += "  " + p.name + std::string(p.name.size() < 26 ? 26 - p.name.size() : 1, ' ') +
                 p.help + "\n";
    }
    h += "\nflags:\n";
    for (const auto& s : specs_) {
        std::string left = "  ";
        if (!s.short_name.empty()) left += s.short_name + ", ";
        left += "--" + s.name;
        for (const auto& a : s.aliases) left += ", " + a;
        if (!s.is_flag) left += " " + s.value_name;
        std::string pad(left.size() < 28 ? 28 - left.size() : 1, ' ');
        std::string dflt;
        if (s.is_flag)
            dflt = s.dflt == "true" ? " (default: on; --no-" + s.name + " turns it off)"
                                    : " (default: off)";
        else
            dflt = " (default: " + (s.dflt.empty() ? std::string("none") : s.dflt) + ")";
        h += left + pad + s.help + dflt + "\n";
    }
    h += "  -h, --help                  show this help\n";
    if (!compat_.empty()) {
        h += "\nllama.cpp flags accepted and ignored (or refused), with why:\n";
        for (const auto& c : compat_)
            h += "  " + c.token + (c.takes_value ? " VALUE" : "") + ": " +
                 (c.refuse ? "refused: " : "") + c.why + "\n";
    }
    return h;
}

}  // namespace glm5::app
