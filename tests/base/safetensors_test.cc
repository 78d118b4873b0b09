#include "common/base/safetensors.h"

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/base/temp_dir.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

using testing::TempDir;

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

// Raw file bytes: length prefix + `header` + `data`, with no validation, so
// that malformed files can be built by hand.
std::string RawFile(const std::string& header, const std::string& data = "") {
  return LittleEndian64(header.size()) + header + data;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Parses a private copy of `content` sized exactly, so that AddressSanitizer
// flags any read past the end. The copy is kept alive in `storage`.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> ParseCopy(
    const std::string& content, std::vector<uint8_t>* storage) {
  storage->assign(content.begin(), content.end());
  return SafetensorsFile::Parse(storage->data(), storage->size(), "test.st");
}

absl::Status ParseStatus(const std::string& content) {
  std::vector<uint8_t> storage;
  return ParseCopy(content, &storage).status();
}

uint64_t HeaderLength(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  return n;
}

// Deterministic, distinct bytes for a tensor; for BOOL only 0/1.
std::string PatternBytes(DType dtype, int64_t numel, int seed) {
  std::string bytes(static_cast<size_t>(numel) * DTypeSize(dtype), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = dtype == DType::kBool ? static_cast<char>((i + seed) % 2)
                                     : static_cast<char>(i * 7 + seed * 13);
  }
  return bytes;
}

TensorToWrite MakeTensor(const std::string& name, DType dtype,
                         std::vector<int64_t> shape, int seed = 1) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes = PatternBytes(dtype, numel, seed);
  return t;
}

std::string ViewBytes(const TensorView& view) {
  return std::string(reinterpret_cast<const char*>(view.data), view.nbytes);
}

void ExpectMatches(const TensorView* view, const TensorToWrite& t) {
  ASSERT_NE(view, nullptr) << t.name;
  EXPECT_EQ(view->name, t.name);
  EXPECT_EQ(view->dtype, t.dtype);
  EXPECT_EQ(view->shape, t.shape);
  EXPECT_EQ(view->nbytes, t.bytes.size());
  EXPECT_EQ(ViewBytes(*view), t.bytes);
}

// A small valid file used by the truncation and mutation tests.
std::string SmallValidFile() {
  std::vector<TensorToWrite> tensors = {
      MakeTensor("a", DType::kF32, {2, 3}),
      MakeTensor("b.weight", DType::kBF16, {4}),
      MakeTensor("c", DType::kU8, {3}, 2),
      MakeTensor("empty", DType::kI64, {0, 2}),
  };
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors(tensors, {{"format", "pt"}});
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or("");
}

// ---------------------------------------------------------------------------
// dtypes

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  const std::map<DType, std::pair<std::string, size_t>> expected = {
      {DType::kF64, {"F64", 8}}, {DType::kF32, {"F32", 4}},
      {DType::kF16, {"F16", 2}}, {DType::kBF16, {"BF16", 2}},
      {DType::kI64, {"I64", 8}}, {DType::kI32, {"I32", 4}},
      {DType::kI16, {"I16", 2}}, {DType::kI8, {"I8", 1}},
      {DType::kU8, {"U8", 1}},   {DType::kBool, {"BOOL", 1}},
  };
  for (const auto& [dtype, name_size] : expected) {
    EXPECT_EQ(DTypeName(dtype), name_size.first);
    EXPECT_EQ(DTypeSize(dtype), name_size.second);
    absl::StatusOr<DType> parsed = ParseDType(name_size.first);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DTypeTest, UnknownNameIsAnError) {
  absl::StatusOr<DType> parsed = ParseDType("F8_E4M3");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("F8_E4M3"));
  EXPECT_FALSE(ParseDType("f32").ok());  // Case matters.
  EXPECT_FALSE(ParseDType("").ok());
}

TEST(TensorViewTest, Numel) {
  TensorView view;
  EXPECT_EQ(view.numel(), 1);  // Scalar.
  view.shape = {2, 3, 4};
  EXPECT_EQ(view.numel(), 24);
  view.shape = {5, 0};
  EXPECT_EQ(view.numel(), 0);
  view.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(view.numel(), -1);  // Overflow is flagged, not UB.
}

