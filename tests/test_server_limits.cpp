// glm5 serve against a hostile but legitimate client, at the transport: a JSON body
// sent as a form is JSON; a body with bytes after its value is a 400; a Content-Length
// that is not a number, or over the limit, is refused from the head at once (the body
// is never waited for); a chunked body is cut off at the limit; a request line that
// never ends gets its 408; a burst of connects fits the listen backlog; refused large
// prompts cost memory in proportion to what is held at once, not to their size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/server_process.h"
#include "server/shared_server.h"

using glm5::test::connect_loopback;
using glm5::test::http_get;
using glm5::test::http_post;
using glm5::test::http_raw;
using glm5::test::HttpReply;
using glm5::test::send_all;
using glm5::test::ServerProcess;
using glm5::test::SharedServer;
using glm5::test::vm_kib;
using json = nlohmann::json;

namespace {

const std::string kModel = std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf";

std::string chat_body(const std::string& content, int max_tokens = 2) {
    return R"({"messages":[{"role":"user","content":)" + json(content).dump() +
           R"(}],"temperature":0,"max_tokens":)" + std::to_string(max_tokens) + "}";
}

std::string error_code(const HttpReply& r) {
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("error") || !j["error"].contains("code")) return "?";
    return j["error"]["code"].is_string() ? j["error"]["code"].get<std::string>() : "null";
}

class ServerLimits : public SharedServer<ServerLimits> {
  public:
    // A read timeout far beyond the clients' own, so that a reply that waits for it shows
    // as the wrong status, not as a slow test.
    static std::vector<std::string> flags() {
        return {"-m",         kModel, "--port",         "0", "-t", "1", "--ctx-size", "256",
                "--max-body", "64K",  "--read-timeout", "5"};
    }

  protected:
    void expect_still_serving() {
        const HttpReply r = http_post(port(), "/v1/chat/completions", chat_body("Hello"));
        EXPECT_EQ(r.status, 200) << r.raw;
    }
};

}  // namespace

