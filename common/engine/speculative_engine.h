// SpeculativeEngine: runs DEdit rounds (docs/ARCHITECTURE.md §1) for many
// sequences at once over a Verifier and an optional Drafter.
//
// Each Step() is one round for every running sequence: one batched Draft
// call (P1..PK), then one batched target step that verifies every block and
// prefills newly submitted prompts in the same forward. W = 1 or K = 0 (or no
// drafter) means plain target-only decoding. At temperature 0 the output is
// token for token the target's greedy output whatever the drafter proposes.
//
// A drafter failure never fails a request: that request continues
// target-only (its drafter context is no longer trustworthy) and the round is
// counted as a fallback round.
//
//   SpeculativeEngine engine(&verifier, &drafter, options);
//   ASSIGN_OR_RETURN(SequenceId id, engine.Submit(request));
//   while (!engine.idle()) RETURN_IF_ERROR(engine.Step());
//   for (GenerationResult& r : engine.TakeFinished()) ...
//
// Thread-compatible: one thread drives the engine.
#ifndef DEDIT_ENGINE_SPECULATIVE_ENGINE_H_
#define DEDIT_ENGINE_SPECULATIVE_ENGINE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engine/generation_request.h"
#include "common/engine/ngram_drafter.h"
#include "common/engine/round_interfaces.h"
#include "common/engine/speculation_options.h"
#include "common/engine/speculation_policies.h"

namespace dedit {

enum class FinishReason {
  kNone,
  kLength,
  kStop,
  kContextLimit,
  kCancelled,
  kError
};
const char* FinishReasonName(FinishReason reason);

// docs/ARCHITECTURE.md §1 "edit outcome per pass": how the final proposal's
// accepted prefix compares with what pass k alone would have achieved.
enum class EditOutcome { kExtended = 0, kUnchanged = 1, kShortened = 2 };
const char* EditOutcomeName(EditOutcome outcome);

struct RoundRecord {
  int window = 1;                  // W used this round (1 = target-only)
  int accepted = 0;                // acc; tau = acc + 1
  bool fallback = false;           // drafting was wanted but the drafter failed
  std::vector<EditOutcome> edits;  // one per pass k < K
  bool looked_up = false;          // kHybrid: the block came from prompt lookup
  // SpeculationOptions::min_draft_confidence: the model's draft was cut
  // (shorter than W-1; `window` is what was verified), or the drafter was
  // skipped this round after drafts cut to nothing (window 1, no Draft call).
  bool cut = false;
  bool skipped = false;
  // SpeculationOptions::verify_chunk: the block was the rest of an earlier
  // model draft, verified with no Draft call.
  bool reused = false;
  // The request speculates, but this round's block was the bonus alone:
  // the round ran more sequences than
  // SpeculationOptions::max_speculative_batch, or adaptive_speculation found
  // the request's drafted rounds slower than plain decoding (or measured a
  // plain round).
  bool paused = false;
  double draft_seconds = 0;   // this round's share of the batched draft call
  double verify_seconds = 0;  // ... and of the target step
};

struct GenerationResult {
  SequenceId id = 0;
  std::vector<int32_t> tokens;  // generated, stop token excluded
  FinishReason finish = FinishReason::kNone;
  absl::Status status;      // non-OK only with kError
  int32_t stop_token = -1;  // the EOS/stop id that ended it, if any
  std::vector<RoundRecord> rounds;
  int prompt_tokens = 0;
  double prefill_seconds = 0;  // the step that prefilled it
  double decode_seconds = 0;   // wall time of the rounds after prefill
  // Sessions: prompt tokens reused from the kept sequence's KV (not
  // prefilled); whether the kept KV was gone and the whole prompt was
  // prefilled instead; whether the sequence is now kept (request.keep).
  int64_t reused_tokens = 0;
  bool cache_lost = false;
  bool kept = false;
};

// Aggregates over rounds (speculative rounds only, i.e. window >= 2).
struct AcceptanceSummary {
  int64_t rounds = 0;          // all rounds
  int64_t drafted_rounds = 0;  // rounds with a draft
  int64_t fallback_rounds = 0;
  int64_t lookup_rounds = 0;  // kHybrid rounds drafted by prompt lookup
  // SpeculationOptions::min_draft_confidence: drafts cut short (or to nothing),
  // and rounds that skipped the drafter after drafts cut to nothing.
  int64_t cut_rounds = 0, skipped_rounds = 0;
  // SpeculationOptions::max_speculative_batch, adaptive_speculation: rounds of
  // a speculating request that decoded one token instead.
  int64_t paused_rounds = 0;
  int64_t reused_rounds = 0;    // SpeculationOptions::verify_chunk
  int64_t draft_tokens = 0;     // sum of W-1
  int64_t accepted_tokens = 0;  // sum of acc
  std::vector<int64_t>
      accepted_per_position;  // position i accepted iff acc > i
  // [pass][outcome] counts, pass 0 = P1.
  std::vector<std::array<int64_t, 3>> edit_outcomes;
  double draft_seconds = 0, verify_seconds = 0;
  // 1 + accepted / drafted rounds (bonus included), 0 without drafts.
  double mean_acceptance_length() const;
  void Add(const RoundRecord& round);
};
AcceptanceSummary Summarize(const std::vector<RoundRecord>& rounds);

// Called with each batch of newly committed tokens of a sequence (before
// stop handling cuts them: only tokens that belong to the output).
using TokenCallback =
    std::function<void(SequenceId, const std::vector<int32_t>& tokens)>;

class SpeculativeEngine {
 public:
  struct Options {
    std::vector<int32_t> eos_token_ids;
    int vocab_size = 0;           // for validating prompt ids (0 = unchecked)
    int64_t max_context = 40960;  // prompt + generated + window
    int max_new_tokens_limit = 1 << 20;
    int max_passes = 8;
    // How each round's block is chosen (common/engine/speculation_options.h).
    SpeculationOptions speculation;
    // Called on the stepping thread for every finished round (after its
    // record is complete, before its tokens are emitted), e.g. to update
    // per-round metrics while requests are still running. May be empty.
    std::function<void(SequenceId, const RoundRecord&)> on_round;
    // Seconds on a monotonic clock, read around each Draft call and target
    // step: the round timings, and what adaptive_speculation compares.
    // Empty = std::chrono::steady_clock. Tests set a fake clock so that a
    // timing-driven policy does the same on a loaded machine as on an
    // idle one.
    std::function<double()> clock;
  };

