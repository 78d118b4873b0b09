// The two sides of a speculative round, as the round logic sees them.
//
// SpeculativeEngine is written against these interfaces only, so the same
// round logic runs in-process (LocalVerifier / LocalDrafter over the models)
// and in the router (gRPC clients of the target and drafter services).
//
// Context features never pass through the round logic: the verifier side
// delivers the committed tokens' features to the drafter side itself (in
// process through a ContextSink (common/model/context_sink.h), across services
// over a stream), exactly as docs/ARCHITECTURE.md §3 streams them from the
// target to the drafter.
#ifndef DEDIT_ENGINE_ROUND_INTERFACES_H_
#define DEDIT_ENGINE_ROUND_INTERFACES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/draft.h"
#include "common/engine/sampling_params.h"

namespace dedit {

struct PrefillWork {
  SequenceId sequence = 0;
  // The tokens to prefill, at positions start .. start + prompt.size() - 1.
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // kept by the verifier for the whole sequence
  // 0: a new sequence. > 0: a kept sequence continues (a session's next
  // turn): its first `start` cached tokens stay, the rest is dropped, and
  // `prompt` follows them. The sampler is replaced by `sampling`.
  int64_t start = 0;
  // Whether the model drafter may draft this sequence, so the verifier side
  // feeds it the sequence's context features. False for target-only and
  // n-gram requests: no feature traffic, and no drafter memory, for a
  // sequence no model will draft.
  bool context = true;
};

struct VerifyWork {
  SequenceId sequence = 0;
  int64_t start = 0;           // committed tokens before the block
  std::vector<int32_t> block;  // [bonus, draft...]: W tokens
};

struct VerifyOutcome {
  int accepted = 0;  // draft tokens accepted (acc); tau = acc + 1
  // The target's choice at every block slot (W entries): the token for
  // position start + j + 1. The next bonus is target_tokens[accepted].
  std::vector<int32_t> target_tokens;
};

struct TargetStepResult {
  std::vector<int32_t> first_tokens;    // one per prefill, in order
  std::vector<VerifyOutcome> verified;  // one per verify, in order
  // Optional per-prefill status (empty = all OK; else one per prefill). A
  // remote target refuses single prompts (e.g. RESOURCE_EXHAUSTED when its
  // KV capacity is full) without failing the rest of the step; the engine
  // finishes only those requests, with that status.
  std::vector<absl::Status> prefill_status;
};

// The target side: prefill, verify, commit, release.
class Verifier {
 public:
  virtual ~Verifier() = default;
  // Runs the prefills and verify blocks (ideally in one batched forward).
  // Afterwards every verified sequence holds exactly start + accepted + 1
  // committed tokens, every prefilled one its prompt.
  virtual absl::StatusOr<TargetStepResult> Step(
      const std::vector<PrefillWork>& prefills,
      const std::vector<VerifyWork>& verifies) = 0;
  virtual absl::Status Release(SequenceId sequence) = 0;
  // The sequence's request ended but its KV cache stays for a next turn (a
  // session): a later PrefillWork with start > 0 continues it. The
  // verifier may drop it while it waits (the continuation then fails with
  // NOT_FOUND). Unsupported by default: the engine then releases it.
  virtual absl::Status Keep(SequenceId /*sequence*/) {
    return absl::UnimplementedError("this verifier keeps no sequences");
  }
};

// The drafter side.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) = 0;
  virtual absl::Status Release(SequenceId sequence) = 0;
  virtual int block_size() const = 0;  // largest window W it can draft
  // True when a pass may hold fewer than W-1 tokens (the verify block is
  // then shorter); otherwise a short pass is malformed and the request
  // falls back to target-only.
  virtual bool proposes_short_blocks() const { return false; }
  // > 0 for a lookup-seeded drafter (DrafterConfig::lookup_seed_ngram):
  // the engine fills DraftRequest::seed with the lookup over suffixes of at
  // least this many tokens.
  virtual int lookup_seed_ngram() const { return 0; }
};

}  // namespace dedit

#endif  // DEDIT_ENGINE_ROUND_INTERFACES_H_