TEST_F(ServerLimits, JsonSentAsAFormIsJson) {
    // curl -d sends application/x-www-form-urlencoded; 9 KB of it is still a JSON body.
    const std::string body = "{" + std::string(9000, ' ') + chat_body("Hello").substr(1);
    const HttpReply r =
        http_raw(port(),
                 "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
    EXPECT_EQ(r.status, 200) << r.raw.substr(0, 500);
    EXPECT_TRUE(json::parse(r.body, nullptr, false).contains("choices")) << r.body;
}

TEST_F(ServerLimits, BytesAfterTheJsonValueAre400) {
    const std::string valid = chat_body("Hello");
    for (const std::string& tail : {std::string("\0{{{garbage", 11), std::string(1, '\0'),
                                    std::string(" {}"), std::string("x")}) {
        const HttpReply r = http_post(port(), "/v1/chat/completions", valid + tail);
        EXPECT_EQ(r.status, 400) << json(tail).dump() << " " << r.raw.substr(0, 300);
        EXPECT_EQ(error_code(r), "invalid_json");
    }
    expect_still_serving();
}

TEST_F(ServerLimits, BadContentLengthIsRefusedFromTheHead) {
    // No body follows: a server that waited for one would answer 408 at the read
    // timeout, not 400.
    for (const char* cl : {"-1", "1180591620717411303424", "12abc", "", "1, 2"}) {
        const int s = connect_loopback(port());
        ASSERT_GE(s, 0);
        send_all(s,
                 std::string(
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ") +
                     cl + "\r\n\r\n");
        const HttpReply r = glm5::test::parse_reply(glm5::test::read_until_closed(s, 30));
        ::close(s);
        EXPECT_EQ(r.status, 400) << "Content-Length: " << cl << "\n" << r.raw;
        EXPECT_EQ(error_code(r), "invalid_content_length") << r.body;
    }
    expect_still_serving();
}

TEST_F(ServerLimits, OverLimitLengthGets413BeforeTheBody) {
    const int s = connect_loopback(port());
    ASSERT_GE(s, 0);
    send_all(s,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
             "application/json\r\nContent-Length: 100000000\r\n\r\n{\"messages\":");
    const HttpReply r = glm5::test::parse_reply(glm5::test::read_until_closed(s, 30));
    ::close(s);
    EXPECT_EQ(r.status, 413) << r.raw;
    EXPECT_EQ(error_code(r), "body_too_large");
    EXPECT_NE(r.body.find("100000000"), std::string::npos) << r.body;
    expect_still_serving();
}

TEST_F(ServerLimits, ChunkedBodyIsCutOffAtTheLimit) {
    const int s = connect_loopback(port());
    ASSERT_GE(s, 0);
    std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        "application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    const std::string piece(8192, 'a');
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
    // 320 KB of chunks against a 64 KB limit; the server stops reading at ~2x.
    for (int i = 0; i < 40; ++i) req += size + piece + "\r\n";
    req += "0\r\n\r\n";
    std::thread writer([&] { send_all(s, req); });
    const HttpReply r = glm5::test::parse_reply(glm5::test::read_until_closed(s, 30));
    ::shutdown(s, SHUT_RDWR);
    writer.join();
    ::close(s);
    EXPECT_EQ(r.status, 413) << r.raw.substr(0, 500);
    EXPECT_EQ(error_code(r), "body_too_large");
    expect_still_serving();
}

TEST_F(ServerLimits, UnknownTransferEncodingIs501) {
    const HttpReply r = http_raw(port(),
                                 "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Transfer-Encoding: gzip, chunked\r\n\r\n");
    EXPECT_EQ(r.status, 501) << r.raw;
    EXPECT_EQ(error_code(r), "unsupported_transfer_encoding");
}

TEST_F(ServerLimits, TrickledRequestLineGets408) {
    // A request line that never ends (the transport's read timeout is 5 s).
    const int s = connect_loopback(port());
    ASSERT_GE(s, 0);
    send_all(s, "POST /v1/chat/comp");
    const HttpReply r = glm5::test::parse_reply(glm5::test::read_until_closed(s, 30));
    ::close(s);
    EXPECT_EQ(r.status, 408) << r.raw;
    EXPECT_EQ(error_code(r), "request_timeout");
}

TEST_F(ServerLimits, HugeHeadIs431) {
    const std::string h = "X-Big: " + std::string(70000, 'b') + "\r\n";
    const HttpReply r =
        http_raw(port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + h + "\r\n");
    EXPECT_EQ(r.status, 431) << r.raw.substr(0, 300);
    expect_still_serving();
}

TEST_F(ServerLimits, PipelinedRequestsAreEachAnswered) {
    // Reading a head never takes bytes of the body or of the next request.
    const std::string body = chat_body("Hello");
    const std::string one =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const HttpReply r = http_raw(port(), one + one +
                                             "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                             "Connection: close\r\n\r\n");
    size_t n = 0;
    for (size_t at = 0; (at = r.raw.find("HTTP/1.1 200", at)) != std::string::npos; ++at) ++n;
    EXPECT_EQ(n, 3u) << r.raw;
}

namespace {

// ListenOverflows of this network namespace (/proc/net/netstat's TcpExt line).
long listen_overflows() {
    std::ifstream f("/proc/net/netstat");
    std::string names, values;
    while (std::getline(f, names) && std::getline(f, values)) {
        if (names.rfind("TcpExt:", 0) != 0) continue;
        std::istringstream n(names), v(values);
        std::string name, value;
        while (n >> name && v >> value)
            if (name == "ListenOverflows") return std::stol(value);
    }
    return -1;
}

bool loopback_up() {
    const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    bool ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    ::close(s);
    return ok;
}

}  // namespace

// 64 connects at once while the server accepts nothing: every one completes its
// handshake into the listen queue and none overflows it (a backlog of 5 dropped all
// but six, which then waited a second for their SYNs to be sent again). In a network
// namespace of its own, so that the counter is this test's alone (CI runs as root).
TEST(ServerBacklog, BurstOfConnectsFitsTheListenQueue) {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << "needs root for a network namespace: " << errno;
    ASSERT_TRUE(loopback_up());
    ServerProcess s(
        {"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "256", "--max-connections", "128"});
    ASSERT_GT(s.port(), 0) << s.log();
    const long before = listen_overflows();
    ASSERT_GE(before, 0);
    s.signal(SIGSTOP);
    std::vector<int> socks;
    for (int i = 0; i < 64; ++i) {
        const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(s.port()));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        (void)::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        socks.push_back(c);
    }
    // Each handshake completes into the queue (the socket becomes writable) or its
    // SYN is dropped and retried a second later; wait for all of them.
    int connected = 0;
    for (int c : socks) {
        pollfd p{c, POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, 10000) == 1 && getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
            err == 0)
            ++connected;
    }
    const long after = listen_overflows();
    s.signal(SIGCONT);
    EXPECT_EQ(after, before);
    EXPECT_EQ(connected, 64);
    for (int c : socks) ::close(c);
    EXPECT_EQ(http_get(s.port(), "/health").status, 200);
}

// Eight 20 MB prompts at once, each refused (the context holds 256 tokens): the
// server's peak memory grows by what the bodies parsed at once cost (at most twice
// --max-body, 32 MiB by default), not by what encoding them would (a refused 20 MB
// prompt once cost ~400 MB, and the allocator kept it), and is given back.
TEST(ServerMemory, ConcurrentHugeRefusedPromptsStayBounded) {
    ServerProcess s({"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "256"});
    ASSERT_GT(s.port(), 0) << s.log();
    ASSERT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body("Hello")).status, 200);
    const long base = vm_kib(s.pid(), "VmRSS:");
    ASSERT_GT(base, 0);
    std::string text;
    text.reserve(20 << 20);
    while (text.size() < (size_t(20) << 20)) text += "In the beginning God created the heaven. ";
    const std::string body = chat_body(text);
    std::vector<std::thread> clients;
    std::vector<HttpReply> replies(8);
    for (int i = 0; i < 8; ++i)
        clients.emplace_back(
            [&, i] { replies[size_t(i)] = http_post(s.port(), "/v1/chat/completions", body); });
    for (auto& t : clients) t.join();
    for (const HttpReply& r : replies) {
        EXPECT_EQ(r.status, 400) << r.raw.substr(0, 300);
        EXPECT_EQ(error_code(r), "context_length_exceeded");
    }
    const long peak = vm_kib(s.pid(), "VmHWM:");
    // The replies went out before the requests' memory was freed: wait for that.
    long now = 0;
    for (int i = 0; i < 250 && (now = vm_kib(s.pid(), "VmRSS:")) - base >= 64 * 1024; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // The bound docs/reliability.md states: bodies over 1 MiB are parsed at most
    // 2 x --max-body (64 MiB) at a time, three of these, each costing about five times
    // its size while it is parsed.
    // The bound docs/reliability.md states: bodies over 1 MiB held at once up to
    // 2 x --max-body (64 MiB), and one parse at a time (about five times its body).
    EXPECT_LT(peak - base, 256 * 1024) << "peak RSS grew by " << (peak - base) / 1024 << " MiB";
    EXPECT_LT(now - base, 64 * 1024) << "RSS kept " << (now - base) / 1024 << " MiB";
    EXPECT_EQ(http_post(s.port(), "/v1/chat/completions", chat_body("Hello")).status, 200);
}

// A reply made without reading the body (the API key check answers before the route
// reads it) leaves the connection able to take the next request: the body is not
// taken for one.
TEST(ServerKeepAlive, RefusedRequestsBodyIsNotTheNextRequest) {
    ServerProcess s(
        {"-m", kModel, "--port", "0", "-t", "1", "--ctx-size", "256", "--api-key", "k1"});
    ASSERT_GT(s.port(), 0) << s.log();
    const std::string body = chat_body("Hello");
    auto post = [&](const std::string& key, bool close) {
        return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
               key + "\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n" + (close ? "Connection: close\r\n" : "") +
               "\r\n" + body;
    };
    const int c = connect_loopback(s.port());
    ASSERT_GE(c, 0);
    send_all(c, post("wrong", false));
    // The first reply, then the second request on the same connection.
    std::string raw;
    char buf[4096];
    timeval tv{30, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while (raw.find("invalid_api_key") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        ASSERT_GT(n, 0) << raw;
        raw.append(buf, size_t(n));
    }
    send_all(c, post("k1", true));
    raw += glm5::test::read_until_closed(c, 30);
    ::close(c);
    EXPECT_EQ(raw.rfind("HTTP/1.1 401", 0), 0u) << raw;
    EXPECT_NE(raw.find("HTTP/1.1 200"), std::string::npos) << raw;
}
