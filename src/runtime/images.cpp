#include "runtime/images.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "image/image.h"

namespace glm5::runtime {

PreparedImage prepare_image(std::span<const uint8_t> bytes, const std::string& name,
                            const model::VisionHParams& hp) {
    PreparedImage p;
    const image::Rgb8 img = image::decode(bytes, name);
    const image::Size size = image::size_for(img.width, img.height);
    p.pixels = image::make_pixels(img, size, hp.mean, hp.std);
    p.width = img.width;
    p.height = img.height;
    p.n_tokens = size.tokens;
    p.key = sha256(bytes);
    return p;
}

std::vector<ImageEmbedding> encode_prepared(model::VisionTower& tower,
                                            std::span<const PreparedImage> images) {
    std::vector<model::VisionTower::Image> in;
    for (const auto& p : images)
        in.push_back({p.pixels.data.data(), p.pixels.width, p.pixels.height});
    std::vector<float> rows;
    tower.encode(in, rows);
    std::vector<ImageEmbedding> out(images.size());
    size_t off = 0;
    for (size_t i = 0; i < images.size(); ++i) {
        ImageEmbedding& e = out[i];
        e.width = images[i].width;
        e.height = images[i].height;
        e.n_tokens = images[i].n_tokens;
        e.key = images[i].key;
        const size_t n = size_t(e.n_tokens * tower.hparams().out);
        e.rows.assign(rows.begin() + long(off), rows.begin() + long(off + n));
        off += n;
    }
    return out;
}

std::vector<ImageEmbedding> encode_images(model::VisionTower& tower,
                                          std::span<const std::vector<uint8_t>> bytes,
                                          std::span<const std::string> names) {
    std::vector<PreparedImage> prepared;
    for (size_t i = 0; i < bytes.size(); ++i)
        prepared.push_back(
            prepare_image(bytes[i], i < names.size() ? names[i] : "image " + std::to_string(i + 1),
                          tower.hparams()));
    return encode_prepared(tower, prepared);
}

ExpandedPrompt expand_placeholders(std::span<const int32_t> ids, int32_t image_token,
                                   std::span<const int64_t> n_tokens,
                                   std::span<const Sha256> keys) {
    const size_t n_ph = size_t(std::count(ids.begin(), ids.end(), image_token));
    if (n_ph != n_tokens.size())
        throw Error("the prompt has " + std::to_string(n_ph) + " <|image|> placeholder" +
                    (n_ph == 1 ? "" : "s") + " but " + std::to_string(n_tokens.size()) + " image" +
                    (n_tokens.size() == 1 ? " was" : "s were") + " given");
    ExpandedPrompt p;
    size_t k = 0;
    for (int32_t t : ids) {
        if (t != image_token) {
            p.tokens.push_back(t);
            p.content.push_back(0);
            continue;
        }
        uint64_t base;
        std::memcpy(&base, keys[k].data(), sizeof base);
        base |= 1;  // never 0 (text)
        const int64_t n = n_tokens[k++];
        p.embeds.push_back({int64_t(p.tokens.size()), n, nullptr});
        for (int64_t r = 0; r < n; ++r) {
            p.tokens.push_back(image_token);
            p.content.push_back(base + 2 * uint64_t(r));
        }
    }
    return p;
}

void set_rows(ExpandedPrompt& p, std::span<const ImageEmbedding> images) {
    if (images.size() != p.embeds.size()) throw Error("set_rows: image count mismatch");
    for (size_t i = 0; i < images.size(); ++i) p.embeds[i].rows = images[i].rows.data();
}

ExpandedPrompt expand_images(std::span<const int32_t> ids, int32_t image_token,
                             std::span<const ImageEmbedding> images) {
    std::vector<int64_t> counts;
    std::vector<Sha256> keys;
    for (const auto& im : images) {
        counts.push_back(im.n_tokens);
        keys.push_back(im.key);
    }
    ExpandedPrompt p = expand_placeholders(ids, image_token, counts, keys);
    set_rows(p, images);
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
