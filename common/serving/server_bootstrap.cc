#include "common/serving/server_bootstrap.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"

namespace dedit {

absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_receive_bytes, std::shared_ptr<grpc::ServerCredentials> credentials,
    int64_t receive_memory_bytes) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  StartedServer started;
  builder.AddListeningPort(address,
                           credentials != nullptr
                               ? std::move(credentials)
                               : grpc::InsecureServerCredentials(),
                           &started.port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes > 0 ? max_receive_bytes
                                                         : kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  if (receive_memory_bytes > 0) {
    // The builder keeps its own reference to the quota.
    grpc::ResourceQuota quota(absl::StrCat("receive-", address));
    quota.Resize(static_cast<size_t>(receive_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  for (grpc::Service* s : services) builder.RegisterService(s);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  started.server->GetHealthCheckService()->SetServingStatus("", false);
  return started;
}

absl::StatusOr<StartedServer> StartHealthServer(const std::string& address) {
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection also gives the server the synchronous service gRPC needs to
  // start one.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  StartedServer started;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &started.port);
  builder.SetMaxReceiveMessageSize(4096);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (health port)"));
  }
  started.server->GetHealthCheckService()->SetServingStatus("", false);
  return started;
}

void HealthFanOut::SetServingStatus(const std::string& service_name,
                                    bool serving) {
  for (grpc::HealthCheckServiceInterface* h : targets_) {
    h->SetServingStatus(service_name, serving);
  }
}

void HealthFanOut::SetServingStatus(bool serving) {
  for (grpc::HealthCheckServiceInterface* h : targets_) {
    h->SetServingStatus(serving);
  }
}

void HealthFanOut::Shutdown() {
  for (grpc::HealthCheckServiceInterface* h : targets_) h->Shutdown();
}

absl::Status WriteReadyFile(const std::string& path, int grpc_port,
                            int metrics_port, int health_port) {
  if (path.empty()) return absl::OkStatus();
  std::string text = absl::StrCat("{\"grpc_port\": ", grpc_port,
                                  ", \"metrics_port\": ", metrics_port);
  if (health_port > 0)
    absl::StrAppend(&text, ", \"health_port\": ", health_port);
  return WriteFileAtomically(path, absl::StrCat(text, "}\n"));
}

grpc::ChannelArguments InternalChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

}  // namespace dedit
