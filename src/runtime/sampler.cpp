#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace glm5::runtime {

namespace {
uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}
}  // namespace

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    return best;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n) {
    TokenLogprob r;
    r.token = token;
    double mx = -INFINITY;
    for (float l : logits) mx = std::max(mx, double(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l) - mx);
    const double log_z = mx + std::log(sum);
    r.logprob = float(double(logits[size_t(token)]) - log_z);
    if (top_n > 0) {
        std::vector<int32_t> ids(logits.size());
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
        const size_t n = std::min(ids.size(), size_t(top_n));
        std::partial_sort(ids.begin(), ids.begin() + long(n), ids.end(), [&](int32_t a, int32_t b) {
            return logits[size_t(a)] > logits[size_t(b)] ||
                   (logits[size_t(a)] == logits[size_t(b)] && a < b);
        });
        for (size_t i = 0; i < n; ++i)
            r.top.emplace_back(ids[i], float(double(logits[size_t(ids[i])]) - log_z));
    }
    return r;
}

Sampler::Sampler(const SamplerParams& p) : p_(p) {
    uint64_t x = p.seed;
    for (auto& s : s_) s = splitmix64(x);
}

double Sampler::next_uniform() {
    // xoshiro256**
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return double(result >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        const std::function<bool(int32_t)>& allowed) {
    const int32_t n = int32_t(logits.size());
    cand_.clear();
    for (int32_t i = 0; i < n; ++i)
        if (!allowed || allowed(i)) cand_.emplace_back(logits[size_t(i)], i);
    if (cand_.empty()) throw Error("sampler: no token is allowed");

    if (!p_.logit_bias.empty()) {
        // cand_ is in id order here.
        for (const auto& [id, bias] : p_.logit_bias) {
            auto it = std::lower_bound(cand_.begin(), cand_.end(), id,
                                       [](const auto& c, int32_t v) { return c.second < v; });
            if (it != cand_.end() && it->second == id) it->first += bias;
        }
        // A ban leaves the token out, unless it is all that is allowed.
        auto banned = [](const auto& c) { return std::isinf(c.first) && c.first < 0; };
        if (!std::all_of(cand_.begin(), cand_.end(), banned))
            cand_.erase(std::remove_if(cand_.begin(), cand_.end(), banned), cand_.end());
    }

    const bool penalties =
        p_.repeat_penalty != 1.0f || p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f;
    if (penalties && p_.repeat_last_n != 0) {
        const size_t from = p_.repeat_last_n < 0 || size_t(p_.repeat_last_n) >= history.size()
                                ? 0
                                : history.size() - size_t(p_.repeat_last_n);
        std::unordered_map<int32_t, int32_t> count;
        for (size_t i = from; i < history.size(); ++i) ++count[history[i]];
        for (auto& [l, id] : cand_) {
            auto it = count.find(id);
            if (it == count.end()) continue;
            if (p_.repeat_penalty != 1.0f)
                l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
            l -= float(it->second) * p_.frequency_penalty + p_.presence_penalty;
        }
    }

    auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (p_.temperature <= 0.0f)
        return std::min_element(cand_.begin(), cand_.end(), by_logit)->second;

    if (p_.top_k > 0 && size_t(p_.top_k) < cand_.size()) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        cand_.resize(size_t(p_.top_k));
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // Softmax at the given temperature (in double, over the survivors).
    std::vector<double> prob(cand_.size());
    const double mx = cand_[0].first;
    double sum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
        prob[i] = std::exp((double(cand_[i].first) - mx) / double(p_.temperature));
        sum += prob[i];
    }
    for (auto& v : prob) v /= sum;
    size_t keep = cand_.size();
    if (p_.min_p > 0.0f) {
        const double floor = prob[0] * double(p_.min_p);
        size_t k = 1;
        while (k < keep && prob[k] >= floor) ++k;
        keep = k;
    }
    if (p_.top_p < 1.0f) {
        double cum = 0;
        size_t k = 0;
        while (k < keep) {
            cum += prob[k++];
            if (cum >= double(p_.top_p)) break;
        }
        keep = std::max<size_t>(1, k);
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += prob[i];
    double r = next_uniform() * total;
    for (size_t i = 0; i < keep; ++i) {
        r -= prob[i];
        if (r < 0) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

}  // namespace glm5::runtime
