#include "core/log.h"

#include <atomic>
#include <cstdarg>

namespace glm5 {

namespace {
std::atomic<int> g_level{int(LogLevel::Info)};

void vlog(const char* fmt, va_list ap) {
    std::vfprintf(stderr, fmt, ap);
    std::fflush(stderr);
}
}  // namespace

void set_log_level(LogLevel level) {
    g_level.store(int(level));
}
LogLevel log_level() {
    return LogLevel(g_level.load());
}

void log_info(const char* fmt, ...) {
    if (g_level.load() < int(LogLevel::Info)) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void log_debug(const char* fmt, ...) {
    if (g_level.load() < int(LogLevel::Debug)) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

}  // namespace glm5
