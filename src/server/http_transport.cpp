#include "server/http_transport.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/client_socket.h"

namespace glm5::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

thread_local int t_socket = -1;
// The head of the request the calling worker serves, as it arrived.
thread_local const std::string* t_head = nullptr;

// Rounded up, so that a wait never ends before its deadline.
int millis_left(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? int(std::min<int64_t>(left, INT32_MAX)) : 0;
}

// Waits until `events` are ready on `sock` or the deadline passes: > 0 ready,
// 0 timed out, < 0 error.
int wait_for(int sock, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{};
        p.fd = sock;
        p.events = events;
        const int r = poll(&p, 1, millis_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
        return r;
    }
}

bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
        if (!inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf))) return false;
        port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
        if (!inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf))) return false;
        port = ntohs(in->sin6_port);
    } else {
        return false;
    }
    host = buf;
    return true;
}

// A whole reply the transport makes itself: status line, JSON body, and the end of the
// connection.
std::string own_reply(int status, const std::string& body, bool retry_after) {
    const char* reason = status == 400   ? "Bad Request"
                         : status == 408 ? "Request Timeout"
                         : status == 413 ? "Payload Too Large"
                         : status == 431 ? "Request Header Fields Too Large"
                         : status == 501 ? "Not Implemented"
                         : status == 503 ? "Service Unavailable"
                                         : "Error";
    return "HTTP/1.1 " + std::to_string(status) + " " + reason +
           "\r\nContent-Type: application/json\r\n" + (retry_after ? "Retry-After: 1\r\n" : "") +
           "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
           body;
}

constexpr size_t kMaxHead = size_t(64) << 10;
// Bodies up to this size take nothing from the body budget (a slow upload of a large
// body must not hold up the small requests).
constexpr size_t kSmallBody = size_t(1) << 20;

// The body budget the calling worker's request holds until its body is parsed.
struct BodyTicket {
    Transport* transport = nullptr;
    size_t bytes = 0;
};
thread_local BodyTicket t_ticket;
// What the calling worker's request holds besides its body (BudgetHolds alive).
thread_local size_t t_held_more = 0;

// What the transport reads of a request's head before httplib does.
struct Head {
    std::string bytes;  // the request line and headers, through the blank line
    std::string path;
    std::string method;
    bool has_length = false;
    uint64_t length = 0;
    bool chunked = false;
    // Why it cannot be served (status 0: it can).
    int status = 0;
    std::string message, code;
};

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(uint8_t(a[i])) != std::tolower(uint8_t(b[i]))) return false;
    return true;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
        s.remove_suffix(1);
    return s;
}

// The request line's method and path, and what the body's headers say of its length.
void parse_head(Head& h, size_t max_body) {
    std::string_view rest = h.bytes;
    size_t eol = rest.find('\n');
    const std::string_view line = trim(rest.substr(0, eol));
    const size_t sp1 = line.find(' ');
    if (sp1 != std::string_view::npos) {
        h.method = std::string(line.substr(0, sp1));
        const std::string_view target = line.substr(sp1 + 1);
        h.path = std::string(target.substr(0, std::min(target.find(' '), target.find('?'))));
    }
    rest.remove_prefix(eol + 1);
    bool te = false;
    std::string te_value;
    while (!rest.empty()) {
        eol = rest.find('\n');
        const std::string_view l = rest.substr(0, eol);
        rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
        const size_t colon = l.find(':');
        if (colon == std::string_view::npos) continue;  // httplib skips it too
        const std::string_view name = l.substr(0, colon), value = trim(l.substr(colon + 1));
        if (iequals(name, "Content-Length")) {
            uint64_t v = 0;
            bool ok = !value.empty() && value.size() <= 19;
            for (char c : value) ok = ok && c >= '0' && c <= '9';
            if (ok)
                for (char c : value) v = v * 10 + uint64_t(c - '0');
            if (!ok || (h.has_length && v != h.length)) {
                h.status = 400;
                h.message = "Content-Length must be one number of bytes, got '" +
                            std::string(value.substr(0, 64)) + "'";
                h.code = "invalid_content_length";
                return;
            }
            h.has_length = true;
            h.length = v;
        } else if (iequals(name, "Transfer-Encoding")) {
            te = true;
            te_value = std::string(value.substr(0, 64));
        }
    }
    if (te) {
        if (!iequals(te_value, "chunked")) {
            h.status = 501;
            h.message = "Transfer-Encoding '" + te_value + "' is not supported (only chunked)";
            h.code = "unsupported_transfer_encoding";
            return;
        }
        if (h.has_length) {
            h.status = 400;
            h.message = "a request may not have both Content-Length and Transfer-Encoding";
            h.code = "invalid_content_length";
            return;
        }
        h.chunked = true;
    }
    if (h.has_length && h.length > max_body) {
        h.status = 413;
        h.message = "the request body (" + std::to_string(h.length) +
                    " bytes) is larger than the limit of " + std::to_string(max_body) + " bytes";
        h.code = "body_too_large";
    }
}

