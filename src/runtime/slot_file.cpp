#include "runtime/slot_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace glm5::runtime {

namespace {

constexpr char kMagic[8] = {'G', 'L', 'M', '5', 'S', 'L', 'O', 'T'};
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

size_t write_slot_file(const std::string& path, const std::string& fingerprint, const SlotFile& f) {
    std::string head(kMagic, sizeof(kMagic));
    put(head, kVersion);
    put(head, uint32_t(fingerprint.size()));
    head += fingerprint;
    put(head, uint64_t(f.tokens.size()));
    head.append(reinterpret_cast<const char*>(f.tokens.data()), f.tokens.size() * sizeof(int32_t));
    put(head, uint64_t(f.state.size()));
    const std::string tmp = path + ".tmp";
    {
        std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
        if (!o) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
        o.write(head.data(), std::streamsize(head.size()));
        o.write(reinterpret_cast<const char*>(f.state.data()), std::streamsize(f.state.size()));
        o.flush();
        if (!o) {
            std::remove(tmp.c_str());
            throw Error("cannot write " + tmp + " (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw Error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
    }
    return head.size() + f.state.size();
}

SlotFile read_slot_file(const std::string& path, const std::string& fingerprint,
                        size_t* bytes_read) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read " + path + ": " + std::strerror(errno));
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes_read) *bytes_read = all.size();
    size_t at = 0;
    auto take = [&](void* dst, size_t n) {
        if (all.size() - at < n) throw Error(path + ": the file ends early (damaged)");
        std::memcpy(dst, all.data() + at, n);
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
    if (fp_len > 4096) throw Error(path + ": damaged header");
    std::string fp(fp_len, '\0');
    take(fp.data(), fp_len);
    if (fp != fingerprint)
        throw Error(path + ": saved by another model or cache type (" + fp.substr(0, 120) +
                    ", this server runs " + fingerprint.substr(0, 120) + ")");
    SlotFile f;
    uint64_t n = 0;
    take(&n, sizeof(n));
    if (n > (all.size() - at) / sizeof(int32_t))
        throw Error(path + ": the file ends early (damaged)");
    f.tokens.resize(size_t(n));
    take(f.tokens.data(), f.tokens.size() * sizeof(int32_t));
    take(&n, sizeof(n));
    if (n != all.size() - at)
        throw Error(path + ": the state's length does not match the file (damaged)");
    f.state.assign(all.begin() + long(at), all.end());
    return f;
}

}  // namespace glm5::runtime
