// The image layer against spec 12.2-12.3: the size rule's check values, the
// pixels the engine makes from the fixture PNGs against the reference's
// (tests/data/glm5next/vision.golden.json), Pillow's bicubic resize byte for
// byte (tests/data/image/resize.golden.json, scripts/gen_resize_goldens.py),
// and the refusals of bytes that are not a decodable image.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/gguf.h"
#include "image/image.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

const nlohmann::json& vision_golden() {
    static const nlohmann::json g = load_json(data_path("glm5next/vision.golden.json"));
    return g;
}

// Keep in step with pattern() in scripts/gen_resize_goldens.py.
image::Rgb8 pattern(int64_t w, int64_t h) {
    image::Rgb8 img{w, h, {}};
    for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
            for (int64_t c = 0; c < 3; ++c) {
                int64_t v = (x * (7 + c) + y * (13 - 2 * c) + ((x * y + c) % 17) * 9) % 256;
                if ((x / 5 + y / 3) % 2 == 0) v = 255 - v;
                img.data.push_back(uint8_t(v));
            }
    return img;
}

std::vector<uint8_t> from_hex(const std::string& s) {
    std::vector<uint8_t> out(s.size() / 2);
    for (size_t i = 0; i < out.size(); ++i)
        out[i] = uint8_t(std::stoi(s.substr(2 * i, 2), nullptr, 16));
    return out;
}

void mean_std(float mean[3], float std_[3]) {
    auto f = gguf::File::open(data_path("glm5next/mmproj-tiny.gguf"));
    const auto* m = f->find("clip.vision.image_mean");
    const auto* s = f->find("clip.vision.image_std");
    ASSERT_TRUE(m && s && m->size() == 3 && s->size() == 3);
    for (size_t c = 0; c < 3; ++c) {
        mean[c] = float(*(*m)[c].as_float());
        std_[c] = float(*(*s)[c].as_float());
    }
}

}  // namespace

TEST(ImageSize, EverySizeRuleEntry) {
    const auto& rules = vision_golden()["size_rule"];
    ASSERT_GE(rules.size(), 8u);
    for (const auto& r : rules) {
        const auto s = image::size_for(r["in"][0].get<int64_t>(), r["in"][1].get<int64_t>());
        const std::string in = r["in"].dump();
        EXPECT_EQ(s.canvas_w, r["canvas"][0].get<int64_t>()) << in;
        EXPECT_EQ(s.canvas_h, r["canvas"][1].get<int64_t>()) << in;
        EXPECT_EQ(s.content_w, r["content"][0].get<int64_t>()) << in;
        EXPECT_EQ(s.content_h, r["content"][1].get<int64_t>()) << in;
        EXPECT_EQ(s.tokens, r["tokens"].get<int64_t>()) << in;
    }
}

TEST(ImageSize, RefusesAZeroSide) {
    EXPECT_THROW(image::size_for(0, 10), Error);
    EXPECT_THROW(image::size_for(10, 0), Error);
}

TEST(ImagePixels, FromThePngsEqualTheGoldenPixels) {
    float mean[3], sd[3];
    mean_std(mean, sd);
    for (const auto& g : vision_golden()["images"]) {
        const auto img = image::load_file(data_path("glm5next/" + g["file"].get<std::string>()));
        EXPECT_EQ(img.width, g["size"][0].get<int64_t>());
        EXPECT_EQ(img.height, g["size"][1].get<int64_t>());
        const auto size = image::size_for(img.width, img.height);
        EXPECT_EQ(size.canvas_w, g["canvas"][0].get<int64_t>());
        EXPECT_EQ(size.canvas_h, g["canvas"][1].get<int64_t>());
        EXPECT_EQ(size.content_w, g["content"][0].get<int64_t>());
        EXPECT_EQ(size.content_h, g["content"][1].get<int64_t>());
        EXPECT_EQ(size.tokens, g["tokens"].get<int64_t>());
        EXPECT_EQ(size.content_w != img.width || size.content_h != img.height,
                  g["resized"].get<bool>());
        const auto px = image::make_pixels(img, size, mean, sd);
        const auto want = g["pixels"].get<std::vector<double>>();
        ASSERT_EQ(px.data.size(), want.size());
        // Float32 rounding of values up to ~2.2 (and of the file's float32
        // mean/std): 1e-6 is far below one 8-bit step (0.015).
        double worst = 0;
        size_t bad = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            const double d = std::fabs(double(px.data[i]) - want[i]);
            worst = std::max(worst, d);
            bad += d > 1e-6;
        }
        std::printf("  %s: %zu pixels, max |d| = %.3g\n", g["file"].get<std::string>().c_str(),
                    want.size(), worst);
        EXPECT_EQ(bad, 0u) << g["file"];
    }
}

