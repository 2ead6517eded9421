// glm5: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "quant/ops.h"

namespace {

struct Command {
    const char* name;
    const char* summary;
    int (*fn)(int argc, char** argv);
};

const Command kCommands[] = {
#define GLM5_COMMAND(name, fn, summary) {name, summary, glm5::app::fn},
#include "command_list.inc"
#undef GLM5_COMMAND
};

void usage(FILE* f) {
    std::fprintf(
        f, "usage: glm5 <command> [flags]   (glm5 <command> --help for its flags)\n\ncommands:\n");
    for (const auto& c : kCommands) std::fprintf(f, "  %-12s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    std::string cmd = argv[1];
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
        usage(stdout);
        return 0;
    }
    try {
        // GLM5_CPU (a forced kernel level) is checked before any work starts.
        glm5::quant::cpu_level();
    } catch (const glm5::Error& e) {
        std::fprintf(stderr, "glm5: %s\n", e.what());
        return 2;
    }
    for (const auto& c : kCommands) {
        if (cmd != c.name) continue;
        try {
            return c.fn(argc, argv);
        } catch (const glm5::app::UsageError& e) {
            std::fprintf(stderr, "glm5 %s: %s (see glm5 %s --help)\n", c.name, e.what(), c.name);
            return 2;
        } catch (const glm5::Error& e) {
            std::fprintf(stderr, "glm5 %s: error: %s\n", c.name, e.what());
            return 2;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "glm5 %s: internal error: %s\n", c.name, e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "glm5: unknown command '%s' (glm5 --help lists the commands)\n",
                 cmd.c_str());
    return 2;
}
