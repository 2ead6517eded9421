#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "server/client_socket.h"

namespace glm5::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

thread_local int t_socket = -1;

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

// One request's reads and writes on a connection. Reads share one deadline: the
// request must arrive whole within the read timeout however slowly it trickles.
class ConnStream final : public httplib::Stream {
  public:
    ConnStream(int sock, const TransportOptions& o)
        : sock_(sock), read_deadline_(Clock::now() + o.read_timeout), write_(o.write_timeout) {}

    bool is_readable() const override { return wait_for(sock_, POLLIN, read_deadline_) > 0; }
    // Room to write within the write timeout, and the peer still there: httplib's
    // DataSink::is_writable, which a streaming reply checks between chunks.
    bool is_writable() const override {
        return wait_for(sock_, POLLOUT, Clock::now() + write_) > 0 && !client_gone(sock_);
    }

    ssize_t read(char* ptr, size_t size) override {
        for (;;) {
            const int r = wait_for(sock_, POLLIN, read_deadline_);
            if (r <= 0) {
                timed_out_ = r == 0;
                return -1;
            }
            const ssize_t n = recv(sock_, ptr, size, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            return n;
        }
    }

    ssize_t write(const char* ptr, size_t size) override {
        if (timed_out_) {
            // httplib answers a request it could not read with a 400; one that
            // did not arrive in time gets a 408 instead, and the connection ends.
            if (!sent_408_) {
                sent_408_ = true;
                const std::string body =
                    "{\"error\":{\"message\":\"the request did not arrive within the read "
                    "timeout\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":"
                    "\"request_timeout\"}}";
                const std::string reply =
                    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                    "Connection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
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

    // A read ran into the request's deadline: the connection is to be closed.
    bool timed_out() const { return timed_out_; }

  private:
    int sock_;
    bool timed_out_ = false, sent_408_ = false;
    Clock::time_point read_deadline_;
    milliseconds write_;
};

}  // namespace

int client_socket() {
    return t_socket;
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
    const size_t threads =
        opt_.max_threads > 0 ? size_t(opt_.max_threads) : size_t(opt_.max_connections) + 16;
    new_task_queue = [threads] { return new ConnectionWorkers(threads); };
    set_keep_alive_timeout(std::max<time_t>(1, opt_.keep_alive.count() / 1000));
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
            ConnStream strm(sock, opt_);
            bool closed = false;
            ok = process_request(strm, left == 1, closed, nullptr);
            if (strm.timed_out()) {
                finish_reply(sock);
                break;
            }
            if (!ok || closed) break;
            --left;
        }
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
}

void Transport::refuse(int sock) {
    ++refused_;
    const std::string body =
        "{\"error\":{\"message\":\"the server has too many open connections (" +
        std::to_string(opt_.max_connections) +
        "); retry later\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_"
        "connections\"}}";
    const std::string reply =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: "
        "1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
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
