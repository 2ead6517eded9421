// One input of the load-path fuzz target (fuzz_load.cpp), shared with the
// corpus replay in ctest (tests/test_fuzz_load_corpus.cpp).
//
// The input is a model GGUF cut after its tensor infos (fuzz/make_load_seeds.py);
// the tensor data, which the load path does not read, is supplied as zeros after
// it. The whole load path runs: GGUF reader, tokenizer and chat format, the
// architecture's hyperparameter and tensor checks, and a sequence state sized by
// the hyperparameters. An mmproj input (general.architecture "clip") is loaded
// as a vision tower for the glm5next fixture model, the one kind of text model
// it serves. Every input must load or be refused with glm5::Error; anything
// else escaping (another exception, a sanitizer report) is a finding.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/glm5next_vision.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace glm5::fuzz {

constexpr size_t kMaxLoadInput = size_t(1) << 20;   // header bytes (libFuzzer -max_len)
constexpr size_t kTensorDataPad = size_t(6) << 20;  // zeros standing for the tensor data

// The text model an mmproj input is loaded for: the glm5next fixture, whole
// (GLM5_SOURCE_DIR is the repository root, set by the fuzz and test builds).
struct VisionHost {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<model::Model> model;
};
inline const model::Model& vision_host(backend::Backend& be) {
    static const VisionHost h = [&] {
        VisionHost v;
        v.file = gguf::File::open(std::string(GLM5_SOURCE_DIR) + "/tests/data/glm5next/tiny.gguf");
        v.model = model::load_model(*v.file, be, {});
        return v;
    }();
    return *h.model;
}

// 0: loaded; 1: refused with glm5::Error.
inline int load_one(const uint8_t* data, size_t size) {
    if (size > kMaxLoadInput) return 1;
    // One buffer for every input: only the bytes the last input dirtied are reset.
    static std::vector<uint8_t> buf(kMaxLoadInput + kTensorDataPad, 0);
    static size_t dirty = 0;
    std::memcpy(buf.data(), data, size);
    if (dirty > size) std::memset(buf.data() + size, 0, dirty - size);
    dirty = size;
    static const std::unique_ptr<backend::Backend> be = [] {
        backend::CpuOptions bo;
        bo.n_threads = 1;
        return backend::make_cpu_backend(bo);
    }();
    try {
        const auto f = gguf::File::parse_memory(buf.data(), size + kTensorDataPad, "fuzz.gguf");
        if (f->get_string("general.architecture", "") == "clip") {
            const auto tower = model::load_vision_tower(*f, *be, vision_host(*be), {});
            (void)tower->scratch_bytes(64);
            return 0;
        }
        if (f->find("tokenizer.ggml.model")) {
            const auto tok = text::Tokenizer::from_gguf(*f);
            const auto fmt = text::ChatFormat::from_gguf(*f);
            (void)tok->n_vocab();
        }
        model::LoadOptions lo;
        lo.load_nextn = true;
        const auto m = model::load_model(*f, *be, lo);
        const auto st = m->new_state(64);
        (void)st->memory_bytes();
    } catch (const Error&) {
        return 1;
    }
    return 0;
}

}  // namespace glm5::fuzz
