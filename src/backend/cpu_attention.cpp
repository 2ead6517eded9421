// The CPU backend's caches and attention: storing rows, the lightning indexer's
// scores and top-k, and MLA over latent rows (one query's heads split across
// threads for decode, deep contexts split by rows, prefill one query a task;
// --attn-bf16: decode's blocks split across threads, prefill in runs of queries).
#include "backend/cpu_backend.h"

#include <algorithm>
#include <memory>
#include <optional>

namespace glm5::backend::cpu {

void CpuBackend::cache_store(const CacheRows& c, DevPtr<const float> x_, int64_t xs, int64_t n_tok,
                             DevPtr<const int32_t> pos_) {
    const int32_t* pos = host(pos_);
    const float* x = host(x_);
    OpTimer timer_(profile_, "cache_store", n_tok);
    for (int64_t t = 0; t < n_tok; ++t) {
        uint8_t* dst = host(c.data) + size_t(pos[t]) * c.row_bytes();
        const float* src = x + t * xs;
        if (c.type == CacheType::F32) {
            std::memcpy(dst, src, size_t(c.width) * sizeof(float));
        } else if (c.type == CacheType::BF16) {
            amx_bf16::round_row(src, c.width, reinterpret_cast<uint16_t*>(dst));
        } else {
            simd().f32_to_f16(c.width, src, reinterpret_cast<uint16_t*>(dst));
        }
    }
}

// The step forms: each segment's rows become per-query lists, decided from the plan's
// positions here rather than by the model on the host.
// The ops one by one (each is one pass of the thread pool over its rows); the query's rope
// part RoPE'd where the copy lands.
void CpuBackend::mla_rows(const MlaRows& m, DevPtr<const int32_t> pos,
                          std::span<const Segment> segs) {
    const int64_t T = rows_of(segs);
    rms_norm(m.kv, m.kv_stride, m.norm_w, T, m.R, m.eps, m.kv, m.kv_stride);
    if (m.n_rot > 0) rope(m.kv + m.R, T, m.kv_stride, 1, m.n_rot, m.n_rot, pos, m.freq_base);
    for (const Segment& s : segs)
        cache_store(s.cache, m.kv + s.first * m.kv_stride, m.kv_stride, s.n, pos + s.first);
    if (m.n_rot > 0) {
        copy_rows(m.q + m.nope, m.q_width, nullptr, T * m.n_heads, m.n_rot, m.qfull + m.R,
                  m.qfull_width);
        rope(m.qfull + m.R, T, m.n_heads * m.qfull_width, m.n_heads, m.qfull_width, m.n_rot, pos,
             m.freq_base);
    }
}

// The ops one by one: each is one pass of the thread pool over its rows already.
void CpuBackend::indexer_inputs(DevPtr<float> q, DevPtr<float> k, DevPtr<float> w,
                                DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                int64_t n_heads, int64_t dim, int64_t n_rot, float freq_base,
                                const float* norm_w, const float* norm_b, float w_scale) {
    const int64_t T = rows_of(keys);
    rope(q, T, n_heads * dim, n_heads, dim, n_rot, pos, freq_base);
    layer_norm(k, norm_w, norm_b, T, dim, 0.0f, k);
    rope(k, T, dim, 1, dim, n_rot, pos, freq_base);
    hadamard(q, T * n_heads, dim);
    hadamard(k, T, dim);
    for (const Segment& s : keys) cache_store(s.cache, k + s.first * dim, dim, s.n, pos + s.first);
    scale(w, w_scale, T * n_heads);
}

void CpuBackend::indexer_select(DevPtr<const float> q, DevPtr<const float> w,
                                DevPtr<const int32_t> pos_, std::span<const Segment> keys,
                                int64_t pool, int64_t n_heads, int64_t dim, int64_t top_k,
                                DevPtr<int32_t> out) {
    const int32_t* pos = host(pos_);
    std::vector<IndexerQuery> queries;
    for (const Segment& s : keys)
        for (int64_t t = s.first; t < s.first + s.n; ++t) {
            const int64_t n_vis = int64_t(pos[t]) + 1;
            if (!Selection::selects(n_vis, pool, top_k)) continue;
            queries.push_back({q + t * n_heads * dim, w + t * n_heads, s.cache,
                               int32_t(n_vis / pool), out + t * top_k});
        }
    if (!queries.empty()) indexer_select(queries, n_heads, dim, top_k);
}

void CpuBackend::mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos_,
                               std::span<const Segment> segs, const Selection& sel, int64_t n_heads,
                               int64_t v_width, float scale, DevPtr<float> out) {
    const int32_t* pos = host(pos_);
    const int64_t T = rows_of(segs);
    std::vector<AttentionQuery> queries(static_cast<size_t>(T));  // in batch order
    for (const Segment& s : segs)
        for (int64_t t = s.first; t < s.first + s.n; ++t) {
            const int64_t n_vis = int64_t(pos[t]) + 1;
            Visible v{int32_t(n_vis), nullptr, 0};
            if (sel.selects(n_vis))
                v = Visible{0, sel.rows + t * sel.stride, int32_t(sel.n_selected(n_vis))};
            queries[size_t(t)] = {q + t * n_heads * s.cache.width, s.cache, v,
                                  out + t * n_heads * v_width};
        }
    if (!queries.empty()) mla_attention(queries, n_heads, v_width, scale);
}

