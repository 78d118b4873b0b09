#include "common/base/safetensors.h"

#include <errno.h>
#include <sys/mman.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/bounded_json.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace dedit {
namespace {

using Json = nlohmann::json;

// A header this large is either corrupt or hostile; real headers are a few
// hundred KB even for models with tens of thousands of tensors. (The
// reference implementation caps at 100 MB too.)
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// Parsing a header into a JSON document costs many times its size in memory,
// so the header must also be small next to the data it describes: at most
// this much plus the size of the data section. A real checkpoint's header is
// a tiny fraction of its data; a small test file fits in the slack.
constexpr uint64_t kHeaderSlackBytes = 1u << 20;
// Containers in a header: the top object, a tensor entry (or __metadata__),
// and a shape or data_offsets array. Anything deeper is malformed, so it is
// refused while parsing rather than built and walked.
constexpr int kMaxHeaderDepth = 3;
// The index file is JSON too and gets the same sanity cap.
constexpr uint64_t kMaxIndexBytes = 100u << 20;

constexpr char kIndexFileName[] = "model.safetensors.index.json";
constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  // Only reachable with an out-of-range enum value cast from an integer.
  return kDTypes[0];
}

// Element count of `shape`, or nullopt when a dimension is negative or the
// product does not fit in int64 (a hostile header can ask for 2^40 x 2^40).
std::optional<int64_t> CheckedNumel(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(numel, dim, &numel)) return std::nullopt;
  }
  return numel;
}

// numel * dtype size in bytes, or nullopt on overflow.
std::optional<uint64_t> CheckedNbytes(int64_t numel, DType dtype) {
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel),
                             static_cast<uint64_t>(DTypeSize(dtype)),
                             &nbytes)) {
    return std::nullopt;
  }
  return nbytes;
}

uint64_t ReadLittleEndian64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return out;
}

// Reads a JSON integer that must be >= 0. The JSON parser stores
// non-negative integers as unsigned and negative ones as signed; floats and
// other types are rejected. get_ptr never throws.
enum class IntResult { kOk, kNotInteger, kNegative };
IntResult ReadNonNegative(const Json& j, uint64_t* out) {
  if (const auto* u = j.get_ptr<const Json::number_unsigned_t*>()) {
    *out = *u;
    return IntResult::kOk;
  }
  if (const auto* i = j.get_ptr<const Json::number_integer_t*>()) {
    if (*i < 0) return IntResult::kNegative;
    *out = static_cast<uint64_t>(*i);
    return IntResult::kOk;
  }
  return IntResult::kNotInteger;
}

// Serialises `json`. dump() throws on strings that are not valid UTF-8
// (tensor names and metadata come from callers), so that one exception is
// turned into a status here.
absl::StatusOr<std::string> DumpJson(const Json& json) {
  try {
    return json.dump();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serialise safetensors header (tensor names and "
                     "metadata must be valid UTF-8): ",
                     e.what()));
  }
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

// Shard names in the index come from the (untrusted) checkpoint; only plain
// file names inside the model folder are accepted, never paths.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// The serialised header of `tensors` (already sorted by name and validated):
// 8-byte length prefix plus space-padded JSON.
absl::StatusOr<std::string> BuildHeader(
    const std::vector<const TensorToWrite*>& tensors,
    const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  for (const TensorToWrite* t : tensors) {
    const uint64_t end = offset + t->bytes.size();
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  ASSIGN_OR_RETURN(std::string text, DumpJson(header));
  // Pad with spaces (valid JSON whitespace) so that the data section starts
  // 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return absl::StrCat(LittleEndian64(text.size()), text);
}

// Validates `tensors` for writing and returns them sorted by name.
absl::StatusOr<std::vector<const TensorToWrite*>> SortAndValidate(
    const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor name '", t.name, "'"));
    }
    const std::optional<int64_t> numel = CheckedNumel(t.shape);
    if (!numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': invalid shape ",
                       ShapeToString(t.shape), " (negative or overflowing)"));
    }
    const std::optional<uint64_t> nbytes = CheckedNbytes(*numel, t.dtype);
    if (!nbytes || *nbytes != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': shape/size mismatch: ", DTypeName(t.dtype),
          ShapeToString(t.shape), " needs ", nbytes ? *nbytes : 0,
          " bytes but ", t.bytes.size(), " were given"));
    }
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) {
              return a->name < b->name;
            });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->name == sorted[i]->name) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name '", sorted[i]->name, "'"));
    }
  }
  return sorted;
}

