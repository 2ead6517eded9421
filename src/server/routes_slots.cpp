// llama-server's slot actions, POST /slots/{id}?action=save|restore|erase: the sequence
// a slot's last request left, to and from a file in --slot-save-path.
#include <httplib.h>

#include <charconv>

#include "core/error.h"
#include "server/exchange.h"
#include "text/unicode.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;

// The body's "filename": a plain file name, nothing that leaves the folder or hides in it.
std::string slot_file_name(const ojson& b) {
    const auto f = b.find("filename");
    if (f == b.end() || !f->is_string())
        throw bad_request("'filename' must be a string", "filename", "invalid_type");
    const std::string name = f->get<std::string>();
    bool ok = !name.empty() && name.size() <= 255 && name[0] != '.' && text::is_valid_utf8(name) &&
              printable(name) == name;
    for (unsigned char c : name) ok = ok && c >= 0x20 && c != '/' && c != '\\' && c != 0x7f;
    if (!ok)
        throw bad_request(
            "'filename' must be a plain file name (no '/', '\\', leading "
            "'.', control or direction-changing characters), got '" +
                printable(name) + "'",
            "filename");
    return name;
}

}  // namespace

void Server::slot_action(const httplib::Request& req, httplib::Response& res) {
    if (opt_.slot_save_path.empty())
        throw ApiError(501, "slot actions need --slot-save-path", "", "not_supported");
    // The id as a number of this server's slots: digits that overflow an int name
    // no slot (atoi would have wrapped them onto one).
    const std::string id = req.matches[1].str();
    int slot = -1;
    const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), slot);
    if (ec != std::errc() || end != id.data() + id.size() || slot < 0 ||
        slot >= engine_.options().n_parallel)
        throw ApiError(400,
                       "slot " + id.substr(0, 24) + " does not exist (slots 0.." +
                           std::to_string(engine_.options().n_parallel - 1) + ")",
                       "", "invalid_slot");
    const std::string action = req.get_param_value("action");
    ojson j = ojson::object();
    j["id_slot"] = slot;
    try {
        if (action == "erase") {
            j["n_erased"] = engine_.erase_slot(slot);
            send_json(res, 200, j);
            return;
        }
        if (action != "save" && action != "restore")
            throw bad_request("'action' must be save, restore or erase, got '" + action + "'",
                              "action");
        const std::string name = slot_file_name(parse_body(req.body));
        const std::string path = opt_.slot_save_path + "/" + name;
        j["filename"] = name;
        if (action == "save") {
            const runtime::Engine::SlotIo io = engine_.save_slot(
                slot, opt_.slot_save_path, name, opt_.slot_fingerprint, opt_.slot_save_max);
            j["n_saved"] = io.tokens;
            j["n_written"] = io.bytes;
            j["timings"] = {{"save_ms", io.seconds * 1e3}};
        } else {
            const runtime::Engine::SlotIo io =
                engine_.restore_slot(slot, path, opt_.slot_fingerprint);
            j["n_restored"] = io.tokens;
            j["n_read"] = io.bytes;
            j["timings"] = {{"restore_ms", io.seconds * 1e3}};
        }
    } catch (const ApiError&) {
        throw;
    } catch (const Error& e) {
        throw bad_request(e.what(), "", "slot_action_failed");
    }
    send_json(res, 200, j);
}

}  // namespace glm5::server
