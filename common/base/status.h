// Status helpers shared by every dedit library.
//
// Debian's abseil (20220623) ships absl::Status/StatusOr but not the status
// macros, so they live here. Engine code returns absl::Status / StatusOr and
// never throws; the libtorch edge converts c10::Error once (torch_status.h).
//
//   absl::StatusOr<int> ParsePort(const std::string& s);
//   absl::Status Run() {
//     ASSIGN_OR_RETURN(int port, ParsePort(flag));
//     RETURN_IF_ERROR(Listen(port));
//     return absl::OkStatus();
//   }
#ifndef DEDIT_BASE_STATUS_H_
#define DEDIT_BASE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define DEDIT_STATUS_CONCAT_INNER_(a, b) a##b
#define DEDIT_STATUS_CONCAT_(a, b) DEDIT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status dedit_status_ = (expr);         \
    if (!dedit_status_.ok()) return dedit_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo());` declares/assigns `x` from an
// absl::StatusOr, or returns its error status.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                           \
  DEDIT_ASSIGN_OR_RETURN_IMPL_(DEDIT_STATUS_CONCAT_(dedit_so_, __LINE__), lhs, \
                               rexpr)
#define DEDIT_ASSIGN_OR_RETURN_IMPL_(so, lhs, rexpr) \
  auto so = (rexpr);                                 \
  if (!so.ok()) return std::move(so).status();       \
  lhs = std::move(so).value()

namespace dedit {

// Prefixes the message of a non-OK status with `context`, keeping its code.
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace dedit

#endif  // DEDIT_BASE_STATUS_H_
