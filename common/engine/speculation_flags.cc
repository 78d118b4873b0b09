#include "common/engine/speculation_flags.h"

#include "absl/flags/flag.h"
#include "common/base/status.h"

// Defaults are SpeculationOptions' own, so a binary's flags and an options
// struct built in code agree.
namespace {
const dedit::SpeculationOptions kDefaults;
}  // namespace

ABSL_FLAG(int, ngram_min, kDefaults.ngram.min_ngram,
          "n-gram method: shortest suffix looked up");
ABSL_FLAG(int, ngram_max, kDefaults.ngram.max_ngram,
          "n-gram method: longest suffix looked up");
ABSL_FLAG(int, ngram_max_window, kDefaults.ngram.max_window,
          "n-gram and hybrid methods: largest W a request may ask");
ABSL_FLAG(int, hybrid_min_ngram, kDefaults.hybrid_min_ngram,
          "hybrid method: shortest suffix whose earlier occurrence makes a "
          "round a prompt lookup (else the drafter drafts it)");
ABSL_FLAG(double, hybrid_short_match_below, kDefaults.hybrid_short_match_below,
          "hybrid method: shorter suffixes (--ngram_min and up) too, once "
          "the drafter's rounds of a request accept fewer tokens than this "
          "(a moving mean over ~10 rounds)");
ABSL_FLAG(double, min_draft_confidence, kDefaults.min_draft_confidence,
          "drafter drafts (model and hybrid methods) are cut before their "
          "first slot whose confidence is below this; a draft cut to "
          "nothing makes the round a decode step, and the request skips the "
          "drafter for 1, 2, 4, then 8 rounds (0 = off)");
ABSL_FLAG(int, verify_chunk, kDefaults.verify_chunk,
          "drafter drafts (model and hybrid methods) are verified this many "
          "block rows per target step; when every verified token is "
          "accepted, the next round verifies the rest of the same draft "
          "with no Draft call (0 = whole drafts; pays where a verify's cost "
          "grows with its rows, as on a CPU)");
ABSL_FLAG(int, max_speculative_batch, kDefaults.max_speculative_batch,
          "a round of more running requests than this speculates for none "
          "of them: each decodes one token, as target-only (0 = no limit; "
          "pays where a verify's cost grows with its rows, as on a CPU or a "
          "GPU at large batch; vLLM's speculative_disable_by_batch_size)");
ABSL_FLAG(bool, adaptive_speculation, kDefaults.adaptive_speculation,
          "per request, speculate only while drafted rounds give more tokens "
          "per second than plain decoding (measured as it runs); otherwise "
          "decode plain rounds, probing again after 1, 2, 4 ... 16 of them");

namespace dedit {

absl::StatusOr<SpeculationOptions> SpeculationOptionsFromFlags() {
  SpeculationOptions o;
  o.ngram.min_ngram = absl::GetFlag(FLAGS_ngram_min);
  o.ngram.max_ngram = absl::GetFlag(FLAGS_ngram_max);
  o.ngram.max_window = absl::GetFlag(FLAGS_ngram_max_window);
  o.hybrid_min_ngram = absl::GetFlag(FLAGS_hybrid_min_ngram);
  o.hybrid_short_match_below = absl::GetFlag(FLAGS_hybrid_short_match_below);
  o.min_draft_confidence = absl::GetFlag(FLAGS_min_draft_confidence);
  o.verify_chunk = absl::GetFlag(FLAGS_verify_chunk);
  o.max_speculative_batch = absl::GetFlag(FLAGS_max_speculative_batch);
  o.adaptive_speculation = absl::GetFlag(FLAGS_adaptive_speculation);
  RETURN_IF_ERROR(ValidateSpeculationOptions(o));
  return o;
}

}  // namespace dedit
