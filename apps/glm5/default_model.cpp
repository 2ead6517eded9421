#include "default_model.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "gen/generator.h"

namespace glm5::app {

std::string cache_dir() {
    if (const char* c = std::getenv("GLM5_CACHE"); c && *c) return c;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/glm5";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/glm5";
    return ".glm5-cache";
}

std::string ensure_default_model() {
    const std::string dir = cache_dir();
    const std::string path = dir + "/tiny.gguf";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return path;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create the cache folder " + dir + ": " + ec.message());
    log_info(
        "glm5: no --model given and no cached default model; generating the tiny synthetic model "
        "into %s\n",
        path.c_str());
    gen::GenOptions o;  // tiny glm-dsa, F32
    gen::generate(o, path);
    return path;
}

}  // namespace glm5::app