absl::Status WriteSorted(const std::string& path,
                         const std::vector<const TensorToWrite*>& sorted,
                         const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::string header, BuildHeader(sorted, metadata));
  // Stream the tensor bytes instead of concatenating them, so that writing a
  // checkpoint does not need a second copy of it in memory.
  std::vector<absl::string_view> pieces;
  pieces.reserve(sorted.size() + 1);
  pieces.push_back(header);
  for (const TensorToWrite* t : sorted) pieces.push_back(t->bytes);
  return WriteFileAtomically(path, pieces);
}

// A tensor's "shape" array (already checked to be an array): non-negative
// dimensions that fit int64. The message names what is wrong, for the
// caller to prefix with the tensor.
absl::StatusOr<std::vector<int64_t>> ParseShape(const Json& shape_json) {
  std::vector<int64_t> shape;
  shape.reserve(shape_json.size());
  for (const Json& dim_json : shape_json) {
    uint64_t dim = 0;
    switch (ReadNonNegative(dim_json, &dim)) {
      case IntResult::kNotInteger:
        // Name the type only: dumping an untrusted (possibly deeply
        // nested) value would recurse.
        return absl::InvalidArgumentError(absl::StrCat(
            "shape entry is not an integer (got ", dim_json.type_name(), ")"));
      case IntResult::kNegative:
        return absl::InvalidArgumentError(absl::StrCat(
            "shape has a negative dimension ", dim_json.get<int64_t>()));
      case IntResult::kOk:
        break;
    }
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape dimension ", dim, " overflows int64"));
    }
    shape.push_back(static_cast<int64_t>(dim));
  }
  return shape;
}

}  // namespace

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::vector<absl::string_view> known;
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
    known.push_back(info.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "' (supported: ", absl::StrJoin(known, ", "), ")"));
}

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t TensorView::numel() const {
  // Views produced by the parser always have a valid shape; -1 flags a
  // hand-built view with a negative or overflowing shape instead of UB.
  return CheckedNumel(shape).value_or(-1);
}

