// The ranks of an MPI job and the messages between them. Every wait has a
// deadline (Debian's Open MPI has no fault tolerance: a stopped or killed
// rank would otherwise hang its peers forever), and waiting sleeps rather
// than spins, so that idle ranks leave the cores to the ranks that compute.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace glm5::dist {

// Whether this process was started by mpirun (Open MPI's environment), and
// the job's size and this process's rank as mpirun announced them (0 when not
// under mpirun). Reading them initialises nothing.
bool under_mpirun();
int mpirun_world_size();
int mpirun_rank();

// A rank that missed a deadline or could not be reached: the job cannot go on.
class RankError : public Error {
  public:
    RankError(int rank, const std::string& msg) : Error(msg), rank_(rank) {}
    int rank() const { return rank_; }

  private:
    int rank_;
};

struct CommStats {
    uint64_t bytes_sent = 0, bytes_received = 0;
    uint64_t messages_sent = 0, messages_received = 0;
    double seconds = 0;  // spent waiting in send / receive
};

class Comm {
  public:
    // Initialises MPI once for the process (finalised at exit). timeout_s:
    // the deadline of every exchange that has one (--rank-timeout).
    static Comm& init(double timeout_s);

    int rank() const { return rank_; }
    int size() const { return size_; }
    double timeout() const { return timeout_; }

    // Starts sending `data` without waiting for it to be taken (messages to
    // one rank with one tag arrive in the order sent); flush() waits, within
    // the timeout, for every send started, and throws RankError naming a rank
    // that took nothing.
    void isend(int to, int tag, std::vector<uint8_t> data);
    void flush();
    // Sends `data` to `to` (to each of them, all in flight at once) and
    // flushes.
    void send(int to, int tag, std::span<const uint8_t> data);
    void send_all(const std::vector<int>& to, int tag, std::span<const uint8_t> data);
    // The next message from `from` with `tag`; waits at most timeout_s
    // seconds (<= 0: for ever), then throws RankError.
    std::vector<uint8_t> recv(int from, int tag, double timeout_s);

    // Ends the whole job now (every rank), with `code`.
    [[noreturn]] void abort(int code);

    const CommStats& stats() const { return stats_; }
    void reset_stats() { stats_ = {}; }

  private:
    Comm() = default;
    struct Outgoing;
    std::vector<std::unique_ptr<Outgoing>> outgoing_;
    int rank_ = 0, size_ = 1;
    double timeout_ = 120;
    CommStats stats_;
};

// A bounds-checked message body: PODs, strings and vectors appended in order
// and read back in the same order (a short or malformed body throws).
class Wire {
  public:
    Wire() = default;
    explicit Wire(std::vector<uint8_t> bytes) : buf_(std::move(bytes)) {}

    template <class T>
    Wire& put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        buf_.insert(buf_.end(), p, p + sizeof(T));
        return *this;
    }
    template <class T>
    Wire& put_span(std::span<const T> v) {
        put(uint64_t(v.size()));
        const auto* p = reinterpret_cast<const uint8_t*>(v.data());
        buf_.insert(buf_.end(), p, p + v.size_bytes());
        return *this;
    }
    Wire& put_string(const std::string& s) {
        return put_span(std::span<const char>(s.data(), s.size()));
    }

    template <class T>
    T get() {
        T v;
        take(&v, sizeof(T));
        return v;
    }
    template <class T>
    std::vector<T> get_vector() {
        const uint64_t n = get<uint64_t>();
        if (n > (buf_.size() - pos_) / sizeof(T)) throw Error("malformed message between ranks");
        std::vector<T> v(static_cast<size_t>(n));
        take(v.data(), size_t(n) * sizeof(T));
        return v;
    }
    std::string get_string() {
        const std::vector<char> v = get_vector<char>();
        return std::string(v.begin(), v.end());
    }

    const std::vector<uint8_t>& bytes() const { return buf_; }

  private:
    void take(void* out, size_t n);
    std::vector<uint8_t> buf_;
    size_t pos_ = 0;
};

}  // namespace glm5::dist
