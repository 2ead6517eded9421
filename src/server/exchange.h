// The pieces of a generation request's life that every API's responders share:
// events from the engine thread, the channel that hands them to the HTTP thread,
// what a choice has produced, and the replies' plumbing. Internal to src/server/.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "server/api_error.h"
#include "server/reply_stream.h"
#include "server/server.h"

namespace glm5::server {

// How often a waiting handler looks at its client's socket.
constexpr std::chrono::milliseconds kPoll{50};

inline std::string dump(const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Text a client sent, fit for a log line or a message: control characters (C0, DEL, C1),
// the bidirectional and line-breaking format characters (U+200E, U+200F, U+2028-U+202E,
// U+2066-U+2069) and bytes that are not UTF-8 become escapes, so that a name cannot forge
// a line or reorder one on a terminal.
std::string printable(std::string_view s);

inline void send_json(httplib::Response& res, int status, const nlohmann::ordered_json& j) {
    res.status = status;
    res.set_content(dump(j), "application/json");
}

inline int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// One event from the engine thread: a choice's text delta, or its end.
struct Event {
    int index = 0;
    Delta delta;
    std::vector<runtime::TokenLogprob> logprobs;  // of the tokens behind it, when asked for
    bool done = false;
    runtime::RequestResult result;
    std::string stop_sequence;  // the stop string that ended it, if one did
};

class Channel {
  public:
    void push(Event e) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            q_.push_back(std::move(e));
        }
        cv_.notify_one();
    }
    // Moves what is there (waiting up to `timeout` for something) into out.
    void take(std::vector<Event>& out, std::chrono::milliseconds timeout) {
        std::unique_lock<std::mutex> lk(mu_);
        if (timeout.count() > 0) cv_.wait_for(lk, timeout, [&] { return !q_.empty(); });
        while (!q_.empty()) {
            out.push_back(std::move(q_.front()));
            q_.pop_front();
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> q_;
};

// What a choice has produced so far.
struct ChoiceState {
    std::string reasoning, content;
    std::vector<text::ToolCall> calls;  // with their ids
    std::vector<runtime::TokenLogprob> logprobs;
    bool done = false;
    runtime::RequestResult result;
    std::string stop_sequence;
    void apply(const Event& e) {
        const Delta& d = e.delta;
        reasoning += d.reasoning;
        content += d.content;
        calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
        logprobs.insert(logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    }
    void finish(Event& e) {
        done = true;
        result = std::move(e.result);
        stop_sequence = std::move(e.stop_sequence);
    }
};

// "12 prompt tokens (4 cached) + 8 generated, stop": a reply's line in the log.
std::string generation_summary(int64_t prompt, int64_t cached, int64_t generated,
                               const std::string& finish);

// An engine request that ended without a reply: its error for the client.
inline std::optional<ApiError> failure(const runtime::RequestResult& r) {
    if (r.finish_reason == "error")
        return ApiError(500, "generation failed: " + r.error, "", "generation_failed");
    if (r.finish_reason == "cancelled")
        return ApiError(503, "the request was cancelled: the server is shutting down", "",
                        "shutting_down");
    return std::nullopt;
}

// What a streamed reply sends, in its API's shape (routes_openai.cpp's chunks,
// routes_anthropic.cpp's events); Server::stream() sends it, a turn of the content
// provider at a time.
class StreamShape {
  public:
    virtual ~StreamShape() = default;
    // The reply's start, sent at once: the client sees the reply start.
    virtual std::string opening() = 0;
    // What one event from the engine thread sends.
    virtual std::string on_event(Event& e) = 0;
    // The end of a turn, after its events: adds what else it sends to `out`; true once
    // the reply is finished.
    virtual bool end_turn(std::string& out) = 0;
    // The finished reply's line in the log (generation_summary()).
    virtual std::string summary() const = 0;
};

struct Server::Exchange {
    std::shared_ptr<Channel> channel = std::make_shared<Channel>();
    std::vector<std::shared_ptr<runtime::Request>> requests;
    void cancel() {
        for (auto& r : requests) r->cancel();
    }
};

// Counts a generation request as in flight for as long as it lives.
struct InFlight {
    explicit InFlight(Server* s) : s_(s) { s_->enter(); }
    ~InFlight() { s_->leave(); }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    Server* s_;
};

}  // namespace glm5::server
