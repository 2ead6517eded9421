// The attention family of the glm-dsa and glm5next forwards: MLA over latent cache rows
// (absorbed, MQA), the lightning indexer's top-k selection, and the pooled indexer's
// compressed keys and the cells its picks expand to.
#pragma once

#include <algorithm>
#include <span>

#include "backend/backend.h"

namespace glm5::backend {

class AttentionOps {
  public:
    static constexpr const char* kWhat = "the MLA and indexer attention ops";
    virtual ~AttentionOps() = default;

    // The scratch mla_attention takes beside its arguments for a batch's queries of
    // n_heads heads over at most n_visible rows each (the memory plan counts it): what
    // the backend keeps per worker is its own business.
    virtual size_t attention_scratch_bytes(int64_t n_heads, int64_t n_visible) const = 0;

    // The storage to allocate for indexer key caches where the model would
    // use `requested` (same bytes per value): the CPU backend under
    // --attn-bf16 keeps F16 keys as BF16, which its tile product reads in place.
    virtual CacheType indexer_key_type(CacheType requested) const { return requested; }

    // A step's rows come in segments, one per sequence: batch rows [first, first + n),
    // with that sequence's cache for the op's layer. What a row sees follows from its
    // position in the step's plan alone (causal: n_vis = pos[t] + 1 cells), so the op
    // list of one shape of step is the same whatever the positions: the ops decide per
    // row, on the backend, what is dense and what is selected.
    struct Segment {
        CacheRows cache;
        int64_t first = 0, n = 0;
    };
    // The batch rows a step's segments cover: 0 to the end of the last.
    static int64_t rows_of(std::span<const Segment> segs) {
        int64_t T = 0;
        for (const Segment& s : segs) T = std::max(T, s.first + s.n);
        return T;
    }
    // A sparse selection. A row with more than `keep` candidates (cells, or complete
    // pools of `pool` cells: n_vis / pool of them) sees the keep * pool + n_vis % pool
    // cells listed at rows[t * stride ..]; a row with fewer sees all of its n_vis cells.
    // A null `rows`: every row sees all of them.
    struct Selection {
        DevPtr<const int32_t> rows;
        int64_t stride = 0;
        int64_t keep = 0;
        int64_t pool = 1;
        // The rule every op of a step applies to a row that sees n_vis cells: whether
        // it has more candidates than are kept, and then how many cells it sees (on a
        // device's kernels too: host-and-device code).
        static GLM5_HD bool selects(int64_t n_vis, int64_t pool, int64_t keep) {
            return n_vis / pool > keep;
        }
        bool selects(int64_t n_vis) const { return rows && selects(n_vis, pool, keep); }
        static GLM5_HD int64_t n_selected(int64_t n_vis, int64_t pool, int64_t keep) {
            return keep * pool + n_vis % pool;
        }
        int64_t n_selected(int64_t n_vis) const { return n_selected(n_vis, pool, keep); }
    };

    // The lightning indexer's inputs made ready for indexer_select, for the segments' rows
    // t at positions pos[t]: each query head q[t][h] (dim values) RoPE'd over its first
    // n_rot values and rotated by the normalised Hadamard transform; each key k[t]
    // layer-normed (norm_w, norm_b, eps 0), RoPE'd and rotated likewise, and stored as row
    // pos[t] of its segment's key cache; the head weights w[t][h] scaled by w_scale. The
    // bits of Backend's rope, layer_norm, hadamard, cache_store and scale (a device does it
    // in fewer launches). q: [T][n_heads][dim], k: [T][dim], w: [T][n_heads].
    virtual void indexer_inputs(DevPtr<float> q, DevPtr<float> k, DevPtr<float> w,
                                DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                int64_t n_heads, int64_t dim, int64_t n_rot, float freq_base,
                                const float* norm_w, const float* norm_b, float w_scale) = 0;

