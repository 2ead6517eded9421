#include "text_chunks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

namespace glm5::app {

std::string read_text_file(const std::string& path) {
    if (path == "-") return {std::istreambuf_iterator<char>(std::cin), {}};
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot read " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

TextTokens tokenize_text(const gguf::File& f, const text::Tokenizer& tok, const std::string& text,
                         bool parse_special) {
    TextTokens t;
    // llama.cpp: the file's add_bos_token / add_eos_token override the vocabulary type's
    // defaults, which for GLM's BPE (pre-tokenizer glm4 / chatglm-bpe) add neither.
    auto key_flag = [&](const char* key) {
        const gguf::Value* v = f.find(key);
        return v && v->as_bool().value_or(false);
    };
    if (key_flag("tokenizer.ggml.add_eos_token"))
        throw Error(
            "the vocabulary appends an EOS to every text (tokenizer.ggml.add_eos_token), which "
            "llama.cpp's perplexity does not take either");
    t.add_bos = key_flag("tokenizer.ggml.add_bos_token");
    t.bos = tok.special().bos;
    if (t.add_bos && t.bos == text::kNoToken)
        throw Error("the vocabulary adds a BOS (tokenizer.ggml.add_bos_token) but names none");
    if (t.add_bos) t.tokens.push_back(t.bos);
    const std::vector<text::TokenId> ids = tok.encode(text, parse_special);
    t.tokens.insert(t.tokens.end(), ids.begin(), ids.end());
    return t;
}

int32_t ChunkPlan::token(int c, int k) const {
    if (k == 0 && text.add_bos) return text.bos;
    return text.tokens[size_t(c) * size_t(n_ctx) + size_t(k)];
}

TextTokens read_tokens(const std::string& model_path, const std::string& text_path) {
    const std::string text = read_text_file(text_path);
    gguf::OpenOptions oo;
    oo.load_splits = false;  // the vocabulary lives in the first shard
    const auto file = gguf::File::open(model_path, oo);
    const auto tok = text::Tokenizer::from_gguf(*file);
    return tokenize_text(*file, *tok, text);
}

ChunkPlan plan_chunks(TextTokens text, int n_ctx, int n_chunks_max, int n_batch, int n_ubatch) {
    if (n_ctx < 3)
        throw Error("a context of " + std::to_string(n_ctx) +
                    " tokens scores none of them (the second half less the last): it must be "
                    "at least 3");
    if (n_batch < 1 || n_ubatch < 1) throw Error("the batch sizes must be at least 1");
    const size_t n = text.tokens.size();
    if (n < 2 * size_t(n_ctx))
        throw Error("you need at least " + std::to_string(2 * size_t(n_ctx)) +
                    " tokens for a context of " + std::to_string(n_ctx) +
                    " tokens, and the text tokenizes to only " + std::to_string(n) +
                    " (give a longer text or a smaller --ctx-size)");
    ChunkPlan p;
    p.n_ctx = n_ctx;
    const int n_chunk_max = int(n / size_t(n_ctx));
    p.n_chunk = n_chunks_max < 0 ? n_chunk_max : std::min(n_chunks_max, n_chunk_max);
    // llama.cpp: n_seq = max(1, n_batch / n_ctx) sequences, n_batch capped to n_ctx * n_seq,
    // each llama_decode split into micro-batches of n_ubatch (itself at most n_batch).
    p.n_seq = std::max(1, n_batch / n_ctx);
    p.n_batch = std::min(n_batch, n_ctx * p.n_seq);
    p.n_ubatch = std::min(n_ubatch, p.n_batch);
    p.text = std::move(text);
    return p;
}

double NllSums::ppl() const {
    return std::exp(nll / double(count));
}

double NllSums::ppl_error() const {
    if (count < 2) return -1;
    const double mean = nll / double(count);
    const double var = nll2 / double(count) - mean * mean;
    if (!(var > 0)) return -1;
    return std::sqrt(var / double(count - 1)) * std::exp(mean);
}

double log_softmax(const float* logits, int64_t n_vocab, int32_t tok) {
    float max_logit = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
    return double(logits[tok] - max_logit) - std::log(sum_exp);
}

namespace {

// Chunks [c0, c0 + n) evaluated together, one sequence each, in forwards of at most
// n_ubatch tokens cut from the sequences laid end to end; nll[s * S + j] is the
// negative log-likelihood of chunk c0 + s's scored token j (S per chunk).
void eval_group(model::Model& m, const ChunkPlan& p, int c0, int n,
                std::vector<std::unique_ptr<model::SequenceState>>& states, ThreadPool& pool,
                std::vector<double>& nll) {
    const int n_ctx = p.n_ctx, first = p.first(), S = p.scored_per_chunk();
    const int64_t V = m.info().n_vocab;
    std::vector<int32_t> toks(size_t(n) * size_t(n_ctx));
    for (int s = 0; s < n; ++s) {
        states[size_t(s)]->reset();
        for (int k = 0; k < n_ctx; ++k)
            toks[size_t(s) * size_t(n_ctx) + size_t(k)] = p.token(c0 + s, k);
    }
    nll.assign(size_t(n) * size_t(S), 0.0);
    const int64_t total = int64_t(toks.size());
    std::vector<model::SeqInput> in;
    std::vector<int64_t> rows;  // each logits row's place in `toks`
    std::vector<float> logits;
    for (int64_t at = 0; at < total;) {
        const int64_t end = std::min(total, at + p.n_ubatch);
        in.clear();
        rows.clear();
        while (at < end) {
            const int s = int(at / n_ctx);
            const int k0 = int(at % n_ctx);
            const int k1 = int(std::min<int64_t>(end - int64_t(s) * n_ctx, n_ctx));
            model::SeqInput si;
            si.state = states[size_t(s)].get();
            si.tokens = {toks.data() + at, size_t(k1 - k0)};
            const int from = p.logits_all ? k0 : std::max(k0, first);
            if (from < k1)
                si.logits_from = from - k0;
            else
                si.logits = false;
            for (int k = from; k < k1; ++k) rows.push_back(int64_t(s) * n_ctx + k);
            in.push_back(si);
            at += k1 - k0;
        }
        m.forward(in, logits);
        if (logits.size() != rows.size() * size_t(V))
            throw Error("perplexity: the forward returned " + std::to_string(logits.size()) +
                        " logits for " + std::to_string(rows.size()) + " rows");
        pool.parallel_for(int64_t(rows.size()), 1, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
                const int64_t at_r = rows[size_t(r)];
                const int k = int(at_r % n_ctx);
                if (k < first || k > n_ctx - 2) continue;  // unscored (logits_all, the last)
                nll[size_t(at_r / n_ctx) * size_t(S) + size_t(k - first)] =
                    -log_softmax(logits.data() + size_t(r) * size_t(V), V, toks[size_t(at_r) + 1]);
            }
        });
    }
}

}  // namespace

