#include "server/reply_stream.h"

#include <algorithm>
#include <random>

namespace glm5::server {

std::string random_id(const char* prefix) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string s = prefix;
    for (int i = 0; i < 24; ++i) s += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    return s;
}

std::string new_call_id() {
    return random_id("call_");
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::feed(std::string_view s) {
    if (matched_) return {};
    if (stops_.empty()) return std::string(s);
    held_ += s;
    size_t first = std::string::npos;
    for (const auto& stop : stops_) {
        const size_t at = held_.find(stop);
        // The earliest match; at the same place, the one listed first.
        if (at < first) {
            first = at;
            which_ = stop;
        }
    }
    if (first != std::string::npos) {
        matched_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Keep the longest tail that some stop string starts with; it may still complete.
    size_t keep = 0;
    for (const auto& stop : stops_) {
        const size_t most = std::min(held_.size(), stop.size() - 1);
        for (size_t k = most; k > keep; --k)
            if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
                keep = k;
                break;
            }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    std::string out;
    out.swap(held_);
    return out;
}

ReplyStream::ReplyStream(const text::Tokenizer& tok, ReplyStreamOptions opt)
    : tok_(&tok),
      dec_(tok),
      parser_(text::ReplyParserOptions{opt.reasoning_open, opt.tools}),
      stop_(opt.stop),
      opt_(std::move(opt)) {
    for (const char* m :
         {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"})
        if (const int32_t id = tok.find(m); id >= 0) markers_.push_back(id);
    think_open_ = tok.find("<think>");
    think_close_ = tok.find("</think>");
}

void ReplyStream::take(const text::ReplyDelta& d, Delta& out) {
    if (over_) return;
    out.reasoning += d.reasoning;
    if (!d.content.empty()) {
        out.content += stop_.feed(d.content);
        if (stop_.matched()) {
            over_ = true;
            return;
        }
    }
    for (const text::ToolCall& c : d.tool_calls) {
        // A stop string cannot span a tool call: what was held back is content.
        out.content += stop_.flush();
        text::ToolCall call = c;
        call.id = new_call_id();
        out.tool_calls.push_back(std::move(call));
        ++tool_calls_;
        if (opt_.single_tool_call) {
            over_ = true;
            return;
        }
    }
}

bool ReplyStream::push(int32_t token, Delta& out) {
    if (over_) return false;
    // A chat reply's control tokens are its structure (reasoning, tool calls) or
    // nothing a reader should see (a stray <|assistant|> or <sop>): the latter are
    // dropped, as llama-server does.
    // Reasoning markers only open a reply or close its reasoning: once the answer has
    // begun, <think></think> is noise (a small model echoing its template).
    if (opt_.parse && tok_->is_control(token)) {
        const bool think = token == think_open_ || token == think_close_;
        if (think ? answering_
                  : std::find(markers_.begin(), markers_.end(), token) == markers_.end())
            return true;
        if (token == think_close_) answering_ = true;
    }
    const std::string piece = dec_.push(token);
    if (!opt_.parse) {
        out.content += stop_.feed(piece);
        over_ = stop_.matched();
    } else {
        take(parser_.feed(piece), out);
        answering_ = answering_ || !out.content.empty() || !out.tool_calls.empty();
    }
    return !over_;
}

void ReplyStream::finish(Delta& out) {
    if (!over_) {
        const std::string tail = dec_.flush();
        if (!opt_.parse) {
            out.content += stop_.feed(tail);
        } else {
            take(parser_.feed(tail), out);
            take(parser_.finish(), out);
        }
    }
    if (!stop_.matched()) out.content += stop_.flush();
    over_ = true;
}

}  // namespace glm5::server
