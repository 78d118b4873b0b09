// Renders the router's GenerateResponse stream in OpenAI's formats: SSE
// chunks ("text_completion" / "chat.completion.chunk" objects, closed by
// `data: [DONE]`) for stream: true, one "text_completion" /
// "chat.completion" body otherwise. The final usage object carries dedit's
// extras next to OpenAI's counts: "acceptance" (the router's
// AcceptanceStats), "time_to_first_token_seconds", "duration_seconds".
//
//   OpenAiResponse response(request.endpoint, request.model,
//                           request.include_usage);
//   sink.write(response.StreamEvents(message));   // per router message
//   sink.write(response.StreamEnd());             // after status OK
//
// Not thread-safe: one response belongs to one HTTP request.
#ifndef DEDIT_GATEWAY_OPENAI_RESPONSE_H_
#define DEDIT_GATEWAY_OPENAI_RESPONSE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dedit/v1/generation.pb.h"
#include "gateway/api_error.h"

namespace dedit {

class OpenAiResponse {
 public:
  OpenAiResponse(Endpoint endpoint, std::string model, bool include_usage);

  // Streaming: the SSE events for one router message (its text delta; the
  // finish chunk when it is the last).
  std::string StreamEvents(const v1::GenerateResponse& message);
  // Streaming, after the router's OK status: the usage chunk when
  // stream_options.include_usage asked for it, then `data: [DONE]`.
  std::string StreamEnd() const;
  // Streaming, after an error status (the HTTP status was already sent):
  // an {"error": ...} event (the SDKs raise it), then `data: [DONE]`.
  static std::string StreamError(const ApiError& error);

  // Not streaming: collects a message; Body() renders the whole response.
  void Append(const v1::GenerateResponse& message);
  std::string Body() const;

  // OpenAI's usage object plus the extras, from the final message.
  static nlohmann::json Usage(const v1::GenerateResponse& last);

 private:
  nlohmann::json Chunk(nlohmann::json choice) const;
  nlohmann::json FinishFields(nlohmann::json choice) const;

  const Endpoint endpoint_;
  const std::string model_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
  bool role_sent_ = false;
  std::string text_;           // non-streaming: the whole text
  v1::GenerateResponse last_;  // the final message (finished = true)
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_OPENAI_RESPONSE_H_
