#include "common/engine/speculation_policies.h"

#include <algorithm>
#include <utility>

namespace dedit {
namespace {

// ConfidenceCut: the longest back-off, in model rounds skipped.
constexpr int kMaxSkippedRounds = 8;
// AdaptiveSpeculation: the longest pause between probes, and the weight of
// the newest round in the moving means.
constexpr int kMaxPausedRounds = 16;
constexpr double kAdaptiveWeight = 0.3;
// HybridLookup: the weight of the newest model round (about ten rounds).
constexpr double kHybridWeight = 0.1;

double MovingMean(double mean, double x, double weight) {
  return mean < 0 ? x : (1 - weight) * mean + weight * x;
}

}  // namespace

std::vector<int32_t> HybridLookup::Propose(const std::vector<int32_t>& known,
                                           int max_tokens) const {
  std::vector<int32_t> proposal = long_matches_->Propose(known, max_tokens);
  if (proposal.empty() && model_accepted_mean_ >= 0 &&
      model_accepted_mean_ < short_match_below_) {
    proposal = any_match_->Propose(known, max_tokens);
  }
  return proposal;
}

void HybridLookup::RecordModelRound(int accepted) {
  model_accepted_mean_ =
      MovingMean(model_accepted_mean_, accepted, kHybridWeight);
}

bool ConfidenceCut::SkipsRound() {
  if (skip_rounds_ == 0) return false;
  --skip_rounds_;
  return true;
}

ConfidenceCut::Cut ConfidenceCut::Apply(DraftResult* draft) {
  DraftPass& last = draft->passes.back();
  size_t keep = last.tokens.size();
  if (min_confidence_ > 0) {
    keep = 0;
    while (keep < last.tokens.size() &&
           (keep >= last.confidences.size() ||
            last.confidences[keep] >= min_confidence_)) {
      ++keep;
    }
  }
  if (keep == last.tokens.size()) {
    next_skip_ = 1;
    return Cut::kWhole;
  }
  last.tokens.resize(keep);
  if (last.confidences.size() > keep) last.confidences.resize(keep);
  if (keep > 0) {
    next_skip_ = 1;
    return Cut::kShortened;
  }
  skip_rounds_ = next_skip_;
  next_skip_ = std::min(next_skip_ * 2, kMaxSkippedRounds);
  return Cut::kEmpty;
}

bool AdaptiveSpeculation::Drafts() {
  if (!enabled_) return true;
  if (plain_seconds_ < 0) return false;  // measure a plain round first
  if (pause_rounds_ > 0) {
    if (--pause_rounds_ == 0) probe_ = true;
    return false;
  }
  if (probe_ || spec_seconds_ < 0) {
    probe_ = false;
    return true;
  }
  // Tokens per second drafting against one token per plain round.
  if (spec_tokens_ * plain_seconds_ >= spec_seconds_) {
    next_pause_ = 1;
    return true;
  }
  pause_rounds_ = next_pause_ - 1;  // this round is the first
  if (pause_rounds_ == 0) probe_ = true;
  next_pause_ = std::min(next_pause_ * 2, kMaxPausedRounds);
  return false;
}

void AdaptiveSpeculation::RecordDrafted(int tokens, double seconds) {
  if (!enabled_) return;
  spec_tokens_ = MovingMean(spec_tokens_, tokens, kAdaptiveWeight);
  spec_seconds_ = MovingMean(spec_seconds_, seconds, kAdaptiveWeight);
}

void AdaptiveSpeculation::RecordPlain(double seconds) {
  if (!enabled_) return;
  plain_seconds_ = MovingMean(plain_seconds_, seconds, kAdaptiveWeight);
}

std::vector<int32_t> ChunkedVerify::TakeHeld() {
  std::vector<int32_t> held = std::move(held_);
  held_.clear();
  return held;
}

size_t ChunkedVerify::Verified(const std::vector<int32_t>& proposal) {
  beyond_.clear();
  if (chunk_ < 2 || proposal.size() <= static_cast<size_t>(chunk_ - 1)) {
    return proposal.size();
  }
  beyond_.assign(proposal.begin() + (chunk_ - 1), proposal.end());
  return static_cast<size_t>(chunk_ - 1);
}

void ChunkedVerify::AfterVerify(bool whole_block_accepted, int32_t next_token) {
  if (!beyond_.empty() && whole_block_accepted &&
      next_token == beyond_.front()) {
    held_.assign(beyond_.begin() + 1, beyond_.end());
  }
  beyond_.clear();
}

}  // namespace dedit
