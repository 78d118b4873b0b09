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
#include "common/tokenizer/tokenizer.h"
#include "dedit/v1/generation.pb.h"
#include "router/generation_loop.h"

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
  // Stop strings are matched on the engine thread that every request
  // shares, so their number and length are bounded.
  // Text (all chat content together) longer than this many bytes cannot
  // fit the context and is refused before tokenizing; 0 = no bound.
  int64_t max_prompt_bytes = 0;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  // Chat content may spell special tokens (ChatTemplateOptions); off by
  // default so that a message cannot forge a turn.
  bool chat_special_tokens_in_content = false;
};

// Bytes of the longest token of the vocabulary (byte-level spelling, which
// is never shorter than the text it covers): a text of B bytes encodes to at
// least B / MaxTokenBytes tokens, before normalization.
int MaxTokenBytes(const Tokenizer& tokenizer);

// `tokenizer` may be null: then only token-id prompts are accepted.
absl::StatusOr<RouterRequest> BuildRouterRequest(
    const v1::GenerateRequest& request, const RequestLimits& limits,
    const Tokenizer* tokenizer);

}  // namespace dedit

#endif  // DEDIT_ROUTER_REQUEST_BUILDER_H_