void CpuBackend::indexer_select(std::span<const IndexerQuery> queries, int64_t n_heads, int64_t dim,
                                int64_t top_k) {
    OpTimer timer_(profile_, "indexer_select", int64_t(queries.size()));
    // Scores for every (query, key), then a top-k per query.
    std::vector<int64_t> score_off(queries.size() + 1, 0);
    for (size_t i = 0; i < queries.size(); ++i) score_off[i + 1] = score_off[i] + queries[i].n_keys;
    // Uninitialised (every score is written: a prefill call at depth 16384
    // scores 32 MB) and freed at the end of the call (a buffer kept across
    // calls took a filled context's peak 8% over the memory plan on the tiny
    // glm5next model).
    const auto score_buf = std::make_unique_for_overwrite<float[]>(size_t(score_off.back()));
    float* scores = score_buf.get();
    for (const IndexerQuery& q : queries) cache_bytes_ += uint64_t(q.n_keys) * q.keys.row_bytes();
    if (!queries.empty() && queries[0].keys.type == CacheType::BF16 && !attention_bf16_)
        throw Error("indexer_select: BF16 keys are read by the --attn-bf16 path only");
    const KeyCaches kc = key_caches(queries);
    // Phases timed apart under GLM5_PROFILE.
    std::optional<OpTimer> phase;
    phase.emplace(profile_, "indexer.scores", int64_t(queries.size()));
    if (attention_bf16_)
        indexer_scores_bf16(queries, kc, n_heads, dim, score_off, scores);
    else
        indexer_scores(queries, kc, n_heads, dim, score_off, scores);
    phase.reset();
    phase.emplace(profile_, "indexer.top_k", int64_t(queries.size()));
    const SimdOps& sv = simd();
    pool_.parallel_for(int64_t(queries.size()), 1, [&](int64_t b, int64_t e, int ith) {
        std::vector<int32_t>& idx = per_thread_[size_t(ith)].idx;
        for (int64_t qi = b; qi < e; ++qi) {
            const IndexerQuery& q = queries[size_t(qi)];
            const float* sc = scores + score_off[size_t(qi)];
            sv.top_k_rows(sc, q.n_keys, top_k, idx, host(q.out_rows));
        }
    });
}

