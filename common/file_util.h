// Small file helpers shared by every library (torch-free).
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
#ifndef DEDIT_COMMON_FILE_UTIL_H_
#define DEDIT_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace dedit {

// Reads a whole file; NOT_FOUND when it cannot be opened, DATA_LOSS when a
// read fails midway.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace dedit

#endif  // DEDIT_COMMON_FILE_UTIL_H_
