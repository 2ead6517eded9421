// Speculative decoding's parts that know nothing of slots: the drafters'
// settings, the weight-free n-gram drafter, and the cost governor that picks
// each window from measured verify costs and acceptance.
//
// Speculation changes nothing but speed: the engine verifies a window
// [pending, d1..dK] in one forward with logits on every row, samples each
// row exactly as plain decoding would (a token's logits do not depend on
// its batch), keeps the accepted prefix and rolls the state back past it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace glm5::runtime {

// External: a drafter the caller supplies (SpecParams::external).
enum class DraftType { Off, Auto, Mtp, Ngram, External };

// "off", "auto", "mtp", "ngram"; throws glm5::Error for another name.
DraftType parse_draft_type(const std::string& s);
const char* draft_type_name(DraftType t);

struct SpecParams {
    DraftType type = DraftType::Off;
    int draft_max = 8;     // the largest window (draft tokens per verify)
    float p_min = 0.0f;    // NextN: stop a chain when the draft's probability falls below
    bool adaptive = true;  // the cost governor picks the window; false: always draft_max
    // DraftType::External: up to k tokens to follow `history` (the prompt,
    // the reply so far and the pending token). Called on the engine thread.
    std::function<std::vector<int32_t>(std::span<const int32_t> history, int k)> external;
};

// The continuation of the most recent earlier occurrence of the longest
// suffix of `history` of n tokens, n from n_max down to n_min; at most k
// tokens, empty when nothing matches.
std::vector<int32_t> ngram_draft(std::span<const int32_t> history, int k, int n_max = 4,
                                 int n_min = 2);

// Verify cost by rows per forward (a moving average of measured forwards that
// only decode), shared by every slot of an engine.
class VerifyCost {
  public:
    static constexpr int kMaxRows = 64;
    void record(int rows, double seconds);
    // Seconds of a forward of `rows` rows; unmeasured sizes are interpolated
    // from measured ones, or from a prior (each extra row 25% of one row's
    // forward, the shape MoE verifies have) before anything is measured.
    double seconds(int rows) const;
    double measured(int rows) const { return rows > 0 && rows <= kMaxRows ? t_[size_t(rows)] : 0; }

  private:
    std::array<double, kMaxRows + 1> t_{};
};

// One sequence's window choice: tracks the acceptance of its drafts and
// picks the window that maximises expected tokens per second; parks drafting
// (window 0) when no window pays, probing again every kProbeEvery steps.
class WindowGovernor {
  public:
    static constexpr int kProbeEvery = 16;
    explicit WindowGovernor(const SpecParams& p) : p_(p) {}
    // The window to draft now (0: decode plainly this step).
    int choose(const VerifyCost& cost, double draft_seconds_per_token);
    // A verify of `drafted` tokens accepted the first `accepted` of them.
    void record(int drafted, int accepted);

  private:
    SpecParams p_;
    // Acceptance per draft token (the chance that a draft is right given the
    // ones before it were), as fading counts with a prior of one half.
    double hit_ = 0, seen_ = 0;
    int parked_steps_ = 0;
};

}  // namespace glm5::runtime
