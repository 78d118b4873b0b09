// Small file helpers shared by every library (torch-free).
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
#ifndef DEDIT_COMMON_FILE_UTIL_H_
#define DEDIT_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace dedit {

// Whole file contents. NOT_FOUND when the file does not exist, the OS error
// as FAILED_PRECONDITION when it cannot be opened, DATA_LOSS when a read
// fails midway.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace dedit

#endif  // DEDIT_COMMON_FILE_UTIL_H_
