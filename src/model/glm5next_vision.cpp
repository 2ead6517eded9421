// The glm5next vision tower's forward (docs/glm5next-format.md 12.4), top to
// bottom as the specification writes it. Only the patch unfolding (the
// pixels are host input, like token ids) happens here; every product, norm
// and attention runs on the backend. Row-wise work of the MLP runs in chunks
// of patches so the scratch stays bounded at the 8000-token budget (32000
// patches); attention needs every patch's q, k and v at once.
#include "model/glm5next_vision.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace glm5::model {

using backend::Backend;
using backend::VisionOps;

namespace {

constexpr int64_t kChunk = 1024;  // patches per MLP chunk

}  // namespace

int64_t VisionTower::rows_for(const Image& im) const {
    const int64_t u = hp_.patch * hp_.merge;
    return (im.width / u) * (im.height / u);
}

size_t VisionTower::scratch_bytes(int64_t N) const {
    const int64_t D = hp_.width, P3 = 3 * hp_.patch * hp_.patch, M = N / 4, E = hp_.out;
    const int64_t C = std::min(N, kChunk);
    const int64_t floats = N * P3 + 6 * N * D + 2 * C * hp_.n_ff + M * (3 * E + 2 * hp_.proj_ff);
    // The attention's transposed keys (one image's, at most all patches).
    return size_t(floats + N * D) * sizeof(float) + 64 * 16;
}

// The images' patches in merge-block order (merged cells row-major, the 2x2 patches
// inside each), unfolded as (channel, row, column), with each patch's 2-D position, and
// one attention sequence per image (its patches, with each other).
struct VisionTower::Patches {
    int64_t n = 0;
    std::vector<float> pixels;
    std::vector<int32_t> row, col;
    std::vector<VisionOps::FullAttentionSeq> seqs;
};

VisionTower::Patches VisionTower::unfold(std::span<const Image> images) const {
    const int64_t P = hp_.patch, P3 = 3 * P * P, U = P * hp_.merge;
    Patches out;
    for (const Image& im : images) {
        if (im.width <= 0 || im.height <= 0 || im.width % U || im.height % U)
            throw Error("vision: an image canvas must be whole 28 x 28 cells, got " +
                        std::to_string(im.width) + " x " + std::to_string(im.height));
        out.n += (im.width / P) * (im.height / P);
    }
    out.pixels.resize(size_t(out.n * P3));
    out.row.resize(size_t(out.n));
    out.col.resize(size_t(out.n));
    int64_t n = 0;
    for (const Image& im : images) {
        const int64_t gh = im.height / P, gw = im.width / P, plane = im.width * im.height;
        out.seqs.push_back({nullptr, nullptr, nullptr, nullptr, gh * gw});
        for (int64_t mh = 0; mh < gh / 2; ++mh)
            for (int64_t mw = 0; mw < gw / 2; ++mw)
                for (int64_t ky = 0; ky < 2; ++ky)
                    for (int64_t kx = 0; kx < 2; ++kx, ++n) {
                        const int64_t r = 2 * mh + ky, c = 2 * mw + kx;
                        out.row[size_t(n)] = int32_t(r);
                        out.col[size_t(n)] = int32_t(c);
                        float* dst = out.pixels.data() + n * P3;
                        for (int64_t ch = 0; ch < 3; ++ch)
                            for (int64_t y = 0; y < P; ++y) {
                                const float* src =
                                    im.pixels + ch * plane + (r * P + y) * im.width + c * P;
                                std::copy(src, src + P, dst + (ch * P + y) * P);
                            }
                    }
    }
    return out;
}

// The encoder's rows on the backend: the residual X, the attention's q, k, v and output,
// a normed or projected row hn, and one chunk's MLP hidden rows g and u.
struct VisionTower::Work {
    int64_t N = 0, C = 0;
    backend::DevPtr<float> X, q, k, v, att, hn, g, u;
};

void VisionTower::encode(std::span<const Image> images, std::vector<float>& out) {
    Backend& be = be_;
    const int64_t D = hp_.width, P = hp_.patch, P3 = 3 * P * P;
    Patches pt = unfold(images);
    out.clear();
    if (pt.n == 0) return;
    const int64_t N = pt.n;
    be.reset_scratch();
    const backend::DevPtr<float> px = be.scratch(size_t(N * P3));
    Work w;
    w.N = N;
    w.C = std::min(N, kChunk);
    for (backend::DevPtr<float>* b : {&w.X, &w.q, &w.k, &w.v, &w.att, &w.hn})
        *b = be.scratch(size_t(N * D));
    w.g = be.scratch(size_t(w.C * hp_.n_ff));
    w.u = be.scratch(size_t(w.C * hp_.n_ff));
    be.write(px, pt.pixels.data(), pt.pixels.size());
    int64_t first = 0;
    for (auto& s : pt.seqs) {
        s.q = w.q + first * D;
        s.k = w.k + first * D;
        s.v = w.v + first * D;
        s.out = w.att + first * D;
        first += s.n;
    }

    // x_p = (W_t0 + W_t1) * pixels_p + b
    be.matmul(patch_embd_, px, P3, N, w.X, D);
    ops_.add_bias(w.X, N, D, D, patch_bias_);
    for (const Block& B : blocks_) block(B, w, pt);
    be.rms_norm(w.X, D, post_ln_, N, D, hp_.eps, w.X, D);
    project(w.X, N, out);
}

