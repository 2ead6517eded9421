// The server's side of the HTTP connections, under cpp-httplib (0.11).
//
// httplib reads and writes a connection through an httplib::Stream and serves it on
// a worker of its task queue. Both are replaced here, so that:
//   - open connections are capped: one beyond the cap gets a 503 (OpenAI's error shape,
//     Retry-After) and is closed, unless its request line (read for at most a second)
//     asks for GET /health, which is answered;
//   - a request must arrive whole within the read timeout (head and body together),
//     so a client that trickles bytes cannot hold a worker longer than that; a write
//     that makes no progress for the write timeout drops the client;
//   - every connection gets a worker of its own at once (threads are started as
//     connections need them, up to the cap), so slow clients delay nobody else;
//   - a handler knows its connection's socket (client_socket()), to notice a client
//     that goes away while its reply is generated;
//   - a request's head is read here before httplib parses it, so that what can be
//     refused from the head is refused at once and the connection closed: a
//     Content-Length that is not a number (400) or over the body limit (413, without
//     reading the body), an unknown Transfer-Encoding (501), a head over 64 KiB (431),
//     a head that does not arrive within the read timeout (408);
//   - a chunked body is cut off at the limit (413), since httplib bounds only stated
//     lengths; a request with neither a length nor chunks has no body (RFC 9112), where
//     httplib would wait for a POST's until the read timeout;
//   - the bodies held in memory at once are bounded (TransportOptions::body_budget): a
//     request whose body would go over waits for room up to the read timeout, then
//     gets a 503 with Retry-After.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace glm5::server {

struct TransportOptions {
    int max_connections = 256;
    std::chrono::milliseconds read_timeout{30000};   // a whole request, and any one wait
    std::chrono::milliseconds write_timeout{30000};  // a write that makes no progress
    std::chrono::milliseconds keep_alive{3000};      // idle time between requests
    int max_threads = 0;  // workers; 0: max_connections + a few for refusals
    size_t max_body = size_t(32) << 20;
    // Bytes of request bodies over 1 MiB (their stated length, or max_body when
    // unstated) read and parsed at once over all connections: from the head until
    // the handler has parsed the body (body_parsed()). A body costs about five times
    // its size while it is parsed. 0: twice max_body.
    size_t body_budget = 0;
};

// Replies the transport makes itself (errors from a request's head, 408, 503): the
// body for `status` in the error shape of the API `path` belongs to.
using TransportErrorBody = std::function<std::string(
    const std::string& path, int status, const std::string& message, const std::string& code)>;

// The socket of the connection the calling thread is serving, -1 outside a
// connection's worker.
int client_socket();
// Header `name` (any case) of the request the calling worker serves, as the client sent it
// ("" when absent): httplib's Request decodes %xx in header values, which would let
// "Bearer%20KEY" pass for "Bearer KEY" and make a key holding '%' impossible to send.
std::string raw_header(std::string_view name);
// The handler running on the calling worker has parsed its request's body: the body
// budget it held is released (the request may go on generating for a long time).
void body_parsed();
// Encoding text whole takes up to about kEncodeCost bytes a byte of it (a run of
// punctuation is one word to the byte-pair merges): what /tokenize and count_tokens hold.
inline constexpr size_t kEncodeCost = 64;

// Memory a request makes from a small body beyond the body (the pixels of its images)
// charged to the body budget while the hold lives, so that what a body can make the server
// hold stays within the budget whatever the body's size. held() is false when the bytes did
// not fit within the read timeout (the caller answers 503); outside a connection's worker
// (the parser's tests) a hold holds nothing and is held.
class BudgetHold {
  public:
    explicit BudgetHold(size_t bytes);
    ~BudgetHold();
    BudgetHold(const BudgetHold&) = delete;
    BudgetHold& operator=(const BudgetHold&) = delete;
    bool held() const { return held_; }

  private:
    class Transport* transport_ = nullptr;
    size_t bytes_ = 0;
    size_t* counter_ = nullptr;  // the holding worker's own total (its thread's)
    bool held_ = true;
};
// Ends the sending side after a last reply and reads what the client still sends
// for a moment (so the reply is not lost to a reset); the caller closes.
void finish_reply(int sock);

class Transport : public httplib::Server {
  public:
    explicit Transport(const TransportOptions& opt);

    int open_connections() const { return open_; }
    uint64_t refused_connections() const { return refused_; }
    // Requests refused or dropped from their head (400, 408, 413, 431, 501, 503).
    uint64_t refused_requests() const { return refused_requests_; }
    // Bytes of request bodies held now (for the body budget).
    size_t body_bytes_held() const;
    const TransportOptions& options() const { return opt_; }
    void set_error_body(TransportErrorBody f) { error_body_ = std::move(f); }
    // What GET /health answers (status, JSON body) on a connection beyond the cap, which
    // gets nothing else: a probe must see a server that slow clients keep busy as busy, not
    // as gone.
    void set_health(std::function<std::pair<int, std::string>()> f) { health_ = std::move(f); }

    // Gives back body budget (body_parsed()).
    void release_body(size_t bytes);
    // Takes `bytes` more for a request already holding `own`: false at the read timeout.
    bool acquire_more(size_t bytes, size_t own);

  private:
    // httplib calls this on a worker for every accepted connection.
    bool process_and_close_socket(int sock) override;
    void refuse(int sock);
    // A reply made here, then the connection ends.
    void reply_and_close(int sock, const std::string& path, int status, const std::string& message,
                         const std::string& code, bool retry_after = false);
    // Waits until `bytes` more fit the body budget (false at the deadline).
    bool acquire_body(size_t bytes, std::chrono::steady_clock::time_point deadline);

    TransportOptions opt_;
    TransportErrorBody error_body_;
    std::function<std::pair<int, std::string>()> health_;
    std::atomic<int> open_{0};
    std::atomic<uint64_t> refused_{0};
    std::atomic<uint64_t> refused_requests_{0};
    mutable std::mutex body_mu_;
    std::condition_variable body_cv_;
    size_t body_held_ = 0;
};

// A task queue that starts a worker for each job that finds none idle, up to
// max_threads; jobs beyond that wait for one.
class ConnectionWorkers : public httplib::TaskQueue {
  public:
    explicit ConnectionWorkers(size_t max_threads) : max_threads_(max_threads) {}
    ~ConnectionWorkers() override;
    void enqueue(std::function<void()> fn) override;
    void shutdown() override;

  private:
    void work();

    size_t max_threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t idle_ = 0;
    bool stopping_ = false;
};

}  // namespace glm5::server
