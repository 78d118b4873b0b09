// The Verifier side of the round logic over dedit-target (gRPC), and the
// router's TargetControl (what the target serves, per-request limits).
//
// One Step() sends the round's prefills and verify blocks as one message,
// which the target's model thread runs in one forward: by default on a
// long-lived Target.Rounds stream (common/serving/round_stream.h), else as a
// unary Target.Step (`round_streams = false`). A prompt the target refuses (KV
// capacity) fails alone via TargetStepResult::prefill_status.
//
// Sequence ids on the wire are (router nonce << 32 | engine id), so that
// several routers, or a restarted one, never collide in the target.
//
//   RemoteVerifier verifier(channel, {.rpc_timeout_ms = 60000}, nonce);
//   ASSIGN_OR_RETURN(TargetInfo info, verifier.FetchInfo(500));
//   SpeculativeEngine engine(&verifier, &drafter, options);
//
// Thread-compatible: one thread (the GenerationLoop's) calls everything.
// Release() only starts an asynchronous call.
#ifndef DEDIT_ROUTER_REMOTE_VERIFIER_H_
#define DEDIT_ROUTER_REMOTE_VERIFIER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/round_interfaces.h"
#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "router/router_backends.h"

namespace dedit {

// Wire id of an engine sequence for the router instance `nonce`.
inline uint64_t WireSequenceId(uint32_t nonce, SequenceId id) {
  return (static_cast<uint64_t>(nonce) << 32) | (id & 0xffffffffu);
}

class RemoteVerifier : public Verifier, public TargetControl {
 public:
  struct Options {
    int64_t rpc_timeout_ms = 60000;  // a round's Step
    // Rounds on one Target.Rounds stream instead of a unary Step each.
    bool round_streams = true;
    // Runs each time a round stream is opened (may be empty).
    std::function<void()> on_round_stream_open;
  };
  using Clock = std::chrono::system_clock;

  RemoteVerifier(std::shared_ptr<grpc::Channel> channel, Options options,
                 uint32_t nonce);

  // TargetControl: Info on the target; limits sent with the Prefill item
  // (reserve_tokens) and bounding the deadline of every call the sequence
  // is part of.
  absl::StatusOr<TargetInfo> FetchInfo(int64_t timeout_ms) override;
  void SetRequestLimits(SequenceId id, int64_t reserve_tokens,
                        Clock::time_point deadline) override;

  absl::StatusOr<TargetStepResult> Step(
      const std::vector<PrefillWork>& prefills,
      const std::vector<VerifyWork>& verifies) override;
  absl::Status Release(SequenceId sequence) override;
  // Target.KeepIdle, fire and forget (common/serving/fire_and_forget.h). A
  // later Step that continues the sequence waits until this call has ended
  // (answered, or past its deadline), so the target never sees the idle
  // mark after the continuation.
  absl::Status Keep(SequenceId sequence) override;
  // Target.KeepAlive, fire and forget.
  void KeepAlive(const std::vector<SequenceId>& sequences) override;

 private:
  struct Limits {
    int64_t reserve_tokens = 0;
    Clock::time_point deadline = Clock::time_point::max();
  };
  Clock::time_point CallDeadline(const std::vector<SequenceId>& ids) const;

  std::unique_ptr<v1::Target::Stub> stub_;
  Options options_;
  // Null with `round_streams` off.
  std::unique_ptr<RoundStreamClient<v1::StepRequest, v1::StepResponse>> rounds_;
  uint32_t nonce_;
  std::unordered_map<SequenceId, Limits> limits_;
  // KeepIdle calls not answered yet. Shared with their callbacks (gRPC
  // threads), which may outlive this object.
  struct Keeping {
    absl::Mutex mu;
    std::unordered_set<SequenceId> ids ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Keeping> keeping_ = std::make_shared<Keeping>();
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_REMOTE_VERIFIER_H_
