// llama-server's utility endpoints, in its shapes: POST /tokenize, /detokenize and
// /apply-template, GET /props (each also under /v1).
#include <httplib.h>

#include <charconv>
#include <cstdlib>

#include "server/exchange.h"
#include "server/http_transport.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;

std::vector<int32_t> token_ids(const text::Tokenizer& tok, const ojson& t, const char* name) {
    if (!t.is_array())
        throw bad_request(std::string("'") + name + "' must be an array of token ids", name,
                          "invalid_type");
    std::vector<int32_t> ids;
    for (const auto& x : t) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.n_vocab())
            throw bad_request(std::string("'") + name + "' holds " + x.dump() +
                                  ", not a token id of this vocabulary (0.." +
                                  std::to_string(tok.n_vocab() - 1) + ")",
                              name);
        ids.push_back(int32_t(x.get<int64_t>()));
    }
    return ids;
}

// /tokenize's reply, written as it is sent: a few thousand tokens a turn of the
// content provider.
httplib::ContentProviderWithoutLength tokens_writer(std::shared_ptr<std::vector<int32_t>> ids,
                                                    const text::Tokenizer* tok, bool with_pieces) {
    auto next = std::make_shared<size_t>(0);
    return [ids, next, tok, with_pieces](size_t, httplib::DataSink& sink) {
        std::string out = *next == 0 ? "{\"tokens\":[" : "";
        const size_t end = std::min(ids->size(), *next + 4096);
        for (size_t i = *next; i < end; ++i) {
            if (i > 0) out += ',';
            const int32_t id = (*ids)[i];
            if (!with_pieces) {
                out += std::to_string(id);
                continue;
            }
            // A piece that is not whole UTF-8 comes as its bytes, as llama-server
            // sends it.
            const std::string& piece = tok->token_bytes(id);
            ojson p = ojson::object();
            p["id"] = id;
            if (text::is_valid_utf8(piece)) {
                p["piece"] = piece;
            } else {
                ojson bytes = ojson::array();
                for (unsigned char c : piece) bytes.push_back(int(c));
                p["piece"] = std::move(bytes);
            }
            out += dump(p);
        }
        *next = end;
        if (end == ids->size()) out += "]}";
        if (!sink.write(out.data(), out.size())) return false;
        if (end == ids->size()) sink.done();
        return true;
    };
}

// A float as the decimal it was given as (0.8, not 0.800000011920929).
double dec(float f) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof(buf), f);
    return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

}  // namespace

void Server::tokenize(const httplib::Request& req, httplib::Response& res) {
    const ojson b = parse_body(req.body);
    const auto it = b.find("content");
    if (it == b.end() || !it->is_string())
        throw bad_request("'content' must be a string", "content", "invalid_type");
    const bool add_special = b.value("add_special", false);
    const bool parse_special = b.value("parse_special", true);
    const bool with_pieces = b.value("with_pieces", false);
    // Encoding takes up to kEncodeCost bytes a byte of content: bounded, and charged to the
    // body budget.
    const std::string& content = it->get_ref<const std::string&>();
    constexpr size_t kMaxContent = size_t(8) << 20;
    if (content.size() > kMaxContent)
        throw ApiError(413,
                       "'content' of " + std::to_string(content.size()) +
                           " bytes: /tokenize takes at most " + std::to_string(kMaxContent) +
                           " (encoding costs up to " + std::to_string(kEncodeCost) +
                           " bytes a byte)",
                       "content", "content_too_large");
    const BudgetHold hold(kEncodeCost * content.size());
    if (!hold.held()) throw request_memory_busy();
    // The ids (4 bytes a token, a token at least a byte of the body) are all this holds;
    // the reply, pieces and all (over 200 bytes a token), is written as it is sent.
    auto ids = std::make_shared<std::vector<int32_t>>();
    if (add_special && mc_.tok->special().bos >= 0) ids->push_back(mc_.tok->special().bos);
    mc_.tok->encode_append(content, parse_special, *ids);
    res.status = 200;
    res.set_chunked_content_provider("application/json",
                                     tokens_writer(std::move(ids), mc_.tok, with_pieces));
}

void Server::detokenize(const httplib::Request& req, httplib::Response& res) {
    const ojson b = parse_body(req.body);
    const auto it = b.find("tokens");
    if (it == b.end())
        throw bad_request("'tokens' is required", "tokens", "missing_required_parameter");
    send_json(res, 200, {{"content", mc_.tok->decode(token_ids(*mc_.tok, *it, "tokens"))}});
}

void Server::apply_template(const httplib::Request& req, httplib::Response& res) {
    send_json(res, 200, {{"prompt", apply_chat_template(parse_body(req.body), mc_)}});
}

void Server::props(const httplib::Request&, httplib::Response& res) {
    const runtime::SamplerParams& sp = mc_.sampling;
    ojson params = ojson::object();
    params["temperature"] = dec(sp.temperature);
    params["top_k"] = sp.top_k;
    params["top_p"] = dec(sp.top_p);
    params["min_p"] = dec(sp.min_p);
    params["repeat_penalty"] = dec(sp.repeat_penalty);
    params["repeat_last_n"] = sp.repeat_last_n;
    params["presence_penalty"] = dec(sp.presence_penalty);
    params["frequency_penalty"] = dec(sp.frequency_penalty);
    params["seed"] = mc_.seed_fixed ? int64_t(sp.seed) : int64_t(-1);
    params["n_predict"] = mc_.default_max_tokens > 0 ? mc_.default_max_tokens : int64_t(-1);
    params["reasoning_budget"] = mc_.reasoning_budget;
    ojson gen = ojson::object();
    gen["n_ctx"] = mc_.n_ctx;
    gen["params"] = std::move(params);
    ojson j = ojson::object();
    j["default_generation_settings"] = std::move(gen);
    j["total_slots"] = engine_.options().n_parallel;
    j["model_alias"] = mc_.id;
    j["model_path"] = mc_.path;
    j["chat_template"] = mc_.format->chat_template();
    j["modalities"] = {{"vision", mc_.vision != nullptr}, {"audio", false}};
    j["build_info"] = "glm5.cpp";
    send_json(res, 200, j);
}

}  // namespace glm5::server
