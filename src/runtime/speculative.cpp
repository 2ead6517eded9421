#include "runtime/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace glm5::runtime {

DraftType parse_draft_type(const std::string& s) {
    if (s == "off") return DraftType::Off;
    if (s == "auto") return DraftType::Auto;
    if (s == "mtp") return DraftType::Mtp;
    if (s == "ngram") return DraftType::Ngram;
    throw Error("unknown speculative type '" + s + "' (auto, mtp, ngram or off)");
}

const char* draft_type_name(DraftType t) {
    switch (t) {
        case DraftType::Off:
            return "off";
        case DraftType::Auto:
            return "auto";
        case DraftType::Mtp:
            return "mtp";
        case DraftType::Ngram:
            return "ngram";
        case DraftType::External:
            return "external";
    }
    return "?";
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> h, int k, int n_max, int n_min) {
    const int64_t L = int64_t(h.size());
    if (k <= 0) return {};
    for (int n = n_max; n >= std::max(1, n_min); --n) {
        if (L < n + 1) continue;
        const int32_t* suffix = h.data() + (L - n);
        // The most recent earlier occurrence: its continuation is what the
        // text did last time it said this.
        for (int64_t j = L - n - 1; j >= 0; --j) {
            if (!std::equal(suffix, suffix + n, h.data() + j)) continue;
            const int64_t from = j + n, to = std::min(L, from + k);
            return std::vector<int32_t>(h.begin() + from, h.begin() + to);
        }
    }
    return {};
}

void VerifyCost::record(int rows, double seconds) {
    if (rows < 1 || rows > kMaxRows || seconds <= 0) return;
    double& t = t_[size_t(rows)];
    t = t == 0 ? seconds : 0.8 * t + 0.2 * seconds;
}

double VerifyCost::seconds(int rows) const {
    rows = std::clamp(rows, 1, kMaxRows);
    if (t_[size_t(rows)] > 0) return t_[size_t(rows)];
    auto prior = [](int r) { return 1.0 + 0.25 * double(r - 1); };
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && t_[size_t(lo)] == 0) --lo;
    while (hi <= kMaxRows && t_[size_t(hi)] == 0) ++hi;
    const bool has_lo = lo >= 1, has_hi = hi <= kMaxRows;
    if (has_lo && has_hi) {
        const double f = double(rows - lo) / double(hi - lo);
        return t_[size_t(lo)] + f * (t_[size_t(hi)] - t_[size_t(lo)]);
    }
    if (has_lo) return t_[size_t(lo)] * prior(rows) / prior(lo);
    if (has_hi) return t_[size_t(hi)] * prior(rows) / prior(hi);
    return prior(rows);
}

int WindowGovernor::choose(const VerifyCost& cost, double draft_seconds_per_token) {
    const int kmax = std::max(0, p_.draft_max);
    if (!p_.adaptive || kmax == 0) return kmax;
    // Expected tokens of a window of k: 1 + a + a^2 + ... + a^k (the bonus
    // row always yields one), against the forward of 1 + k rows plus
    // drafting. Before anything is measured the cost is in units of one
    // row's forward and drafting is taken as free.
    const double alpha = (hit_ + 1.0) / (seen_ + 2.0);
    const bool calibrated = cost.measured(1) > 0;
    double best_rate = 1.0 / cost.seconds(1), expected = 1.0, chain = 1.0;
    int best = 0;
    for (int k = 1; k <= kmax; ++k) {
        chain *= alpha;
        expected += chain;
        const double t =
            cost.seconds(1 + k) + (calibrated ? double(k) * draft_seconds_per_token : 0.0);
        if (expected / t > best_rate) {
            best_rate = expected / t;
            best = k;
        }
    }
    if (best > 0) {
        parked_steps_ = 0;
        return best;
    }
    // Parked: probe with one draft now and then, so a drafter that starts to
    // pay (a repetitive stretch of text) is picked up again.
    if (++parked_steps_ >= kProbeEvery) {
        parked_steps_ = 0;
        return 1;
    }
    return 0;
}

void WindowGovernor::record(int drafted, int accepted) {
    // A verify tried min(accepted + 1, drafted) positions and accepted
    // `accepted` of them. Old evidence fades (factor 0.95 per verify), so the
    // estimate follows the text.
    const int tried = std::min(accepted + 1, drafted);
    seen_ = 0.95 * seen_ + double(tried);
    hit_ = 0.95 * hit_ + double(std::min(accepted, drafted));
}

}  // namespace glm5::runtime