// ---------------------------------------------------------------------------
// Round trips

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, SerializeThenParse) {
  const DType dtype = GetParam();
  std::vector<TensorToWrite> tensors = {
      MakeTensor("w", dtype, {2, 3}, 1),
      MakeTensor("scalar", dtype, {}, 2),
      MakeTensor("v", dtype, {5}, 3),
  };
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<uint8_t> storage;
  auto file = ParseCopy(*bytes, &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->TensorNames(), ElementsAre("scalar", "v", "w"));
  for (const TensorToWrite& t : tensors)
    ExpectMatches((*file)->Find(t.name), t);
  EXPECT_EQ((*file)->Find("w")->numel(), 6);
  EXPECT_EQ((*file)->Find("scalar")->numel(), 1);
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST_P(RoundTripTest, WriteThenOpen) {
  const DType dtype = GetParam();
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::vector<TensorToWrite> tensors = {
      MakeTensor("layers.0.weight", dtype, {4, 2}, 4),
      MakeTensor("layers.0.bias", dtype, {4}, 5),
  };
  const std::string path = dir.Join("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->source_name(), path);
  for (const TensorToWrite& t : tensors)
    ExpectMatches((*file)->Find(t.name), t);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RoundTripTest,
                         ::testing::Values(DType::kF64, DType::kF32,
                                           DType::kF16, DType::kBF16,
                                           DType::kI64, DType::kI32,
                                           DType::kI16, DType::kI8, DType::kU8,
                                           DType::kBool),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(SafetensorsWriteTest, MetadataRoundTrip) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "quotes \" and \\ and ünïcode"}, {"", ""}};
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({MakeTensor("t", DType::kF32, {1})}, metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<uint8_t> storage;
  auto file = ParseCopy(*bytes, &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), metadata);
  EXPECT_THAT((*file)->TensorNames(), ElementsAre("t"));
}

TEST(SafetensorsWriteTest, NoMetadataKeyWhenEmpty) {
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({MakeTensor("t", DType::kF32, {1})});
  ASSERT_TRUE(bytes.ok());
  EXPECT_THAT(*bytes, ::testing::Not(HasSubstr("__metadata__")));
}

TEST(SafetensorsWriteTest, HeaderIsPaddedToEightBytes) {
  // Vary the name length so that every residue of the JSON length occurs.
  for (int len = 1; len <= 24; ++len) {
    SCOPED_TRACE(len);
    absl::StatusOr<std::string> bytes = SerializeSafetensors(
        {MakeTensor(std::string(len, 'n'), DType::kF16, {3})});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const uint64_t n = HeaderLength(*bytes);
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(bytes->size(), 8 + n + 6);
    // Padding is trailing spaces after the closing brace.
    const std::string header = bytes->substr(8, n);
    EXPECT_EQ(header.front(), '{');
    EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
    std::vector<uint8_t> storage;
    EXPECT_TRUE(ParseCopy(*bytes, &storage).ok());
  }
}

TEST(SafetensorsWriteTest, DataLaidOutInNameOrder) {
  std::vector<TensorToWrite> tensors = {MakeTensor("z", DType::kU8, {2}, 1),
                                        MakeTensor("a", DType::kU8, {3}, 2),
                                        MakeTensor("m", DType::kU8, {1}, 3)};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok());
  const std::string data = bytes->substr(8 + HeaderLength(*bytes));
  EXPECT_EQ(data, tensors[1].bytes + tensors[2].bytes + tensors[0].bytes);
  const std::string header = bytes->substr(8, HeaderLength(*bytes));
  EXPECT_LT(header.find("\"a\""), header.find("\"m\""));
  EXPECT_LT(header.find("\"m\""), header.find("\"z\""));
}

