// Images in a prompt (docs/glm5next-format.md 12.5): bytes -> pixels -> the
// vision tower's rows, and the prompt's <|image|> placeholders expanded to
// as many tokens as each image has rows, with the rows that replace their
// embeddings. Each image is keyed by the SHA-256 of its bytes so a cached
// prefix holding an image is reused only for the same bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "image/image.h"
#include "model/glm5next_vision.h"
#include "model/model.h"

namespace glm5::runtime {

struct ImageEmbedding {
    std::vector<float> rows;  // [n_tokens][n_embd]
    int64_t n_tokens = 0;
    int64_t width = 0, height = 0;  // of the decoded image
    Sha256 key{};                   // of the image's bytes
};

// One image decoded, sized, resized and normalised (what runs before the
// tower; no backend work, so any thread may do it).
struct PreparedImage {
    image::Pixels pixels;
    int64_t n_tokens = 0;
    int64_t width = 0, height = 0;  // of the decoded image
    Sha256 key{};                   // of the image's bytes
};
// Throws glm5::Error naming `name` for bytes that are not a decodable image.
PreparedImage prepare_image(std::span<const uint8_t> bytes, const std::string& name,
                            const model::VisionHParams& hp);
// The tower's rows of prepared images, in one tower call.
std::vector<ImageEmbedding> encode_prepared(model::VisionTower& tower,
                                            std::span<const PreparedImage> images);

// Decodes (PNG / JPEG), sizes, resizes and normalises every image, then
// encodes them in one tower call. `names` label errors (a path, "image 2").
// Throws glm5::Error for bytes that are not a decodable image.
std::vector<ImageEmbedding> encode_images(model::VisionTower& tower,
                                          std::span<const std::vector<uint8_t>> bytes,
                                          std::span<const std::string> names);

// A prompt whose i-th `image_token` has been expanded to images[i].n_tokens
// copies, and the embedding rows that replace them.
struct ExpandedPrompt {
    std::vector<int32_t> tokens;
    std::vector<model::EmbedRows> embeds;  // point into the images' rows
    // Per token: 0 for text, else a key that differs between images (and
    // between rows of one image): what a prefix cache compares besides ids.
    std::vector<uint64_t> content;
};
// Throws glm5::Error when the number of placeholders is not the number of images.
ExpandedPrompt expand_images(std::span<const int32_t> ids, int32_t image_token,
                             std::span<const ImageEmbedding> images);
// The same from each image's token count and key, before its rows exist
// (embeds[i].rows stay null; fill them with set_rows once encoded).
ExpandedPrompt expand_placeholders(std::span<const int32_t> ids, int32_t image_token,
                                   std::span<const int64_t> n_tokens, std::span<const Sha256> keys);
void set_rows(ExpandedPrompt& p, std::span<const ImageEmbedding> images);

// The embedding rows of tokens [begin, end) of an expanded prompt, relative
// to `begin` (a prefill chunk's SeqInput::embeds).
std::vector<model::EmbedRows> embeds_in(const ExpandedPrompt& p, int64_t begin, int64_t end,
                                        int64_t n_embd);

}  // namespace glm5::runtime
