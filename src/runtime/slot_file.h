// The persistent prompt cache's files (glm5 serve --slot-save-path): a sequence's
// tokens and state (model::SequenceState::save), with what identifies the model and
// cache type that made them, so that a file is only ever read back into the same.
//
//   "GLM5SLOT" | u32 version | u32 n + the fingerprint | u64 n + n i32 tokens |
//   u64 n + n bytes of state
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace glm5::runtime {

struct SlotFile {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> state;
};

// Writes `f` to `path` (through a temporary file renamed over it, so a reader never
// sees half a file); returns the bytes written. Throws glm5::Error.
size_t write_slot_file(const std::string& path, const std::string& fingerprint, const SlotFile& f);
// Reads a file written for `fingerprint`: a missing or damaged file, or one another
// model or cache type wrote, is refused (glm5::Error saying which).
SlotFile read_slot_file(const std::string& path, const std::string& fingerprint,
                        size_t* bytes_read);

}  // namespace glm5::runtime
