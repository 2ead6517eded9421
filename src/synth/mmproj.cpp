#include "synth/mmproj.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "gguf/writer.h"
#include "synth/random.h"

namespace glm5::synth {

MmprojHParams MmprojHParams::preset(std::string_view name) {
    MmprojHParams h;
    if (name == "tiny") return h;
    if (name == "flash") {
        h.width = 1024;
        h.n_ff = 4096;
        h.n_block = 24;
        h.n_head = 16;
        h.out = 4096;
        h.proj_ff = 10240;
        h.limit = 10.0f;
        h.type = quant::Type::BF16;
        return h;
    }
    throw Error("unknown mmproj preset '" + std::string(name) + "' (tiny or flash)");
}

std::vector<std::string> MmprojHParams::preset_names() {
    return {"tiny", "flash"};
}

uint64_t write_mmproj(const MmprojHParams& hp, uint64_t seed, const std::string& path,
                      int n_threads, const std::function<void(uint64_t, uint64_t)>& progress) {
    if (hp.type != quant::Type::F32 && hp.type != quant::Type::F16 && hp.type != quant::Type::BF16)
        throw Error("mmproj matrices must be F32, F16 or BF16");
    ThreadPool pool(n_threads > 0 ? n_threads : ThreadPool::default_threads());
    gguf::Writer w;
    w.set_string("general.architecture", "clip");
    w.set_string("general.name", "glm5next-mmproj-synthetic");
    w.set_string("clip.projector_type", "glm5next");
    w.set_bool("clip.has_vision_encoder", true);
    const std::string v = "clip.vision.";
    w.set_u32(v + "embedding_length", uint32_t(hp.width));
    w.set_u32(v + "feed_forward_length", uint32_t(hp.n_ff));
    w.set_u32(v + "block_count", uint32_t(hp.n_block));
    w.set_u32(v + "attention.head_count", uint32_t(hp.n_head));
    w.set_f32(v + "attention.layer_norm_epsilon", 1e-5f);
    w.set_u32(v + "patch_size", 14);
    w.set_u32(v + "spatial_merge_size", 2);
    w.set_u32(v + "projection_dim", uint32_t(hp.out));
    w.set_f32(v + "swiglu_limit", hp.limit);
    w.set_u32(v + "image_size", 448);
    w.set_array_f32(v + "image_mean", {0.48145466f, 0.4578275f, 0.40821073f});
    w.set_array_f32(v + "image_std", {0.26862954f, 0.26130258f, 0.27577711f});

    // mean + scale * N(0, 1) per value, from the tensor's own stream.
    auto add = [&](const std::string& name, std::vector<int64_t> ne, quant::Type type, float mean,
                   float scale) {
        const uint64_t s = stream_seed(seed, name);
        w.add_tensor(name, type, ne, [=, &pool](uint8_t* dst, size_t) {
            int64_t n = 1;
            for (int64_t x : ne) n *= x;
            const float unit = scale * kNormalUnit;
            pool.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; ++i) {
                    const float f = mean + float(normal_fixed(s, uint64_t(i))) * unit;
                    if (type == quant::Type::F32)
                        reinterpret_cast<float*>(dst)[i] = f;
                    else if (type == quant::Type::F16)
                        reinterpret_cast<uint16_t*>(dst)[i] = fp32_to_fp16(f);
                    else
                        reinterpret_cast<uint16_t*>(dst)[i] = fp32_to_bf16(f);
                }
            });
        });
    };
    const int64_t D = hp.width, F = hp.n_ff, E = hp.out, Fp = hp.proj_ff, d = D / hp.n_head;
    const quant::Type f32 = quant::Type::F32, mt = hp.type;
    auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(float(fan_in)); };
    // The two temporal slices together act as one kernel over 588 inputs.
    add("v.patch_embd.weight", {14, 14, 3, D}, f32, 0.0f, 0.5f * inv(588));
    add("v.patch_embd.weight.1", {14, 14, 3, D}, f32, 0.0f, 0.5f * inv(588));
    add("v.patch_embd.bias", {D}, f32, 0.0f, 0.02f);
    for (int64_t b = 0; b < hp.n_block; ++b) {
        const std::string p = "v.blk." + std::to_string(b) + ".";
        add(p + "ln1.weight", {D}, f32, 1.0f, 0.05f);
        add(p + "ln2.weight", {D}, f32, 1.0f, 0.05f);
        add(p + "attn_qkv.weight", {D, 3 * D}, mt, 0.0f, inv(D));
        add(p + "attn_qkv.bias", {3 * D}, f32, 0.0f, 0.02f);
        add(p + "attn_q_norm.weight", {d}, f32, 1.0f, 0.05f);
        add(p + "attn_k_norm.weight", {d}, f32, 1.0f, 0.05f);
        add(p + "attn_out.weight", {D, D}, mt, 0.0f, inv(D));
        add(p + "attn_out.bias", {D}, f32, 0.0f, 0.02f);
        add(p + "ffn_gate.weight", {D, F}, mt, 0.0f, inv(D));
        add(p + "ffn_gate.bias", {F}, f32, 0.0f, 0.02f);
        add(p + "ffn_up.weight", {D, F}, mt, 0.0f, inv(D));
        add(p + "ffn_up.bias", {F}, f32, 0.0f, 0.02f);
        add(p + "ffn_down.weight", {F, D}, mt, 0.0f, inv(F));
        add(p + "ffn_down.bias", {D}, f32, 0.0f, 0.02f);
    }
    add("v.post_ln.weight", {D}, f32, 1.0f, 0.05f);
    add("mm.patch_merger.weight", {2, 2, D, E}, f32, 0.0f, inv(4 * D));
    add("mm.patch_merger.bias", {E}, f32, 0.0f, 0.02f);
    add("mm.model.fc.weight", {E, E}, mt, 0.0f, inv(E));
    add("mm.post_norm.weight", {E}, f32, 1.0f, 0.05f);
    add("mm.post_norm.bias", {E}, f32, 0.0f, 0.02f);
    add("mm.gate.weight", {E, Fp}, mt, 0.0f, inv(E));
    add("mm.up.weight", {E, Fp}, mt, 0.0f, inv(E));
    add("mm.down.weight", {Fp, E}, mt, 0.0f, inv(Fp));
    w.write(path, progress);
    return std::filesystem::file_size(path);
}

}  // namespace glm5::synth