void score_chunks(model::Model& m, const ChunkPlan& p, int threads, NllSums& sums,
                  const std::function<void(int chunk, const NllSums& sums)>& done) {
    ThreadPool pool(PoolOptions{std::max(1, threads), 0});
    std::vector<std::unique_ptr<model::SequenceState>> states;
    for (int s = 0; s < std::min(p.n_seq, p.n_chunk); ++s) states.push_back(m.new_state(p.n_ctx));
    const size_t S = size_t(p.scored_per_chunk());
    std::vector<double> nll;
    for (int c0 = 0; c0 < p.n_chunk; c0 += p.n_seq) {
        const int n = std::min(p.n_seq, p.n_chunk - c0);
        eval_group(m, p, c0, n, states, pool, nll);
        for (int s = 0; s < n; ++s) {
            for (size_t j = 0; j < S; ++j) {
                const double v = nll[size_t(s) * S + j];
                sums.nll += v;
                sums.nll2 += v * v;
            }
            sums.count += int64_t(S);
            if (done) done(c0 + s, sums);
        }
    }
}

std::string ppl_progress(int chunk, const NllSums& sums) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "[%d]%.4lf,", chunk + 1, sums.ppl());
    return buf;
}

std::string ppl_final(const NllSums& sums) {
    char buf[160];
    const double err = sums.ppl_error();
    if (err >= 0)
        std::snprintf(buf, sizeof(buf), "Final estimate: PPL = %.4lf +/- %.5lf", sums.ppl(), err);
    else
        std::snprintf(buf, sizeof(buf),
                      "Final estimate: PPL = %.4lf (no uncertainty: too few tokens scored)",
                      sums.ppl());
    return buf;
}

}  // namespace glm5::app
