// OpenAI's error object and the one mapping from a router gRPC status to an
// HTTP status. Every error the gateway answers is one of these, serialized
// as {"error": {"message", "type", "param", "code"}} (what the OpenAI SDKs
// parse into APIError).
//
//   ApiError e = ApiError::Invalid("n must be 1", "n");
//   res.status = e.http_status;  res.set_content(e.Body(), "application/json");
#ifndef DEDIT_GATEWAY_API_ERROR_H_
#define DEDIT_GATEWAY_API_ERROR_H_

#include <grpcpp/support/status.h>

#include <string>

namespace dedit {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; empty → null
  std::string code;   // empty → null

  // 400 invalid_request_error naming `param`.
  static ApiError Invalid(std::string message, std::string param);
  // The JSON body: {"error": {...}}.
  std::string Body() const;
};

enum class Endpoint { kCompletions, kChatCompletions };

// Maps a router status to HTTP (INVALID_ARGUMENT/OUT_OF_RANGE/
// FAILED_PRECONDITION 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, CANCELLED 499, UNIMPLEMENTED 501,
// the rest 500). For a 400 the field is read from the router's message,
// which names it first ("sampling.temperature must be >= 0" → temperature;
// "chat.messages[1].role ..." → messages).
ApiError ApiErrorFromGrpc(const grpc::Status& status, Endpoint endpoint);

}  // namespace dedit

#endif  // DEDIT_GATEWAY_API_ERROR_H_
