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
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/ngram_drafter.h"
#include "engine/round_interfaces.h"

namespace dedit {

// Who proposes a request's blocks.
enum class DraftMethod {
  kModel,  // the engine's Drafter (DEdit/DFlash, in process or a service)
  kNgram,  // prompt lookup over the request's own tokens (no model)
  // Per round: prompt lookup when the sequence's last `hybrid_min_ngram`
  // tokens occurred before (the answer is copying), else the model
  // drafter (the answer is computed); shorter matches too once the
  // model's drafts of the sequence stop paying
  // (Options::hybrid_short_match_below). A lookup round costs no drafter
  // pass. The two kinds of text favour opposite drafters
  // (docs/RESULTS.md, "The hybrid method"); this takes each round's better
  // guess at the price of a lookup.
  kHybrid,
};
const char* DraftMethodName(DraftMethod method);
// The inverse of DraftMethodName ("model", "ngram", "hybrid"); false for
// any other name.
bool DraftMethodFromName(absl::string_view name, DraftMethod* method);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_new_tokens = 128;
  SamplingParams sampling;
  // W (block size incl. the bonus slot); 1 → target-only. Submit rejects a W
  // above the drafter's block size.
  int window = 16;
  int passes = 1;  // K; 0 → target-only. The n-gram method has one pass;
                   // with kHybrid, K applies to the model's rounds.
  DraftMethod method = DraftMethod::kModel;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS
  bool ignore_eos = false;
  // Sessions (docs/ARCHITECTURE.md §8). `keep`: when the request finishes
  // (any reason but an error) its sequence is kept (Verifier::Keep) with
  // the tokens in its KV cache, instead of released, for a later request
  // to continue (KeptSequences(), ReleaseKept()).
  bool keep = false;
  // A sequence kept by an earlier request: this request continues it under
  // the same id, prefilling only the prompt after the longest common
  // prefix of the kept tokens and `prompt` (at least one token is
  // prefilled). 0, or an id not kept (any more): a new sequence, and
  // GenerationResult::cache_lost when it was not 0.
  SequenceId continue_sequence = 0;
};

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
  // Options::min_draft_confidence: the model's draft was cut (shorter than
  // W-1; `window` is what was verified), or the drafter was skipped this
  // round after drafts cut to nothing (window 1, no Draft call).
  bool cut = false;
  bool skipped = false;
  // Options::verify_chunk: the block was the rest of an earlier model
  // draft, verified with no Draft call.
  bool reused = false;
  // The request speculates, but this round's block was the bonus alone:
  // the round ran more sequences than Options::max_speculative_batch, or
  // Options::adaptive_speculation found the request's drafted rounds
  // slower than plain decoding (or measured a plain round).
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
  // Options::min_draft_confidence: drafts cut short (or to nothing), and
  // rounds that skipped the drafter after drafts cut to nothing.
  int64_t cut_rounds = 0, skipped_rounds = 0;
  // Options::max_speculative_batch, adaptive_speculation: rounds of a
  // speculating request that decoded one token instead.
  int64_t paused_rounds = 0;
  int64_t reused_rounds = 0;    // Options::verify_chunk: no Draft call
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