void VisionTower::block(const Block& B, const Work& w, const Patches& pt) {
    Backend& be = be_;
    VisionOps& vo = ops_;
    const VisionHParams& h = hp_;
    const int64_t D = h.width, F = h.n_ff, H = h.n_head, d = h.head_dim, N = w.N;
    // ---- attention: fused QKV, per-head norms, 2-D RoPE, all patches of an image
    // against each other
    be.rms_norm(w.X, D, B.ln1, N, D, h.eps, w.hn, D);
    const Backend::MatmulOut qkv[3] = {{&B.q, w.q, D}, {&B.k, w.k, D}, {&B.v, w.v, D}};
    be.matmuls(qkv, w.hn, D, N);
    vo.add_bias(w.q, N, D, D, B.q_bias);
    vo.add_bias(w.k, N, D, D, B.k_bias);
    vo.add_bias(w.v, N, D, D, B.v_bias);
    be.rms_norm(w.q, d, B.q_norm, N * H, d, h.eps, w.q, d);
    be.rms_norm(w.k, d, B.k_norm, N * H, d, h.eps, w.k, d);
    vo.rope_2d(w.q, N, D, H, d, pt.row.data(), pt.col.data(), h.rope_theta);
    vo.rope_2d(w.k, N, D, H, d, pt.row.data(), pt.col.data(), h.rope_theta);
    vo.attention_full(pt.seqs, H, d, D, 1.0f / std::sqrt(float(d)));
    be.matmul(B.wo, w.att, D, N, w.hn, D);
    vo.add_bias(w.hn, N, D, D, B.wo_bias);
    be.add(w.X, w.hn, N * D);

    // ---- clamped SwiGLU MLP, chunk by chunk
    for (int64_t r0 = 0; r0 < N; r0 += w.C) {
        const int64_t n = std::min(w.C, N - r0);
        const backend::DevPtr<float> xr = w.X + r0 * D;
        be.rms_norm(xr, D, B.ln2, n, D, h.eps, w.hn, D);
        const Backend::MatmulOut gu[2] = {{&B.gate, w.g, F}, {&B.up, w.u, F}};
        be.matmuls(gu, w.hn, D, n);
        if (B.gate_bias) vo.add_bias(w.g, n, F, F, B.gate_bias);
        if (B.up_bias) vo.add_bias(w.u, n, F, F, B.up_bias);
        be.swiglu(w.g, w.u, n, F, F, h.limit, w.g);
        be.matmul(B.down, w.g, F, n, w.hn, D);
        if (B.down_bias) vo.add_bias(w.hn, n, D, D, B.down_bias);
        be.add(xr, w.hn, n * D);
    }
}

// The 2x2 merger (a merged cell's four patches are consecutive rows) and the projector:
// fc, LayerNorm, exact GELU, clamped SwiGLU.
void VisionTower::project(backend::DevPtr<const float> X, int64_t N, std::vector<float>& out) {
    Backend& be = be_;
    const int64_t D = hp_.width, E = hp_.out, M = N / 4, Fp = hp_.proj_ff;
    const backend::DevPtr<float> y = be.scratch(size_t(M * E));
    const backend::DevPtr<float> z = be.scratch(size_t(M * E));
    const backend::DevPtr<float> pg = be.scratch(size_t(M * Fp));
    const backend::DevPtr<float> pu = be.scratch(size_t(M * Fp));
    const backend::DevPtr<float> o = be.scratch(size_t(M * E));
    be.matmul(merger_, X, 4 * D, M, y, E);
    ops_.add_bias(y, M, E, E, merger_bias_);
    be.matmul(fc_, y, E, M, z, E);
    be.layer_norm(z, post_norm_w_, post_norm_b_, M, E, 1e-5f, z);
    ops_.gelu_erf(z, M * E);
    const Backend::MatmulOut proj[2] = {{&mm_gate_, pg, Fp}, {&mm_up_, pu, Fp}};
    be.matmuls(proj, z, E, M);
    be.swiglu(pg, pu, M, Fp, Fp, hp_.limit, pg);
    be.matmul(mm_down_, pg, Fp, M, o, E);
    out.resize(size_t(M * E));
    be.read(o, out.data(), out.size());
}

}  // namespace glm5::model