CpuBackend::KeyCaches CpuBackend::key_caches(std::span<const IndexerQuery> queries) {
    KeyCaches kc;
    kc.cache_of.resize(queries.size());
    for (size_t i = 0; i < queries.size(); ++i) {
        const CacheRows& k = queries[i].keys;
        size_t c = 0;
        while (c < kc.keys.size() && cpu::host(kc.keys[c]->data) != cpu::host(k.data)) ++c;
        if (c == kc.keys.size()) {
            kc.keys.push_back(&k);
            kc.n_keys.push_back(0);
            kc.members.emplace_back();
        }
        kc.cache_of[i] = c;
        kc.n_keys[c] = std::max<int64_t>(kc.n_keys[c], queries[i].n_keys);
        kc.members[c].push_back(i);
    }
    return kc;
}

void CpuBackend::indexer_scores(std::span<const IndexerQuery> queries, const KeyCaches& kc,
                                int64_t n_heads, int64_t dim, const std::vector<int64_t>& score_off,
                                float* scores) {
    // A score depends only on its query and key, so scoring a block of keys
    // for many queries at once changes no bit. Converting a block once for
    // a whole run (prefill converted every key once per query: 15% of the
    // scores' time at depth 16384) and scoring it while it is in L1 (a
    // chunk converted whole was 128 KB, read back from L2) is what this buys.
    const size_t n_caches = kc.keys.size();
    std::vector<int64_t> runs(n_caches), first(n_caches + 1, 0), chunk(n_caches);
    for (size_t c = 0; c < n_caches; ++c) {
        runs[c] = (int64_t(kc.members[c].size()) + kIndexerRun - 1) / kIndexerRun;
        // One query: about four stretches per thread, each one stream whose
        // keys the form asks for ahead (256-key chunks left more of each
        // stretch's first keys cold: at depth 4096, 55-67 against 47-56 us).
        chunk[c] =
            kc.members[c].size() > 1
                ? kIndexerChunk
                : std::max(kIndexerChunk, (kc.n_keys[c] / (4 * pool_.size()) + 15) / 16 * 16);
        first[c + 1] = first[c] + runs[c] * ((kc.n_keys[c] + chunk[c] - 1) / chunk[c]);
    }
    const SimdOps& sv = simd();
    pool_.parallel_for(first.back(), 1, [&](int64_t b, int64_t e, int ith) {
        std::vector<float>& kf = per_thread_[size_t(ith)].row;
        kf.resize(size_t(kIndexerBlock * dim));
        for (int64_t task = b; task < e; ++task) {
            const size_t c =
                size_t(std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1);
            const int64_t local = task - first[c];
            const std::vector<size_t>& m = kc.members[c];
            const size_t m0 = size_t(local % runs[c] * kIndexerRun);
            const size_t m1 = std::min(m.size(), m0 + size_t(kIndexerRun));
            int64_t run_keys = 0;  // the most keys a query of the run reads
            for (size_t i = m0; i < m1; ++i)
                run_keys = std::max<int64_t>(run_keys, queries[m[i]].n_keys);
            const int64_t s0 = local / runs[c] * chunk[c];
            const int64_t s1 = std::min(run_keys, s0 + chunk[c]);
            const CacheRows& cache = *kc.keys[c];
            const size_t rb = cache.row_bytes();
            const uint8_t* base = host(cache.data);
            if (cache.type == CacheType::F16 && m1 - m0 == 1) {
                // One query (decode): the form that converts each 16 keys
                // as it scores them and asks for the keys ahead.
                const IndexerQuery& q = queries[m[m0]];
                sv.indexer_scores_f16(host(q.q), n_heads, host(q.w),
                                      reinterpret_cast<const uint16_t*>(base + size_t(s0) * rb),
                                      int64_t(rb / sizeof(uint16_t)), s1 - s0, dim,
                                      scores + score_off[m[m0]] + s0);
                continue;
            }
            for (int64_t j0 = s0; j0 < s1; j0 += kIndexerBlock) {
                const int64_t jn = std::min(kIndexerBlock, s1 - j0);
                const float* keys;
                int64_t ks;
                if (cache.type == CacheType::F32) {
                    keys = reinterpret_cast<const float*>(base + size_t(j0) * rb);
                    ks = int64_t(rb / sizeof(float));
                } else {
                    for (int64_t s = j0; s < j0 + jn; ++s)
                        sv.f16_to_f32(dim, reinterpret_cast<const uint16_t*>(base + size_t(s) * rb),
                                      kf.data() + (s - j0) * dim);
                    keys = kf.data();
                    ks = dim;
                }
                for (size_t i = m0; i < m1; ++i) {
                    const IndexerQuery& q = queries[m[i]];
                    if (q.n_keys <= j0) continue;
                    sv.indexer_scores(host(q.q), n_heads, host(q.w), keys, ks,
                                      std::min<int64_t>(jn, q.n_keys - j0), dim,
                                      scores + score_off[m[i]] + j0);
                }
            }
        }
    });
}

