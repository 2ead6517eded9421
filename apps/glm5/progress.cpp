#include "progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

namespace glm5::app {

std::string gib(uint64_t bytes) {
    char b[32];
    if (bytes >= (1ull << 30))
        std::snprintf(b, sizeof b, "%.2f GiB", double(bytes) / double(1ull << 30));
    else
        std::snprintf(b, sizeof b, "%.2f MiB", double(bytes) / double(1ull << 20));
    return b;
}

std::function<void(uint64_t, uint64_t)> byte_progress(bool quiet) {
    if (quiet) return nullptr;
    struct State {
        bool tty = isatty(2);
        int last_decile = -1;
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    };
    auto st = std::make_shared<State>();
    return [st](uint64_t done, uint64_t total) {
        if (total == 0) return;
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - st->t0).count();
        const int pct = int(100.0 * double(done) / double(total));
        if (st->tty) {
            std::fprintf(stderr, "\r  %3d%%  %s / %s  %.1f s", pct, gib(done).c_str(),
                         gib(total).c_str(), s);
            if (done == total) std::fputc('\n', stderr);
        } else if (pct / 10 != st->last_decile) {
            st->last_decile = pct / 10;
            std::fprintf(stderr, "  %3d%%  %s / %s  %.1f s\n", pct, gib(done).c_str(),
                         gib(total).c_str(), s);
        }
    };
}

}  // namespace glm5::app
