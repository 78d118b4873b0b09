// File I/O for every dedit library (torch-free): the one place that opens,
// reads, creates and replaces files, so that every checkpoint, config,
// tokenizer, report and cache is written with the same crash-safety and every
// error reads the same way.
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
//   RETURN_IF_ERROR(MakeDirs(out_dir));
//   RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.json", json));
//
// Errors name the path and carry the OS error text ("cannot open /m/x: No
// such file or directory"). Codes follow errno (ErrnoToStatus): NOT_FOUND
// for a missing path, PERMISSION_DENIED, RESOURCE_EXHAUSTED for a full disk
// or quota; INVALID_ARGUMENT for a path that is not what the call needs (a
// directory where a file is expected, a file over a size cap).
#ifndef DEDIT_BASE_FILE_UTIL_H_
#define DEDIT_BASE_FILE_UTIL_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dedit {

// `what: strerror(err)` with a code chosen from `err`: ENOENT/ENOTDIR →
// NOT_FOUND, EACCES/EPERM/EROFS → PERMISSION_DENIED, ENOSPC/EDQUOT/EFBIG →
// RESOURCE_EXHAUSTED, anything else → INTERNAL.
absl::Status ErrnoToStatus(int err, absl::string_view what);

// A file descriptor, closed when destroyed. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes now and returns 0 or close(2)'s errno (a deferred write error on
  // some file systems, so writers must check it). Leaves the object empty.
  int Close();

 private:
  int fd_ = -1;
};

// A regular file open for reading, and its size when it was opened.
struct RegularFile {
  FileDescriptor fd;
  uint64_t size_bytes = 0;
};

// True when `path` names anything (file, directory, ...) that stat() sees.
bool PathExists(const std::string& path);

// Opens `path` read-only. INVALID_ARGUMENT when it is not a regular file: a
// directory, FIFO or device could block or never end, and none of them is a
// checkpoint or a config.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path);

// Whole contents of the regular file `path`. INVALID_ARGUMENT when the file
// is larger than `max_bytes` (checked before reading, and again if the file
// grows while it is read), DATA_LOSS when a read fails midway.
absl::StatusOr<std::string> ReadFileToString(
    const std::string& path,
    uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// mkdir -p: creates `dir` and its missing parents (0755), syncing the parent
// of every directory it creates so the new entries survive a crash.
// INVALID_ARGUMENT when `dir` exists but is not a directory.
absl::Status MakeDirs(const std::string& dir);

// Replaces `path` with `pieces` written back to back, so that after a crash
// or power loss `path` holds either its old contents or all of the new ones,
// never a mix or a truncated file:
//   1. write a temporary file `<path>.tmp.<pid>.<n>` in the same directory
//      (a rename is only atomic within one file system),
//   2. fsync it, 3. rename it over `path`, 4. fsync the directory, so that
//      the rename itself is durable.
// On any failure the temporary file is removed and an existing `path` is left
// untouched (except when only step 4 fails: the new file is then in place but
// may not survive a crash, and the error says so). Only a crash midway can
// leave a `<path>.tmp.*` file behind; nothing reads those. The parent
// directory must exist. Concurrent writers of one path are safe; the last
// rename wins.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces);
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// Appends `data` to `path`, creating it (0644) when absent. Not synced and
// not atomic: for logs and append-only records whose readers tolerate a lost
// or torn tail (the trainers' log.jsonl, the distill file).
absl::Status AppendToFile(const std::string& path, absl::string_view data);

}  // namespace dedit

#endif  // DEDIT_BASE_FILE_UTIL_H_
