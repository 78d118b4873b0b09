#include "serving/service_readiness.h"

#include <utility>

namespace dedit {

ServiceReadiness::ServiceReadiness(std::string service_name)
    : service_name_(std::move(service_name)) {}

void ServiceReadiness::Set(bool serving) {
  absl::MutexLock lock(&mu_);
  serving_ = serving;
  if (health_ != nullptr) health_->SetServingStatus(service_name_, serving_);
}

bool ServiceReadiness::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

void ServiceReadiness::PublishTo(grpc::HealthCheckServiceInterface* health) {
  absl::MutexLock lock(&mu_);
  health_ = health;
  if (health_ != nullptr) health_->SetServingStatus(service_name_, serving_);
}

}  // namespace dedit
