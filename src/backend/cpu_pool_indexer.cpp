// Pooled key compression on the CPU: each complete pool of cache rows becomes
// one key, a gated softmax average of its rows followed by an RMSNorm. A
// pool's key depends only on its own rows, so it is computed once, when the
// pool completes, and kept in the pool-key cache.
#include "backend/cpu_backend.h"

namespace glm5::backend::cpu {

void CpuBackend::pool_compress(const CacheRows& cells, int64_t Dk, int64_t Gw, int64_t B,
                               const float* ape, const float* norm_w, float eps,
                               const CacheRows& pools, DevPtr<const int32_t> pos_, int64_t n_rows) {
    if (n_rows <= 0) return;
    const int32_t* pos = host(pos_);
    const int64_t first = pos[0] / B, n_pools = (int64_t(pos[n_rows - 1]) + 1) / B - first;
    if (n_pools <= 0) return;
    pool_.parallel_for(n_pools, 1, [&](int64_t b, int64_t e, int) {
        std::vector<float> rows(static_cast<size_t>(B * cells.width));
        std::vector<float> logit(static_cast<size_t>(B * Gw)), pooled(static_cast<size_t>(Dk));
        for (int64_t pj = b; pj < e; ++pj) {
            const int64_t j = first + pj;
            for (int64_t s = 0; s < B; ++s) {
                float* dst = rows.data() + s * cells.width;
                const float* r = load_row(cells, j * B + s, dst);
                if (r != dst) std::memcpy(dst, r, size_t(cells.width) * sizeof(float));
            }
            // Slot weights per gate channel: softmax over the B slots of gate + ape.
            for (int64_t i = 0; i < Gw; ++i) {
                float mx = -INFINITY;
                for (int64_t s = 0; s < B; ++s) {
                    const float z = rows[size_t(s * cells.width + Dk + i)] + ape[s * Gw + i];
                    logit[size_t(s * Gw + i)] = z;
                    mx = std::max(mx, z);
                }
                float sum = 0.0f;
                for (int64_t s = 0; s < B; ++s) {
                    float& z = logit[size_t(s * Gw + i)];
                    z = std::exp(z - mx);
                    sum += z;
                }
                for (int64_t s = 0; s < B; ++s) logit[size_t(s * Gw + i)] /= sum;
            }
            for (int64_t i = 0; i < Dk; ++i) {
                const int64_t gi = Gw == 1 ? 0 : i;
                float acc = 0.0f;
                for (int64_t s = 0; s < B; ++s)
                    acc += logit[size_t(s * Gw + gi)] * rows[size_t(s * cells.width + i)];
                pooled[size_t(i)] = acc;
            }
            simd().rms_norm(pooled.data(), norm_w, Dk, eps, pooled.data());
            const int32_t row = int32_t(j);
            cache_store(pools, dev(pooled.data()), Dk, 1, dev(&row));
        }
    });
}

void CpuBackend::pool_cells(DevPtr<const int32_t> picked_, DevPtr<const int32_t> pos_,
                            int64_t n_rows, int64_t n_sel, int64_t B, DevPtr<int32_t> rows,
                            int64_t stride) {
    const int32_t* pos = host(pos_);
    for (int64_t t = 0; t < n_rows; ++t) {
        const int64_t n_vis = int64_t(pos[t]) + 1;
        if (!Selection::selects(n_vis, B, n_sel)) continue;
        const int32_t* picked = host(picked_ + t * n_sel);
        int32_t* r = host(rows + t * stride);
        int64_t n = 0;
        for (int64_t j = 0; j < n_sel; ++j)
            for (int64_t s = 0; s < B; ++s) r[n++] = int32_t(picked[j] * B + s);
        for (int64_t cell = (n_vis / B) * B; cell < n_vis; ++cell) r[n++] = int32_t(cell);
    }
}

}  // namespace glm5::backend::cpu
