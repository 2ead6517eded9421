// Diagnostics go to stderr; stdout is reserved for machine-readable output.
#pragma once

#include <cstdio>
#include <string>

namespace glm5 {

enum class LogLevel { Quiet = 0, Info = 1, Debug = 2 };

void set_log_level(LogLevel level);
LogLevel log_level();

// printf-style message to stderr when the level is enabled.
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace glm5