  // What the last Step() did, for per-step metrics.
  struct StepStats {
    int prefills = 0;           // prompts prefilled
    int verifies = 0;           // sequences verified (drafted or not)
    int drafts = 0;             // sequences drafted
    double draft_seconds = 0;   // the batched Draft call
    double verify_seconds = 0;  // the batched target step
  };

  // `drafter` may be null (target-only engine).
  SpeculativeEngine(Verifier* verifier, Drafter* drafter, Options options);

  // Validates and queues a request; it is prefilled by the next Step().
  absl::StatusOr<SequenceId> Submit(GenerationRequest request,
                                    TokenCallback on_tokens = nullptr);
  // Stops a request; it is reported as finished (kCancelled) and released.
  absl::Status Cancel(SequenceId id);
  // One round for every running sequence. A non-OK status means the target
  // step failed; the affected requests are finished with kError.
  absl::Status Step();
  bool idle() const { return pending_.empty() && running_.empty(); }
  size_t num_running() const { return running_.size() + pending_.size(); }
  std::vector<GenerationResult> TakeFinished();
  const StepStats& last_step() const { return last_step_; }

  // Sequences kept by finished requests (GenerationRequest::keep), waiting
  // to be continued or released.
  std::vector<SequenceId> KeptSequences() const;
  // Releases a kept sequence on both sides; NOT_FOUND if it is not kept
  // (continued by a running request, or released).
  absl::Status ReleaseKept(SequenceId id);
  void ReleaseAllKept();

  // Submits all requests, steps until done, and returns results in order.
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      std::vector<GenerationRequest> requests);

