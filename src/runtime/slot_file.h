// The persistent prompt cache's files (glm5 serve --slot-save-path): a sequence's
// tokens and state (model::SequenceState::save), with what identifies the model and
// cache type that made them, so that a file is only ever read back into the same.
//
//   "GLM5SLOT" | u32 version | u32 n + the fingerprint | u64 n + n i32 tokens |
//   u64 n + n bytes of state
//
// The folder is the operator's and the files hold conversations: a file is written only
// as a new file of this process's (mode 0600, never through a link), then renamed into
// place, and only over nothing or another slot file; a file is read only when it is a
// regular file whose header says it is a slot file of this model, of a size that fits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace glm5::runtime {

struct SlotFile {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> state;
};

// Writes `f` as `name` in `folder` (a new temporary file renamed over it, so a reader never
// sees half a file); returns the bytes written. Refuses, leaving everything as it was, a name
// that is anything but absent or a slot file, and a save that would take the folder's files
// past `folder_limit` bytes (0: no limit). Throws glm5::Error.
size_t write_slot_file(const std::string& folder, const std::string& name,
                       const std::string& fingerprint, const SlotFile& f,
                       uint64_t folder_limit = 0);
// Reads a file written for `fingerprint` of at most `max_bytes`: a missing, damaged,
// oversized or linked file, anything but a regular file, or one another model or cache type
// wrote, is refused from its metadata and header (glm5::Error saying which).
SlotFile read_slot_file(const std::string& path, const std::string& fingerprint, uint64_t max_bytes,
                        size_t* bytes_read);
// Why a folder cannot hold slot files ("" when it can): it must be a folder that only its
// owner may write to.
std::string slot_folder_problem(const std::string& folder);

}  // namespace glm5::runtime
