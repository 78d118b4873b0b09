// Prompt-lookup drafting (vLLM's `ngram` speculative method): propose the
// tokens that followed the most recent earlier occurrence of the sequence's
// last n tokens. It needs no model and no device, so every engine (in
// process, and the router without a drafter service) can offer it; it is
// the baseline a learned drafter must beat.
//
// For n = max_ngram down to min_ngram, the suffix of length n of the known
// tokens (prompt + output, ending with the bonus) is looked up in the tokens
// before it; the first n with a match wins, and the latest match of that n
// is used. The proposal copies what followed the match, up to W-1 tokens;
// when the copy reaches the end of the known tokens it continues over its
// own proposal, so a repeating pattern ("a, b, a, b, ...") is proposed
// whole. With no match the proposal is empty and the round verifies the
// bonus alone: no verify compute is spent on a guess.
//
//   NgramDrafter ngram({.min_ngram = 1, .max_ngram = 4});
//   DraftRequest r{.sequence = id, .start = n, .bonus = t, .window = 8,
//                  .passes = 1, .tokens = &known};   // known.size() == n + 1
//   ASSIGN_OR_RETURN(std::vector<DraftResult> d, ngram.Draft({r}));
//
// Stateless and thread-compatible: Release is a no-op.
#ifndef DEDIT_ENGINE_NGRAM_DRAFTER_H_
#define DEDIT_ENGINE_NGRAM_DRAFTER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/round_interfaces.h"

namespace dedit {

class NgramDrafter : public Drafter {
 public:
  struct Options {
    int min_ngram = 1;
    int max_ngram = 4;
    int max_window = 64;  // largest W a request may ask
  };

  NgramDrafter() : NgramDrafter(Options()) {}
  explicit NgramDrafter(Options options) : options_(options) {}

  // INVALID_ARGUMENT when min_ngram < 1, max_ngram < min_ngram or
  // max_window < 2.
  static absl::Status Validate(const Options& options);

  // Every request needs `tokens` (prompt + output, tokens->size() ==
  // start + 1, ending with the bonus) and passes == 1; each result has one
  // pass of 0..W-1 tokens.
  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override;
  absl::Status Release(SequenceId sequence) override {
    return absl::OkStatus();
  }
  int block_size() const override { return options_.max_window; }
  bool proposes_short_blocks() const override { return true; }

  // The proposal for `known` (at most max_tokens tokens).
  std::vector<int32_t> Propose(const std::vector<int32_t>& known,
                               int max_tokens) const;
  // A proposal as a one-pass draft (a lookup is certain of what it copies:
  // confidence 1 per token).
  static DraftResult AsDraft(std::vector<int32_t> proposal);

 private:
  Options options_;
};

// The lookup a lookup-seeded DEdit drafter's P1 reads
// (DrafterConfig::lookup_seed_ngram): suffixes of min_ngram..max(min_ngram,
// 4) tokens, up to max_window - 1 proposed. The engine's DEditDrafter and
// the trainer both take it from here, so they seed alike.
NgramDrafter::Options LookupSeedOptions(int min_ngram, int max_window);

// INVALID_ARGUMENT unless r.seed holds at most W-1 ids inside [0,
// vocab_size) (the drafter service's and the DEdit drafter's check).
absl::Status CheckDraftSeed(const DraftRequest& r, int vocab_size);

}  // namespace dedit

#endif  // DEDIT_ENGINE_NGRAM_DRAFTER_H_