    // MLA's rows of a step made ready for mla_attention: each row t's cache row
    // kv[t] = [c | k_rope] (kv_stride apart), c = RMSNorm(kv[t][0, R); norm_w, eps) and k_rope
    // = kv[t][R, R + n_rot) RoPE'd at pos[t], stored as row pos[t] of its segment's cache
    // (kv is left normed and RoPE'd); and each query head's rope part q[t][h][nope, nope +
    // n_rot) (q_width apart) RoPE'd into qfull[t][h][R, R + n_rot) (qfull_width apart; q left
    // as it is). The bits of Backend's rms_norm, rope, cache_store and copy_rows (a device
    // does it in one launch).
    struct MlaRows {
        DevPtr<float> kv;
        int64_t kv_stride = 0, R = 0, n_rot = 0;
        const float* norm_w = nullptr;
        float eps = 0.0f, freq_base = 10000.0f;
        DevPtr<const float> q;
        int64_t n_heads = 0, q_width = 0, nope = 0;
        DevPtr<float> qfull;
        int64_t qfull_width = 0;
    };
    virtual void mla_rows(const MlaRows& m, DevPtr<const int32_t> pos,
                          std::span<const Segment> segs) = 0;

    // Lightning-indexer selection: for each of the segments' rows t with more than top_k
    // candidates (n_vis / pool: tokens when pool is 1, complete pools otherwise),
    // score(s) = sum_h w[t][h] * relu(q[t][h] . key_s) over its candidates (rows of its
    // segment's cache); the indices of the top_k highest scores (ties to the lower index),
    // ascending, to out[t * top_k ..]. Other rows are left alone. q: [T][n_heads][dim]
    // (rounded to the cache type like the keys), w: [T][n_heads].
    virtual void indexer_select(DevPtr<const float> q, DevPtr<const float> w,
                                DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                int64_t pool, int64_t n_heads, int64_t dim, int64_t top_k,
                                DevPtr<int32_t> out) = 0;

    // MLA (absorbed, MQA over latent rows) for the segments' rows. For each row t and
    // head h: s_j = scale * q[t][h] . row_j over the cache rows `sel` lets t see
    // (rows are [latent | rope], width = q width), p = softmax(s),
    // out[t][h] = sum_j p_j * row_j[0..v_width). q: [T][n_heads][width],
    // out: [T][n_heads][v_width]. With an F16 cache the query and the probabilities are
    // rounded to F16, as llama.cpp's F16 path does.
    virtual void mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos,
                               std::span<const Segment> segs, const Selection& sel, int64_t n_heads,
                               int64_t v_width, float scale, DevPtr<float> out) = 0;

    // Compressed keys of complete pools of `pool_size` consecutive cache rows.
    // Row r of `cells` is [key (key_width) | gate (gate_width: key_width or 1)].
    // For pool j (rows j*B .. j*B+B-1), per channel i:
    //   a_s = softmax over slots s of (gate[jB+s][i] + ape[s*gate_width + i])
    //   out_j = RMSNorm(sum_s a_s * key[jB+s]; norm_w)
    // (a width-1 gate gives one weight per slot for every channel), stored as
    // row j of `pools` for the pools that n_rows new cells at positions pos[0 ..]
    // (one sequence's, in order: the step's plan) complete.
    virtual void pool_compress(const CacheRows& cells, int64_t key_width, int64_t gate_width,
                               int64_t pool_size, const float* ape, const float* norm_w, float eps,
                               const CacheRows& pools, DevPtr<const int32_t> pos,
                               int64_t n_rows) = 0;
    // The cells a pooled selection lets each of n_rows rows see, for the rows past
    // the dense limit (n_vis / pool_size > n_sel, n_vis = pos[t] + 1): its n_sel picked
    // pools (picked[t * n_sel ..], ascending: indexer_select's output) expanded to their
    // cells j*B .. j*B+B-1, then the cells of its trailing partial pool
    // [(n_vis / B) * B, n_vis), to rows[t * stride ..] (n_sel*B + n_vis % B indices).
    virtual void pool_cells(DevPtr<const int32_t> picked, DevPtr<const int32_t> pos, int64_t n_rows,
                            int64_t n_sel, int64_t pool_size, DevPtr<int32_t> rows,
                            int64_t stride) = 0;
};

}  // namespace glm5::backend
