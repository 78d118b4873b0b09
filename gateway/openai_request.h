// Translates an OpenAI request body (/v1/completions, /v1/chat/completions)
// into the dedit.v1.GenerateRequest the router validates and serves. The
// gateway checks only what gRPC cannot express: JSON syntax, types, fields
// OpenAI defines that dedit does not support (n > 1, logprobs, tools,
// non-zero penalties, ...), and unknown fields. Every range check (max_tokens
// limit, window, passes, temperature, context length) stays in the router, so
// HTTP and gRPC clients meet the same validation. A field sent with its
// neutral value (presence_penalty 0, logit_bias {}, n 1, logprobs false, user
// "...") is accepted; one asking for something unsupported is a 400 naming
// it, never silently ignored.
//
//   OpenAiRequest request;
//   if (auto error = ParseOpenAiRequest(Endpoint::kChatCompletions, body,
//                                       served, &request)) {
//     return Reply(*error);
//   }
//   stub->Generate(&context, request.generate, ...);
#ifndef DEDIT_GATEWAY_OPENAI_REQUEST_H_
#define DEDIT_GATEWAY_OPENAI_REQUEST_H_

#include <optional>
#include <string>
#include <string_view>

#include "dedit/v1/generation.pb.h"
#include "gateway/api_error.h"

namespace dedit {

// What the gateway knows of the router's model (from ListModels).
struct ServedModel {
  std::string name;
  int max_tokens_limit = 4096;
  // max_tokens of a chat request that gives none (completions: 16, as
  // OpenAI's API), capped at max_tokens_limit.
  int default_chat_max_tokens = 512;
};

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  v1::GenerateRequest generate;
  std::string model;  // the served name (the request's, or the default)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses `body` into `out`; returns the error to answer instead (400, or
// 404 model_not_found for a model the router does not serve).
std::optional<ApiError> ParseOpenAiRequest(Endpoint endpoint,
                                           std::string_view body,
                                           const ServedModel& served,
                                           OpenAiRequest* out);

}  // namespace dedit

#endif  // DEDIT_GATEWAY_OPENAI_REQUEST_H_
