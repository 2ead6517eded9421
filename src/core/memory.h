// What memory the machine offers this process: the numbers every memory
// decision (weight copies, the context plan) starts from.
#pragma once

#include <cstdint>
#include <string>

namespace glm5 {

struct MemoryAvailable {
    uint64_t bytes = 0;  // the smaller of the sources below; 0 when unknown
    std::string source;  // which source set it: "MemAvailable", "cgroup", "GLM5_MEM_AVAILABLE"
    uint64_t mem_available = 0;    // /proc/meminfo MemAvailable (0: unknown)
    uint64_t cgroup_headroom = 0;  // the cgroup's limit minus its usage (0: no limit)
};

// MemAvailable, bounded by the cgroup's memory.max (v2) or
// memory.limit_in_bytes (v1) headroom. GLM5_MEM_AVAILABLE=BYTES replaces
// both: how tests and users simulate a smaller machine.
MemoryAvailable available_memory();

// Anonymous resident memory of this process (RssAnon) and its peak resident
// set (VmHWM), in bytes; 0 when unknown.
uint64_t rss_anon_bytes();
uint64_t peak_rss_bytes();

}  // namespace glm5
