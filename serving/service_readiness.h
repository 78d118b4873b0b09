// The grpc.health.v1 status of one named service that follows a condition
// changing on gRPC threads — the drafter's "dedit.v1.Drafter" is SERVING
// only while a context stream is attached (drafter_service.h). The
// condition may change before the server exists and during the drain;
// while a health service is attached, it always shows the latest value.
//
//   ServiceReadiness readiness("dedit.v1.Drafter");
//   // any thread, e.g. when a stream attaches or detaches:
//   readiness.Set(streams > 0);
//   // ServeHooks:
//   hooks.on_serving = [&](grpc::HealthCheckServiceInterface* health) {
//     readiness.PublishTo(health);
//   };
//   hooks.before_drain = [&] { readiness.PublishTo(nullptr); };
//
// Thread-safe.
#ifndef DEDIT_SERVING_SERVICE_READINESS_H_
#define DEDIT_SERVING_SERVICE_READINESS_H_

#include <grpcpp/health_check_service_interface.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

class ServiceReadiness {
 public:
  explicit ServiceReadiness(std::string service_name);
  ServiceReadiness(const ServiceReadiness&) = delete;
  ServiceReadiness& operator=(const ServiceReadiness&) = delete;

  // Records the status and publishes it when a health service is attached.
  void Set(bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  bool serving() const ABSL_LOCKS_EXCLUDED(mu_);

  // Attaches `health` and publishes the current status to it; nullptr
  // detaches (later Set calls are only recorded). Detach before the
  // drain: the server already reports NOT_SERVING for every name then,
  // and `health` dies with the server.
  void PublishTo(grpc::HealthCheckServiceInterface* health)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string service_name_;
  // Held while publishing, an exception to "no lock across a call out":
  // it makes the last status set the last one published, and
  // SetServingStatus only updates the health service's own table, never
  // calling back into this class.
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVICE_READINESS_H_
