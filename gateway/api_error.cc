#include "gateway/api_error.h"

#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

// The OpenAI field named by a router message's leading identifier.
std::string ParamFromRouterMessage(const std::string& message,
                                   Endpoint endpoint) {
  size_t end = 0;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) ||
          message[end] == '_' || message[end] == '.')) {
    ++end;
  }
  const std::string head = message.substr(0, end);
  const std::string prompt =
      endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (absl::StartsWith(head, "sampling.")) return head.substr(9);
  if (head == "chat" || head == "chat.messages" || head == "token_ids" ||
      head == "prompt") {
    return prompt;
  }
  if (head == "max_tokens" || head == "stop" || head == "stop_token_ids" ||
      head == "window" || head == "passes" || head == "speculative_method") {
    return head;
  }
  if (absl::StartsWith(message, "unknown model")) return "model";
  return "";
}

// Whether an UNAVAILABLE message is gRPC's about the connection (rather
// than the router's own, such as no stack serving).
bool IsTransportError(absl::string_view message) {
  for (absl::string_view mark :
       {"ipv4:", "ipv6:", "unix:", "failed to connect", "Socket closed",
        "Connection refused", "connections to all backends failing",
        "DNS resolution failed"}) {
    if (absl::StrContains(message, mark)) return true;
  }
  return false;
}

}  // namespace

ApiError ApiError::Invalid(std::string message, std::string param) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::string ApiError::Body() const {
  nlohmann::json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? nlohmann::json() : nlohmann::json(param);
  error["code"] = code.empty() ? nlohmann::json() : nlohmann::json(code);
  // A message may quote what a client sent (a path, a value): bytes that
  // are not UTF-8 become U+FFFD instead of an exception.
  return nlohmann::json({{"error", error}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError ApiErrorFromGrpc(const grpc::Status& status, Endpoint endpoint) {
  ApiError e;
  e.message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      e.http_status = 400;
      e.param = ParamFromRouterMessage(e.message, endpoint);
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "resource_exhausted";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "service_unavailable_error";
      e.code = "unavailable";
      // gRPC's own transport errors name the router's address and socket
      // state, which are the operator's business, not a client's.
      if (IsTransportError(e.message)) {
        e.message = "the model server is unavailable";
      }
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "timeout_error";
      e.code = "deadline_exceeded";
      break;
    case grpc::StatusCode::CANCELLED:
      e.http_status = 499;  // nginx's "client closed request"
      e.type = "cancelled";
      e.code = "cancelled";
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      e.http_status = 501;
      e.type = "not_implemented_error";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      // The router refused the gateway's own credentials (its internal
      // token or certificate, --authenticate_clients): the operator's
      // misconfiguration, not the client's key, so a 503 that names
      // nothing internal; the detail goes to the log.
      std::fprintf(stderr,
                   "dedit-openai: the router refused this gateway: %s\n",
                   e.message.c_str());
      e.http_status = 503;
      e.type = "service_unavailable_error";
      e.code = "unavailable";
      e.message = "the model server is unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal";
      break;
  }
  if (e.message.empty()) {
    e.message = absl::StrCat("router returned gRPC code ",
                             static_cast<int>(status.error_code()));
  }
  return e;
}

}  // namespace dedit
