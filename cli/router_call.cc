#include "cli/router_call.h"

#include <chrono>

namespace dedit {

std::unique_ptr<v1::Generation::Stub> RouterStub(
    const GenerateCommandOptions& options) {
  return v1::Generation::NewStub(
      grpc::CreateChannel(options.router, grpc::InsecureChannelCredentials()));
}

void SetCommandDeadline(const GenerateCommandOptions& options,
                        grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(options.timeout_s));
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CONTEXT_LIMIT:
      return "context_limit";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

}  // namespace dedit
