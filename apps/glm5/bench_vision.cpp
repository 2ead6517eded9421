// glm5 bench --mmproj: encode synthetic images of the given sizes (the size
// rule, the resize and the tower, as a request would), report the median
// time of the tower, its float operations per second and their share of the
// measured FMA peak of the same threads.
#include "bench_vision.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu.h"
#include "core/compute_peak.h"
#include "core/thread_pool.h"
#include "image/image.h"
#include "model/glm5next_vision.h"
#include "model_setup.h"

namespace glm5::app {

namespace {

struct WH {
    int64_t w, h;
};

std::vector<WH> parse_sizes(const std::string& s) {
    std::vector<WH> out;
    size_t at = 0;
    while (at <= s.size()) {
        const size_t end = std::min(s.find(',', at), s.size());
        const std::string item = s.substr(at, end - at);
        const size_t x = item.find('x');
        try {
            if (x == std::string::npos) throw 0;
            const int64_t w = std::stoll(item.substr(0, x)), h = std::stoll(item.substr(x + 1));
            if (w < 1 || h < 1 || w > 20000 || h > 20000) throw 0;
            out.push_back({w, h});
        } catch (...) {
            throw UsageError("--image-sizes expects WxH[,WxH...] (1..20000), got '" + s + "'");
        }
        at = end + 1;
    }
    return out;
}

// A deterministic picture with edges and ramps (the content does not change
// the work).
image::Rgb8 picture(int64_t w, int64_t h) {
    image::Rgb8 img{w, h, std::vector<uint8_t>(size_t(w * h * 3))};
    for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
            for (int64_t c = 0; c < 3; ++c)
                img.data[size_t((y * w + x) * 3 + c)] =
                    uint8_t((x * (3 + c) + y * 5 + x * y) & 255);
    return img;
}

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void add_vision_bench_flags(Args& a) {
    a.option("mmproj", "FILE", "",
             "bench the glm5next vision tower of this mmproj instead of text (--model optional: "
             "without it the tower runs alone)");
    a.option("image-sizes", "LIST", "448x448,1024x1024", "image sizes encoded with --mmproj");
}

int bench_vision(const Args& a) {
    const auto sizes = parse_sizes(a.get("image-sizes"));
    const int64_t reps = a.get_int("repetitions", 1, 1000);
    auto file = gguf::File::open(a.get("mmproj"));
    backend::CpuOptions bo;
    bo.n_threads = int(a.get_int("threads", 1, 1024));
    auto be = backend::make_cpu_backend(bo);
    model::ModelInfo text;
    text.arch = "glm5next";
    text.n_embd = int64_t(file->get_uint("clip.vision.projection_dim"));
    model::VisionTower tower(*file, *be, text, {});
    const model::VisionHParams& h = tower.hparams();
    std::fprintf(stderr,
                 "glm5: vision tower %s: width %lld, %lld blocks, %lld heads, projector %lld -> "
                 "%lld, %.2f GB of weights, %d threads\n",
                 tower.name().c_str(), (long long)h.width, (long long)h.n_block,
                 (long long)h.n_head, (long long)h.out, (long long)h.proj_ff,
                 double(tower.weight_bytes()) * 1e-9, bo.n_threads);

    std::printf(
        "| image | canvas | tokens | patches | prep s | encode s | GFLOP | GFLOP/s | "
        "peak |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const WH& s : sizes) {
        const image::Rgb8 img = picture(s.w, s.h);
        const auto t0 = std::chrono::steady_clock::now();
        const image::Size size = image::size_for(s.w, s.h);
        const image::Pixels px = image::make_pixels(img, size, h.mean, h.std);
        const double prep = since(t0);
        const int64_t N = (size.canvas_w / 14) * (size.canvas_h / 14), M = N / 4;
        const double D = double(h.width), F = double(h.n_ff), E = double(h.out);
        const double flops = 2.0 * double(N) * 588 * D +
                             double(h.n_block) * (2.0 * double(N) * (4 * D * D + 3 * D * F) +
                                                  4.0 * double(N) * double(N) * D) +
                             2.0 * double(M) * (4 * D * E + E * E + 3 * E * double(h.proj_ff));
        std::vector<double> times;
        std::vector<float> rows;
        const model::VisionTower::Image in{px.data.data(), px.width, px.height};
        for (int64_t r = 0; r < reps; ++r) {
            const auto t1 = std::chrono::steady_clock::now();
            tower.encode({&in, 1}, rows);
            times.push_back(since(t1));
        }
        std::sort(times.begin(), times.end());
        const double t = times[times.size() / 2];
        ThreadPool pool(bo.n_threads);
        const double peak = measure_fma_peak(pool);  // right after, as the roofline does
        std::printf(
            "| %lldx%lld | %lldx%lld | %lld | %lld | %.3f | %.2f | %.0f | %.1f | %.0f%% "
            "of %.0f |\n",
            (long long)s.w, (long long)s.h, (long long)size.canvas_w, (long long)size.canvas_h,
            (long long)size.tokens, (long long)N, prep, t, flops * 1e-9, flops * 1e-9 / t,
            100.0 * flops * 1e-9 / t / peak, peak);
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace glm5::app
