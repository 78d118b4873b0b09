#include "common/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

// The directory holding `path`, for syncing the entry a rename creates.
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Makes the entries of `dir` (a file renamed into it, a directory created in
// it) durable. Some file systems cannot fsync a directory and say EINVAL;
// there is nothing stronger to do on those, so that is not an error.
absl::Status SyncDirectory(const std::string& dir) {
  FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("cannot open directory ", dir));
  }
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    return ErrnoToStatus(errno, absl::StrCat("cannot fsync directory ", dir));
  }
  return absl::OkStatus();
}

// write(2) until all of `data` is written; returns 0 or an errno value.
int WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // No progress on a non-empty write.
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// Distinguishes temporary files of concurrent writers in one process; the
// pid does it across processes.
std::atomic<uint64_t> temp_file_counter{0};

}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

int FileDescriptor::Close() {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) return errno;
  return 0;
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK so that opening a FIFO cannot hang waiting for a writer; it
  // is cleared again below for the regular file this must be.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot fcntl ", path));
  }
  RegularFile file;
  file.fd = std::move(fd);
  file.size_bytes = static_cast<uint64_t>(st.st_size);
  return file;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             uint64_t max_bytes) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) return file.status();
  auto over_limit = [&](uint64_t size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", size, " bytes, over the limit of ", max_bytes));
  };
  if (file->size_bytes > max_bytes) return over_limit(file->size_bytes);
  std::string contents;
  contents.reserve(static_cast<size_t>(file->size_bytes));
  // Read to end of file rather than to the size fstat saw: the file may
  // change meanwhile, and some (procfs) report size 0.
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(file->fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      return absl::DataLossError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > max_bytes) return over_limit(contents.size());
  }
  return contents;
}

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) == 0) {
      absl::Status synced = SyncDirectory(DirectoryOf(prefix));
      if (!synced.ok()) return synced;
    } else if (errno != EEXIST) {
      return ErrnoToStatus(errno,
                           absl::StrCat("cannot create directory ", prefix));
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot stat ", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces) {
  auto error = [&path](int err, absl::string_view step) {
    return ErrnoToStatus(err, absl::StrCat("cannot write ", path, ": ", step));
  };
  // O_EXCL + O_NOFOLLOW: never write through a stale file or a symlink that
  // happens to have the temporary name; try the next name instead.
  std::string tmp;
  FileDescriptor fd;
  int open_err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".",
                       temp_file_counter.fetch_add(1));
    const int raw_fd =
        ::open(tmp.c_str(),
               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    open_err = errno;
    fd = FileDescriptor(raw_fd);
    if (fd.valid() || open_err != EEXIST) break;
  }
  if (!fd.valid()) {
    return error(open_err, absl::StrCat("create temporary file ", tmp));
  }

  int err = 0;
  std::string step;
  for (absl::string_view piece : pieces) {
    if ((err = WriteAll(fd.get(), piece)) != 0) {
      step = absl::StrCat("write to temporary file ", tmp);
      break;
    }
  }
  if (err == 0 && ::fsync(fd.get()) != 0) {
    err = errno;
    step = absl::StrCat("fsync of temporary file ", tmp);
  }
  if (const int close_err = fd.Close(); close_err != 0 && err == 0) {
    err = close_err;
    step = absl::StrCat("close of temporary file ", tmp);
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    step = absl::StrCat("rename of ", tmp, " over it");
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    return error(err, step);
  }
  const absl::Status synced = SyncDirectory(DirectoryOf(path));
  if (!synced.ok()) {
    return absl::Status(
        synced.code(),
        absl::StrCat("wrote ", path,
                     " but it may not survive a crash: ", synced.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  return WriteFileAtomically(path, std::vector<absl::string_view>{contents});
}

absl::Status AppendToFile(const std::string& path, absl::string_view data) {
  FileDescriptor fd(
      ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  if (const int err = WriteAll(fd.get(), data); err != 0) {
    return ErrnoToStatus(err, absl::StrCat("cannot append to ", path));
  }
  if (const int err = fd.Close(); err != 0) {
    return ErrnoToStatus(err, absl::StrCat("cannot append to ", path));
  }
  return absl::OkStatus();
}

}  // namespace dedit
