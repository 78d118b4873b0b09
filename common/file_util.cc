#include "common/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dedit {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"),
                                             &std::fclose);
  if (file == nullptr) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  std::string contents;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) {
    contents.append(buffer, n);
  }
  if (std::ferror(file.get())) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  return contents;
}

}  // namespace dedit