// One request's reads and writes on a connection. Reads share one deadline: the
// request must arrive whole within the read timeout however slowly it trickles.
class ConnStream final : public httplib::Stream {
  public:
    using Reply = std::function<std::string(int status)>;

    ConnStream(int sock, const TransportOptions& o, Reply reply)
        : sock_(sock),
          read_deadline_(Clock::now() + o.read_timeout),
          write_(o.write_timeout),
          reply_(std::move(reply)) {}

    Clock::time_point read_deadline() const { return read_deadline_; }

    // Reads the request's head, through its blank line and not a byte further (the
    // body, and pipelined requests after it, stay for httplib): false when the
    // connection ended, the deadline passed (timed_out()) or the head grew past
    // kMaxHead (head_too_large()).
    bool read_head(std::string& head) {
        char buf[16384];
        for (;;) {
            const int r = wait_for(sock_, POLLIN, read_deadline_);
            if (r <= 0) {
                timed_out_ = r == 0;
                return false;
            }
            const size_t room = std::min(sizeof(buf), kMaxHead + 1 - head.size());
            const ssize_t n = recv(sock_, buf, room, MSG_PEEK | MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n <= 0) return false;
            // The blank line ends the head: "\n\r\n" (httplib's lines end in CRLF;
            // one ending in a bare LF before it is skipped).
            const size_t keep = std::min<size_t>(head.size(), 2);
            std::string_view seen(buf, size_t(n));
            std::string window = head.substr(head.size() - keep) + std::string(seen);
            const size_t end = window.find("\n\r\n");
            const size_t take = end == std::string::npos ? size_t(n) : end + 3 - keep;
            const ssize_t got = recv(sock_, buf, take, MSG_DONTWAIT);
            if (got <= 0) return false;
            head.append(buf, size_t(got));
            if (end != std::string::npos && size_t(got) == take) {
                head_ = head;
                return true;
            }
            if (head.size() > kMaxHead) {
                head_too_large_ = true;
                return false;
            }
        }
    }
    // Adds a header line to the head httplib reads (the request keeps its own head).
    void add_header(const std::string& line) {
        const size_t end = head_.rfind("\r\n\r\n");
        const size_t at = end != std::string::npos ? end + 2 : head_.size() - 2;
        head_.insert(at, line + "\r\n");
    }
    // The body may be at most `cap` bytes as sent (chunk framing included).
    void set_body_cap(uint64_t cap) { body_cap_ = cap; }
    uint64_t body_read() const { return body_read_; }
    // Reads and drops `n` more bytes of the body, if that is little (64 KiB) and
    // arrives in time; false otherwise.
    bool skip_body(uint64_t n) {
        if (n > (64u << 10)) return false;
        char buf[4096];
        while (n > 0) {
            const ssize_t got = read(buf, size_t(std::min<uint64_t>(n, sizeof(buf))));
            if (got <= 0) return false;
            n -= uint64_t(got);
        }
        return true;
    }

    bool is_readable() const override {
        return head_at_ < head_.size() || wait_for(sock_, POLLIN, read_deadline_) > 0;
    }
    // Room to write within the write timeout, and the peer still there: httplib's
    // DataSink::is_writable, which a streaming reply checks between chunks.
    bool is_writable() const override {
        return wait_for(sock_, POLLOUT, Clock::now() + write_) > 0 && !client_gone(sock_);
    }

