// What the two model services' reactors (target_service/target_service.cc,
// drafter_service/drafter_service.cc) share: each RPC hands its work to the
// service's model thread and returns; the thread answers. `Worker` is the
// service's worker, a ModelThread (common/model/model_thread.h): the
// templates need only its poisoned() and Release(), so this library links
// no model code.
//
//   grpc::ServerUnaryReactor* DrafterServiceImpl::Release(
//       grpc::CallbackServerContext* context,
//       const v1::DrafterReleaseRequest* request,
//       v1::DrafterReleaseResponse* response) {
//     return ReleaseReactor(context, worker_, *request, response);
//   }
#ifndef DEDIT_SERVING_MODEL_SERVICE_REACTORS_H_
#define DEDIT_SERVING_MODEL_SERVICE_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "proto/grpc_status.h"

namespace dedit {

// A poisoned worker refuses every call at once with its INTERNAL error:
// finishes `reactor` with `poisoned` (the worker's poisoned()) when that is
// an error, and returns whether it did.
inline bool FinishIfPoisoned(const absl::Status& poisoned,
                             grpc::ServerUnaryReactor* reactor) {
  if (poisoned.ok()) return false;
  reactor->Finish(ToGrpcStatus(poisoned));
  return true;
}

// Target.Release and Drafter.Release: drops request.sequences() on the
// model thread (ModelThread::Release) and answers how many of them existed
// (response->released). A poisoned worker refuses it (FinishIfPoisoned).
template <typename Worker, typename Request, typename Response>
grpc::ServerUnaryReactor* ReleaseReactor(grpc::CallbackServerContext* context,
                                         Worker* worker, const Request& request,
                                         Response* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (FinishIfPoisoned(worker->poisoned(), reactor)) return reactor;
  worker->Release({request.sequences().begin(), request.sequences().end()},
                  [reactor, response](int released) {
                    response->set_released(released);
                    reactor->Finish(grpc::Status::OK);
                  });
  return reactor;
}

}  // namespace dedit

#endif  // DEDIT_SERVING_MODEL_SERVICE_REACTORS_H_
