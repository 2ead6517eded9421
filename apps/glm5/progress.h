// Progress of a long write on stderr: a line redrawn in place on a terminal, a line per
// tenth of the work elsewhere (a log stays short).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace glm5::app {

// progress(done, total) in bytes; nothing when quiet.
std::function<void(uint64_t, uint64_t)> byte_progress(bool quiet);

// "1.23 GiB" / "45.67 MiB".
std::string gib(uint64_t bytes);

}  // namespace glm5::app