    ssize_t read(char* ptr, size_t size) override {
        if (head_at_ < head_.size()) {
            const size_t n = std::min(size, head_.size() - head_at_);
            std::memcpy(ptr, head_.data() + head_at_, n);
            head_at_ += n;
            return ssize_t(n);
        }
        if (body_read_ >= body_cap_) {
            over_limit_ = true;
            return -1;
        }
        size = size_t(std::min<uint64_t>(size, body_cap_ - body_read_ + 1));
        for (;;) {
            const int r = wait_for(sock_, POLLIN, read_deadline_);
            if (r <= 0) {
                timed_out_ = r == 0;
                return -1;
            }
            const ssize_t n = recv(sock_, ptr, size, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n > 0) {
                body_read_ += uint64_t(n);
                if (body_read_ > body_cap_) {
                    over_limit_ = true;
                    return -1;
                }
            }
            return n;
        }
    }

    ssize_t write(const char* ptr, size_t size) override {
        if (timed_out_ || over_limit_) {
            // httplib answers a request it could not read with a 400; one that did
            // not arrive in time gets a 408 instead, one whose body ran past the
            // limit a 413, and the connection ends.
            if (!sent_own_) {
                sent_own_ = true;
                const std::string reply = reply_(timed_out_ ? 408 : 413);
                (void)send(sock_, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
            }
            return ssize_t(size);
        }
        const Clock::time_point deadline = Clock::now() + write_;
        for (;;) {
            if (wait_for(sock_, POLLOUT, deadline) <= 0) return -1;
            const ssize_t n = send(sock_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            return n;
        }
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage a{};
        socklen_t len = sizeof(a);
        if (getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage a{};
        socklen_t len = sizeof(a);
        if (getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
    }
    int socket() const override { return sock_; }

    // A read ran into the request's deadline, or its body past the limit: the
    // connection is to be closed.
    bool timed_out() const { return timed_out_; }
    bool over_limit() const { return over_limit_; }
    bool head_too_large() const { return head_too_large_; }

  private:
    int sock_;
    bool timed_out_ = false, over_limit_ = false, head_too_large_ = false, sent_own_ = false;
    Clock::time_point read_deadline_;
    milliseconds write_;
    Reply reply_;
    std::string head_;
    size_t head_at_ = 0;
    uint64_t body_read_ = 0, body_cap_ = UINT64_MAX;
};

}  // namespace

int client_socket() {
    return t_socket;
}

std::string raw_header(std::string_view name) {
    if (!t_head) return "";
    std::string_view rest = *t_head;
    rest.remove_prefix(std::min(rest.size(), rest.find('\n') + 1));  // the request line
    while (!rest.empty()) {
        const size_t eol = rest.find('\n');
        const std::string_view l = rest.substr(0, eol);
        rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
        const size_t colon = l.find(':');
        if (colon != std::string_view::npos && iequals(l.substr(0, colon), name))
            return std::string(trim(l.substr(colon + 1)));
    }
    return "";
}

void body_parsed() {
    BodyTicket t = std::exchange(t_ticket, BodyTicket{});
    if (t.transport && t.bytes > 0) t.transport->release_body(t.bytes);
}

// After a last reply on a connection the client may still be sending: read what
// it sends for a moment, since closing a socket with unread data resets the
// connection and the client could lose the reply.
void finish_reply(int sock) {
    ::shutdown(sock, SHUT_WR);
    const Clock::time_point end = Clock::now() + milliseconds(200);
    char buf[4096];
    while (wait_for(sock, POLLIN, end) > 0)
        if (recv(sock, buf, sizeof(buf), MSG_DONTWAIT) <= 0) break;
}

Transport::Transport(const TransportOptions& opt) : opt_(opt) {
    if (opt_.body_budget == 0) opt_.body_budget = 2 * opt_.max_body;
    const size_t threads =
        opt_.max_threads > 0 ? size_t(opt_.max_threads) : size_t(opt_.max_connections) + 16;
    new_task_queue = [threads] { return new ConnectionWorkers(threads); };
    set_keep_alive_timeout(std::max<time_t>(1, opt_.keep_alive.count() / 1000));
    set_payload_max_length(opt_.max_body);
    error_body_ = [](const std::string&, int status, const std::string& message,
                     const std::string& code) {
        return "{\"error\":{\"message\":" + nlohmann::json(message).dump() + ",\"type\":\"" +
               (status >= 500 ? "server_error" : "invalid_request_error") +
               "\",\"param\":null,\"code\":" + nlohmann::json(code).dump() + "}}";
    };
}

size_t Transport::body_bytes_held() const {
    std::lock_guard<std::mutex> lk(body_mu_);
    return body_held_;
}

bool Transport::acquire_body(size_t bytes, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(body_mu_);
    // One body larger than the whole budget still runs, alone.
    const bool fits = body_cv_.wait_until(
        lk, deadline, [&] { return body_held_ == 0 || body_held_ + bytes <= opt_.body_budget; });
    if (fits) body_held_ += bytes;
    return fits;
}

bool Transport::acquire_more(size_t bytes, size_t own) {
    std::unique_lock<std::mutex> lk(body_mu_);
    // As a body: what is larger than the budget runs alone (this request's own hold aside).
    const bool fits = body_cv_.wait_until(lk, Clock::now() + opt_.read_timeout, [&] {
        return body_held_ == own || body_held_ + bytes <= opt_.body_budget;
    });
    if (fits) body_held_ += bytes;
    return fits;
}

BudgetHold::BudgetHold(size_t bytes) {
    if (!t_ticket.transport || bytes == 0) return;
    held_ = t_ticket.transport->acquire_more(bytes, t_ticket.bytes + t_held_more);
    if (held_) {
        transport_ = t_ticket.transport;
        bytes_ = bytes;
        counter_ = &t_held_more;
        t_held_more += bytes;
    }
}

BudgetHold::~BudgetHold() {
    if (!transport_) return;
    *counter_ -= bytes_;
    transport_->release_body(bytes_);
}

void Transport::release_body(size_t bytes) {
    {
        std::lock_guard<std::mutex> lk(body_mu_);
        body_held_ -= bytes;
    }
    body_cv_.notify_all();
}

void Transport::reply_and_close(int sock, const std::string& path, int status,
                                const std::string& message, const std::string& code,
                                bool retry_after) {
    ++refused_requests_;
    const std::string reply =
        own_reply(status, error_body_(path, status, message, code), retry_after);
    // The reply is small: a socket's send buffer takes it at once.
    (void)send(sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    finish_reply(sock);
}

bool Transport::process_and_close_socket(int sock) {
    struct Open {
        std::atomic<int>& n;
        int now;
        explicit Open(std::atomic<int>& c) : n(c), now(++c) {}
        ~Open() {
            --n;
            t_socket = -1;
        }
    } open(open_);
    bool ok = false;
    if (open.now > opt_.max_connections) {
        refuse(sock);
    } else {
        t_socket = sock;
        size_t left = keep_alive_max_count_;
        // Between requests: wait for the next one in short steps, so that a
        // stopping server is not held up by idle keep-alive connections.
        auto next_request = [&] {
            const Clock::time_point idle_end = Clock::now() + opt_.keep_alive;
            while (svr_sock_ != INVALID_SOCKET) {
                const auto step = std::min(idle_end, Clock::now() + milliseconds(100));
                const int r = wait_for(sock, POLLIN, step);
                if (r != 0) return r > 0;
                if (Clock::now() >= idle_end) return false;
            }
            return false;
        };
        while (left > 0 && next_request()) {
            Head head;
            ConnStream strm(sock, opt_, [&](int status) {
                ++refused_requests_;
                const std::string msg = status == 408
                                            ? "the request did not arrive within the read timeout"
                                            : "the request body is larger than the limit of " +
                                                  std::to_string(opt_.max_body) + " bytes";
                return own_reply(status,
                                 error_body_(head.path, status, msg,
                                             status == 408 ? "request_timeout" : "body_too_large"),
                                 false);
            });
            if (!strm.read_head(head.bytes)) {
                if (strm.timed_out())
                    reply_and_close(sock, head.path, 408,
                                    "the request did not arrive within the read timeout",
                                    "request_timeout");
                else if (strm.head_too_large())
                    reply_and_close(sock, head.path, 431,
                                    "the request line and headers are larger than " +
                                        std::to_string(kMaxHead) + " bytes",
                                    "headers_too_large");
                break;
            }
            parse_head(head, opt_.max_body);
            if (head.status != 0) {
                reply_and_close(sock, head.path, head.status, head.message, head.code);
                break;
            }
            // The body as sent: a stated length is read to the byte; chunk framing may
            // double a body's size. A request that states neither has no body (RFC 9112,
            // 6.3), which httplib is told, since it would read a POST's to the end.
            if (!head.has_length && !head.chunked) {
                head.has_length = true;
                head.length = 0;
                if (head.method == "POST" || head.method == "PUT" || head.method == "PATCH")
                    strm.add_header("Content-Length: 0");
            }
            const size_t stated = head.has_length ? size_t(head.length) : opt_.max_body;
            const size_t held = stated > kSmallBody ? stated : 0;
            strm.set_body_cap(head.has_length ? head.length : 2 * uint64_t(opt_.max_body) + 65536);
            if (held > 0 && !acquire_body(held, strm.read_deadline())) {
                reply_and_close(sock, head.path, 503,
                                "the server holds too many request bodies; retry later",
                                "server_busy", true);
                break;
            }
            t_ticket = {this, held};
            t_head = &head.bytes;
            bool closed = false;
            ok = process_request(strm, left == 1, closed, nullptr);
            t_head = nullptr;
            body_parsed();
            // A large body's parse leaves the allocator holding its peak: give it
            // back to the system.
            if (stated > kSmallBody) malloc_trim(0);
            if (strm.timed_out() || strm.over_limit()) {
                finish_reply(sock);
                break;
            }
            if (!ok || closed) break;
            // A reply made without reading the body (a 401 from the API key check)
            // leaves it in the socket, where it would be taken for the next request:
            // read a small rest to keep the connection, else end it. A chunked body's
            // end is not known here: its connection ends.
            if (head.chunked) break;
            if (head.has_length && strm.body_read() < head.length &&
                !strm.skip_body(head.length - strm.body_read()))
                break;
            --left;
        }
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
}

void Transport::refuse(int sock) {
    // A health probe among them is answered: its request line within a second.
    if (health_) {
        char buf[64];
        size_t got = 0;
        const Clock::time_point end = Clock::now() + milliseconds(1000);
        while (got < sizeof(buf) && std::memchr(buf, '\n', got) == nullptr &&
               wait_for(sock, POLLIN, end) > 0) {
            const ssize_t n = recv(sock, buf + got, sizeof(buf) - got, MSG_DONTWAIT);
            if (n <= 0) break;
            got += size_t(n);
        }
        const std::string_view line(buf, got);
        if (line.rfind("GET /health ", 0) == 0 || line.rfind("GET /v1/health ", 0) == 0) {
            const auto [status, body] = health_();
            const std::string reply =
                "HTTP/1.1 " + std::to_string(status) +
                (status == 200 ? " OK" : " Service Unavailable") +
                "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body;
            (void)send(sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
            finish_reply(sock);
            return;
        }
    }
    ++refused_;
    const std::string body =
        "{\"error\":{\"message\":\"the server has too many open connections (" +
        std::to_string(opt_.max_connections) +
        "); retry later\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_"
        "connections\"}}";
    const std::string reply = own_reply(503, body, true);
    // A fresh socket's send buffer takes the whole reply at once.
    (void)send(sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    finish_reply(sock);
}

ConnectionWorkers::~ConnectionWorkers() {
    shutdown();
}

void ConnectionWorkers::enqueue(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        jobs_.push_back(std::move(fn));
        // Jobs nobody waits for yet: start a worker for this one.
        if (jobs_.size() > idle_ && threads_.size() < max_threads_)
            threads_.emplace_back([this] { work(); });
    }
    cv_.notify_one();
}

void ConnectionWorkers::shutdown() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_ && threads_.empty()) return;
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    std::lock_guard<std::mutex> lk(mu_);
    threads_.clear();
}

void ConnectionWorkers::work() {
    for (;;) {
        std::function<void()> fn;
        {
            std::unique_lock<std::mutex> lk(mu_);
            ++idle_;
            cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
            --idle_;
            if (jobs_.empty()) return;  // stopping, and nothing left to serve
            fn = std::move(jobs_.front());
            jobs_.pop_front();
        }
        fn();
    }
}

}  // namespace glm5::server
