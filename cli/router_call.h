// What dedit-cli's two router commands, generate (generate_command.h) and
// chat (chat_command.h), share: the stub and deadline of their one call to
// dedit-router, the request fields that GenerateRequest and SessionOpen
// both carry, and the finish reason's name in their statistics lines.
#ifndef DEDIT_CLI_ROUTER_CALL_H_
#define DEDIT_CLI_ROUTER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/generate_command.h"
#include "common/base/status.h"
#include "dedit/v1/services.grpc.pb.h"

namespace dedit {

// A Generation stub on a plaintext channel to options.router (the router's
// public port is plaintext).
std::unique_ptr<v1::Generation::Stub> RouterStub(
    const GenerateCommandOptions& options);

// Sets `context`'s deadline to options.timeout_s from now: the whole
// generation, or the whole chat session.
void SetCommandDeadline(const GenerateCommandOptions& options,
                        grpc::ClientContext* context);

// Sets the fields a GenerateRequest and a SessionOpen both carry, under the
// same names: model, sampling, window, passes, disable_speculation,
// speculative_method and ignore_eos. INVALID_ARGUMENT for a bad --method
// (SpeculativeMethodFromName).
template <typename Message>
absl::Status SetGenerationFields(const GenerateCommandOptions& o,
                                 Message* message) {
  message->set_model(o.model);
  v1::SamplingParams* s = message->mutable_sampling();
  s->set_temperature(o.temperature);
  s->set_top_k(o.top_k);
  s->set_top_p(o.top_p);
  if (o.seed >= 0) {
    s->set_has_seed(true);
    s->set_seed(static_cast<uint64_t>(o.seed));
  }
  message->set_window(o.window);
  message->set_passes(o.passes);
  message->set_disable_speculation(o.no_speculation);
  ASSIGN_OR_RETURN(const int method, SpeculativeMethodFromName(o.method));
  message->set_speculative_method(static_cast<v1::SpeculativeMethod>(method));
  message->set_ignore_eos(o.ignore_eos);
  return absl::OkStatus();
}

// "length", "stop", "context_limit", "cancelled", or "unknown".
const char* FinishReasonName(v1::FinishReason reason);

}  // namespace dedit

#endif  // DEDIT_CLI_ROUTER_CALL_H_
