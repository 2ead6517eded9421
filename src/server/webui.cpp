#include "server/webui.h"

#include <httplib.h>

#include <array>
#include <string>

#include "server/server.h"

// The page's bytes, placed in .rodata by the assembler (CMake passes the folder; the
// files are the object's dependencies, so an edited page rebuilds it).
#ifndef GLM5_WEBUI_DIR
#error "GLM5_WEBUI_DIR (src/server/webui) must be defined"
#endif
#define GLM5_EMBED(name, file)                            \
    asm(".section .rodata\n"                              \
        ".balign 16\n" #name                              \
        "_begin:\n"                                       \
        ".incbin \"" GLM5_WEBUI_DIR "/" file "\"\n" #name \
        "_end:\n"                                         \
        ".previous\n");                                   \
    extern "C" const char name##_begin[];                 \
    extern "C" const char name##_end[];
GLM5_EMBED(glm5_webui_html, "index.html")
GLM5_EMBED(glm5_webui_js, "webui.js")
GLM5_EMBED(glm5_webui_css, "webui.css")

namespace glm5::server::webui {

namespace {

std::string_view bytes(const char* b, const char* e) {
    return {b, size_t(e - b)};
}

}  // namespace

const Asset* find(std::string_view path) {
    static const std::array<Asset, 4> assets = {{
        {"/", "text/html; charset=utf-8", bytes(glm5_webui_html_begin, glm5_webui_html_end)},
        {"/index.html", "text/html; charset=utf-8",
         bytes(glm5_webui_html_begin, glm5_webui_html_end)},
        {"/webui.js", "text/javascript; charset=utf-8",
         bytes(glm5_webui_js_begin, glm5_webui_js_end)},
        {"/webui.css", "text/css; charset=utf-8", bytes(glm5_webui_css_begin, glm5_webui_css_end)},
    }};
    for (const Asset& a : assets)
        if (a.path == path) return &a;
    return nullptr;
}

}  // namespace glm5::server::webui

namespace glm5::server {

// GET /, /index.html, /webui.js, /webui.css. The page itself is public: what it asks of
// the API needs the key.
void Server::page(const httplib::Request& req, httplib::Response& res) {
    const webui::Asset* a = webui::find(req.path);
    res.set_header("Content-Security-Policy", std::string(webui::kContentSecurityPolicy));
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(a->bytes.data(), a->bytes.size(), std::string(a->content_type));
}

}  // namespace glm5::server
