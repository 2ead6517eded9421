#include "server/large_body.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace glm5::server {

BodyBuffer::BodyBuffer(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {
    void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
}

BodyBuffer::~BodyBuffer() {
    if (data_) munmap(data_, capacity_);
}

void BodyBuffer::append(const char* data, size_t n) {
    if (size_ + n > capacity_) {
        const size_t want = std::max(capacity_ * 2, size_ + n);
        void* p = mremap(data_, capacity_, want, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) throw std::bad_alloc();
        data_ = static_cast<char*>(p);
        capacity_ = want;
    }
    std::memcpy(data_ + size_, data, n);
    size_ += n;
}

ParseLane::ParseLane() : thread_([this] { loop(); }) {}

ParseLane::~ParseLane() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void ParseLane::run(const std::function<void()>& job) {
    std::lock_guard<std::mutex> one(submit_);
    std::unique_lock<std::mutex> lk(mu_);
    job_ = &job;
    done_ = false;
    error_ = nullptr;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ParseLane::loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || job_; });
        if (!job_) return;
        const std::function<void()>* job = std::exchange(job_, nullptr);
        lk.unlock();
        std::exception_ptr err;
        try {
            (*job)();
        } catch (...) {
            err = std::current_exception();
        }
        lk.lock();
        error_ = err;
        done_ = true;
        cv_.notify_all();
    }
}

}  // namespace glm5::server
