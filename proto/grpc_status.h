// The one conversion between absl::Status (engine code) and grpc::Status
// (service adapters). Codes map one to one (both follow google.rpc.Code).
//
//   return ToGrpcStatus(worker.Submit(...));       // in a reactor
//   absl::Status s = FromGrpcStatus(stub_status);   // in a client
#ifndef DEDIT_PROTO_GRPC_STATUS_H_
#define DEDIT_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dedit {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A per-item status carried inside a message ({int32 code, string message}).
absl::Status StatusFromCode(int code, const std::string& message);

}  // namespace dedit

#endif  // DEDIT_PROTO_GRPC_STATUS_H_