// ---------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(RegularFile regular, OpenRegularFile(path));
  if (regular.size_bytes > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": too large to map (", regular.size_bytes, " bytes)"));
  }
  const size_t size = static_cast<size_t>(regular.size_bytes);
  // mmap rejects zero-length mappings, and such a file is malformed anyway.
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is empty, not a safetensors file"));
  }
  void* mapping =
      ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, regular.fd.get(), 0);
  const int mmap_errno = errno;
  regular.fd.Close();  // The mapping keeps the file alive.
  if (mapping == MAP_FAILED) {
    return ErrnoToStatus(mmap_errno, absl::StrCat("cannot mmap ", path));
  }
  // Owned from here on, so the destructor unmaps on every error path too.
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_name_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  RETURN_IF_ERROR(
      file->ParseHeader(static_cast<const uint8_t*>(mapping), size));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    const uint8_t* bytes, size_t size, std::string source_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_name_ = std::move(source_name);
  RETURN_IF_ERROR(file->ParseHeader(bytes, size));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::Status SafetensorsFile::ParseHeader(const uint8_t* bytes, size_t size) {
  const std::string& src = source_name_;
  auto error = [&src](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": ", parts...));
  };

  if (bytes == nullptr || size < 8) {
    return error("file is too short (", size,
                 " bytes) to hold the 8-byte header length");
  }
  const uint64_t header_len = ReadLittleEndian64(bytes);
  if (header_len > kMaxHeaderBytes) {
    return error("header length ", header_len, " exceeds the limit of ",
                 kMaxHeaderBytes, " bytes");
  }
  if (header_len > size - 8) {
    return error("header length ", header_len, " exceeds the ", size - 8,
                 " bytes that follow it (truncated file?)");
  }
  if (header_len > kHeaderSlackBytes + (size - 8 - header_len)) {
    return error("header length ", header_len, " is out of proportion to the ",
                 size - 8 - header_len, " bytes of tensor data (at most ",
                 kHeaderSlackBytes, " + the data size)");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  absl::StatusOr<Json> header =
      ParseBoundedJson(absl::string_view(header_begin, header_len),
                       absl::StrCat(src, ": header"), kMaxHeaderDepth);
  if (!header.ok()) return header.status();
  if (!header->is_object()) return error("header JSON is not an object");

  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;

  for (const auto& item : header->items()) {
    // Plain references rather than structured bindings: the lambdas below
    // capture them.
    const std::string& name = item.key();
    const Json& entry = item.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) return error("__metadata__ is not an object");
      for (const auto& meta : entry.items()) {
        const auto* str = meta.value().get_ptr<const std::string*>();
        if (str == nullptr) {
          return error("__metadata__ value for '", meta.key(),
                       "' is not a string");
        }
        metadata_[meta.key()] = *str;
      }
      continue;
    }
    auto tensor_error = [&](auto&&... parts) {
      return error("tensor '", name, "': ", parts...);
    };
    if (!entry.is_object()) return tensor_error("entry is not an object");

    // dtype
    auto it = entry.find("dtype");
    if (it == entry.end()) return tensor_error("missing dtype");
    const auto* dtype_name = it->get_ptr<const std::string*>();
    if (dtype_name == nullptr) return tensor_error("dtype is not a string");
    absl::StatusOr<DType> dtype = ParseDType(*dtype_name);
    if (!dtype.ok()) return tensor_error(dtype.status().message());

    // shape
    it = entry.find("shape");
    if (it == entry.end()) return tensor_error("missing shape");
    if (!it->is_array()) return tensor_error("shape is not an array");
    absl::StatusOr<std::vector<int64_t>> parsed_shape = ParseShape(*it);
    if (!parsed_shape.ok())
      return tensor_error(parsed_shape.status().message());
    std::vector<int64_t> shape = std::move(*parsed_shape);
    const std::optional<int64_t> numel = CheckedNumel(shape);
    if (!numel) {
      return tensor_error("element count of shape ", ShapeToString(shape),
                          " overflows int64");
    }
    const std::optional<uint64_t> expected_bytes =
        CheckedNbytes(*numel, *dtype);
    if (!expected_bytes) {
      return tensor_error("byte size of ", *dtype_name, ShapeToString(shape),
                          " overflows");
    }

    // data_offsets
    it = entry.find("data_offsets");
    if (it == entry.end()) return tensor_error("missing data_offsets");
    if (!it->is_array() || it->size() != 2) {
      return tensor_error("data_offsets is not a [begin, end] array");
    }
    uint64_t begin = 0, end = 0;
    if (ReadNonNegative((*it)[0], &begin) != IntResult::kOk ||
        ReadNonNegative((*it)[1], &end) != IntResult::kOk) {
      return tensor_error("data_offsets are not non-negative integers");
    }
    if (begin > end) {
      return tensor_error("data_offsets begin ", begin, " > end ", end);
    }
    if (end > data_size) {
      return tensor_error("data_offsets end ", end,
                          " is beyond the data section of ", data_size,
                          " bytes (truncated file?)");
    }
    if (end - begin != *expected_bytes) {
      return tensor_error("shape/size mismatch: ", *dtype_name,
                          ShapeToString(shape), " needs ", *expected_bytes,
                          " bytes but data_offsets span ", end - begin);
    }

    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    view.shape = std::move(shape);
    view.data = data + begin;
    view.nbytes = static_cast<size_t>(end - begin);
    auto [pos, inserted] = tensors_.emplace(name, std::move(view));
    (void)inserted;  // JSON object keys are unique already.
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (begin != end) ranges.push_back({begin, end, &pos->first});
  }

  // Tensors must not share bytes: a crafted file could otherwise alias one
  // weight with another and make in-place conversions corrupt both.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return error("tensors '", *ranges[i - 1].name, "' and '", *ranges[i].name,
                   "' overlap in the data section");
    }
  }
  return absl::OkStatus();
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------
// WeightArchive

