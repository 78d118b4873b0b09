// SpeculationOptions: how a speculative engine chooses each round's block,
// the one set of knobs every engine embeds (SpeculativeEngine::Options, the
// router's GenerationLoop::Options, InProcessStack::Options) and that
// common/engine/speculation_flags.h declares as flags once.
//
// None of these change the output: verification decides every token, so at
// temperature 0 the text is the target's greedy text whatever they are set
// to. They trade drafter calls and verify rows against accepted tokens; the
// policies that read them are in common/engine/speculation_policies.h, and
// the results notebook (docs/log/) measures what each one buys on the
// bundled pairs.
#ifndef DEDIT_ENGINE_SPECULATION_OPTIONS_H_
#define DEDIT_ENGINE_SPECULATION_OPTIONS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/engine/ngram_drafter.h"

namespace dedit {

struct SpeculationOptions {
  // The n-gram method (prompt lookup, no model). Its max_window bounds W
  // for the n-gram and hybrid methods.
  NgramDrafter::Options ngram;
  // The hybrid method looks up suffixes of hybrid_min_ngram ..
  // max(ngram.max_ngram, hybrid_min_ngram) tokens: a shorter match (one
  // digit of a sum) is too often a coincidence, where the model drafter
  // does better.
  int hybrid_min_ngram = 3;
  // ... and also shorter suffixes (ngram.min_ngram and up) once the model's
  // drafts of the sequence accept fewer tokens per round than this (a
  // moving mean over about ten model rounds): text the model cannot guess
  // (a list reversed, a name renamed) goes to the lookup, computed text
  // stays with the model.
  double hybrid_short_match_below = 0.5;
  // Model drafts are cut before their first slot whose last-pass
  // confidence (max softmax probability) is below this; 0 keeps every draft
  // whole. A draft cut to nothing makes its round a plain decode step, and
  // the sequence then skips the drafter for 1, 2, 4, then 8 rounds (reset
  // by a draft that keeps a slot): where the drafter cannot guess, a round
  // costs one decode step instead of a draft plus a verify of W rows.
  double min_draft_confidence = 0;
  // Model drafts longer than verify_chunk - 1 tokens are verified
  // verify_chunk block rows at a time: when the target accepts a whole
  // chunk and its own next token is the draft's next one, the next round
  // verifies the rest of the same draft with no Draft call. Tokens per
  // Draft call are unchanged; only verify rows change. It pays where a
  // forward's cost grows with its rows and most drafts are rejected early;
  // where a forward costs the same for 1 and W rows it only adds rounds.
  // 0 (or >= W) verifies every draft whole.
  int verify_chunk = 0;
  // A round of more running sequences than this speculates for none of
  // them: each block is the bonus alone, a plain decode step (0 = no
  // limit). Where a batch's verify rows cost more than its drafts save (a
  // CPU; a GPU at large batch) this keeps large batches at target-only
  // speed. vLLM's speculative_disable_by_batch_size, applied per round.
  int max_speculative_batch = 0;
  // Per request, speculate only while it pays: while drafted rounds give
  // fewer tokens per second than plain ones (both measured as the request
  // runs), decode plain rounds, 1, 2, 4 ... 16 of them before each drafted
  // probe. Hybrid lookups cost no drafter call and are never paused.
  bool adaptive_speculation = false;
};

// INVALID_ARGUMENT naming the option (as its flag, "--verify_chunk") when
// one is out of range: n-gram sizes 1 <= min <= max and max window >= 2,
// hybrid_min_ngram >= 1, min_draft_confidence in [0, 1], verify_chunk 0
// or in [2, kMaxVerifyChunk], max_speculative_batch >= 0.
absl::Status ValidateSpeculationOptions(const SpeculationOptions& options);

// SpeculationOptions::verify_chunk's range: 0 (off) or 2..kMaxVerifyChunk;
// INVALID_ARGUMENT naming `name` otherwise.
inline constexpr int kMaxVerifyChunk = 1024;
absl::Status ValidateVerifyChunk(int chunk, absl::string_view name);

}  // namespace dedit

#endif  // DEDIT_ENGINE_SPECULATION_OPTIONS_H_
