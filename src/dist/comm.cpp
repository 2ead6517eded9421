#include "dist/comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace glm5::dist {

namespace {

int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : 0;
}

using Clock = std::chrono::steady_clock;

std::string mpi_error(int code) {
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(code, msg, &n);
    return std::string(msg, size_t(n));
}

// Polls `done` until it is true or the deadline passes, sleeping between
// polls (a few microseconds at first, then up to 200 us: an idle rank costs
// almost no CPU, a busy exchange little latency).
template <class F>
bool poll_until(F done, Clock::time_point deadline, bool forever) {  // NOLINT
    auto nap = std::chrono::microseconds(2);
    while (true) {
        if (done()) return true;
        if (!forever && Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
}

void finalize_at_exit() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

}  // namespace

bool under_mpirun() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}
int mpirun_world_size() {
    return env_int("OMPI_COMM_WORLD_SIZE");
}
int mpirun_rank() {
    return env_int("OMPI_COMM_WORLD_RANK");
}

Comm& Comm::init(double timeout_s) {
    static Comm* comm = nullptr;
    if (comm) return *comm;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        throw Error("MPI could not be initialised");
    std::atexit(finalize_at_exit);
    // Errors come back as codes (turned into RankError) instead of aborting.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    comm = new Comm();
    MPI_Comm_rank(MPI_COMM_WORLD, &comm->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &comm->size_);
    comm->timeout_ = timeout_s;
    return *comm;
}

void Comm::send(int to, int tag, std::span<const uint8_t> data) {
    send_all({to}, tag, data);
}

void Comm::send_all(const std::vector<int>& to, int tag, std::span<const uint8_t> data) {
    for (int r : to) isend(r, tag, std::vector<uint8_t>(data.begin(), data.end()));
    flush();
}

struct Comm::Outgoing {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<uint8_t> data;
    int to = 0;
};

void Comm::isend(int to, int tag, std::vector<uint8_t> data) {
    if (data.size() > size_t(INT_MAX))
        throw Error("a message between ranks is over 2 GiB (" + std::to_string(data.size()) +
                    " bytes)");
    auto o = std::make_unique<Outgoing>();
    o->data = std::move(data);
    o->to = to;
    const int rc =
        MPI_Isend(o->data.data(), int(o->data.size()), MPI_BYTE, to, tag, MPI_COMM_WORLD, &o->req);
    if (rc != MPI_SUCCESS)
        throw RankError(to, "rank " + std::to_string(rank_) + " cannot send to rank " +
                                std::to_string(to) + ": " + mpi_error(rc));
    stats_.bytes_sent += o->data.size();
    ++stats_.messages_sent;
    outgoing_.push_back(std::move(o));
}

void Comm::flush() {
    const auto t0 = Clock::now();
    const auto deadline =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
    for (auto& o : outgoing_) {
        int rc = MPI_SUCCESS;
        const bool ok = poll_until(
            [&] {
                int flag = 0;
                rc = MPI_Test(&o->req, &flag, MPI_STATUS_IGNORE);
                return flag || rc != MPI_SUCCESS;
            },
            deadline, false);
        if (rc != MPI_SUCCESS)
            throw RankError(
                o->to, "rank " + std::to_string(o->to) + " cannot be reached: " + mpi_error(rc));
        if (!ok)
            throw RankError(o->to, "rank " + std::to_string(o->to) + " took no message within " +
                                       std::to_string(int(timeout_)) +
                                       " s (--rank-timeout): stopped, hung or gone");
    }
    outgoing_.clear();
    stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<uint8_t> Comm::recv(int from, int tag, double timeout_s) {
    const auto t0 = Clock::now();
    MPI_Status st;
    int rc = MPI_SUCCESS;
    const bool ok = poll_until(
        [&] {
            int flag = 0;
            rc = MPI_Iprobe(from, tag, MPI_COMM_WORLD, &flag, &st);
            return flag || rc != MPI_SUCCESS;
        },
        t0 + std::chrono::duration_cast<Clock::duration>(
                 std::chrono::duration<double>(std::max(timeout_s, 0.0))),
        timeout_s <= 0);
    if (rc != MPI_SUCCESS)
        throw RankError(from,
                        "rank " + std::to_string(from) + " cannot be reached: " + mpi_error(rc));
    if (!ok)
        throw RankError(from, "rank " + std::to_string(from) + " sent nothing within " +
                                  std::to_string(int(timeout_s)) +
                                  " s (--rank-timeout): stopped, hung or gone");
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    std::vector<uint8_t> buf(size_t(std::max(n, 0)));
    rc = MPI_Recv(buf.data(), n, MPI_BYTE, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        throw RankError(from, "receiving from rank " + std::to_string(from) + ": " + mpi_error(rc));
    stats_.bytes_received += buf.size();
    ++stats_.messages_received;
    // Waiting for the next command is idleness, not communication.
    if (timeout_s > 0) stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return buf;
}

void Comm::abort(int code) {
    // Exiting with a non-zero code makes mpirun end every other rank (a
    // stopped one included); MPI_Abort would try to reach the lost rank first.
    std::fflush(stderr);
    std::_Exit(code);
}

void Wire::take(void* out, size_t n) {
    if (n > buf_.size() - pos_) throw Error("malformed message between ranks");
    std::memcpy(out, buf_.data() + pos_, n);
    pos_ += n;
}

}  // namespace glm5::dist
