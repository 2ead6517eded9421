// The server's side of the HTTP connections, under cpp-httplib (0.11).
//
// httplib reads and writes a connection through an httplib::Stream and serves it on
// a worker of its task queue. Both are replaced here, so that:
//   - open connections are capped: one beyond the cap gets an immediate 503 (OpenAI's
//     error shape, Retry-After) and is closed, without a worker waiting on it;
//   - a request must arrive whole within the read timeout (head and body together),
//     so a client that trickles bytes cannot hold a worker longer than that; a write
//     that makes no progress for the write timeout drops the client;
//   - every connection gets a worker of its own at once (threads are started as
//     connections need them, up to the cap), so slow clients delay nobody else;
//   - a handler knows its connection's socket (client_socket()), to notice a client
//     that goes away while its reply is generated.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace glm5::server {

struct TransportOptions {
    int max_connections = 256;
    std::chrono::milliseconds read_timeout{30000};   // a whole request, and any one wait
    std::chrono::milliseconds write_timeout{30000};  // a write that makes no progress
    std::chrono::milliseconds keep_alive{3000};      // idle time between requests
    int max_threads = 0;  // workers; 0: max_connections + a few for refusals
};

// The socket of the connection the calling thread is serving, -1 outside a
// connection's worker.
int client_socket();
// Ends the sending side after a last reply and reads what the client still sends
// for a moment (so the reply is not lost to a reset); the caller closes.
void finish_reply(int sock);

class Transport : public httplib::Server {
  public:
    explicit Transport(const TransportOptions& opt);

    int open_connections() const { return open_; }
    uint64_t refused_connections() const { return refused_; }
    const TransportOptions& options() const { return opt_; }

  private:
    // httplib calls this on a worker for every accepted connection.
    bool process_and_close_socket(int sock) override;
    void refuse(int sock);

    TransportOptions opt_;
    std::atomic<int> open_{0};
    std::atomic<uint64_t> refused_{0};
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