void CpuBackend::indexer_scores_bf16(std::span<const IndexerQuery> queries, const KeyCaches& kc,
                                     int64_t n_heads, int64_t dim,
                                     const std::vector<int64_t>& score_off, float* scores) {
    // Each distinct key cache prepared once (prefill: every query of a
    // sequence reads the same keys), up to the most keys a query reads:
    // F16/F32 keys converted to BF16 tiles, BF16 keys read in place.
    const int64_t nq = int64_t(queries.size());
    const std::vector<const CacheRows*>& keys = kc.keys;
    const std::vector<size_t>& cache_of = kc.cache_of;
    // Decode (no two queries share keys): each scoring task converts the keys
    // it scores, while they are in this core's cache. Otherwise every key
    // tile is converted once first, beside the queries.
    const bool fused = keys.size() == queries.size();
    if (idx_keys_.size() < keys.size()) idx_keys_.resize(keys.size());
    std::vector<int64_t> first_tile(keys.size() + 1, 0);
    for (size_t c = 0; c < keys.size(); ++c) {
        idx_keys_[c].reset(amx_bf16::Rows{host(keys[c]->data), keys[c]->row_bytes(), nullptr,
                                          elem_of(keys[c]->type)},
                           kc.n_keys[c], dim);
        first_tile[c + 1] = first_tile[c] + (fused ? 0 : idx_keys_[c].tiles());
    }
    const int64_t qsize = idx_keys_[0].query_size(n_heads);
    idx_q_.resize(size_t(nq * qsize));
    pool_.parallel_for(first_tile.back() + nq, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; ++task) {
            if (task >= first_tile.back()) {
                const int64_t qi = task - first_tile.back();
                idx_keys_[cache_of[size_t(qi)]].convert_query(host(queries[size_t(qi)].q), n_heads,
                                                              idx_q_.data() + qi * qsize);
                continue;
            }
            const size_t c = size_t(std::upper_bound(first_tile.begin(), first_tile.end(), task) -
                                    first_tile.begin() - 1);
            idx_keys_[c].convert(task - first_tile[c]);
        }
    });
    std::vector<int64_t> first_task(queries.size() + 1, 0);
    for (size_t i = 0; i < queries.size(); ++i)
        first_task[i + 1] = first_task[i] + (queries[i].n_keys + kIndexerChunk - 1) / kIndexerChunk;
    pool_.parallel_for(first_task.back(), 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; ++task) {
            const size_t qi = size_t(std::upper_bound(first_task.begin(), first_task.end(), task) -
                                     first_task.begin() - 1);
            const int64_t s0 = (task - first_task[qi]) * kIndexerChunk;
            const int64_t s1 = std::min<int64_t>(queries[qi].n_keys, s0 + kIndexerChunk);
            const IndexerQuery& q = queries[qi];
            amx_bf16::IndexerKeys& k = idx_keys_[cache_of[qi]];
            if (fused && k.tiles() > 0)
                for (int64_t t = s0 / 16; t < (s1 + 15) / 16; ++t) k.convert(t);
            k.scores(idx_q_.data() + int64_t(qi) * qsize, n_heads, host(q.w), s0, s1,
                     scores + score_off[qi] + s0);
        }
    });
}