TEST(ImageResize, MatchesPillowByteForByte) {
    const auto g = load_json(data_path("image/resize.golden.json"));
    ASSERT_GE(g["cases"].size(), 10u);
    bool shrink = false, enlarge = false;
    for (const auto& c : g["cases"]) {
        const std::string src = c["source"];
        const image::Rgb8 in =
            src.rfind("pattern:", 0) == 0
                ? pattern(std::stoi(src.substr(8)), std::stoi(src.substr(src.find('x') + 1)))
                : image::load_file(data_path("glm5next/" + src));
        const int64_t w = c["size"][0], h = c["size"][1];
        shrink = shrink || w < in.width || h < in.height;
        enlarge = enlarge || w > in.width || h > in.height;
        const auto out = image::resize_bicubic(in, w, h);
        const auto want = from_hex(c["rgb_hex"]);
        ASSERT_EQ(out.data.size(), want.size()) << src << " -> " << w << "x" << h;
        size_t diff = 0;
        for (size_t i = 0; i < want.size(); ++i) diff += out.data[i] != want[i];
        EXPECT_EQ(diff, 0u) << src << " -> " << w << "x" << h << ": bytes that differ";
    }
    EXPECT_TRUE(shrink && enlarge);
}

TEST(ImageDecode, RefusesWhatIsNotADecodableImage) {
    const auto png = image::read_file(data_path("glm5next/img-a.png"));
    auto refuses = [](std::vector<uint8_t> b, const std::string& why, const char* detail = "") {
        try {
            image::decode(b, "upload");
            ADD_FAILURE() << "accepted: " << why;
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("upload"), std::string::npos) << m;
            EXPECT_NE(m.find(detail), std::string::npos) << m;
            std::printf("  %s -> %s\n", why.c_str(), m.c_str());
        }
    };
    refuses({}, "empty", "empty");
    refuses({'G', 'I', 'F', '8', '9', 'a', 0, 0}, "a GIF");
    refuses(std::vector<uint8_t>(png.begin(), png.begin() + long(png.size() / 2)), "truncated PNG",
            "truncated");
    auto corrupt = png;
    for (size_t i = 60; i < 400 && i < corrupt.size(); ++i) corrupt[i] ^= 0x5a;
    refuses(corrupt, "corrupt PNG");
    // A zero width in the header, with the chunk's CRC made right again.
    auto zero = png;
    zero[16] = zero[17] = zero[18] = zero[19] = 0;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 12; i < 29; ++i) {  // "IHDR" and its 13 data bytes
        crc ^= zero[i];
        for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    crc = ~crc;
    for (int k = 0; k < 4; ++k) zero[29 + size_t(k)] = uint8_t(crc >> (24 - 8 * k));
    refuses(zero, "zero-width PNG", "width is zero");
    refuses({0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F', 0}, "truncated JPEG");
}

TEST(ImageDecode, JpegDecodesAsPillowDoes) {
    const auto g = load_json(data_path("image/resize.golden.json"))["jpeg"];
    const auto j = image::load_file(data_path("image/" + g["file"].get<std::string>()));
    EXPECT_EQ(j.width, g["size"][0].get<int64_t>());
    EXPECT_EQ(j.height, g["size"][1].get<int64_t>());
    EXPECT_TRUE(j.data == from_hex(g["rgb_hex"]));
}
