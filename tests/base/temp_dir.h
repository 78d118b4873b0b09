// A fresh directory under /tmp for one test, removed with its contents at
// scope exit; shared by the parser and file tests.
#ifndef DEDIT_TESTS_BASE_TEMP_DIR_H_
#define DEDIT_TESTS_BASE_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace dedit::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dedit_test_XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    if (dir != nullptr) path_ = dir;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

  // Names of the entries in the directory, so a test can see that no
  // temporary file was left behind.
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

 private:
  std::string path_;
};

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_BASE_TEMP_DIR_H_
