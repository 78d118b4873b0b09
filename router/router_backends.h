// What the router's GenerationLoop needs from the target and the drafter
// beyond the round interfaces (common/engine/round_interfaces.h): what the
// target serves and per-request limits (TargetControl), and whether new
// requests may speculate (DrafterHealth). Proto-free, so that the in-process
// backends (common/model/local_backends.h) can stand in for the services in
// tests.
//
// In the router one object implements both sides of each service:
// RemoteVerifier is a Verifier and a TargetControl, RemoteDrafter a Drafter
// and a DrafterHealth.
//
//   RouterBackends backends{&verifier, &verifier, &drafter, &drafter};
//   GenerationLoop loop(backends, tokenizer, registry, options);
#ifndef DEDIT_ROUTER_ROUTER_BACKENDS_H_
#define DEDIT_ROUTER_ROUTER_BACKENDS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/round_interfaces.h"

namespace dedit {

// What the target serves (dedit.v1.Target/Info).
struct TargetInfo {
  std::string model_name;
  int vocab_size = 0;
  int64_t max_context = 0;  // prompt + generated tokens per sequence
  std::vector<int32_t> eos_token_ids;
  // Sequences no call names for this long are released by the target
  // (--sequence_lease_seconds); 0 = never.
  double sequence_lease_seconds = 0;
};

// The target beyond rounds. Called on the GenerationLoop thread only.
class TargetControl {
 public:
  virtual ~TargetControl() = default;

  // What the target serves. UNAVAILABLE (or another error) when it cannot
  // be reached within `timeout_ms`; the loop retries.
  virtual absl::StatusOr<TargetInfo> FetchInfo(int64_t timeout_ms) = 0;

  // Per-request facts the Verifier interface does not carry, set after the
  // engine accepted the request and before its prefill: the KV tokens to
  // reserve for the sequence's whole life (prompt + max tokens + W, at
  // most the max context: KvReservationTokens in generation_loop.h,
  // docs/ARCHITECTURE.md §3 "Admission control"), and the client's
  // deadline (internal calls never outlive every client they serve). They
  // apply until Verifier::Release(id).
  virtual void SetRequestLimits(
      SequenceId id, int64_t reserve_tokens,
      std::chrono::system_clock::time_point deadline) = 0;

  // Renews the leases of sequences kept idle on purpose (sessions between
  // turns, docs/ARCHITECTURE.md §8), without waiting for the answer.
  virtual void KeepAlive(const std::vector<SequenceId>& /*sequences*/) {}
};

// The drafter's readiness and limits. Thread-safe: read by the loop thread
// (admission) and by gRPC threads (model card, router Info).
class DrafterHealth {
 public:
  virtual ~DrafterHealth() = default;

  // True while new requests may speculate; false after a failed Draft call
  // until the drafter is known to be ready again.
  virtual bool healthy() const = 0;
  // Largest window W it can draft; 0 until the drafter has been reached.
  virtual int block_size() const = 0;
  virtual int num_passes() const = 0;  // the checkpoint's K (the default)
  virtual int max_passes() const = 0;  // largest K it accepts
};

// The services one GenerationLoop drives. `verifier` and `target` are
// required (usually the same object); `drafter` and `drafter_health` are
// both null (target-only router) or both set (usually the same object).
struct RouterBackends {
  Verifier* verifier = nullptr;
  TargetControl* target = nullptr;
  Drafter* drafter = nullptr;
  const DrafterHealth* drafter_health = nullptr;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_ROUTER_BACKENDS_H_
