// glm5 tokenize: text -> token ids with the model's own tokenizer, as JSON on stdout.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text_chunks.h"

namespace glm5::app {

int cmd_tokenize(int argc, char** argv) {
    Args a("tokenize",
           "Tokenize text with a model's vocabulary and print one JSON array on stdout.\n"
           "Default output: the ids, e.g. [615,281,78]. With --pieces: one object per token,\n"
           "{\"id\":615,\"piece\":\"He\",\"text\":\"He\"}: piece is the vocabulary string "
           "(byte-level\n"
           "form, e.g. \"Ġthe\" for \" the\"), text the bytes it stands for; a token whose\n"
           "bytes are not valid UTF-8 on their own (part of a character) has \"bytes\":[...]\n"
           "instead of text. No BOS is added. Errors: one line on stderr, exit code 2.");
    a.option("model", "FILE", "", "GGUF model file (first shard of a split model)", "-m");
    a.option("text", "TEXT", "", "text to tokenize");
    a.option("file", "FILE", "", "read the text from FILE instead ('-' for stdin)");
    a.flag("parse-special", "match control tokens written in the text (<|user|>, <think>...)",
           true);
    a.flag("pieces", "print {id, piece, text} objects instead of bare ids");
    if (!a.parse(argc, argv, 2)) return 0;

    if (a.get("model").empty()) throw UsageError("--model is required");
    if (a.is_set("text") == a.is_set("file"))
        throw UsageError("give exactly one of --text and --file");
    const std::string text = a.is_set("text") ? a.get("text") : read_text_file(a.get("file"));

    gguf::OpenOptions oo;
    oo.load_splits = false;  // the vocabulary lives in the first shard
    const auto file = gguf::File::open(a.get("model"), oo);
    const auto tok = text::Tokenizer::from_gguf(*file);
    const auto ids = tok->encode(text, a.get_flag("parse-special"));

    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (text::TokenId id : ids) {
        if (!a.get_flag("pieces")) {
            out.push_back(id);
            continue;
        }
        nlohmann::ordered_json t = nlohmann::ordered_json::object();
        t["id"] = id;
        t["piece"] = tok->token_text(id);
        const std::string& bytes = tok->token_bytes(id);
        if (text::is_valid_utf8(bytes)) {
            t["text"] = bytes;
        } else {
            nlohmann::ordered_json b = nlohmann::ordered_json::array();
            for (unsigned char c : bytes) b.push_back(int(c));
            t["bytes"] = std::move(b);
        }
        out.push_back(std::move(t));
    }
    const std::string s =
        out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

}  // namespace glm5::app