TEST(SafetensorsWriteTest, ZeroElementTensors) {
  std::vector<TensorToWrite> tensors = {
      MakeTensor("empty_rows", DType::kF32, {0, 4}),
      MakeTensor("empty_cols", DType::kBF16, {3, 0}),
      MakeTensor("full", DType::kF32, {2}),
  };
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<uint8_t> storage;
  auto file = ParseCopy(*bytes, &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const TensorToWrite& t : tensors)
    ExpectMatches((*file)->Find(t.name), t);
  EXPECT_EQ((*file)->Find("empty_rows")->numel(), 0);
  EXPECT_EQ((*file)->Find("empty_cols")->nbytes, 0u);

  // A file whose only tensor is empty has an empty data section.
  absl::StatusOr<std::string> only_empty =
      SerializeSafetensors({MakeTensor("e", DType::kU8, {0})});
  ASSERT_TRUE(only_empty.ok());
  EXPECT_TRUE(ParseStatus(*only_empty).ok());
  // So does a file with no tensors at all.
  absl::StatusOr<std::string> none = SerializeSafetensors({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(ParseStatus(*none).ok());
}

TEST(SafetensorsWriteTest, RejectsInvalidTensors) {
  TensorToWrite bad = MakeTensor("bad", DType::kF32, {2, 2});
  bad.bytes.pop_back();
  absl::StatusOr<std::string> bytes = SerializeSafetensors({bad});
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("shape/size mismatch"));
  EXPECT_THAT(bytes.status().message(), HasSubstr("bad"));

  TensorToWrite negative = MakeTensor("neg", DType::kF32, {1});
  negative.shape = {-1};
  EXPECT_FALSE(SerializeSafetensors({negative}).ok());

  absl::StatusOr<std::string> dup = SerializeSafetensors(
      {MakeTensor("x", DType::kU8, {1}), MakeTensor("x", DType::kU8, {2})});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate"));

  EXPECT_FALSE(
      SerializeSafetensors({MakeTensor("__metadata__", DType::kU8, {1})}).ok());
  EXPECT_FALSE(SerializeSafetensors({MakeTensor("", DType::kU8, {1})}).ok());
  // Invalid UTF-8 cannot be written as JSON; it must be a status, not a throw.
  EXPECT_FALSE(
      SerializeSafetensors({MakeTensor("bad\xff", DType::kU8, {1})}).ok());
  EXPECT_FALSE(
      SerializeSafetensors({MakeTensor("t", DType::kU8, {1})}, {{"k", "\xc3"}})
          .ok());
}

TEST(SafetensorsWriteTest, WriteLeavesNoTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.Join("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {MakeTensor("t", DType::kU8, {4})}).ok());
  // Overwriting an existing file works too.
  ASSERT_TRUE(WriteSafetensors(path, {MakeTensor("t", DType::kU8, {5})}).ok());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("model.safetensors"));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find("t")->nbytes, 5u);
}

TEST(SafetensorsWriteTest, WriteToMissingDirectoryFails) {
  TempDir dir;
  absl::Status status = WriteSafetensors(dir.Join("no/such/dir/x.safetensors"),
                                         {MakeTensor("t", DType::kU8, {1})});
  EXPECT_FALSE(status.ok());
}

// ---------------------------------------------------------------------------
// Opening files

TEST(SafetensorsOpenTest, MissingFileIsNotFound) {
  TempDir dir;
  auto file = SafetensorsFile::Open(dir.Join("nope.safetensors"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("nope.safetensors"));
}

TEST(SafetensorsOpenTest, EmptyFile) {
  TempDir dir;
  const std::string path = dir.Join("empty.safetensors");
  WriteFile(path, "");
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("empty"));
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

TEST(SafetensorsOpenTest, DirectoryIsNotAFile) {
  TempDir dir;
  auto file = SafetensorsFile::Open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("regular file"));
}

TEST(SafetensorsOpenTest, MalformedFileErrorNamesThePath) {
  TempDir dir;
  const std::string path = dir.Join("bad.safetensors");
  WriteFile(path, RawFile("[1, 2]"));
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr("object"));
}

// ---------------------------------------------------------------------------
// Malformed input

struct MalformedCase {
  std::string name;
  std::string content;
  std::string expected_substring;
};

std::string Entry(const std::string& name, const std::string& dtype,
                  const std::string& shape, const std::string& offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype,
                      "\",\"shape\":", shape, ",\"data_offsets\":", offsets,
                      "}");
}