void CpuBackend::mla_attention(std::span<const AttentionQuery> queries, int64_t n_heads,
                               int64_t v_width, float scale) {
    OpTimer timer_(profile_, "mla_attention", int64_t(queries.size()));
    // Few queries (decode): split each query's heads across threads, one
    // group per thread (every group converts all the rows it reads, so
    // more groups cost more conversions: two per thread measured slower
    // decode deep in a context); many (prefill): one task per query, all
    // heads sharing each row read.
    const int64_t nq = int64_t(queries.size());
    for (const AttentionQuery& q : queries)
        cache_bytes_ += uint64_t(n_visible(q)) * q.cache.row_bytes();
    if (attention_bf16_) {
        attend_bf16(queries, n_heads, v_width, scale);
        return;
    }
    if (nq < pool_.size() && queries[0].cache.type == CacheType::F16) {
        for (const AttentionQuery& q : queries) {
            if (n_visible(q) < kWideRows)
                attend_split({&q, 1}, pool_.size(), n_heads, v_width, scale);
            else
                attend_wide(q, n_heads, v_width, scale);
        }
        return;
    }
    attend_split(queries, std::clamp<int64_t>((pool_.size() + nq - 1) / nq, 1, n_heads), n_heads,
                 v_width, scale);
}

void CpuBackend::attend_bf16(std::span<const AttentionQuery> queries, int64_t H, int64_t v_width,
                             float scale) {
    using amx_bf16::Query;
    const int64_t nq = int64_t(queries.size()), groups = (H + Query::kHeads - 1) / Query::kHeads;
    auto rows_of = [](const AttentionQuery& q) {
        return amx_bf16::Rows{cpu::host(q.cache.data), q.cache.row_bytes(),
                              q.visible.n_dense > 0 ? nullptr : cpu::host(q.visible.rows),
                              elem_of(q.cache.type)};
    };
    auto query = [&](const AttentionQuery& q, int64_t g) {
        const int64_t h0 = g * Query::kHeads, nh = std::min(Query::kHeads, H - h0);
        return Query(host(q.q) + h0 * q.cache.width, nh, q.cache.width, v_width, n_visible(q),
                     scale);
    };
    if (nq < pool_.size()) {
        // Few queries (decode): the blocks of each query's rows shared by the
        // threads, each block of up to kMaxRun head groups together (its rows
        // gathered once for all of them).
        for (const AttentionQuery& q : queries) {
            const amx_bf16::Rows rows = rows_of(q);
            for (int64_t g0 = 0; g0 < groups; g0 += Query::kMaxRun) {
                std::vector<Query> gs;
                for (int64_t g = g0; g < std::min(groups, g0 + Query::kMaxRun); ++g)
                    gs.push_back(query(q, g));
                Query* in[Query::kMaxRun];
                amx_bf16::Rows in_rows[Query::kMaxRun];
                for (size_t i = 0; i < gs.size(); ++i) {
                    in[i] = &gs[i];
                    in_rows[i] = rows;
                }
                // Each thread a stretch of blocks: it asks for its next
                // block's rows while it computes one.
                const int64_t nb = gs[0].blocks();
                pool_.parallel_for(
                    nb, (nb + pool_.size() - 1) / pool_.size(), [&](int64_t b, int64_t e, int) {
                        for (int64_t k = b; k < e; ++k)
                            Query::block_of_run({in, gs.size()}, {in_rows, gs.size()}, k,
                                                k + 1 < e ? k + 1 : -1);
                    });
                for (size_t i = 0; i < gs.size(); ++i)
                    gs[i].finish(host(q.out) + (g0 + int64_t(i)) * Query::kHeads * v_width,
                                 v_width);
            }
        }
        return;
    }
    // Many (prefill): one task per run of consecutive queries and up to
    // kMaxRun / kRun head groups, block k of each query and group with block
    // k of the others. Neighbouring queries pick nearly the same rows and a
    // block holds the k-th stretch of a query's sorted rows, so the run's
    // blocks share most of their rows: each is read, converted and scored
    // once for the run.
    constexpr int64_t kRun = Query::kRunQueries, kGroups = Query::kMaxRun / kRun;
    const int64_t runs = (nq + kRun - 1) / kRun, chunks = (groups + kGroups - 1) / kGroups;
    pool_.parallel_for(runs * chunks, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; ++task) {
            // The last runs first: a causal ubatch's later queries see more rows.
            const int64_t q0 = (runs - 1 - task / chunks) * kRun, q1 = std::min(nq, q0 + kRun);
            const int64_t g0 = task % chunks * kGroups, g1 = std::min(groups, g0 + kGroups);
            std::vector<Query> run;  // query-major: (q0, g0), (q0, g0 + 1), ...
            std::vector<amx_bf16::Rows> rows;
            run.reserve(size_t((q1 - q0) * (g1 - g0)));
            int64_t most = 0;
            for (int64_t qi = q0; qi < q1; ++qi)
                for (int64_t g = g0; g < g1; ++g) {
                    run.push_back(query(queries[size_t(qi)], g));
                    rows.push_back(rows_of(queries[size_t(qi)]));
                    most = std::max(most, run.back().blocks());
                }
            for (int64_t k = 0; k < most; ++k) {
                Query* in[Query::kMaxRun];
                amx_bf16::Rows in_rows[Query::kMaxRun];
                size_t n = 0;
                for (size_t j = 0; j < run.size(); ++j)
                    if (k < run[j].blocks()) {
                        in[n] = &run[j];
                        in_rows[n++] = rows[j];
                    }
                Query::block_of_run({in, n}, {in_rows, n}, k);
            }
            for (size_t j = 0; j < run.size(); ++j) {
                const int64_t qi = q0 + int64_t(j) / (g1 - g0), g = g0 + int64_t(j) % (g1 - g0);
                run[j].finish(host(queries[size_t(qi)].out) + g * Query::kHeads * v_width, v_width);
            }
        }
    });
}

