// Turns a public GenerateRequest into a RouterRequest: validates every
// field against the served model and the drafter's limits, renders chat
// messages with the Qwen3 template, and tokenizes text. Every problem is an
// INVALID_ARGUMENT whose message names the field.
//
//   ASSIGN_OR_RETURN(RouterRequest r,
//                    BuildRouterRequest(proto, limits, tokenizer.get()));
#ifndef DEDIT_ROUTER_REQUEST_BUILDER_H_
#define DEDIT_ROUTER_REQUEST_BUILDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "dedit/v1/generation.pb.h"
#include "router/generation_loop.h"
#include "tokenizer/tokenizer.h"

namespace dedit {

struct RequestLimits {
  ServedModel model;
  int max_tokens_limit = 4096;
  int drafter_block_size = 0;  // 0 = drafter never reached (no W check)
  int max_passes = 8;
  int default_window = 16;  // clamped to the block size when known
  int default_passes = 1;
  // Who drafts when the request does not say, and the n-gram method's
  // window: its default and the largest a request may ask.
  DraftMethod default_method = DraftMethod::kModel;
  int ngram_default_window = 8;
  int ngram_max_window = 64;
};

// `tokenizer` may be null: then only token-id prompts are accepted.
absl::StatusOr<RouterRequest> BuildRouterRequest(
    const v1::GenerateRequest& request, const RequestLimits& limits,
    const Tokenizer* tokenizer);

}  // namespace dedit

#endif  // DEDIT_ROUTER_REQUEST_BUILDER_H_
