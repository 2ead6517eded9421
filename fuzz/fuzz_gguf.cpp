// libFuzzer target for the GGUF reader. Any input must either parse or raise
// gguf::FormatError; anything else that escapes (another exception, a
// sanitizer report, a broken invariant) is a finding. On success it reads
// every metadata value and every tensor byte so that a bad bounds check shows
// up as an ASan out-of-bounds read rather than passing unnoticed.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gguf/gguf.h"

using namespace glm5::gguf;

namespace {

uint64_t touch(const Value& v) {
    uint64_t h = uint64_t(v.type());
    if (auto u = v.as_uint()) h += *u;
    if (auto i = v.as_int()) h += uint64_t(*i);
    if (auto f = v.as_float()) h += uint64_t(*f != *f);
    if (auto b = v.as_bool()) h += *b;
    if (const std::string* s = v.as_string())
        for (char c : *s) h = h * 31 + uint8_t(c);
    for (const Value& item : v.items()) h += touch(item);
    return h;
}

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<File> f;
    try {
        f = File::parse_memory(data, size, "fuzz.gguf");
    } catch (const FormatError&) {
        return 0;
    }
    volatile uint64_t sink = 0;
    for (const auto& [key, v] : f->metadata()) {
        sink = sink + touch(v) + v.to_display().size();
        check(f->find(key) == &v);
        // The typed getters either answer or refuse with FormatError.
        try {
            sink = sink + f->get_uint(key);
        } catch (const FormatError&) {
        }
        try {
            sink = sink + f->get_string(key).size();
        } catch (const FormatError&) {
        }
    }
    for (const auto& t : f->tensors()) {
        check(t.data >= data && t.nbytes <= size && t.data - data <= ptrdiff_t(size - t.nbytes));
        check(t.n_dims >= 1 && t.n_dims <= 4 && t.nelements() >= 0);
        check(t.row_bytes() * size_t(t.nrows()) == t.nbytes || t.nelements() == 0);
        check(t.offset % f->alignment() == 0);
        check(f->find_tensor(t.name) == &t);
        uint64_t sum = 0;
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
        sink = sink + sum + t.shape_string().size();
    }
    return 0;
}