void CpuBackend::attend_split(std::span<const AttentionQuery> queries, int64_t groups,
                              int64_t n_heads, int64_t v_width, float scale) {
    pool_.parallel_for(int64_t(queries.size()) * groups, 1, [&](int64_t b, int64_t e, int ith) {
        PerThread& pt = per_thread_[size_t(ith)];
        for (int64_t task = b; task < e; ++task) {
            const int64_t g = task % groups;
            attend(queries[size_t(task / groups)], g * n_heads / groups, (g + 1) * n_heads / groups,
                   v_width, scale, pt);
        }
    });
}

void CpuBackend::attend_wide(const AttentionQuery& q, int64_t H, int64_t v_width, float scale) {
    const CacheRows& c = q.cache;
    const int64_t W = c.width;
    const int64_t n = n_visible(q);
    const int32_t* idx = q.visible.n_dense > 0 ? nullptr : host(q.visible.rows);
    const SimdOps& sv = simd();
    // Rows [j0, ..) of the visible set, columns from c0 on.
    auto rows_from = [&](int64_t j0, int64_t c0) {
        const uint8_t* base = host(c.data) + size_t(c0) * sizeof(uint16_t);
        if (idx) return F16Rows{base, c.row_bytes(), idx + j0};
        return F16Rows{base + size_t(j0) * c.row_bytes(), c.row_bytes(), nullptr};
    };
    // Aligned: every thread's scores_f16 reads it in place.
    float* const wq = reinterpret_cast<float*>(wide_q_.get(size_t(H * W) * sizeof(float)));
    sv.round_f16(H * W, host(q.q), wq);
    wide_scores_.resize(size_t(H * n));
    float* sc = wide_scores_.data();
    const int64_t T = pool_.size();
    const int64_t rgrain = (n / (4 * T) + 15) / 16 * 16;
    // Phases timed apart under GLM5_PROFILE.
    std::optional<OpTimer> phase;
    phase.emplace(profile_, "attention.scores", 1);
    pool_.parallel_for(n, std::max<int64_t>(16, rgrain), [&](int64_t b, int64_t e, int) {
        sv.scores_f16(wq, H, W, rows_from(b, 0), e - b, sc + b, n);
        for (int64_t h = 0; h < H; ++h)
            for (int64_t j = b; j < e; ++j) sc[h * n + j] *= scale;
    });
    phase.emplace(profile_, "attention.softmax", 1);
    pool_.parallel_for(H, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t h = b; h < e; ++h) sv.softmax(sc + h * n, n, true);
    });
    phase.emplace(profile_, "attention.values", 1);
    // Value columns in pieces of 64 (whole tiles), all heads per piece.
    const int64_t cw = 64, pieces = (v_width + cw - 1) / cw;
    pool_.parallel_for(pieces, 1, [&](int64_t b, int64_t e, int ith) {
        std::vector<float>& part = per_thread_[size_t(ith)].acc;
        for (int64_t k = b; k < e; ++k) {
            const int64_t c0 = k * cw, w = std::min(cw, v_width - c0);
            part.resize(size_t(H * w));
            sv.weighted_sum_f16(sc, n, H, rows_from(0, c0), n, w, part.data());
            for (int64_t h = 0; h < H; ++h)
                std::memcpy(host(q.out) + h * v_width + c0, part.data() + h * w,
                            size_t(w) * sizeof(float));
        }
    });
}

