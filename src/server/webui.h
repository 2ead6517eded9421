// The chat page glm5 serve opens at / (src/server/webui/: one HTML file, its script and
// its style), compiled into the binary: no build step, nothing fetched at run time;
// webui.cpp also serves them (Server::page).
#pragma once

#include <string_view>

namespace glm5::server::webui {

struct Asset {
    std::string_view path;  // "/", "/webui.js", "/webui.css"
    std::string_view content_type;
    std::string_view bytes;
};

// The page's files; null when `path` is none of them.
const Asset* find(std::string_view path);

// What the page may load and run: its own script and style, connections to this
// server, images from data: and blob: URLs (attachments); no inline script or event
// handler, no frames, no other origin.
constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data: blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

}  // namespace glm5::server::webui
