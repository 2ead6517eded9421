// Spec 12.2: the canvas is the image rounded up to whole 28 x 28 cells, scaled
// up to at least 16 cells or down to at most 8000; the content is the image
// scaled to fit the canvas (never up when it is large enough on its own).
// Float64 throughout, as the reference: 111 x 111 keeps content 111 because
// 111 * (112 / 111) is just below 112.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "image/image.h"

namespace glm5::image {

namespace {

int64_t up(double v) {
    return std::max<int64_t>(kUnit, int64_t(std::ceil(v / double(kUnit))) * kUnit);
}

int64_t tokens(int64_t cw, int64_t ch) {
    return (cw / kUnit) * (ch / kUnit);
}

}  // namespace

Size size_for(int64_t w, int64_t h) {
    if (w < 1 || h < 1)
        throw Error("image size " + std::to_string(w) + " x " + std::to_string(h) +
                    ": a side is zero");
    Size s;
    int64_t Wc = up(double(w)), Hc = up(double(h));
    if (tokens(Wc, Hc) < kMinTokens) {
        const double f = std::sqrt(double(kMinTokens * kUnit * kUnit) / (double(h) * double(w)));
        Wc = up(double(w) * f);
        Hc = up(double(h) * f);
    } else if (tokens(Wc, Hc) > kMaxTokens) {
        // The largest content height whose canvas fits the budget (one 28 x
        // 28 cell when none does).
        int64_t lo = 1, hi = h, bw = kUnit, bh = kUnit;
        while (lo <= hi) {
            const int64_t ch = lo + (hi - lo) / 2;
            const int64_t cw = std::max<int64_t>(1, (w * ch) / h);
            if (tokens(up(double(cw)), up(double(ch))) <= kMaxTokens) {
                bw = up(double(cw));
                bh = up(double(ch));
                lo = ch + 1;
            } else {
                hi = ch - 1;
            }
        }
        Wc = bw;
        Hc = bh;
    }
    double scale = std::min(double(Hc) / double(h), double(Wc) / double(w));
    if (h * w >= kMinTokens * kUnit * kUnit) scale = std::min(scale, 1.0);
    s.canvas_w = Wc;
    s.canvas_h = Hc;
    s.content_w =
        std::max<int64_t>(1, std::min<int64_t>(Wc, int64_t(std::floor(double(w) * scale))));
    s.content_h =
        std::max<int64_t>(1, std::min<int64_t>(Hc, int64_t(std::floor(double(h) * scale))));
    s.tokens = tokens(Wc, Hc);
    return s;
}

}  // namespace glm5::image