std::vector<MalformedCase> MalformedCases() {
  const std::string data16(16, 'x');
  return {
      {"Empty", "", "too short"},
      {"FiveBytes", "\x01\x02\x03\x04\x05", "too short"},
      {"HeaderLongerThanFile", LittleEndian64(100) + "{}", "header length"},
      {"HeaderLengthTwoTo63", LittleEndian64(uint64_t{1} << 63) + "{}",
       "header length"},
      {"HeaderLengthMax", LittleEndian64(~uint64_t{0}) + "{}", "header length"},
      {"HeaderOverCap", LittleEndian64(200u << 20) + "{}", "limit"},
      {"NotJson", RawFile("{not json"), "JSON"},
      {"EmptyHeader", RawFile(""), "JSON"},
      {"TrailingGarbage", RawFile("{} x"), "JSON"},
      {"InvalidUtf8", RawFile("{\"\xff\":1}"), "JSON"},
      {"JsonArray", RawFile("[1,2]"), "not an object"},
      {"JsonString", RawFile("\"abc\""), "not an object"},
      {"EntryNotObject", RawFile("{\"t\":[1]}"), "entry is not an object"},
      {"MissingDataOffsets",
       RawFile("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", data16),
       "data_offsets"},
      {"MissingDtype",
       RawFile("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", data16),
       "dtype"},
      {"DtypeNotString",
       RawFile("{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
               data16),
       "dtype"},
      {"MissingShape",
       RawFile("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", data16),
       "shape"},
      {"ShapeNotArray",
       RawFile("{" + Entry("t", "F32", "4", "[0,4]") + "}", data16), "shape"},
      {"ShapeFloat",
       RawFile("{" + Entry("t", "F32", "[1.0]", "[0,4]") + "}", data16),
       "integer"},
      // Refused while parsing: a header never nests deeper than 3.
      {"ShapeNested",
       RawFile("{" + Entry("t", "F32", "[[1]]", "[0,4]") + "}", data16),
       "nested deeper"},
      {"UnknownDtype",
       RawFile("{" + Entry("t", "F8_E9", "[1]", "[0,1]") + "}", data16),
       "F8_E9"},
      {"NegativeDim",
       RawFile("{" + Entry("t", "F32", "[-1,4]", "[0,4]") + "}", data16),
       "negative"},
      {"ShapeSizeMismatch",
       RawFile("{" + Entry("t", "F32", "[3]", "[0,8]") + "}", data16),
       "shape/size mismatch"},
      {"EndBeyondFile",
       RawFile("{" + Entry("t", "F32", "[8]", "[0,32]") + "}", data16),
       "beyond"},
      {"HugeEnd",
       RawFile("{" +
                   Entry("t", "U8", "[1]",
                         "[18446744073709551614,18446744073709551615]") +
                   "}",
               data16),
       "beyond"},
      {"BeginAfterEnd",
       RawFile("{" + Entry("t", "F32", "[1]", "[8,4]") + "}", data16), "begin"},
      {"OffsetsWrongArity",
       RawFile("{" + Entry("t", "F32", "[1]", "[0,4,8]") + "}", data16),
       "data_offsets"},
      {"OffsetsNotArray",
       RawFile("{" + Entry("t", "F32", "[1]", "4") + "}", data16),
       "data_offsets"},
      {"NegativeOffset",
       RawFile("{" + Entry("t", "F32", "[1]", "[-4,0]") + "}", data16),
       "non-negative"},
      {"FloatOffset",
       RawFile("{" + Entry("t", "F32", "[1]", "[0.0,4]") + "}", data16),
       "non-negative integers"},
      {"Overlap",
       RawFile("{" + Entry("a", "F32", "[2]", "[0,8]") + "," +
                   Entry("b", "F32", "[2]", "[4,12]") + "}",
               data16),
       "overlap"},
      {"SameRange",
       RawFile("{" + Entry("a", "F32", "[2]", "[0,8]") + "," +
                   Entry("b", "U8", "[8]", "[0,8]") + "}",
               data16),
       "overlap"},
      {"NumelOverflow",
       RawFile("{" +
                   Entry("t", "F32", "[4294967296,4294967296,4294967296]",
                         "[0,4]") +
                   "}",
               data16),
       "overflow"},
      {"DimBeyondInt64",
       RawFile("{" + Entry("t", "U8", "[18446744073709551615]", "[0,4]") + "}",
               data16),
       "overflow"},
      {"ByteSizeOverflow",
       RawFile("{" + Entry("t", "F64", "[4611686018427387904]", "[0,8]") + "}",
               data16),
       "overflow"},
      {"MetadataValueNotString", RawFile("{\"__metadata__\":{\"format\":1}}"),
       "__metadata__"},
      {"MetadataNotObject", RawFile("{\"__metadata__\":\"pt\"}"),
       "__metadata__"},
  };
}

class MalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedTest, IsRejectedWithATellingMessage) {
  const MalformedCase& c = GetParam();
  absl::Status status = ParseStatus(c.content);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(c.expected_substring));
  EXPECT_THAT(status.message(), HasSubstr("test.st"));  // Names the file.
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedTest, ::testing::ValuesIn(MalformedCases()),
    [](const ::testing::TestParamInfo<MalformedCase>& info) {
      return info.param.name;
    });

