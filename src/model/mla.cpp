#include "model/mla.h"

#include <cmath>
#include <vector>

namespace glm5::model {

MlaWeights load_mla(TensorSource& ts, const std::string& p, int64_t n_embd, const MlaShape& s,
                    bool split, int64_t h0, int64_t n) {
    const int64_t E = n_embd, H = s.n_head;
    // Split: the heads' matrices in the file's row layout, so that this
    // rank's part can be cut from them below.
    const auto heads = split ? TensorSource::Layout::Plain : TensorSource::Layout::Products;
    MlaWeights w;
    w.q_a = ts.matrix(p + "attn_q_a.weight", {E, s.q_lora});
    w.q_a_norm = ts.vector(p + "attn_q_a_norm.weight", s.q_lora);
    w.q_b = ts.matrix(p + "attn_q_b.weight", {s.q_lora, H * s.k_mla}, heads);
    w.kv_a = ts.matrix(p + "attn_kv_a_mqa.weight", {E, s.row()});
    w.kv_a_norm = ts.vector(p + "attn_kv_a_norm.weight", s.kv_lora);
    w.k_b = ts.matrix(p + "attn_k_b.weight", {s.nope(), s.kv_lora, H}, heads);
    w.v_b = ts.matrix(p + "attn_v_b.weight", {s.kv_lora, s.v_mla, H}, heads);
    w.wo = ts.matrix(p + "attn_output.weight", {H * s.v_mla, E}, heads);
    if (split) {
        w.q_b = rows_of(w.q_b, h0 * s.k_mla, n * s.k_mla, p + "attn_q_b.weight");
        w.k_b = slices_of(w.k_b, h0, n, p + "attn_k_b.weight");
        w.v_b = slices_of(w.v_b, h0, n, p + "attn_v_b.weight");
        w.wo = columns_of(w.wo, h0 * s.v_mla, n * s.v_mla, p + "attn_output.weight");
    }
    return w;
}

void MlaBlock::project(backend::DevPtr<const float> xn, std::span<const MatmulOut> from_x,
                       std::span<const MatmulOut> from_qr) const {
    const int64_t Q = s_.q_lora;
    std::vector<MatmulOut> outs = {{&w_.q_a, b_.qr, Q}, {&w_.kv_a, b_.kv, s_.row()}};
    outs.insert(outs.end(), from_x.begin(), from_x.end());
    be_.matmuls(outs, xn, w_.q_a.cols, T_);
    be_.rms_norm(b_.qr, Q, w_.q_a_norm, T_, Q, s_.eps, b_.qr, Q);
    outs.assign({{&w_.q_b, b_.q, s_.n_head * s_.k_mla}});
    outs.insert(outs.end(), from_qr.begin(), from_qr.end());
    be_.matmuls(outs, b_.qr, Q, T_);
}

void MlaBlock::attend(backend::DevPtr<const int32_t> pos, std::span<const MlaSeq> seqs,
                      const backend::AttentionOps::Selection& sel,
                      backend::DevPtr<float> out) const {
    backend::Backend& be = be_;
    const int64_t T = T_, H = s_.n_head, R = s_.kv_lora, W = s_.row();
    const int64_t Dq = s_.k_mla, Dv = s_.v_mla, n_rot = s_.n_rot;

    // The cache row [c | k_rope]: c normed, k_rope (shared by all heads) RoPE'd at its
    // position, stored; the queries' rope parts RoPE'd into their latent-space rows.
    std::vector<backend::AttentionOps::Segment> segs;
    for (const MlaSeq& q : seqs) segs.push_back({*q.latent, q.first, q.n});
    backend::AttentionOps::MlaRows rows;
    rows.kv = b_.kv, rows.kv_stride = W, rows.R = R, rows.n_rot = n_rot;
    rows.norm_w = w_.kv_a_norm, rows.eps = s_.eps, rows.freq_base = s_.freq_base;
    rows.q = b_.q, rows.n_heads = H, rows.q_width = Dq, rows.nope = s_.nope();
    rows.qfull = b_.qfull, rows.qfull_width = W;
    attn_.mla_rows(rows, pos, segs);

    // Queries in latent space: q_abs = K_b[h] . q_nope[h] beside the rope part.
    be.matmul_slices(w_.k_b, b_.q, H * Dq, Dq, T, b_.qfull, H * W, W);

    attn_.mla_attention(b_.qfull, pos, segs, sel, H, R, 1.0f / std::sqrt(float(Dq)), b_.olat);

    // Decompress each head's latent output with V_b[h], then project out.
    be.matmul_slices(w_.v_b, b_.olat, H * R, R, T, b_.ov, H * Dv, Dv);
    be.matmul(w_.wo, b_.ov, H * Dv, T, out, w_.wo.rows);
}

}  // namespace glm5::model
