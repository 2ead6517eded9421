// glm5 serve under pressure: a full queue answers 429 with Retry-After in OpenAI's
// shape (and /metrics counts it); slow clients that trickle their requests hold no
// worker that others need and are dropped at the read timeout; connections beyond
// the cap get an immediate 503.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/server_process.h"

using glm5::test::connect_loopback;
using glm5::test::http_get;
using glm5::test::http_post;
using glm5::test::HttpReply;
using glm5::test::metric_value;
using glm5::test::send_all;
using glm5::test::ServerProcess;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kModel = std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf";

std::string chat_body(int max_tokens, bool stream = false) {
    return R"({"messages":[{"role":"user","content":"Hello there"}],"temperature":0,"ignore_eos":true,"max_tokens":)" +
           std::to_string(max_tokens) + (stream ? R"(,"stream":true)" : "") + "}";
}

// Polls /metrics until `name` reaches `want` (or 20 s pass).
bool wait_metric(int port, const std::string& name, double want) {
    const auto end = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < end) {
        if (metric_value(http_get(port, "/metrics").body, name) == want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

// Sends a request on a fresh connection and leaves it open without reading.
int send_and_hold(int port, const std::string& body) {
    const int s = connect_loopback(port);
    EXPECT_GE(s, 0);
    send_all(s, glm5::test::http_request("POST", "/v1/chat/completions", body));
    return s;
}

// The peer closed the connection (EOF or reset) within `timeout`; what it sent
// before goes to `got`.
bool closed_within(int s, std::chrono::milliseconds timeout, std::string* got = nullptr) {
    const auto end = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < end) {
        pollfd p{s, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            const ssize_t n = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
            if (n <= 0) return true;
            if (got) got->append(buf, size_t(n));
        }
    }
    return false;
}

TEST(ServerBackpressure, FullQueueGets429WithRetryAfter) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "4096", "--parallel",
                     "1", "--max-queue", "1"});
    ASSERT_GT(s.port(), 0) << s.log();
    // One long request holds the only slot, a second waits in the queue.
    const int busy = send_and_hold(s.port(), chat_body(4000, true));
    ASSERT_TRUE(wait_metric(s.port(), "glm5_busy_slots", 1)) << s.log();
    const int queued = send_and_hold(s.port(), chat_body(4));
    ASSERT_TRUE(wait_metric(s.port(), "glm5_queue_depth", 1)) << s.log();

    const HttpReply r = http_post(s.port(), "/v1/chat/completions", chat_body(4));
    EXPECT_EQ(r.status, 429) << r.raw;
    std::string headers = r.headers;
    for (auto& c : headers) c = char(std::tolower(c));
    EXPECT_NE(headers.find("retry-after: 1"), std::string::npos) << r.headers;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_EQ(e["error"]["code"], "queue_full");
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"].contains("type") && e["error"].contains("param"));
    const std::string m = http_get(s.port(), "/metrics").body;
    EXPECT_EQ(metric_value(m, "glm5_requests_refused_total"), 1) << m;
    EXPECT_EQ(metric_value(m, "glm5_queue_limit"), 1) << m;
    EXPECT_NE(m.find("glm5_http_responses_total{code=\"429\"} 1"), std::string::npos) << m;

    // The client holding the slot goes away: its request is cancelled, the queued
    // one runs, and new requests are taken again.
    ::close(busy);
    ::close(queued);
    ASSERT_TRUE(wait_metric(s.port(), "glm5_busy_slots", 0)) << s.log();
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body(4)).status, 200);
}

TEST(ServerBackpressure, SlowClientsDoNotStopOthersAndAreDropped) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "256", "--parallel", "2",
                     "--max-connections", "48", "--read-timeout", "2"});
    ASSERT_GT(s.port(), 0) << s.log();
    // 40 clients start a request and trickle a byte of it every 200 ms for 1.5 s,
    // then send nothing more (a real trickler that keeps sending is dropped the
    // same way, but may see its 408 lost to the reset its later bytes cause).
    constexpr int kSlow = 40;
    std::vector<int> slow;
    for (int i = 0; i < kSlow; ++i) {
        const int c = connect_loopback(s.port());
        ASSERT_GE(c, 0);
        send_all(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        slow.push_back(c);
    }
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
        const auto end = Clock::now() + std::chrono::milliseconds(1500);
        while (!stop && Clock::now() < end) {
            for (int c : slow) (void)send(c, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    });
    // Meanwhile normal requests are served, and quickly.
    const auto t0 = Clock::now();
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(http_get(s.port(), "/health").status, 200);
        const HttpReply r = http_post(s.port(), "/v1/chat/completions", chat_body(4));
        EXPECT_EQ(r.status, 200) << r.raw;
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
    // The slow requests do not get to finish: at the read timeout they get a 408
    // and the connection is closed.
    int dropped = 0, told = 0;
    for (int c : slow) {
        std::string got;
        dropped += closed_within(c, std::chrono::seconds(4), &got);
        told +=
            got.rfind("HTTP/1.1 408", 0) == 0 && got.find("request_timeout") != std::string::npos;
    }
    stop = true;
    trickle.join();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(dropped, kSlow);
    EXPECT_EQ(told, kSlow);
    for (int c : slow) ::close(c);
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body(4)).status, 200);
}

// (GET /health is answered beyond the cap: health probes see a busy server as busy.)
TEST(ServerBackpressure, ConnectionsBeyondTheCapGet503AtOnce) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "256",
                     "--max-connections", "8", "--keep-alive", "60"});
    ASSERT_GT(s.port(), 0) << s.log();
    // Seven idle connections and the /metrics request itself fill seven and then
    // eight places; one more idle connection fills the last. (Idle connections
    // are kept 60 s here, so a loaded machine cannot close them mid-test.)
    std::vector<int> idle;
    for (int i = 0; i < 7; ++i) idle.push_back(connect_loopback(s.port()));
    ASSERT_TRUE(wait_metric(s.port(), "glm5_http_connections_open", 8)) << s.log();
    idle.push_back(connect_loopback(s.port()));
    // The last idle connection takes its place once a worker has picked it up (on a
    // loaded machine that may be after the next request): ask until the cap shows.
    HttpReply r;
    for (int i = 0; i < 200; ++i) {
        const auto t0 = Clock::now();
        r = http_get(s.port(), "/props");
        if (r.status == 503) {
            EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(r.status, 503) << r.raw;
    EXPECT_NE(r.headers.find("Retry-After: 1"), std::string::npos) << r.headers;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.raw;
    EXPECT_EQ(e["error"]["code"], "too_many_connections");
    // A health probe is answered even so: the server is busy, not gone.
    const HttpReply h = http_get(s.port(), "/health");
    EXPECT_EQ(h.status, 200) << h.raw;
    EXPECT_EQ(json::parse(h.body, nullptr, false).value("status", ""), "ok") << h.raw;
    for (int c : idle) ::close(c);
    // Once they are gone, connections are taken again.
    bool served = false;
    for (int i = 0; i < 100 && !served; ++i) {
        served = http_get(s.port(), "/props").status == 200;
        if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(served);
    EXPECT_GE(
        metric_value(http_get(s.port(), "/metrics").body, "glm5_http_connections_refused_total"),
        1);
}

}  // namespace
