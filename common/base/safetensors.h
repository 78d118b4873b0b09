// Reading and writing the safetensors format (torch-free).
//
// Layout: [u64 little-endian header length N][N bytes of JSON][data]. Each
// JSON entry is {"dtype", "shape", "data_offsets": [begin, end]} relative to
// the data section; "__metadata__" maps strings to strings.
//
// Files are memory-mapped; TensorView points into the mapping and stays valid
// as long as the SafetensorsFile (or the WeightArchive holding it) lives.
// Every malformed input is reported as an error Status, never a crash:
// truncated files, headers longer than the file, offsets out of range or
// overlapping, unknown dtypes, shape/size mismatches.
//
//   ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
//   ASSIGN_OR_RETURN(TensorView w, archive->Get("model.norm.weight"));
#ifndef DEDIT_BASE_SAFETENSORS_H_
#define DEDIT_BASE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dedit {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ... as written in safetensors headers.
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);
size_t DTypeSize(DType dtype);

// "[a, b, c]", as shape errors print it.
std::string ShapeToString(const std::vector<int64_t>& shape);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // Not owned; may be unaligned.
  size_t nbytes = 0;

  int64_t numel() const;
};

// One parsed safetensors file (mmap-backed, or over caller-owned bytes).
class SafetensorsFile {
 public:
  // Maps `path` read-only and parses its header.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  // Parses `bytes`, which must outlive the returned object. `source_name`
  // only appears in error messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(
      const uint8_t* bytes, size_t size, std::string source_name);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr when absent.
  const TensorView* Find(absl::string_view name) const;
  std::vector<std::string> TensorNames() const;  // sorted
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  const std::string& source_name() const { return source_name_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(const uint8_t* bytes, size_t size);

  std::string source_name_;
  void* mapping_ = nullptr;  // munmap'ed in the destructor when set.
  size_t mapping_size_ = 0;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All weights of a model folder: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` (weight_map: tensor -> file). A tensor the
// index names but its shard lacks is an error at open time.
class WeightArchive {
 public:
  static absl::StatusOr<std::unique_ptr<WeightArchive>> OpenDirectory(
      const std::string& dir);
  // Builds an archive from already-open files (tests, single files).
  static absl::StatusOr<std::unique_ptr<WeightArchive>> FromFiles(
      std::vector<std::unique_ptr<SafetensorsFile>> files);

  // NOT_FOUND naming the tensor when absent.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  bool Contains(absl::string_view name) const;
  std::vector<std::string> TensorNames() const;  // sorted

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;
  std::string source_;  // The directory or the file names, for errors.
};

// A tensor to write: raw little-endian bytes of `dtype` with `shape`.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Serialises tensors (sorted by name, 8-byte aligned header) to bytes.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});
// Replaces `path` crash-safely (WriteFileAtomically, common/base/file_util.h):
// a reader or a crash sees the old file or the whole new one, never a mix.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});
// Writes `tensors` as shards of at most `max_shard_bytes` plus
// model.safetensors.index.json into `dir` (created when missing). Each file
// is replaced atomically, the index last, so a crash midway leaves the old
// index naming shards that may already hold new contents: rewrite a sharded
// checkpoint into a fresh directory when that matters.
absl::Status WriteShardedSafetensors(const std::string& dir,
                                     const std::vector<TensorToWrite>& tensors,
                                     size_t max_shard_bytes);

}  // namespace dedit

#endif  // DEDIT_BASE_SAFETENSORS_H_
