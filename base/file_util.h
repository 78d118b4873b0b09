// Small file helpers shared by every library (torch-free).
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
#ifndef DEDIT_BASE_FILE_UTIL_H_
#define DEDIT_BASE_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

// Whole file contents. NOT_FOUND when the file does not exist, the OS error
// as FAILED_PRECONDITION when it cannot be opened, DATA_LOSS when a read
// fails midway.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// mkdir -p.
absl::Status MakeDirs(const std::string& dir);

// Writes `text` through a temporary file and a rename, so readers never see
// a half-written file.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace dedit

#endif  // DEDIT_BASE_FILE_UTIL_H_