TEST(SafetensorsParseTest, ErrorsNameTheTensor) {
  absl::Status status = ParseStatus(
      RawFile("{" + Entry("model.norm.weight", "F32", "[3]", "[0,8]") + "}",
              std::string(8, 'x')));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("model.norm.weight"));
}

TEST(SafetensorsParseTest, NullBytesAreAnError) {
  EXPECT_FALSE(SafetensorsFile::Parse(nullptr, 0, "null").ok());
}

TEST(SafetensorsParseTest, EmptyTensorMayShareAnOffset) {
  // Empty tensors occupy no bytes, so they never overlap anything.
  std::vector<uint8_t> storage;
  auto file = ParseCopy(RawFile("{" + Entry("a", "F32", "[2]", "[0,8]") + "," +
                                    Entry("b", "F32", "[0]", "[4,4]") + "}",
                                std::string(8, 'x')),
                        &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find("b")->nbytes, 0u);
}

TEST(SafetensorsParseTest, UnalignedAndUnsortedOffsetsAreAccepted) {
  // Nothing requires alignment or that entries appear in data order.
  std::vector<uint8_t> storage;
  auto file = ParseCopy(RawFile("{" + Entry("b", "U8", "[3]", "[0,3]") + "," +
                                    Entry("a", "I16", "[2]", "[3,7]") + "}",
                                "0123456"),
                        &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(ViewBytes(*(*file)->Find("a")), "3456");
  EXPECT_EQ(ViewBytes(*(*file)->Find("b")), "012");
}

TEST(SafetensorsParseTest, DuplicateKeysKeepTheLast) {
  std::vector<uint8_t> storage;
  auto file = ParseCopy(RawFile("{" + Entry("a", "U8", "[1]", "[0,1]") + "," +
                                    Entry("a", "U8", "[2]", "[1,3]") + "}",
                                "xyz"),
                        &storage);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(ViewBytes(*(*file)->Find("a")), "yz");
}

TEST(SafetensorsParseTest, DeeplyNestedJsonDoesNotCrash) {
  const int depth = 100000;
  std::string nested = std::string(depth, '[') + std::string(depth, ']');
  EXPECT_FALSE(ParseStatus(RawFile(nested)).ok());
  EXPECT_FALSE(
      ParseStatus(RawFile("{" + Entry("t", "U8", nested, "[0,1]") + "}", "x"))
          .ok());
  EXPECT_FALSE(
      ParseStatus(RawFile("{\"__metadata__\":{\"k\":" + nested + "}}")).ok());
}

TEST(SafetensorsParseTest, EveryTruncationIsRejected) {
  const std::string valid = SmallValidFile();
  ASSERT_FALSE(valid.empty());
  ASSERT_TRUE(ParseStatus(valid).ok());
  TempDir dir;
  const std::string path = dir.Join("t.safetensors");
  for (size_t len = 0; len < valid.size(); ++len) {
    SCOPED_TRACE(len);
    const std::string prefix = valid.substr(0, len);
    // The last tensor ends at the end of the file, so every cut breaks it.
    EXPECT_FALSE(ParseStatus(prefix).ok());
    WriteFile(path, prefix);
    EXPECT_FALSE(SafetensorsFile::Open(path).ok());
  }
}

TEST(SafetensorsParseTest, HeaderMutationFuzz) {
  const std::string valid = SmallValidFile();
  ASSERT_FALSE(valid.empty());
  const size_t header_end = 8 + HeaderLength(valid);
  // Bytes that keep the JSON parseable more often than random ones, to get
  // past the parser into the validation code.
  const std::string interesting = "{}[]\",:0123456789-eE. FUIB_";
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string mutated = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % header_end;
      switch (rng() % 3) {
        case 0:
          mutated[pos] = static_cast<char>(mutated[pos] ^ (1u << (rng() % 8)));
          break;
        case 1:
          mutated[pos] = static_cast<char>(rng() & 0xff);
          break;
        default:
          mutated[pos] = interesting[rng() % interesting.size()];
          break;
      }
    }
    std::vector<uint8_t> storage;
    auto file = ParseCopy(mutated, &storage);
    if (!file.ok()) continue;
    ++accepted;
    const uint8_t* begin = storage.data();
    const uint8_t* end = storage.data() + storage.size();
    for (const std::string& name : (*file)->TensorNames()) {
      const TensorView* view = (*file)->Find(name);
      ASSERT_NE(view, nullptr);
      ASSERT_GE(view->data, begin) << "iteration " << iter;
      ASSERT_LE(view->data + view->nbytes, end) << "iteration " << iter;
      ASSERT_EQ(static_cast<uint64_t>(view->numel()) * DTypeSize(view->dtype),
                view->nbytes);
    }
  }
  // Some mutations (e.g. inside padding or metadata) must keep it valid.
  EXPECT_GT(accepted, 0);
}

