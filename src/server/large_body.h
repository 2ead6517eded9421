// Large request bodies (over 1 MiB: long prompts, images) without the memory they
// would otherwise leave behind. glibc keeps the top of each thread's heap (up to
// 64 MiB) once a large block there is freed, and malloc_trim does not give it back,
// so parsing big bodies on many connection threads left hundreds of MiB resident.
// Here the bytes live in their own mapping, unmapped when the request is done, and
// their JSON is parsed one body at a time on a thread of its own, so at most one
// heap holds a large parse's leftovers and parses do not add up.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

namespace glm5::server {

// Bodies above this size go through a BodyBuffer and the ParseLane.
constexpr size_t kLargeBody = size_t(1) << 20;

// A body's bytes in an anonymous mapping of its stated size (grown by remapping
// when the size was not stated).
class BodyBuffer {
  public:
    explicit BodyBuffer(size_t capacity);
    ~BodyBuffer();
    BodyBuffer(const BodyBuffer&) = delete;
    BodyBuffer& operator=(const BodyBuffer&) = delete;

    void append(const char* data, size_t n);
    std::string_view view() const { return {data_, size_}; }
    size_t size() const { return size_; }

  private:
    char* data_ = nullptr;
    size_t size_ = 0, capacity_ = 0;
};

// Runs jobs one at a time on one thread; run() waits for the job and rethrows what
// it threw.
class ParseLane {
  public:
    ParseLane();
    ~ParseLane();
    ParseLane(const ParseLane&) = delete;
    ParseLane& operator=(const ParseLane&) = delete;

    void run(const std::function<void()>& job);

  private:
    void loop();

    std::mutex submit_;  // one caller at a time
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void()>* job_ = nullptr;
    std::exception_ptr error_;
    bool done_ = false, stop_ = false;
    std::thread thread_;
};

}  // namespace glm5::server
