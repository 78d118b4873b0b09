// Fuzzes WeightArchive::OpenDirectory through model.safetensors.index.json:
// the input is the index, next to two valid shards written once per
// process. Invariant for an accepted folder: every tensor the archive lists
// can be fetched, and nothing outside the folder was opened (shard names are
// plain file names).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/base/file_util.h"
#include "common/base/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::string MakeFolder() {
  char tmpl[] = "/tmp/dedit_fuzz_index_XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  using dedit::DType;
  FUZZ_CHECK(dedit::WriteSafetensors(dir + "/a.safetensors",
                                     {{"x", DType::kU8, {2}, "ab"},
                                      {"y", DType::kF32, {1}, "abcd"}})
                 .ok());
  FUZZ_CHECK(dedit::WriteSafetensors(dir + "/b.safetensors",
                                     {{"z", DType::kU8, {}, "c"}})
                 .ok());
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = MakeFolder();
  const std::string index = dir + "/model.safetensors.index.json";
  // A plain write: WriteFileAtomically's fsyncs would dominate the run.
  dedit::FileDescriptor fd(::creat(index.c_str(), 0600));
  FUZZ_CHECK(fd.valid());
  FUZZ_CHECK(::write(fd.get(), data, size) == static_cast<ssize_t>(size));
  FUZZ_CHECK(fd.Close() == 0);
  auto archive = dedit::WeightArchive::OpenDirectory(dir);
  if (!archive.ok()) return 0;
  for (const std::string& name : (*archive)->TensorNames()) {
    auto view = (*archive)->Get(name);
    FUZZ_CHECK(view.ok());
    FUZZ_CHECK(name == "x" || name == "y" || name == "z");
  }
  return 0;
}
