// dedit.v1.Generation: the public API. Generate validates and tokenizes the
// request in the reaction (CPU only, no waiting), hands it to the StackSet
// (which admits it on one stack's GenerationLoop), and streams what the
// loop sends; a client that goes away
// (cancel, deadline) cancels its request in the engine, which releases the
// sequence on both services.
#ifndef DEDIT_ROUTER_GENERATION_SERVICE_H_
#define DEDIT_ROUTER_GENERATION_SERVICE_H_

#include <functional>

#include "dedit/v1/services.grpc.pb.h"
#include "router/request_builder.h"
#include "router/session_service.h"
#include "router/stack_set.h"

namespace dedit {

class GenerationServiceImpl final : public v1::Generation::CallbackService {
 public:
  struct Defaults {
    int max_tokens_limit = 4096;
    int max_passes = 8;
    int default_window = 0;  // 0 → the drafter's block size
    int default_passes = 0;  // 0 → the drafter checkpoint's K
    DraftMethod default_method = DraftMethod::kModel;
    int ngram_default_window = 8;
    int ngram_max_window = 64;  // = GenerationLoop::Options::ngram
    // Text prompts longer than max context x this are refused before
    // tokenizing; 0 = twice the longest vocabulary token (MaxTokenBytes).
    int max_bytes_per_token = 0;
    int max_stop_strings = 16;
    int max_stop_string_bytes = 256;
    bool chat_special_tokens_in_content = false;
    SessionOptions sessions;  // Session (router/session_service.h)
  };
  // `tokenizer` and `registry` (dedit_sessions_open) may be null. The
  // stacks' drafters size request defaults.
  GenerationServiceImpl(StackSet* stacks, const Tokenizer* tokenizer,
                        Defaults defaults,
                        prometheus::Registry* registry = nullptr)
      : stacks_(stacks),
        drafter_(stacks),
        tokenizer_(tokenizer),
        defaults_(defaults),
        bytes_per_token_(
            defaults.max_bytes_per_token > 0
                ? defaults.max_bytes_per_token
                : (tokenizer != nullptr ? 2 * MaxTokenBytes(*tokenizer) : 0)),
        sessions_(
            stacks, tokenizer, defaults.sessions,
            [this] { return CurrentLimits(); }, registry) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const v1::GenerateRequest* request) override;
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* context) override {
    return sessions_.Open(context);
  }
  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::RouterInfoRequest* request,
                                 v1::RouterInfoResponse* response) override;

 private:
  RequestLimits CurrentLimits() const;
  void FillCard(v1::ModelCard* card) const;

  StackSet* stacks_;
  const DrafterHealth* drafter_;
  const Tokenizer* tokenizer_;
  Defaults defaults_;
  const int64_t bytes_per_token_;  // 0 = no bound on text length
  SessionManager sessions_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_GENERATION_SERVICE_H_
