// The glm4 / chatglm-bpe pre-tokenizer: splits text into the pieces BPE runs on.
//
// llama.cpp defines it by the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// (the same one as Llama 3) and runs it with a hand-written scanner; this is an
// independent scanner over code points with the same leftmost-alternative semantics.
// Character classes come from unicode_tables.h. Invalid UTF-8 bytes class as "other"
// (punctuation-like), one byte at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace glm5::text {

// Appends the pieces of `text`, in order; their concatenation is `text`.
void pretokenize_glm4(std::string_view text, std::vector<std::string_view>& pieces);

// Calls piece() with each piece in order while it returns true. The text is decoded
// as the scan reaches it and forgotten behind it, so memory follows the longest
// piece; a piece longer than max_piece_bytes is not scanned to its end. Returns
// false when piece() asked to stop or a piece was too long (the rest is not passed
// on), true when every piece was.
bool pretokenize_glm4(std::string_view text, const std::function<bool(std::string_view)>& piece,
                      size_t max_piece_bytes = SIZE_MAX);

}  // namespace glm5::text
