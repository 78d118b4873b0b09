// Unary calls whose answer nobody waits for: the router's Release to the
// target and the drafter, and its KeepIdle and KeepAlive to the target.
// The caller goes on at once; the call owns its context and messages until
// gRPC ends it, on one of gRPC's callback threads.
//
//   v1::ReleaseRequest request;
//   request.add_sequences(id);
//   FireAndForget(stub->async(), &v1::Target::Stub::async::Release,
//                 std::move(request));
//
// One deadline for all of them, kFireAndForgetDeadline. Each is answered
// by the service's model thread between two forwards, so the deadline must
// outlast a forward under load. A call that does not arrive in time costs
// no correctness: the target releases a sequence that no call has named
// for its lease (--sequence_lease_seconds) and passes every release on to
// the drafter over the context stream, and a session whose kept sequence
// is gone prefills its next turn whole (NOT_FOUND). A deadline well under
// the lease keeps a call to an unreachable service from holding its memory
// longer than the lease would hold the sequence.
#ifndef DEDIT_SERVING_FIRE_AND_FORGET_H_
#define DEDIT_SERVING_FIRE_AND_FORGET_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <utility>

namespace dedit {

// The deadline of every fire-and-forget call, from when it is started.
inline constexpr std::chrono::seconds kFireAndForgetDeadline{10};

// Starts `(async->*method)(request)` (a stub's callback API, e.g.
// &v1::Target::Stub::async::Release) with kFireAndForgetDeadline and
// returns. Its status and response are dropped; `done`, when given, runs
// once the call has ended, whatever its status, on a gRPC thread (it must
// not block).
template <typename Async, typename Request, typename Response>
void FireAndForget(Async* async,
                   void (Async::*method)(grpc::ClientContext*, const Request*,
                                         Response*,
                                         std::function<void(grpc::Status)>),
                   Request request, std::function<void()> done = nullptr) {
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
    std::function<void()> done;
  };
  auto* call = new Call;
  call->request = std::move(request);
  call->done = std::move(done);
  call->context.set_deadline(std::chrono::system_clock::now() +
                             kFireAndForgetDeadline);
  (async->*method)(&call->context, &call->request, &call->response,
                   [call](grpc::Status) {
                     if (call->done) call->done();
                     delete call;
                   });
}

}  // namespace dedit

#endif  // DEDIT_SERVING_FIRE_AND_FORGET_H_