void CpuBackend::attend(const AttentionQuery& q, int64_t h0, int64_t h1, int64_t v_width,
                        float scale, PerThread& pt) {
    const CacheRows& c = q.cache;
    const int64_t W = c.width, nh = h1 - h0;
    const bool f16 = c.type == CacheType::F16;
    const int64_t n = n_visible(q);
    const SimdOps& sv = simd();
    const quant::VecDotFn dot32 = quant::vec_dot_fn(quant::Type::F32);
    auto row_ptr = [&](int64_t j) {
        const int64_t r = q.visible.n_dense > 0 ? j : host(q.visible.rows)[j];
        return host(c.data) + size_t(r) * c.row_bytes();
    };
    // An F16 K cache makes the query F16 too (the activation of an F16
    // product). 64-byte aligned: scores_f16 reads it in place.
    float* const qh = reinterpret_cast<float*>(pt.q.get(size_t(nh * W) * sizeof(float)));
    if (f16)
        sv.round_f16(nh * W, host(q.q) + h0 * W, qh);
    else
        std::memcpy(qh, host(q.q) + h0 * W, size_t(nh * W) * sizeof(float));
    pt.scores.resize(size_t(nh * n));
    const F16Rows rows{host(c.data), c.row_bytes(),
                       q.visible.n_dense > 0 ? nullptr : host(q.visible.rows)};
    if (f16) {
        sv.scores_f16(qh, nh, W, rows, n, pt.scores.data(), n);
        for (float& v : pt.scores) v *= scale;
    } else {
        for (int64_t j = 0; j < n; ++j) {
            const uint8_t* r = row_ptr(j);
            for (int64_t h = 0; h < nh; ++h)
                pt.scores[size_t(h * n + j)] = dot32(W, qh + h * W, r) * scale;
        }
    }
    for (int64_t h = 0; h < nh; ++h) sv.softmax(pt.scores.data() + h * n, n, f16);
    if (f16) {
        sv.weighted_sum_f16(pt.scores.data(), n, nh, rows, n, v_width, host(q.out) + h0 * v_width);
        return;
    }
    pt.acc.assign(size_t(nh * v_width), 0.0f);
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t* r = row_ptr(j);
        for (int64_t h = 0; h < nh; ++h)
            sv.axpy_f32(v_width, pt.scores[size_t(h * n + j)], reinterpret_cast<const float*>(r),
                        pt.acc.data() + h * v_width);
    }
    for (int64_t h = 0; h < nh; ++h)
        std::memcpy(host(q.out) + (h0 + h) * v_width, pt.acc.data() + h * v_width,
                    size_t(v_width) * sizeof(float));
}

}  // namespace glm5::backend::cpu