// ---------------------------------------------------------------------------
// WeightArchive

std::vector<TensorToWrite> ModelTensors() {
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(MakeTensor(absl::StrCat("layers.", i, ".weight"),
                                 DType::kF32, {10}, i));  // 40 bytes each.
  }
  tensors.push_back(MakeTensor("norm.weight", DType::kBF16, {4}, 11));
  return tensors;
}

TEST(WeightArchiveTest, SingleFileDirectory) {
  TempDir dir;
  const std::vector<TensorToWrite> tensors = ModelTensors();
  ASSERT_TRUE(WriteSafetensors(dir.Join("model.safetensors"), tensors).ok());
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ((*archive)->TensorNames().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    EXPECT_TRUE((*archive)->Contains(t.name));
    absl::StatusOr<TensorView> view = (*archive)->Get(t.name);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectMatches(&*view, t);
  }
  absl::StatusOr<TensorView> missing = (*archive)->Get("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.path()));
  EXPECT_FALSE((*archive)->Contains("lm_head.weight"));
}

TEST(WeightArchiveTest, ShardedRoundTrip) {
  TempDir dir;
  const std::string model_dir = dir.Join("nested/model");  // Created.
  const std::vector<TensorToWrite> tensors = ModelTensors();
  ASSERT_TRUE(WriteShardedSafetensors(model_dir, tensors, 100).ok());

  // Ten 40-byte tensors packed into 100-byte shards: two per shard, and the
  // 8-byte norm.weight still fits in the fifth.
  for (int i = 1; i <= 5; ++i) {
    EXPECT_TRUE(fs::exists(
        absl::StrCat(model_dir, "/model-0000", i, "-of-00005.safetensors")))
        << i;
  }
  EXPECT_FALSE(fs::exists(model_dir + "/model-00006-of-00005.safetensors"));
  const std::string index =
      ReadFile(model_dir + "/model.safetensors.index.json");
  EXPECT_THAT(index, HasSubstr("\"total_size\":408"));
  EXPECT_THAT(index, HasSubstr("\"weight_map\""));

  auto archive = WeightArchive::OpenDirectory(model_dir);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ((*archive)->TensorNames().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    absl::StatusOr<TensorView> view = (*archive)->Get(t.name);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectMatches(&*view, t);
  }
}

TEST(WeightArchiveTest, OversizedTensorGetsItsOwnShard) {
  TempDir dir;
  ASSERT_TRUE(WriteShardedSafetensors(dir.path(),
                                      {MakeTensor("a", DType::kU8, {2}),
                                       MakeTensor("b", DType::kU8, {50}),
                                       MakeTensor("c", DType::kU8, {2})},
                                      10)
                  .ok());
  EXPECT_TRUE(fs::exists(dir.Join("model-00003-of-00003.safetensors")));
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_THAT((*archive)->TensorNames(), ElementsAre("a", "b", "c"));
  EXPECT_FALSE(WriteShardedSafetensors(dir.path(), {}, 0).ok());
}

TEST(WeightArchiveTest, IndexNamingAMissingTensorIsAnError) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Join("shard-a.safetensors"),
                               {MakeTensor("x", DType::kU8, {1})})
                  .ok());
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"x": "shard-a.safetensors",
                               "ghost.weight": "shard-a.safetensors"}})");
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_FALSE(archive.ok());
  EXPECT_EQ(archive.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(archive.status().message(), HasSubstr("ghost.weight"));
  EXPECT_THAT(archive.status().message(), HasSubstr("shard-a.safetensors"));
}

TEST(WeightArchiveTest, IndexNamingAMissingShardIsAnError) {
  TempDir dir;
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"x": "gone.safetensors"}})");
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_FALSE(archive.ok());
  EXPECT_THAT(archive.status().message(), HasSubstr("gone.safetensors"));
}

