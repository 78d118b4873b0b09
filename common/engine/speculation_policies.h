// The speculation policies of SpeculativeEngine (common/engine/
// speculative_engine.h), one small object each, read by the engine's round
// in this order:
//
//   plan    BatchPause         the round is too big to speculate in
//           ChunkedVerify      the rest of the last draft is this block
//           HybridLookup       prompt lookup instead of the model drafter
//           ConfidenceCut      backing off the model drafter
//           AdaptiveSpeculation  drafting does not pay for this request
//   draft   ConfidenceCut      cut the model's draft before a doubtful slot
//   verify  ChunkedVerify      verify only the first chunk of a long draft
//   commit  ChunkedVerify, HybridLookup, AdaptiveSpeculation learn from the
//           round's outcome
//
// Each per-sequence object holds that sequence's state for one policy and
// is owned by the engine's Sequence; BatchPause needs none. None of them
// changes what is committed (verification decides every token); they only
// choose what is proposed and how it is verified. Their knobs are
// SpeculationOptions (common/engine/speculation_options.h).
//
// Thread-compatible, like the engine.
#ifndef DEDIT_ENGINE_SPECULATION_POLICIES_H_
#define DEDIT_ENGINE_SPECULATION_POLICIES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/engine/draft.h"
#include "common/engine/ngram_drafter.h"

namespace dedit {

// SpeculationOptions::max_speculative_batch.
class BatchPause {
 public:
  explicit BatchPause(int max_speculative_batch)
      : max_batch_(max_speculative_batch) {}
  // Whether a round of `running` sequences decodes one token each.
  bool Pauses(size_t running) const {
    return max_batch_ > 0 && running > static_cast<size_t>(max_batch_);
  }

 private:
  int max_batch_;
};

// SpeculationOptions::hybrid_min_ngram and hybrid_short_match_below: a
// hybrid request's choice, per round, between prompt lookup and the model.
class HybridLookup {
 public:
  // `long_matches` looks up suffixes of hybrid_min_ngram tokens and up,
  // `any_match` the n-gram method's whole range; both outlive this.
  HybridLookup(const NgramDrafter* long_matches, const NgramDrafter* any_match,
               double short_match_below)
      : long_matches_(long_matches),
        any_match_(any_match),
        short_match_below_(short_match_below) {}

  // The looked-up block for the sequence's `known` tokens (at most
  // max_tokens), or empty when the model drafts this round: a long match
  // always wins; a shorter one only once the model's drafts of this
  // sequence have stopped paying.
  std::vector<int32_t> Propose(const std::vector<int32_t>& known,
                               int max_tokens) const;
  // A model-drafted round accepted `accepted` tokens.
  void RecordModelRound(int accepted);

 private:
  const NgramDrafter* long_matches_;
  const NgramDrafter* any_match_;
  double short_match_below_;
  double model_accepted_mean_ = -1;  // moving mean, -1 before the first
};

// SpeculationOptions::min_draft_confidence.
class ConfidenceCut {
 public:
  explicit ConfidenceCut(double min_confidence)
      : min_confidence_(min_confidence) {}

  // Whether the model drafter sits this round out, backing off after drafts
  // cut to nothing; counts the skipped rounds down.
  bool SkipsRound();

  enum class Cut { kWhole, kShortened, kEmpty };
  // Cuts the draft's proposal (its last pass) before its first slot below
  // the minimum confidence (a slot without a confidence counts as
  // confident). kEmpty: nothing is left to verify, and the next 1, 2, 4,
  // then 8 model rounds (doubling with each kEmpty in a row) are skipped.
  // Any other outcome resets the back-off.
  Cut Apply(DraftResult* draft);

 private:
  double min_confidence_;
  int skip_rounds_ = 0;  // model rounds still to skip
  int next_skip_ = 1;    // rounds the next kEmpty skips
};

// SpeculationOptions::adaptive_speculation: moving means of the request's
// drafted rounds (tokens, seconds) and plain rounds (seconds).
class AdaptiveSpeculation {
 public:
  explicit AdaptiveSpeculation(bool enabled) : enabled_(enabled) {}

  // Whether this round may call a drafter (always, when disabled); counts
  // pauses down. The first round after the prefill is a plain one, to
  // measure it.
  bool Drafts();
  // A round that called a drafter produced `tokens` in `seconds` (its share
  // of the Draft call plus the target step); a plain round took `seconds`.
  void RecordDrafted(int tokens, double seconds);
  void RecordPlain(double seconds);

 private:
  bool enabled_;
  double spec_tokens_ = -1, spec_seconds_ = -1, plain_seconds_ = -1;
  int pause_rounds_ = 0;  // plain rounds still to decode
  int next_pause_ = 1;    // the next pause's length
  bool probe_ = false;    // the next round drafts (after a pause)
};

// SpeculationOptions::verify_chunk: verifies a long model draft a chunk of
// block rows at a time, holding the rest for the next round.
class ChunkedVerify {
 public:
  explicit ChunkedVerify(int verify_chunk) : chunk_(verify_chunk) {}

  // The rest of the last draft, if its last chunk was accepted whole and the
  // target's next token was the draft's: this round's proposal, with no
  // Draft call. Empty otherwise. Taken once.
  std::vector<int32_t> TakeHeld();
  // How many tokens of a model proposal (or a held rest) this round
  // verifies; the rest is set aside for AfterVerify.
  size_t Verified(const std::vector<int32_t>& proposal);
  // After the round: `whole_block_accepted` (every verified token was) and
  // the target's `next_token` decide whether the set-aside rest is held.
  void AfterVerify(bool whole_block_accepted, int32_t next_token);

 private:
  int chunk_;
  std::vector<int32_t> beyond_;  // this round's unverified tail
  std::vector<int32_t> held_;    // next round's proposal
};

}  // namespace dedit

#endif  // DEDIT_ENGINE_SPECULATION_POLICIES_H_
