#include "default_model.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

// The model file's bytes, placed in .rodata by the assembler. CMake passes the
// path and its SHA-256 (the hash also makes ccache see a new model as a new
// object: .incbin is invisible to the preprocessor).
#ifndef GLM5_DEFAULT_MODEL
#error "GLM5_DEFAULT_MODEL (the path of models/kjv-mini.gguf) must be defined"
#endif
asm(".section .rodata\n"
    ".balign 64\n"
    "glm5_default_model_begin:\n"
    ".incbin \"" GLM5_DEFAULT_MODEL
    "\"\n"
    "glm5_default_model_end:\n"
    ".previous\n");
extern "C" const unsigned char glm5_default_model_begin[];
extern "C" const unsigned char glm5_default_model_end[];

namespace glm5::app {

namespace {

std::string_view embedded() {
    return {reinterpret_cast<const char*>(glm5_default_model_begin),
            size_t(glm5_default_model_end - glm5_default_model_begin)};
}

// Whether `path` holds exactly the embedded bytes.
bool same_bytes(const std::string& path, std::string_view want) {
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) != want.size() || ec) return false;
    std::ifstream f(path, std::ios::binary);
    std::string have((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return have.size() == want.size() && std::memcmp(have.data(), want.data(), want.size()) == 0;
}

}  // namespace

std::string cache_dir() {
    if (const char* c = std::getenv("GLM5_CACHE"); c && *c) return c;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/glm5";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/glm5";
    return ".glm5-cache";
}

std::string ensure_default_model() {
    const std::string dir = cache_dir();
    // The name carries the model's hash: a newer binary never reads an older model.
    const std::string path =
        dir + "/kjv-mini-" + std::string(GLM5_DEFAULT_MODEL_SHA256, 12) + ".gguf";
    const std::string_view bytes = embedded();
    // A cached copy is checked byte for byte (12 MB, a few ms), so a truncated or
    // edited file is replaced rather than loaded.
    if (same_bytes(path, bytes)) return path;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create the cache folder " + dir + ": " + ec.message());
    log_info(
        "glm5: no --model given; writing the embedded default model (%.1f MB, glm-dsa "
        "trained on the King James Bible) to %s\n",
        double(bytes.size()) / 1e6, path.c_str());
    // Written to a temporary name and renamed, so a concurrent run never sees half a file.
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f.write(bytes.data(), std::streamsize(bytes.size()));
        if (!f) throw Error("cannot write the default model to " + tmp);
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec)
        throw Error("cannot move the default model into place at " + path + ": " + ec.message());
    return path;
}

}  // namespace glm5::app
