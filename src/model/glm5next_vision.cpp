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

void VisionTower::encode(std::span<const Image> images, std::vector<float>& out) {
    Backend& be = be_;
    VisionOps& vo = ops_;
    const VisionHParams& h = hp_;
    const int64_t D = h.width, F = h.n_ff, H = h.n_head, d = h.head_dim, E = h.out;
    const int64_t P = h.patch, P3 = 3 * P * P, U = P * h.merge;

    // Patches of every image in merge-block order (merged cells row-major,
    // the 2x2 patches inside each), unfolded as (channel, row, column), and
    // each patch's 2-D position.
    int64_t N = 0;
    for (const Image& im : images) {
        if (im.width <= 0 || im.height <= 0 || im.width % U || im.height % U)
            throw Error("vision: an image canvas must be whole 28 x 28 cells, got " +
                        std::to_string(im.width) + " x " + std::to_string(im.height));
        N += (im.width / P) * (im.height / P);
    }
    out.clear();
    if (N == 0) return;
    std::vector<float> patches(size_t(N * P3));
    std::vector<int32_t> prow(static_cast<size_t>(N)), pcol(static_cast<size_t>(N));
    std::vector<VisionOps::FullAttentionSeq> seqs;
    {
        int64_t n = 0;
        for (const Image& im : images) {
            const int64_t gh = im.height / P, gw = im.width / P, plane = im.width * im.height;
            seqs.push_back({nullptr, nullptr, nullptr, nullptr, gh * gw});
            for (int64_t mh = 0; mh < gh / 2; ++mh)
                for (int64_t mw = 0; mw < gw / 2; ++mw)
                    for (int64_t ky = 0; ky < 2; ++ky)
                        for (int64_t kx = 0; kx < 2; ++kx, ++n) {
                            const int64_t r = 2 * mh + ky, c = 2 * mw + kx;
                            prow[size_t(n)] = int32_t(r);
                            pcol[size_t(n)] = int32_t(c);
                            float* dst = patches.data() + n * P3;
                            for (int64_t ch = 0; ch < 3; ++ch)
                                for (int64_t y = 0; y < P; ++y) {
                                    const float* src =
                                        im.pixels + ch * plane + (r * P + y) * im.width + c * P;
                                    std::copy(src, src + P, dst + (ch * P + y) * P);
                                }
                        }
        }
    }

    be.reset_scratch();
    const backend::DevPtr<float> px = be.scratch(size_t(N * P3));
    const backend::DevPtr<float> X = be.scratch(size_t(N * D));
    const backend::DevPtr<float> q = be.scratch(size_t(N * D));
    const backend::DevPtr<float> k = be.scratch(size_t(N * D));
    const backend::DevPtr<float> v = be.scratch(size_t(N * D));
    const backend::DevPtr<float> att = be.scratch(size_t(N * D));
    const backend::DevPtr<float> hn = be.scratch(size_t(N * D));
    const int64_t C = std::min(N, kChunk);
    const backend::DevPtr<float> g = be.scratch(size_t(C * F));
    const backend::DevPtr<float> u = be.scratch(size_t(C * F));
    be.write(px, patches.data(), patches.size());
    {
        int64_t first = 0;
        for (auto& s : seqs) {
            s.q = q + first * D;
            s.k = k + first * D;
            s.v = v + first * D;
            s.out = att + first * D;
            first += s.n;
        }
    }

    // x_p = (W_t0 + W_t1) * pixels_p + b
    be.matmul(patch_embd_, px, P3, N, X, D);
    vo.add_bias(X, N, D, D, patch_bias_);

    for (const Block& B : blocks_) {
        // ---- attention: fused QKV, per-head norms, 2-D RoPE, all patches of
        // an image against each other
        be.rms_norm(X, D, B.ln1, N, D, h.eps, hn, D);
        const Backend::MatmulOut qkv[3] = {{&B.q, q, D}, {&B.k, k, D}, {&B.v, v, D}};
        be.matmuls(qkv, hn, D, N);
        vo.add_bias(q, N, D, D, B.q_bias);
        vo.add_bias(k, N, D, D, B.k_bias);
        vo.add_bias(v, N, D, D, B.v_bias);
        be.rms_norm(q, d, B.q_norm, N * H, d, h.eps, q, d);
        be.rms_norm(k, d, B.k_norm, N * H, d, h.eps, k, d);
        vo.rope_2d(q, N, D, H, d, prow.data(), pcol.data(), h.rope_theta);
        vo.rope_2d(k, N, D, H, d, prow.data(), pcol.data(), h.rope_theta);
        vo.attention_full(seqs, H, d, D, 1.0f / std::sqrt(float(d)));
        be.matmul(B.wo, att, D, N, hn, D);
        vo.add_bias(hn, N, D, D, B.wo_bias);
        be.add(X, hn, N * D);

        // ---- clamped SwiGLU MLP, chunk by chunk
        for (int64_t r0 = 0; r0 < N; r0 += C) {
            const int64_t n = std::min(C, N - r0);
            const backend::DevPtr<float> xr = X + r0 * D;
            be.rms_norm(xr, D, B.ln2, n, D, h.eps, hn, D);
            const Backend::MatmulOut gu[2] = {{&B.gate, g, F}, {&B.up, u, F}};
            be.matmuls(gu, hn, D, n);
            if (B.gate_bias) vo.add_bias(g, n, F, F, B.gate_bias);
            if (B.up_bias) vo.add_bias(u, n, F, F, B.up_bias);
            be.swiglu(g, u, n, F, F, h.limit, g);
            be.matmul(B.down, g, F, n, hn, D);
            if (B.down_bias) vo.add_bias(hn, n, D, D, B.down_bias);
            be.add(xr, hn, n * D);
        }
    }
    be.rms_norm(X, D, post_ln_, N, D, h.eps, X, D);

    // ---- 2x2 merger (a merged cell's four patches are consecutive rows) and
    // the projector: fc, LayerNorm, exact GELU, clamped SwiGLU.
    const int64_t M = N / 4, Fp = h.proj_ff;
    const backend::DevPtr<float> y = be.scratch(size_t(M * E));
    const backend::DevPtr<float> z = be.scratch(size_t(M * E));
    const backend::DevPtr<float> pg = be.scratch(size_t(M * Fp));
    const backend::DevPtr<float> pu = be.scratch(size_t(M * Fp));
    const backend::DevPtr<float> o = be.scratch(size_t(M * E));
    be.matmul(merger_, X, 4 * D, M, y, E);
    vo.add_bias(y, M, E, E, merger_bias_);
    be.matmul(fc_, y, E, M, z, E);
    be.layer_norm(z, post_norm_w_, post_norm_b_, M, E, 1e-5f, z);
    vo.gelu_erf(z, M * E);
    const Backend::MatmulOut proj[2] = {{&mm_gate_, pg, Fp}, {&mm_up_, pu, Fp}};
    be.matmuls(proj, z, E, M);
    be.swiglu(pg, pu, M, Fp, Fp, h.limit, pg);
    be.matmul(mm_down_, pg, Fp, M, o, E);
    out.resize(size_t(M * E));
    be.read(o, out.data(), out.size());
}

}  // namespace glm5::model
