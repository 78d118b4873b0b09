// A request to a speculative engine, and the one place its rules are
// checked: the engine's Submit and the router's request builder
// (router/request_builder.h) both call ValidateRequest, so a rule and its
// message exist once, worded with the wire's field names
// (proto/dedit/v1/generation.proto) that clients send.
#ifndef DEDIT_ENGINE_GENERATION_REQUEST_H_
#define DEDIT_ENGINE_GENERATION_REQUEST_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/engine/draft.h"
#include "common/engine/sampling_params.h"

namespace dedit {

// Who proposes a request's blocks.
enum class DraftMethod {
  kModel,  // the engine's Drafter (DEdit/DFlash, in process or a service)
  kNgram,  // prompt lookup over the request's own tokens (no model)
  // Per round: prompt lookup when the sequence's last hybrid_min_ngram
  // tokens occurred before (the answer is copying), else the model drafter
  // (the answer is computed); shorter matches too once the model's drafts
  // of the sequence stop paying (SpeculationOptions). A lookup round costs
  // no drafter pass. The two kinds of text favour opposite drafters; this
  // takes each round's better guess at the price of a lookup.
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
  // to continue (SpeculativeEngine::KeptSequences, ReleaseKept).
  bool keep = false;
  // A sequence kept by an earlier request: this request continues it under
  // the same id, prefilling only the prompt after the longest common
  // prefix of the kept tokens and `prompt` (at least one token is
  // prefilled). 0, or an id not kept (any more): a new sequence, and
  // GenerationResult::cache_lost when it was not 0.
  SequenceId continue_sequence = 0;
};

// What a request is checked against: the served model and the engine's
// limits. 0 leaves a limit unchecked where noted.
struct RequestRules {
  int vocab_size = 0;  // prompt and stop ids (0 = unchecked)
  int64_t max_context = 40960;
  int max_new_tokens_limit = 1 << 20;
  int max_passes = 8;
  // The model drafter's block size, the largest W of the model and hybrid
  // methods (0 = no model drafter, or not known yet).
  int drafter_block_size = 0;
  int ngram_max_window = 64;  // the largest W of the n-gram and hybrid ones
};

// INVALID_ARGUMENT, naming the field as the wire does, when the prompt is
// empty, holds an id outside the vocabulary or leaves no room in the
// context; max_tokens is outside [1, limit]; the sampling parameters are
// out of range; a stop id is outside the vocabulary; W < 1; K is outside
// [0, max_passes] (at most 1 with the n-gram method); or W exceeds the
// method's largest window.
absl::Status ValidateRequest(const GenerationRequest& request,
                             const RequestRules& rules);

}  // namespace dedit

#endif  // DEDIT_ENGINE_GENERATION_REQUEST_H_
