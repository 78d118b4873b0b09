#include "cli/generate_command.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/router_call.h"
#include "common/base/status.h"
#include "proto/grpc_status.h"

namespace dedit {

absl::Status RunGenerate(const GenerateCommandOptions& o,
                         std::ostream& text_out, std::ostream& stats_out) {
  v1::GenerateRequest request;
  RETURN_IF_ERROR(SetGenerationFields(o, &request));
  if (!o.prompt_ids.empty()) {
    request.mutable_token_ids()->mutable_ids()->Add(o.prompt_ids.begin(),
                                                    o.prompt_ids.end());
  } else if (o.chat) {
    v1::ChatMessage* m = request.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(o.prompt);
    request.mutable_chat()->set_enable_thinking(o.enable_thinking);
  } else {
    request.set_text(o.prompt);
  }
  request.set_max_tokens(o.max_tokens);
  for (const std::string& stop : o.stop) request.add_stop(stop);

  std::unique_ptr<v1::Generation::Stub> stub = RouterStub(o);
  grpc::ClientContext context;
  SetCommandDeadline(o, &context);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  v1::GenerateResponse response, last;
  int tokens = 0;
  bool any_text = false;
  while (reader->Read(&response)) {
    tokens += response.token_ids_size();
    if (!response.text().empty()) {
      any_text = true;
      text_out << response.text();
    } else if (!any_text) {
      for (int32_t id : response.token_ids()) text_out << id << ' ';
    }
    text_out.flush();
    if (response.finished()) last = response;
  }
  const grpc::Status status = reader->Finish();
  text_out << '\n';
  if (!status.ok()) return FromGrpcStatus(status);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  const v1::AcceptanceStats& a = last.acceptance();
  stats_out << absl::StrFormat(
      "[%d tokens, %.1f tokens/s, mean acceptance length %.2f, %d rounds "
      "(%d drafted, %d fallback), finish %s]\n",
      tokens, seconds > 0 ? tokens / seconds : 0.0, a.mean_acceptance_length(),
      a.rounds(), a.drafted_rounds(), a.fallback_rounds(),
      FinishReasonName(last.finish_reason()));
  return absl::OkStatus();
}

absl::StatusOr<int> SpeculativeMethodFromName(const std::string& name) {
  if (name.empty()) return v1::SPECULATIVE_METHOD_UNSPECIFIED;
  if (name == "model") return v1::SPECULATIVE_METHOD_MODEL;
  if (name == "ngram") return v1::SPECULATIVE_METHOD_NGRAM;
  if (name == "hybrid") return v1::SPECULATIVE_METHOD_HYBRID;
  return absl::InvalidArgumentError(absl::StrCat(
      "--method must be model, ngram or hybrid, got '", name, "'"));
}

}  // namespace dedit