// SpeculativeEngine::Options::verify_chunk as a flag takes 0 (off) or
// 2..kMaxVerifyChunk; INVALID_ARGUMENT naming `flag` otherwise.
inline constexpr int kMaxVerifyChunk = 1024;
absl::Status ValidateVerifyChunk(int chunk, absl::string_view flag);

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
    // The n-gram method (always available; its max_window bounds W).
    NgramDrafter::Options ngram;
    // kHybrid looks up suffixes of hybrid_min_ngram .. max(ngram.max_ngram,
    // hybrid_min_ngram) tokens: a shorter match (a digit of a sum) is too
    // often a coincidence, and the model drafter does better there. On 56
    // held-out chat tasks with the bundled pair, W=16 K=1, tau was 2.62 /
    // 3.24 / 3.33 / 3.20 for a minimum of 1 / 2 / 3 / 4 (docs/RESULTS.md).
    int hybrid_min_ngram = 3;
    // ... and also shorter suffixes (ngram.min_ngram and up) once the
    // model's drafts of the sequence accept fewer tokens per round than
    // this, a moving mean over about ten model rounds: text the model
    // cannot guess (a list reversed, a name renamed) goes to the lookup,
    // computed text (digits) stays with the model. 56 held-out chat
    // tasks, W=16 K=1: 3.29 tokens per round without, 3.50 with 0.5.
    double hybrid_short_match_below = 0.5;
    // Model drafts (kModel, and kHybrid's model rounds) are cut before
    // their first slot whose last-pass confidence (max softmax
    // probability) is below this; 0 keeps every draft whole. A draft cut
    // to nothing makes its round a plain decode step (a block of the bonus
    // alone), and the sequence then skips the drafter for 1, 2, 4, then 8
    // rounds after each such round in a row (reset by a draft that keeps
    // a slot): where the drafter cannot guess (text copied from the
    // prompt), a round costs about one decode step instead of a draft plus
    // a verify of W tokens. Verification is unchanged, so the output is
    // too (docs/RESULTS.md, "Confident drafts").
    double min_draft_confidence = 0;
    // Model drafts (kModel, and kHybrid's model rounds) longer than
    // verify_chunk - 1 tokens are verified verify_chunk block rows at a
    // time: a round verifies the bonus and the first verify_chunk - 1
    // drafted tokens, and when the target accepts all of them and its own
    // next token is the draft's next one, the next round verifies the rest
    // of the same draft (again in chunks) with no Draft call. The tokens
    // produced per Draft call are those of verifying the whole draft at
    // once, so the output and the drafter's work are unchanged; only the
    // verify rows change. It pays where a forward's cost grows with its
    // rows (a CPU: ~0.1 ms per row of the bundled target against ~0.7 ms
    // for a decode step; bench/README.md "Verifying drafts in chunks")
    // and most drafts are rejected early; where a forward costs the same
    // for 1 and 16 rows (a GPU) it only adds rounds. 0 (or >= W) verifies
    // every draft whole.
    int verify_chunk = 0;
    // A round of more running sequences than this speculates for none of
    // them: every block is the bonus alone, a plain decode step (0 = no
    // limit). Where a forward costs about the same for 1 and W rows (a GPU
    // at small batch), speculation pays at any batch a step stays
    // launch-bound; where its cost grows with its rows (a CPU; a GPU at
    // large batch), a batch's verify rows cost more than its drafts save:
    // on this repository's CPU host, 16 sequences at W=8 decode at ~0.4x
    // of target-only (bench/README.md, "Speculation at batch"). The same
    // knob as vLLM's speculative_disable_by_batch_size, applied per round
    // (a request speculates again once the batch shrinks). Output is
    // unchanged.
    int max_speculative_batch = 0;
    // Speculate only while it pays, per request: the engine keeps moving
    // means of its drafted rounds' tokens and wall time (draft call plus
    // target step) and of its plain rounds' wall time (the first round
    // after the prefill is a plain one, to measure it). While drafted
    // rounds give fewer tokens per second than plain ones, the request
    // decodes plain rounds, 1, 2, 4, ... up to 16 before each drafted
    // probe (reset by a probe that pays); the hybrid method's lookups are
    // never paused and not counted. Where drafts are good (copied
    // text) nothing changes; where they lose (text the drafter cannot
    // guess, a CPU whose verify costs several decode steps) a request
    // decodes at about target-only speed instead of below it. Output is
    // unchanged.
    bool adaptive_speculation = false;
    // Called on the stepping thread for every finished round (after its
    // record is complete, before its tokens are emitted), e.g. to update
    // per-round metrics while requests are still running. May be empty.
    std::function<void(SequenceId, const RoundRecord&)> on_round;
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
    // kHybrid: accepted tokens per model-drafted round, a moving mean
    // (-1 before the first).
    double model_accepted_mean = -1;
    // Options::min_draft_confidence: model rounds still to skip, and how
    // many the next cut-to-nothing draft skips.
    int skip_model_rounds = 0;
    int next_skip = 1;
    // Options::adaptive_speculation: moving means (-1 before the first)
    // of drafted rounds' tokens and seconds and of plain rounds' seconds;
    // plain rounds still to decode, the next pause's length, and whether
    // the next round must draft (a probe after a pause).
    double spec_tokens = -1, spec_seconds = -1, plain_seconds = -1;
    int pause_rounds = 0;
    int next_pause = 1;
    bool probe = false;
    // Options::verify_chunk: what the model drafted past the tokens the
    // last round verified and accepted, verified next round.
    std::vector<int32_t> held;
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

  // Appends tokens to the output, applying stops and max tokens. Returns
  // true when the sequence finished.
  bool Emit(Sequence& seq, const std::vector<int32_t>& tokens);
  void Finish(SequenceId id, FinishReason reason, absl::Status status = {});
  int WindowFor(const Sequence& seq) const;
  // The n-gram and hybrid methods propose from `Sequence::known`.
  static bool LooksUp(DraftMethod method);
  Drafter* DrafterFor(const Sequence& seq);
  // Options::adaptive_speculation: whether `seq` drafts this round (it
  // wants to); counts its pauses down.
  static bool SpeculationPays(Sequence& seq);
  // Whether the model drafter may ever draft `seq`, so the verifier side
  // feeds it the sequence's context (PrefillWork::context).
  bool FeedsContext(const Sequence& seq) const;
  // Right number of passes, W-1 tokens each (at most W-1 for a drafter
  // that proposes short blocks), ids inside the vocabulary.
  bool WellFormedDraft(const Drafter& drafter, const DraftRequest& request,
                       const DraftResult& draft) const;

  Verifier* verifier_;
  Drafter* drafter_;
  Options options_;
  NgramDrafter ngram_;
  NgramDrafter hybrid_lookup_;  // Options::hybrid_min_ngram and up
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
