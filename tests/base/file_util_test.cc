#include "common/base/file_util.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/base/temp_dir.h"

namespace dedit {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

using testing::TempDir;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Caps the size of files this process may write (RLIMIT_FSIZE) while alive,
// so that write(2) fails midway with EFBIG: a disk that fills up during a
// checkpoint write, without needing a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = ::getrlimit(RLIMIT_FSIZE, &saved_) == 0;
    // Past the limit the kernel sends SIGXFSZ, which would kill the test;
    // ignored, the write fails with EFBIG instead.
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

// ---------------------------------------------------------------------------
// ErrnoToStatus

TEST(ErrnoToStatusTest, CodesFollowErrnoAndMessageHasTheOsText) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(ENOTDIR, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EROFS, "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "x").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "cannot open /a/b").message(),
            "cannot open /a/b: No such file or directory");
}

// ---------------------------------------------------------------------------
// Reading

TEST(ReadFileToStringTest, ReadsWholeFile) {
  TempDir dir;
  std::string content(200000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = char(i * 7);
  ASSERT_TRUE(WriteFileAtomically(dir.Join("f"), content).ok());
  absl::StatusOr<std::string> read = ReadFileToString(dir.Join("f"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, content);
  ASSERT_TRUE(WriteFileAtomically(dir.Join("empty"), "").ok());
  EXPECT_EQ(*ReadFileToString(dir.Join("empty")), "");
}

TEST(ReadFileToStringTest, MissingFileIsNotFoundNamingThePath) {
  TempDir dir;
  absl::StatusOr<std::string> read = ReadFileToString(dir.Join("nope.json"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(dir.Join("nope.json")));
  EXPECT_THAT(read.status().message(), HasSubstr("No such file or directory"));
}

TEST(ReadFileToStringTest, DirectoryAndFifoAreNotRegularFiles) {
  TempDir dir;
  absl::StatusOr<std::string> read = ReadFileToString(dir.path());
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("not a regular file"));
  // A FIFO without a writer would block a plain open forever.
  ASSERT_EQ(::mkfifo(dir.Join("fifo").c_str(), 0600), 0);
  read = ReadFileToString(dir.Join("fifo"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(dir.Join("fifo")));
}

TEST(ReadFileToStringTest, SizeCapIsEnforced) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("f"), std::string(100, 'x')).ok());
  EXPECT_TRUE(ReadFileToString(dir.Join("f"), 100).ok());
  absl::StatusOr<std::string> read = ReadFileToString(dir.Join("f"), 99);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(dir.Join("f")));
  EXPECT_THAT(read.status().message(), HasSubstr("limit of 99"));
}

TEST(OpenRegularFileTest, ReportsSize) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("f"), "12345").ok());
  absl::StatusOr<RegularFile> file = OpenRegularFile(dir.Join("f"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->fd.valid());
  EXPECT_EQ(file->size_bytes, 5u);
  EXPECT_EQ(file->fd.Close(), 0);
  EXPECT_FALSE(file->fd.valid());
}

// ---------------------------------------------------------------------------
// Atomic writes

TEST(WriteFileAtomicallyTest, CreatesAndReplacesLeavingNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir.Join("config.json");
  ASSERT_TRUE(WriteFileAtomically(path, "first, and longer").ok());
  EXPECT_EQ(Slurp(path), "first, and longer");
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(Slurp(path), "second");
  EXPECT_THAT(dir.Entries(), ElementsAre("config.json"));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(WriteFileAtomicallyTest, PiecesAreWrittenBackToBack) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("f"), {"ab", "", "cde"}).ok());
  EXPECT_EQ(Slurp(dir.Join("f")), "abcde");
  ASSERT_TRUE(
      WriteFileAtomically(dir.Join("g"), std::vector<absl::string_view>{})
          .ok());
  EXPECT_EQ(Slurp(dir.Join("g")), "");
}

TEST(WriteFileAtomicallyTest, RelativePathUsesTheCurrentDirectory) {
  TempDir dir;
  const fs::path saved = fs::current_path();
  fs::current_path(dir.path());
  const absl::Status status = WriteFileAtomically("rel.txt", "x");
  fs::current_path(saved);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Slurp(dir.Join("rel.txt")), "x");
}

