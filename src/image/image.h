// Images for the vision tower (docs/glm5next-format.md section 12.2-12.3):
// decoding PNG and JPEG to 8-bit RGB, the token-budget size rule, the
// byte-exact Pillow bicubic resize and the normalised pixel canvas. Uses
// core only; the tower itself (model/glm5next_vision) takes the pixels.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace glm5::image {

// 8-bit RGB, row-major, 3 bytes per pixel.
struct Rgb8 {
    int64_t width = 0;
    int64_t height = 0;
    std::vector<uint8_t> data;
};

// The most pixels an image may have (Pillow's decompression-bomb error
// threshold): a larger one is refused before any pixel memory is taken.
constexpr int64_t kMaxPixels = 178956970;

// PNG or JPEG bytes (told apart by their signature) to RGB: palettes and grey
// expanded, 16-bit samples reduced to their high byte, alpha dropped (not
// composited), as Pillow's convert("RGB") does. Throws glm5::Error naming
// `what` and the reason for anything else: another format, a truncated or
// corrupt file, a zero side, more than kMaxPixels pixels.
Rgb8 decode(std::span<const uint8_t> bytes, const std::string& what);
// An image's width and height from its header alone (nothing decoded, no pixel memory):
// what decode() would produce, refused for the same reasons where the header shows them.
struct Dims {
    int64_t width = 0, height = 0;
};
Dims dimensions(std::span<const uint8_t> bytes, const std::string& what);
// Reads and decodes a file (errors name the path).
Rgb8 load_file(const std::string& path);
// The file's bytes (throws glm5::Error naming the path when unreadable).
std::vector<uint8_t> read_file(const std::string& path);

// Spec 12.2: one text row covers a 28 x 28 pixel cell (patch 14, merge 2).
constexpr int64_t kPatch = 14;
constexpr int64_t kMerge = 2;
constexpr int64_t kUnit = kPatch * kMerge;
constexpr int64_t kMinTokens = 16;
constexpr int64_t kMaxTokens = 8000;

struct Size {
    int64_t canvas_w = 0, canvas_h = 0;    // multiples of 28
    int64_t content_w = 0, content_h = 0;  // the resized image, top-left on the canvas
    int64_t tokens = 0;                    // (canvas_w / 28) * (canvas_h / 28)
};
// Canvas, content and token count of a w x h image (w, h >= 1).
Size size_for(int64_t w, int64_t h);

// Pillow's 8-bit bicubic resize (Image.BICUBIC on an RGB image): Keys cubic
// with a = -0.5, support widened by the scale when shrinking, a horizontal
// then a vertical pass with 22-bit fixed-point coefficients, each pass
// rounded and clipped to 8 bits. A pass whose size is unchanged is skipped.
Rgb8 resize_bicubic(const Rgb8& src, int64_t width, int64_t height);

// The tower's input: the image resized to its content size (12.3), placed
// top-left on a black canvas, each channel as (v/255 - mean[c]) / std[c];
// layout [3][canvas_h][canvas_w].
struct Pixels {
    int64_t width = 0, height = 0;  // the canvas
    std::vector<float> data;
};
Pixels make_pixels(const Rgb8& img, const Size& size, const float mean[3], const float std_[3]);

}  // namespace glm5::image
