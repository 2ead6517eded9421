// Pillow's 8-bit bicubic resample, written from the algorithm's description
// (spec 12.3). Per output pixel of a pass: the source window is the filter's
// support around the pixel's centre (widened by the scale when shrinking, so
// the filter also low-passes), the Keys cubic weights over it are normalised
// to sum 1 in double, then rounded to 22-bit fixed point; the pass sums
// byte * weight in int32 from a half-unit bias and clips the top byte to
// 0..255. Horizontal pass first (only over the source rows the vertical pass
// reads), then vertical. Byte exactness matters: the pixels feed a random
// tower where one step per pixel moves logits by units.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "image/image.h"

namespace glm5::image {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// Keys cubic convolution kernel with a = -0.5; support 2.
double cubic(double x) {
    constexpr double a = -0.5;
    x = std::fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

// The window and fixed-point weights of every output pixel of one axis.
struct Coeffs {
    int64_t ksize = 0;
    std::vector<int64_t> first, count;  // source window per output pixel
    std::vector<int32_t> k;             // [out][ksize]
};

Coeffs coefficients(int64_t in_size, int64_t out_size) {
    constexpr double support0 = 2.0;
    const double scale = double(in_size) / double(out_size);
    const double filterscale = std::max(scale, 1.0);
    const double support = support0 * filterscale;
    Coeffs c;
    c.ksize = int64_t(std::ceil(support)) * 2 + 1;
    c.first.resize(size_t(out_size));
    c.count.resize(size_t(out_size));
    c.k.assign(size_t(out_size * c.ksize), 0);
    std::vector<double> w(size_t(c.ksize));
    for (int64_t xx = 0; xx < out_size; ++xx) {
        const double center = (double(xx) + 0.5) * scale;
        const double ss = 1.0 / filterscale;
        // C casts: truncation toward zero, then clamped to the image.
        int64_t xmin = int64_t(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int64_t xmax = int64_t(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int64_t x = 0; x < xmax; ++x) {
            const double v = cubic((double(x + xmin) - center + 0.5) * ss);
            w[size_t(x)] = v;
            ww += v;
        }
        for (int64_t x = 0; x < xmax; ++x) {
            const double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
            const double f = v * double(1 << kPrecisionBits);
            c.k[size_t(xx * c.ksize + x)] = int32_t(v < 0 ? -0.5 + f : 0.5 + f);
        }
        c.first[size_t(xx)] = xmin;
        c.count[size_t(xx)] = xmax;
    }
    return c;
}

uint8_t clip8(int32_t v) {
    if (v <= 0) return 0;
    const int32_t s = v >> kPrecisionBits;
    return uint8_t(s > 255 ? 255 : s);
}

}  // namespace

Rgb8 resize_bicubic(const Rgb8& src, int64_t width, int64_t height) {
    if (width < 1 || height < 1 || src.width < 1 || src.height < 1)
        throw Error("resize: a side is zero");
    const Coeffs ch = coefficients(src.width, width);
    const Coeffs cv = coefficients(src.height, height);
    const bool horizontal = width != src.width;
    const bool vertical = height != src.height;

    // Source rows the vertical pass reads.
    const int64_t y_first = cv.first[0];
    const int64_t y_last = cv.first[size_t(height - 1)] + cv.count[size_t(height - 1)];

    const Rgb8* in = &src;
    int64_t row0 = 0;  // source row of in's row 0
    Rgb8 tmp;
    if (horizontal) {
        tmp.width = width;
        tmp.height = y_last - y_first;
        tmp.data.resize(size_t(tmp.width * tmp.height * 3));
        for (int64_t y = 0; y < tmp.height; ++y) {
            const uint8_t* s = src.data.data() + size_t((y + y_first) * src.width * 3);
            uint8_t* d = tmp.data.data() + size_t(y * width * 3);
            for (int64_t xx = 0; xx < width; ++xx) {
                const int32_t* k = ch.k.data() + xx * ch.ksize;
                const int64_t x0 = ch.first[size_t(xx)], n = ch.count[size_t(xx)];
                int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
                for (int64_t x = 0; x < n; ++x) {
                    const uint8_t* p = s + (x0 + x) * 3;
                    s0 += int32_t(p[0]) * k[x];
                    s1 += int32_t(p[1]) * k[x];
                    s2 += int32_t(p[2]) * k[x];
                }
                d[xx * 3 + 0] = clip8(s0);
                d[xx * 3 + 1] = clip8(s1);
                d[xx * 3 + 2] = clip8(s2);
            }
        }
        in = &tmp;
        row0 = y_first;
    }
    if (!vertical) {
        if (horizontal) return tmp;
        return src;
    }
    Rgb8 out;
    out.width = in->width;
    out.height = height;
    out.data.resize(size_t(out.width * height * 3));
    // Integer sums are exact: accumulating a whole row per source row (for
    // locality) gives the per-pixel sums bit for bit.
    const int64_t W3 = in->width * 3;
    std::vector<int32_t> acc(static_cast<size_t>(W3));
    for (int64_t yy = 0; yy < height; ++yy) {
        const int32_t* k = cv.k.data() + yy * cv.ksize;
        const int64_t y0 = cv.first[size_t(yy)] - row0, n = cv.count[size_t(yy)];
        std::fill(acc.begin(), acc.end(), int32_t(1) << (kPrecisionBits - 1));
        for (int64_t y = 0; y < n; ++y) {
            const uint8_t* s = in->data.data() + size_t((y0 + y) * W3);
            const int32_t ky = k[y];
            for (int64_t i = 0; i < W3; ++i) acc[size_t(i)] += int32_t(s[i]) * ky;
        }
        uint8_t* d = out.data.data() + size_t(yy * W3);
        for (int64_t i = 0; i < W3; ++i) d[i] = clip8(acc[size_t(i)]);
    }
    return out;
}

}  // namespace glm5::image