absl::StatusOr<std::unique_ptr<WeightArchive>> WeightArchive::OpenDirectory(
    const std::string& dir) {
  const std::string index_path = JoinPath(dir, kIndexFileName);
  const std::string single_path = JoinPath(dir, kSingleFileName);

  std::vector<std::unique_ptr<SafetensorsFile>> files;
  if (PathExists(index_path)) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFileToString(index_path, kMaxIndexBytes));
    ASSIGN_OR_RETURN(Json index_doc, ParseBoundedJson(text, index_path));
    const Json* index = &index_doc;
    if (!index->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": not a JSON object"));
    }
    auto map_it = index->find("weight_map");
    if (map_it == index->end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": missing weight_map object"));
    }

    // Open every distinct shard once, in name order.
    std::map<std::string, SafetensorsFile*> shards;
    for (const auto& item : map_it->items()) {
      const auto* file_name = item.value().get_ptr<const std::string*>();
      if (file_name == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry for '", item.key(),
                         "' is not a string"));
      }
      if (!IsPlainFileName(*file_name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry for '", item.key(),
                         "' names '", *file_name,
                         "', which is not a plain file name in the model "
                         "directory (path traversal?)"));
      }
      shards.emplace(*file_name, nullptr);
    }
    for (auto& [file_name, shard] : shards) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                       SafetensorsFile::Open(JoinPath(dir, file_name)));
      shard = file.get();
      files.push_back(std::move(file));
    }
    // Catch a stale or mismatched index at load time rather than when the
    // model first asks for the missing weight.
    for (const auto& item : map_it->items()) {
      const std::string& file_name =
          *item.value().get_ptr<const std::string*>();
      if (shards[file_name]->Find(item.key()) == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            index_path, ": tensor '", item.key(), "' is mapped to shard ",
            file_name, " but that shard does not contain it"));
      }
    }
  } else if (PathExists(single_path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open(single_path));
    files.push_back(std::move(file));
  } else {
    return absl::NotFoundError(absl::StrCat("no ", kIndexFileName, " or ",
                                            kSingleFileName, " in ", dir));
  }

  ASSIGN_OR_RETURN(std::unique_ptr<WeightArchive> archive,
                   FromFiles(std::move(files)));
  archive->source_ = dir;
  return archive;
}

absl::StatusOr<std::unique_ptr<WeightArchive>> WeightArchive::FromFiles(
    std::vector<std::unique_ptr<SafetensorsFile>> files) {
  std::unique_ptr<WeightArchive> archive(new WeightArchive());
  // Which file each tensor came from, for the duplicate error message.
  std::map<absl::string_view, const std::string*> owner;
  std::vector<std::string> sources;
  for (const std::unique_ptr<SafetensorsFile>& file : files) {
    if (file == nullptr) {
      return absl::InvalidArgumentError("WeightArchive::FromFiles: null file");
    }
    sources.push_back(file->source_name());
    for (const std::string& name : file->TensorNames()) {
      const TensorView* view = file->Find(name);
      auto [it, inserted] = archive->index_.emplace(name, view);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' appears in both ",
                         *owner[it->first], " and ", file->source_name()));
      }
      owner[it->first] = &file->source_name();
    }
  }
  archive->source_ = absl::StrJoin(sources, ", ");
  archive->files_ = std::move(files);
  return archive;
}

absl::StatusOr<TensorView> WeightArchive::Get(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", name, "' not found in ", source_));
  }
  return *it->second;
}

bool WeightArchive::Contains(absl::string_view name) const {
  return index_.find(name) != index_.end();
}

std::vector<std::string> WeightArchive::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------
// Writing

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::vector<const TensorToWrite*> sorted,
                   SortAndValidate(tensors));
  ASSIGN_OR_RETURN(std::string out, BuildHeader(sorted, metadata));
  size_t total = out.size();
  for (const TensorToWrite* t : sorted) total += t->bytes.size();
  out.reserve(total);
  for (const TensorToWrite* t : sorted) out += t->bytes;
  return out;
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::vector<const TensorToWrite*> sorted,
                   SortAndValidate(tensors));
  return WriteSorted(path, sorted, metadata);
}

absl::Status WriteShardedSafetensors(const std::string& dir,
                                     const std::vector<TensorToWrite>& tensors,
                                     size_t max_shard_bytes) {
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError("max_shard_bytes must be positive");
  }
  ASSIGN_OR_RETURN(std::vector<const TensorToWrite*> sorted,
                   SortAndValidate(tensors));

  // Greedy packing in name order: start a new shard when the next tensor
  // would overflow the current one. A tensor larger than the limit gets a
  // shard of its own. There is always at least one shard.
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  size_t shard_bytes = 0;
  uint64_t total_size = 0;
  for (const TensorToWrite* t : sorted) {
    if (!shards.back().empty() &&
        shard_bytes + t->bytes.size() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += t->bytes.size();
    total_size += t->bytes.size();
  }

  RETURN_IF_ERROR(MakeDirs(dir));
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file_name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteSorted(JoinPath(dir, file_name), shards[i], {}));
    for (const TensorToWrite* t : shards[i]) weight_map[t->name] = file_name;
  }
  Json index = Json::object();
  index["metadata"]["total_size"] = total_size;
  index["weight_map"] = std::move(weight_map);
  ASSIGN_OR_RETURN(std::string text, DumpJson(index));
  text += '\n';
  return WriteFileAtomically(JoinPath(dir, kIndexFileName), text);
}

}  // namespace dedit
