// Command-line flags for the glm5 subcommands. Every flag is declared with a
// default and help text, so --help lists them all and anything unknown or
// malformed is refused (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace glm5::app {

class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class Args {
  public:
    Args(std::string command, std::string summary);

    // A boolean switch: --name (and --no-name when dflt is true).
    Args& flag(const std::string& name, const std::string& help, bool dflt = false);
    // A valued option: --name VALUE (also --name=VALUE). Short aliases like "-n" allowed.
    Args& option(const std::string& name, const std::string& value_name, const std::string& dflt,
                 const std::string& help, const std::string& short_name = "");
    // Another spelling of a declared flag or option ("--temperature" for --temp,
    // llama.cpp's "-sys" for --system).
    Args& alias(const std::string& name, const std::string& token);
    // A llama.cpp flag that means nothing here: accepted (with a value when
    // takes_value), and `why` said once on stderr when it is given.
    Args& ignored(const std::string& token, bool takes_value, const std::string& why);
    // A llama.cpp flag this program refuses: given, it is a UsageError saying `why`.
    Args& refused(const std::string& token, const std::string& why);
    // Positional arguments, in order.
    Args& positional(const std::string& name, const std::string& help, bool required = true);

    // Throws UsageError. Returns false when --help was asked (help already printed to stdout).
    bool parse(int argc, char** argv, int first);

    bool is_set(const std::string& name) const;  // given on the command line
    bool declared(const std::string& name) const { return values_.count(name) > 0; }
    bool get_flag(const std::string& name) const;
    const std::string& get(const std::string& name) const;
    // Every value a valued option was given, in order (--image A --image B).
    std::vector<std::string> get_all(const std::string& name) const;
    int64_t get_int(const std::string& name, int64_t min, int64_t max) const;
    double get_double(const std::string& name, double min, double max) const;
    const std::string& positional_value(const std::string& name) const;
    bool has_positional(const std::string& name) const;

    std::string help() const;

  private:
    struct Spec {
        std::string name, short_name, value_name, dflt, help;
        bool is_flag = false;
        std::vector<std::string> aliases;
    };
    struct Compat {
        std::string token, why;
        bool takes_value = false, refuse = false;
    };
    const Spec* find(const std::string& token) const;

    std::string command_, summary_;
    std::vector<Spec> specs_;
    std::vector<Spec> positionals_;
    std::vector<Compat> compat_;
    std::map<std::string, std::string> values_;
    std::map<std::string, bool> given_;
    std::map<std::string, std::vector<std::string>> all_values_;
    std::map<std::string, std::string> pos_values_;
};

}  // namespace glm5::app