 private:
  struct Sequence {
    Sequence(const SpeculativeEngine& engine);
    GenerationRequest request;
    TokenCallback on_tokens;
    GenerationResult result;
    int64_t start = 0;   // committed tokens (prompt + generated - bonus)
    int32_t bonus = -1;  // next block slot 0
    // prompt + every token produced so far (start + 1 once running): what
    // the n-gram and hybrid methods look their proposals up in, and a
    // lookup-seeded drafter's seeds (kept for every method: a remote
    // drafter says whether it is seeded only once it has been reached).
    std::vector<int32_t> known;
    bool drafter_failed = false;
    // The speculation policies' state (common/engine/speculation_policies.h).
    HybridLookup hybrid;
    ConfidenceCut confidence;
    AdaptiveSpeculation adaptive;
    ChunkedVerify chunked;
    double first_token_time = 0;
    // Sessions: every token of the sequence (prompt, then each committed
    // token); its first `start` are in the KV cache. Kept only with
    // request.keep.
    std::vector<int32_t> tokens;
    // A continuation: prompt tokens reused from the kept KV, and what the
    // kept sequence held (until its prefill succeeds).
    int64_t reuse = 0;
    std::vector<int32_t> kept_tokens;
  };

  // One running sequence's round, from plan to commit.
  struct Round {
    SequenceId id = 0;
    RoundRecord record;  // its flags are set as the policies decide
    int window = 1;      // >= 2 with no draft yet: the drafter is asked
    // The proposal (the last pass is verified), if the round has one.
    std::optional<DraftResult> draft;
    bool modeled = false;         // drafted by the model drafter
    bool called_drafter = false;  // a Draft call was made for it
    double draft_seconds = 0;     // that call's wall time
  };

  // Step's phases (docs/ARCHITECTURE.md §1).
  Round PlanRound(SequenceId id, bool over_batch);
  void DraftRounds(std::vector<Round>& rounds);
  void TakeDraft(Drafter* drafter, Round& round, DraftResult draft);
  std::vector<PrefillWork> PrefillWorkFor(
      const std::vector<SequenceId>& ids) const;
  std::vector<VerifyWork> VerifyWorkFor(std::vector<Round>& rounds);
  void CommitPrefills(const std::vector<SequenceId>& ids,
                      const TargetStepResult& step, double seconds);
  void CommitRound(Round& round, const VerifyWork& verified,
                   const VerifyOutcome& outcome, double verify_seconds);

  // Appends tokens to the output, applying stops and max tokens. Returns
  // true when the sequence finished.
  bool Emit(Sequence& seq, const std::vector<int32_t>& tokens);
  void Finish(SequenceId id, FinishReason reason, absl::Status status = {});
  // Options::clock, or the steady clock.
  double Now() const;
  int WindowFor(const Sequence& seq) const;
  // The n-gram and hybrid methods propose from `Sequence::known`.
  static bool LooksUp(DraftMethod method);
  Drafter* DrafterFor(const Sequence& seq);
  // Whether the model drafter may ever draft `seq`, so the verifier side
  // feeds it the sequence's context (PrefillWork::context).
  bool FeedsContext(const Sequence& seq) const;
  // Right number of passes, W-1 tokens each (at most W-1 for a drafter
  // that proposes short blocks), ids inside the vocabulary.
  bool WellFormedDraft(const Drafter& drafter, const DraftRequest& request,
                       const DraftResult& draft) const;
  // A continuation's kept sequence, taken over when it shares a prefix with
  // `prompt`: (id, kept tokens, reused prompt tokens, cache lost).
  struct Continuation {
    SequenceId id = 0;
    std::vector<int32_t> kept_tokens;
    int64_t reuse = 0;
    bool cache_lost = false;
  };
  Continuation TakeKept(SequenceId kept, const std::vector<int32_t>& prompt);

  Verifier* verifier_;
  Drafter* drafter_;
  Options options_;
  NgramDrafter ngram_;
  NgramDrafter hybrid_lookup_;  // SpeculationOptions::hybrid_min_ngram and up
  BatchPause batch_pause_;
  SequenceId next_id_ = 1;
  std::deque<SequenceId> pending_;
  std::map<SequenceId, Sequence> sequences_;  // pending and running
  // Kept sequences: the tokens in their KV cache.
  std::map<SequenceId, std::vector<int32_t>> kept_;
  std::vector<SequenceId> running_;
  std::vector<GenerationResult> finished_;
  StepStats last_step_;
};

}  // namespace dedit

#endif  // DEDIT_ENGINE_SPECULATIVE_ENGINE_H_
