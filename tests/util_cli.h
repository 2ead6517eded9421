// Test helper: run the glm5 binary (or any command) and capture stdout,
// stderr and the exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace glm5::test {

struct CliResult {
    int code = -1;
    std::string out, err;
};

// Runs `cmd` through the shell; `env` is prepended (e.g. "GLM5_CACHE=/tmp/x").
inline CliResult run_shell(const std::string& cmd, const std::string& input = "",
                           const std::string& env = "") {
    char errt[] = "/tmp/glm5-test-err-XXXXXX";
    char int_[] = "/tmp/glm5-test-in-XXXXXX";
    const int efd = mkstemp(errt);
    const int ifd = mkstemp(int_);
    if (efd < 0 || ifd < 0) return {};
    if (!input.empty() && ::write(ifd, input.data(), input.size()) != ssize_t(input.size()))
        return {};
    ::close(efd);
    ::close(ifd);
    const std::string full = (env.empty() ? "" : env + " ") + cmd + " <" + int_ + " 2>" + errt;
    CliResult r;
    FILE* p = ::popen(full.c_str(), "r");
    if (!p) return r;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    const int st = ::pclose(p);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    std::ifstream ef(errt);
    std::stringstream ss;
    ss << ef.rdbuf();
    r.err = ss.str();
    std::remove(errt);
    std::remove(int_);
    return r;
}

// The glm5 binary: GLM5_BINARY in the environment when set (a test binary that runs away
// from this checkout: scripts/device-check.sh carries glm5 beside its GPU tests), else the
// one built beside the tests.
inline std::string glm5_binary() {
    const char* b = std::getenv("GLM5_BINARY");
    return b && *b ? b : GLM5_BINARY;
}

// Runs the glm5 binary with `args`.
inline CliResult run_glm5(const std::string& args, const std::string& input = "",
                          const std::string& env = "") {
    return run_shell(glm5_binary() + " " + args, input, env);
}

}  // namespace glm5::test
