#include "core/memory.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace glm5 {

namespace {

// "Key:   123 kB" from a /proc file, in bytes (0 when absent).
uint64_t proc_kb(const char* path, const std::string& key) {
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line))
        if (line.compare(0, key.size(), key) == 0) {
            std::istringstream is(line.substr(key.size()));
            uint64_t kb = 0;
            is >> kb;
            return kb * 1024;
        }
    return 0;
}

// The first number in a file, or 0 ("max" and missing files mean no limit).
uint64_t file_number(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    if (!(f >> s) || s.empty() || s[0] < '0' || s[0] > '9') return 0;
    return std::strtoull(s.c_str(), nullptr, 10);
}

// This process's cgroup directory under /sys/fs/cgroup (v2: the "0::" line).
std::string cgroup_dir() {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line))
        if (line.compare(0, 3, "0::") == 0) return "/sys/fs/cgroup" + line.substr(3);
    return "";
}

uint64_t cgroup_headroom() {
    // v2: the process's own cgroup and its ancestors each may set memory.max.
    uint64_t best = 0;
    std::string dir = cgroup_dir();
    while (!dir.empty() && dir.size() >= std::string("/sys/fs/cgroup").size()) {
        const uint64_t max = file_number(dir + "/memory.max");
        if (max > 0) {
            const uint64_t cur = file_number(dir + "/memory.current");
            const uint64_t room = max > cur ? max - cur : 1;
            if (best == 0 || room < best) best = room;
        }
        if (dir == "/sys/fs/cgroup") break;
        dir = dir.substr(0, dir.find_last_of('/'));
    }
    if (best) return best;
    // v1.
    const uint64_t lim = file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (lim > 0 && lim < (uint64_t(1) << 60)) {
        const uint64_t use = file_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        return lim > use ? lim - use : 1;
    }
    return 0;
}

}  // namespace

MemoryAvailable available_memory() {
    MemoryAvailable m;
    if (const char* e = std::getenv("GLM5_MEM_AVAILABLE")) {
        m.bytes = std::strtoull(e, nullptr, 10);
        m.source = "GLM5_MEM_AVAILABLE";
        return m;
    }
    m.mem_available = proc_kb("/proc/meminfo", "MemAvailable:");
    m.cgroup_headroom = cgroup_headroom();
    m.bytes = m.mem_available;
    m.source = "MemAvailable";
    if (m.cgroup_headroom && (m.bytes == 0 || m.cgroup_headroom < m.bytes)) {
        m.bytes = m.cgroup_headroom;
        m.source = "cgroup";
    }
    return m;
}

uint64_t rss_anon_bytes() {
    return proc_kb("/proc/self/status", "RssAnon:");
}
uint64_t peak_rss_bytes() {
    return proc_kb("/proc/self/status", "VmHWM:");
}

}  // namespace glm5
