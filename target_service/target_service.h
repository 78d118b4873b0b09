// dedit.v1.Target over a TargetWorker: each RPC converts its message, hands
// the work to the model thread and returns; the model thread answers. A
// poisoned worker (common/model/model_thread.h) fails every call but Info
// at once with its INTERNAL error.
//
//   TargetServiceImpl service(&worker, &stream, model_name, device, dtype);
//   StartGrpcServer(address, {&service});
#ifndef DEDIT_TARGET_SERVICE_TARGET_SERVICE_H_
#define DEDIT_TARGET_SERVICE_TARGET_SERVICE_H_

#include <string>

#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "target_service/context_stream_client.h"
#include "target_service/target_worker.h"

namespace dedit {

class TargetServiceImpl final : public v1::Target::CallbackService {
 public:
  struct Identity {
    std::string model_name;
    std::string device;
    std::string dtype;
  };
  // `stream` may be null (no drafter configured).
  TargetServiceImpl(TargetWorker* worker, const ContextStreamClient* stream,
                    Identity identity)
      : worker_(worker), stream_(stream), identity_(std::move(identity)) {}

  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request,
                                 v1::StepResponse* response) override;
  // Step's rounds on one long-lived stream (common/serving/round_stream.h).
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Rounds(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* KeepIdle(grpc::CallbackServerContext* context,
                                     const v1::KeepIdleRequest* request,
                                     v1::KeepIdleResponse* response) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* context,
                                      const v1::KeepAliveRequest* request,
                                      v1::KeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::TargetInfoRequest* request,
                                 v1::TargetInfoResponse* response) override;

  // Graceful shutdown, before the server's drain: each round stream ends
  // UNAVAILABLE after its round in flight (a unary Step's refusal).
  void DrainRounds() { rounds_.Drain(); }

 private:
  // One round (Step or a Rounds message): `done` gets its status, once.
  void RunStep(const v1::StepRequest& request, v1::StepResponse* response,
               std::function<void(absl::Status)> done);

  TargetWorker* worker_;
  const ContextStreamClient* stream_;
  Identity identity_;
  RoundStreams rounds_;
};

}  // namespace dedit

#endif  // DEDIT_TARGET_SERVICE_TARGET_SERVICE_H_
