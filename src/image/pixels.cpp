// Spec 12.3: the tower's input canvas.
#include "core/error.h"
#include "image/image.h"

namespace glm5::image {

Pixels make_pixels(const Rgb8& img, const Size& size, const float mean[3], const float std_[3]) {
    const Rgb8 content = (img.width == size.content_w && img.height == size.content_h)
                             ? Rgb8{}
                             : resize_bicubic(img, size.content_w, size.content_h);
    const Rgb8& c = content.width ? content : img;
    if (c.width > size.canvas_w || c.height > size.canvas_h)
        throw Error("image content larger than its canvas");
    Pixels p;
    p.width = size.canvas_w;
    p.height = size.canvas_h;
    const int64_t plane = p.width * p.height;
    p.data.resize(size_t(3 * plane));
    // Normalised in double, rounded once to float (the reference is float64).
    for (int ch = 0; ch < 3; ++ch) {
        float table[256];
        for (int v = 0; v < 256; ++v)
            table[v] = float((double(v) / 255.0 - double(mean[ch])) / double(std_[ch]));
        float* out = p.data.data() + ch * plane;
        for (int64_t y = 0; y < p.height; ++y)
            for (int64_t x = 0; x < p.width; ++x)
                out[y * p.width + x] = (y < c.height && x < c.width)
                                           ? table[c.data[size_t((y * c.width + x) * 3 + ch)]]
                                           : table[0];
    }
    return p;
}

}  // namespace glm5::image