TEST(WeightArchiveTest, IndexPathTraversalIsRejected) {
  for (const char* file :
       {"../x", "..", "/etc/passwd", "sub/model.safetensors", ""}) {
    SCOPED_TRACE(file);
    TempDir dir;
    WriteFile(dir.Join("model.safetensors.index.json"),
              absl::StrCat(R"({"weight_map": {"w": ")", file, R"("}})"));
    auto archive = WeightArchive::OpenDirectory(dir.path());
    ASSERT_FALSE(archive.ok());
    EXPECT_EQ(archive.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(archive.status().message(), HasSubstr("plain file name"));
  }
}

TEST(WeightArchiveTest, MalformedIndexIsAnError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "JSON"},
      {"[]", "object"},
      {"{}", "weight_map"},
      {R"({"weight_map": []})", "weight_map"},
      {R"({"weight_map": {"w": 3}})", "not a string"},
  };
  for (const auto& [content, expected] : cases) {
    SCOPED_TRACE(content);
    TempDir dir;
    WriteFile(dir.Join("model.safetensors.index.json"), content);
    auto archive = WeightArchive::OpenDirectory(dir.path());
    ASSERT_FALSE(archive.ok());
    EXPECT_THAT(archive.status().message(), HasSubstr(expected));
  }
}

TEST(WeightArchiveTest, TensorInTwoShardsIsAnError) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Join("a.safetensors"),
                               {MakeTensor("x", DType::kU8, {1})})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir.Join("b.safetensors"),
                               {MakeTensor("x", DType::kU8, {1}),
                                MakeTensor("y", DType::kU8, {1})})
                  .ok());
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_FALSE(archive.ok());
  EXPECT_THAT(archive.status().message(), HasSubstr("'x'"));
  EXPECT_THAT(archive.status().message(), HasSubstr("both"));
}

TEST(WeightArchiveTest, EmptyDirectoryIsNotFound) {
  TempDir dir;
  auto archive = WeightArchive::OpenDirectory(dir.path());
  ASSERT_FALSE(archive.ok());
  EXPECT_EQ(archive.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(archive.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(archive.status().message(), HasSubstr(dir.path()));

  EXPECT_EQ(WeightArchive::OpenDirectory(dir.Join("missing")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(WeightArchiveTest, FromFiles) {
  absl::StatusOr<std::string> a =
      SerializeSafetensors({MakeTensor("x", DType::kU8, {2}, 1)});
  absl::StatusOr<std::string> b =
      SerializeSafetensors({MakeTensor("y", DType::kU8, {2}, 2),
                            MakeTensor("x", DType::kU8, {2}, 3)});
  absl::StatusOr<std::string> c =
      SerializeSafetensors({MakeTensor("z", DType::kU8, {2}, 4)});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<uint8_t> sa, sb, sc;  // Must outlive the files.

  std::vector<std::unique_ptr<SafetensorsFile>> files;
  auto fa = ParseCopy(*a, &sa);
  auto fc = ParseCopy(*c, &sc);
  ASSERT_TRUE(fa.ok() && fc.ok());
  files.push_back(std::move(*fa));
  files.push_back(std::move(*fc));
  auto archive = WeightArchive::FromFiles(std::move(files));
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_THAT((*archive)->TensorNames(), ElementsAre("x", "z"));
  absl::StatusOr<TensorView> z = (*archive)->Get("z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(ViewBytes(*z), PatternBytes(DType::kU8, 2, 4));

  std::vector<std::unique_ptr<SafetensorsFile>> dup_files;
  auto fa2 = SafetensorsFile::Parse(sa.data(), sa.size(), "first.st");
  sb.assign(b->begin(), b->end());
  auto fb = SafetensorsFile::Parse(sb.data(), sb.size(), "second.st");
  ASSERT_TRUE(fa2.ok() && fb.ok());
  dup_files.push_back(std::move(*fa2));
  dup_files.push_back(std::move(*fb));
  auto dup = WeightArchive::FromFiles(std::move(dup_files));
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), HasSubstr("'x'"));
  EXPECT_THAT(dup.status().message(), HasSubstr("first.st"));
  EXPECT_THAT(dup.status().message(), HasSubstr("second.st"));

  std::vector<std::unique_ptr<SafetensorsFile>> with_null;
  with_null.push_back(nullptr);
  EXPECT_FALSE(WeightArchive::FromFiles(std::move(with_null)).ok());
}

}  // namespace
}  // namespace dedit
