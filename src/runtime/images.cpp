#include "runtime/images.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "image/image.h"

namespace glm5::runtime {

std::vector<ImageEmbedding> encode_images(model::VisionTower& tower,
                                          std::span<const std::vector<uint8_t>> bytes,
                                          std::span<const std::string> names) {
    const model::VisionHParams& hp = tower.hparams();
    std::vector<ImageEmbedding> out(bytes.size());
    std::vector<image::Pixels> pixels(bytes.size());
    std::vector<model::VisionTower::Image> in;
    for (size_t i = 0; i < bytes.size(); ++i) {
        const std::string name = i < names.size() ? names[i] : "image " + std::to_string(i + 1);
        const image::Rgb8 img = image::decode(bytes[i], name);
        const image::Size size = image::size_for(img.width, img.height);
        pixels[i] = image::make_pixels(img, size, hp.mean, hp.std);
        out[i].width = img.width;
        out[i].height = img.height;
        out[i].n_tokens = size.tokens;
        out[i].key = sha256(bytes[i]);
        in.push_back({pixels[i].data.data(), pixels[i].width, pixels[i].height});
    }
    std::vector<float> rows;
    tower.encode(in, rows);
    size_t off = 0;
    for (auto& e : out) {
        const size_t n = size_t(e.n_tokens * hp.out);
        e.rows.assign(rows.begin() + long(off), rows.begin() + long(off + n));
        off += n;
    }
    return out;
}

ExpandedPrompt expand_images(std::span<const int32_t> ids, int32_t image_token,
                             std::span<const ImageEmbedding> images) {
    const size_t n_ph = size_t(std::count(ids.begin(), ids.end(), image_token));
    if (n_ph != images.size())
        throw Error("the prompt has " + std::to_string(n_ph) + " <|image|> placeholder" +
                    (n_ph == 1 ? "" : "s") + " but " + std::to_string(images.size()) + " image" +
                    (images.size() == 1 ? " was" : "s were") + " given");
    ExpandedPrompt p;
    size_t k = 0;
    for (int32_t t : ids) {
        if (t != image_token) {
            p.tokens.push_back(t);
            p.content.push_back(0);
            continue;
        }
        const ImageEmbedding& im = images[k++];
        uint64_t base;
        std::memcpy(&base, im.key.data(), sizeof base);
        base |= 1;  // never 0 (text)
        p.embeds.push_back({int64_t(p.tokens.size()), im.n_tokens, im.rows.data()});
        for (int64_t r = 0; r < im.n_tokens; ++r) {
            p.tokens.push_back(image_token);
            p.content.push_back(base + 2 * uint64_t(r));
        }
    }
    return p;
}

std::vector<model::EmbedRows> embeds_in(const ExpandedPrompt& p, int64_t begin, int64_t end,
                                        int64_t E) {
    std::vector<model::EmbedRows> out;
    for (const auto& e : p.embeds) {
        const int64_t a = std::max(begin, e.at), b = std::min(end, e.at + e.n);
        if (a >= b) continue;
        out.push_back({a - begin, b - a, e.rows + (a - e.at) * E});
    }
    return out;
}

}  // namespace glm5::runtime
