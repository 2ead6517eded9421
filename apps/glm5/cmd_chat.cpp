// glm5 chat: an interactive conversation in the terminal.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "args.h"
#include "chat_runner.h"
#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "default_model.h"
#include "image/image.h"
#include "model_setup.h"
#include "vision_setup.h"

namespace glm5::app {

namespace {

const char* kHelp =
    "commands:\n"
    "  /think on|off   reasoning before answering (now: %s)\n"
    "  /reset          forget the conversation\n"
    "  /image PATH     attach a PNG or JPEG to the next message (needs --mmproj)\n"
    "  /exit           leave (Ctrl-D too)\n"
    "  /help           this list\n"
    "A line ending in \\ continues on the next line; a line of \"\"\" starts and ends a block.\n";

// Reads one user message; false at end of input.
bool read_message(bool tty, std::string& msg) {
    msg.clear();
    std::string line;
    if (tty) std::fputs("\n> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line)) return false;
    if (line == "\"\"\"") {
        while (std::getline(std::cin, line) && line != "\"\"\"")
            msg += (msg.empty() ? "" : "\n") + line;
        return true;
    }
    while (!line.empty() && line.back() == '\\') {
        line.pop_back();
        msg += line + "\n";
        if (tty) std::fputs(". ", stdout), std::fflush(stdout);
        if (!std::getline(std::cin, line)) break;
    }
    msg += line;
    return true;
}

}  // namespace

int cmd_chat(int argc, char** argv) {
    Args a("chat", "Talk to a model interactively. Type /help for the commands.");
    add_model_flags(a, false);
    add_generation_flags(a);
    a.flag("show-reasoning", "print the model's reasoning (dimmed) before its answer", true);
    add_vision_flags(a, false);
    if (!a.parse(argc, argv, 2)) return 0;
    const text::ReasoningEffort effort = [&] {
        try {
            return text::parse_reasoning_effort(a.get("reasoning-effort"));
        } catch (const Error& e) {
            throw UsageError(std::string("--reasoning-effort: ") + e.what());
        }
    }();
    const runtime::SamplerParams sp = sampling_from_args(a);
    const int64_t ubatch = a.get_int("ubatch", 1, 1 << 16);
    requested_context_check(a);
    const int64_t n_predict = a.get_int("n-predict", 0, 1 << 24);
    const std::string path = a.is_set("model") ? a.get("model") : ensure_default_model();
    LoadedModel m = open_model(a, path);
    LoadedVision vision = open_vision(a, m);
    ContextRequest cr = cli_context_request(ubatch, m.spec);
    plan_vision(vision, cr);
    const ContextChoice ctx = plan_context(a, *m.model, cr);
    ChatRunner chat(m, ctx, ubatch, sp, n_predict, &vision);
    chat.set_reasoning_budget(a.get_int("reasoning-budget", -1, INT64_MAX / 4));
    if (!a.get("system").empty()) chat.set_system(a.get("system"));

    const bool tty = isatty(0) && isatty(1);
    bool think = a.get_flag("think");
    const bool show_reasoning = a.get_flag("show-reasoning");
    std::printf("glm5 chat with %s. /help for commands, /exit to leave.\n",
                m.model->info().name.c_str());
    std::string msg;
    while (read_message(tty, msg)) {
        if (msg.empty()) continue;
        if (msg[0] == '/') {
            if (msg == "/exit" || msg == "/quit") break;
            if (msg == "/reset") {
                chat.reset();
                std::printf("(conversation cleared)\n");
            } else if (msg == "/think on" || msg == "/think off") {
                think = msg == "/think on";
                std::printf("(reasoning %s)\n", think ? "on" : "off");
            } else if (msg.rfind("/image", 0) == 0 && (msg.size() == 6 || msg[6] == ' ')) {
                const size_t b = msg.find_first_not_of(' ', 6);
                const std::string path = b == std::string::npos ? "" : msg.substr(b);
                if (!vision.tower) {
                    std::printf("(no vision tower: start glm5 chat with --mmproj)\n");
                } else if (path.empty()) {
                    std::printf("usage: /image PATH\n");
                } else {
                    try {
                        chat.attach_image(runtime::prepare_image(image::read_file(path), path,
                                                                 vision.tower->hparams()),
                                          path);
                        std::printf("(image %s attached to the next message)\n", path.c_str());
                    } catch (const Error& e) {
                        std::printf("(image refused: %s)\n", e.what());
                    }
                }
            } else if (msg == "/help") {
                std::printf(kHelp, think ? "on" : "off");
            } else {
                std::printf("unknown command %s; /help lists them\n", msg.c_str());
            }
            std::fflush(stdout);
            continue;
        }
        StreamCallbacks cb;
        bool in_reasoning = false;
        cb.reasoning = [&](const std::string& s) {
            if (!show_reasoning) return;
            if (!in_reasoning) std::fputs(tty ? "\x1b[2m" : "[reasoning] ", stdout);
            in_reasoning = true;
            std::fputs(s.c_str(), stdout);
            std::fflush(stdout);
        };
        cb.content = [&](const std::string& s) {
            if (in_reasoning) std::fputs(tty ? "\x1b[0m\n" : "\n", stdout), in_reasoning = false;
            std::fputs(s.c_str(), stdout);
            std::fflush(stdout);
        };
        cb.tool_call = [&](const text::ToolCall& c) {
            std::printf("\n[tool call] %s %s", c.name.c_str(), c.arguments.dump().c_str());
        };
        TurnResult r = chat.turn(msg, think, effort, cb);
        if (in_reasoning && tty) std::fputs("\x1b[0m", stdout);
        std::fputs("\n", stdout);
        std::fflush(stdout);
        log_info("[%s]\n", timing_summary(r.gen).c_str());
    }
    return 0;
}

}  // namespace glm5::app