TEST(WriteFileAtomicallyTest, MissingDirectoryIsNotFoundNamingThePath) {
  TempDir dir;
  const std::string path = dir.Join("no/such/dir/x.json");
  const absl::Status status = WriteFileAtomically(path, "x");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("cannot write " + path));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
  EXPECT_TRUE(dir.Entries().empty());
}

TEST(WriteFileAtomicallyTest, FailedRenameRemovesTheTemporaryFile) {
  TempDir dir;
  // A non-empty directory where the file should go: everything up to the
  // rename succeeds, the rename fails.
  const std::string path = dir.Join("model.safetensors");
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(path + "/keep", "k").ok());
  const absl::Status status = WriteFileAtomically(path, "new contents");
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot write " + path));
  EXPECT_THAT(status.message(), HasSubstr("rename"));
  EXPECT_THAT(dir.Entries(), ElementsAre("model.safetensors"));
  EXPECT_EQ(Slurp(path + "/keep"), "k");
}

TEST(WriteFileAtomicallyTest, FailedWriteKeepsTheOldFileAndNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir.Join("state.safetensors");
  ASSERT_TRUE(WriteFileAtomically(path, "old state").ok());
  absl::Status status;
  {
    FileSizeLimit limit(4096);
    ASSERT_TRUE(limit.ok());
    status = WriteFileAtomically(
        path, {std::string(3000, 'a'), std::string(3000, 'b')});
  }
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("cannot write " + path));
  EXPECT_THAT(status.message(), HasSubstr("File too large"));
  EXPECT_EQ(Slurp(path), "old state");
  EXPECT_THAT(dir.Entries(), ElementsAre("state.safetensors"));
}

TEST(WriteFileAtomicallyTest, ConcurrentWritersOfOnePathNeverMix) {
  TempDir dir;
  const std::string path = dir.Join("report.json");
  const std::string a(50000, 'a'), b(70000, 'b');
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(4);
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 10 && results[w].ok(); ++i) {
        results[w] = WriteFileAtomically(path, w % 2 ? a : b);
      }
    });
  }
  for (std::thread& t : writers) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(Slurp(path), AnyOf(a, b));
  EXPECT_THAT(dir.Entries(), ElementsAre("report.json"));
}

// ---------------------------------------------------------------------------
// Directories and appends

TEST(MakeDirsTest, CreatesMissingParentsAndIsIdempotent) {
  TempDir dir;
  const std::string nested = dir.Join("a/b/c");
  ASSERT_TRUE(MakeDirs(nested).ok());
  ASSERT_TRUE(MakeDirs(nested).ok());
  ASSERT_TRUE(MakeDirs(nested + "/").ok());
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(MakeDirs("").ok());
}

TEST(MakeDirsTest, AFileInTheWayIsAnErrorNamingIt) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("file"), "x").ok());
  absl::Status status = MakeDirs(dir.Join("file"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(dir.Join("file")));
  status = MakeDirs(dir.Join("file/sub"));
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(dir.Join("file/sub")));
  EXPECT_THAT(status.message(), HasSubstr("Not a directory"));
}

TEST(AppendToFileTest, CreatesThenAppends) {
  TempDir dir;
  const std::string path = dir.Join("log.jsonl");
  ASSERT_TRUE(AppendToFile(path, "{\"step\": 1}\n").ok());
  ASSERT_TRUE(AppendToFile(path, "{\"step\": 2}\n").ok());
  EXPECT_EQ(Slurp(path), "{\"step\": 1}\n{\"step\": 2}\n");
  const absl::Status status = AppendToFile(dir.Join("no/log"), "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(dir.Join("no/log")));
}

TEST(PathExistsTest, FilesAndDirectories) {
  TempDir dir;
  EXPECT_TRUE(PathExists(dir.path()));
  EXPECT_FALSE(PathExists(dir.Join("x")));
  ASSERT_TRUE(WriteFileAtomically(dir.Join("x"), "").ok());
  EXPECT_TRUE(PathExists(dir.Join("x")));
}

}  // namespace
}  // namespace dedit
