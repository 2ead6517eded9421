#include "runtime/slot_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace glm5::runtime {

namespace {

constexpr char kMagic[8] = {'G', 'L', 'M', '5', 'S', 'L', 'O', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxFingerprint = 4096;

template <class T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A descriptor closed with its scope.
struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
};

bool write_all(int fd, const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= size_t(w);
    }
    return true;
}

bool read_all(int fd, void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t r = ::read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c += r;
        n -= size_t(r);
    }
    return true;
}

// Opens `path` for reading if it is a regular file, never through a link and never waiting
// (a pipe would block the reader forever); -1 with the reason in `why` otherwise.
int open_regular(const std::string& path, struct stat& st, std::string& why) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        why = errno == ELOOP ? "is a symbolic link" : std::strerror(errno);
        return -1;
    }
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        why = "is not a regular file (a folder, a pipe or a device)";
        ::close(fd);
        return -1;
    }
    return fd;
}

// Whether the regular file `fd` starts with the slot files' magic.
bool has_magic(int fd) {
    char m[sizeof(kMagic)];
    return ::pread(fd, m, sizeof(m), 0) == ssize_t(sizeof(m)) &&
           std::memcmp(m, kMagic, sizeof(kMagic)) == 0;
}

// The bytes of the regular files in `folder` but `except` (not followed through links).
uint64_t folder_bytes(const std::string& folder, const std::string& except) {
    uint64_t total = 0;
    DIR* d = ::opendir(folder.c_str());
    if (!d) return 0;
    while (const dirent* e = ::readdir(d)) {
        struct stat st;
        if (except == e->d_name) continue;
        if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            total += uint64_t(st.st_size);
    }
    ::closedir(d);
    return total;
}

}  // namespace

std::string slot_folder_problem(const std::string& folder) {
    struct stat st;
    if (::stat(folder.c_str(), &st) != 0) return folder + ": " + std::strerror(errno);
    if (!S_ISDIR(st.st_mode)) return folder + " is not a folder";
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return folder + " may be written by others than its owner (mode " +
               std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
               std::to_string(st.st_mode & 7) +
               "): saved conversations would be theirs to read or replace; chmod go-w it, or "
               "name a folder of your own";
    return "";
}

size_t write_slot_file(const std::string& folder, const std::string& name,
                       const std::string& fingerprint, const SlotFile& f, uint64_t folder_limit) {
    const std::string path = folder + "/" + name;
    std::string head(kMagic, sizeof(kMagic));
    put(head, kVersion);
    put(head, uint32_t(fingerprint.size()));
    head += fingerprint;
    put(head, uint64_t(f.tokens.size()));
    head.append(reinterpret_cast<const char*>(f.tokens.data()), f.tokens.size() * sizeof(int32_t));
    put(head, uint64_t(f.state.size()));
    const uint64_t bytes = head.size() + f.state.size();
    // What the name holds now: nothing, or a slot file (replaced); anything else stays.
    struct stat st;
    uint64_t replaced = 0;
    if (::lstat(path.c_str(), &st) == 0) {
        std::string why;
        const int fd = open_regular(path, st, why);
        if (fd < 0) throw Error(path + " exists and " + why + ": not replaced");
        const bool ours = has_magic(fd);
        ::close(fd);
        if (!ours) throw Error(path + " exists and is not a saved sequence: not replaced");
        replaced = uint64_t(st.st_size);
    }
    if (folder_limit) {
        const uint64_t held = folder_bytes(folder, name);
        if (held + bytes > folder_limit)
            throw Error("saving " + std::to_string(bytes) + " bytes would take " + folder + " to " +
                        std::to_string(held + bytes) + " bytes, over --slot-save-max " +
                        std::to_string(folder_limit) + " (" + std::to_string(replaced) +
                        " of them replaced): erase saved files, or raise the limit");
    }
    // A new file of our own: mkstemp creates it (O_EXCL: never an existing name, never
    // through a link) with mode 0600. Names starting with '.' are never the clients'.
    std::string tmp = folder + "/." + name + ".XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) throw Error("cannot write in " + folder + ": " + std::strerror(errno));
    {
        Fd out(fd);
        const bool ok = write_all(fd, head.data(), head.size()) &&
                        write_all(fd, f.state.data(), f.state.size()) && ::fsync(fd) == 0;
        if (!ok) {
            const std::string why = std::strerror(errno);
            ::unlink(tmp.c_str());
            throw Error("cannot write " + path + ": " + why + " (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw Error("cannot rename " + tmp + " to " + path + ": " + why);
    }
    return size_t(bytes);
}

SlotFile read_slot_file(const std::string& path, const std::string& fingerprint, uint64_t max_bytes,
                        size_t* bytes_read) {
    struct stat st;
    std::string why;
    const int raw = open_regular(path, st, why);
    if (raw < 0) throw Error("cannot read " + path + ": it " + why);
    Fd in(raw);
    const uint64_t size = uint64_t(st.st_size);
    if (bytes_read) *bytes_read = size_t(size);
    uint64_t at = 0;
    auto take = [&](void* dst, size_t n) {
        if (size - at < n || !read_all(in.fd, dst, n))
            throw Error(path + ": the file ends early (damaged)");
        at += n;
    };
    char magic[sizeof(kMagic)];
    take(magic, sizeof(magic));
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
        throw Error(path + ": not a saved sequence of glm5");
    uint32_t version = 0, fp_len = 0;
    take(&version, sizeof(version));
    if (version != kVersion)
        throw Error(path + ": saved in format " + std::to_string(version) + ", this is " +
                    std::to_string(kVersion));
    take(&fp_len, sizeof(fp_len));
    if (fp_len > kMaxFingerprint) throw Error(path + ": damaged header");
    std::string fp(fp_len, '\0');
    take(fp.data(), fp_len);
    if (fp != fingerprint)
        throw Error(path + ": saved by another model or cache type (" + fp.substr(0, 120) +
                    ", this server runs " + fingerprint.substr(0, 120) + ")");
    // The sizes the header states must be the file's, and one this server can hold, before
    // anything is allocated for them.
    if (size > max_bytes)
        throw Error(path + ": holds " + std::to_string(size) +
                    " bytes, more than a sequence of this server's context can (" +
                    std::to_string(max_bytes) + ")");
    SlotFile f;
    uint64_t n = 0;
    take(&n, sizeof(n));
    if (n > (size - at) / sizeof(int32_t)) throw Error(path + ": the file ends early (damaged)");
    f.tokens.resize(size_t(n));
    take(f.tokens.data(), f.tokens.size() * sizeof(int32_t));
    take(&n, sizeof(n));
    if (n != size - at)
        throw Error(path + ": the state's length does not match the file (damaged)");
    f.state.resize(size_t(n));
    take(f.state.data(), f.state.size());
    return f;
}

}  // namespace glm5::runtime
