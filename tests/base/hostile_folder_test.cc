// Regression tests for hostile model folders: every input here
// once crashed, hung, over-allocated or was silently accepted. Each must now
// be an INVALID_ARGUMENT naming the file and the field, quickly. The binary
// runs under ASan + UBSan (label "parser").
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/bounded_json.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/base/temp_dir.h"

namespace dedit {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;

MATCHER_P(IsInvalidArgumentWith, substring, "") {
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(substring) != std::string::npos;
}

std::string Nested(int depth, const std::string& inner = "0") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

std::string RawSafetensors(const std::string& header,
                           const std::string& data = "") {
  return LittleEndian64(header.size()) + header + data;
}

absl::Status ParseSafetensors(const std::string& bytes) {
  return SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()),
                                bytes.size(), "hostile.safetensors")
      .status();
}

// A small, valid Qwen3 config with `extra` members appended.
std::string TargetConfig(const std::string& extra = "") {
  return absl::StrCat(
      R"({"vocab_size": 100, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 2)",
      extra.empty() ? "" : ", ", extra, "}");
}

// A small, valid drafter config; `dflash` replaces the dflash_config body.
std::string DrafterConfig(const std::string& layers,
                          const std::string& dflash = R"("mask_token_id": 1)") {
  return absl::StrCat(R"({"vocab_size": 100, "hidden_size": 8,
      "intermediate_size": 16, "num_attention_heads": 2, )",
                      layers, R"(, "dflash_config": {)", dflash, "}}");
}

// --- ParseBoundedJson

TEST(BoundedJsonTest, DepthIsCountedInContainers) {
  EXPECT_TRUE(ParseBoundedJson(Nested(3), "x", 3).ok());
  EXPECT_THAT(ParseBoundedJson(Nested(4), "x.json", 3).status(),
              IsInvalidArgumentWith("x.json: JSON nested deeper than 3"));
  EXPECT_TRUE(ParseBoundedJson("7", "x", 0).ok());
  EXPECT_THAT(ParseBoundedJson(R"({"a": {"b": [1]}})", "x", 2).status(),
              IsInvalidArgumentWith("nested deeper"));
  EXPECT_THAT(ParseBoundedJson("[1,", "x.json").status(),
              IsInvalidArgumentWith("x.json: invalid JSON"));
}

TEST(BoundedJsonTest, VeryDeepDocumentsAreRefusedCheaply) {
  // 1M levels: building this document used to take gigabytes, and walking
  // it overflowed the stack.
  auto doc = ParseBoundedJson(Nested(1000000), "deep.json");
  EXPECT_THAT(doc.status(), IsInvalidArgumentWith("nested deeper than 64"));
  auto object = ParseBoundedJson(absl::StrCat(std::string(100000, '{'), "}"),
                                 "deep.json");
  EXPECT_FALSE(object.ok());
}

TEST(BoundedJsonTest, JsonForErrorIsShort) {
  EXPECT_EQ(JsonForError(nlohmann::json(5)), "5");
  EXPECT_EQ(JsonForError(nlohmann::json("ab")), "\"ab\"");
  EXPECT_EQ(JsonForError(nlohmann::json::array({1, 2})), "array");
  const std::string s = JsonForError(nlohmann::json(std::string(1000, 'x')));
  EXPECT_LT(s.size(), 100u);
  EXPECT_THAT(s, HasSubstr("1000 bytes"));
  // Never cuts a character in two: é is 2 bytes; 64 falls inside one.
  std::string accents = "x";
  for (int i = 0; i < 100; ++i) accents += "\xC3\xA9";
  const std::string cut = JsonForError(nlohmann::json(accents));
  EXPECT_EQ(cut.find("\xC3..."), std::string::npos);
  EXPECT_NE(cut.find("\xC3\xA9..."), std::string::npos);
}

// --- config.json

TEST(HostileConfigTest, AbsurdLayerCountsAreRefusedBeforeAllocating) {
  // 2^31-1 layers and no target_layer_ids once built an 8.6 GB default list.
  const std::string huge = R"("num_hidden_layers": 2147483647,
                              "num_target_layers": 2147483647)";
  EXPECT_THAT(ParseDrafterConfig(DrafterConfig(huge)).status(),
              IsInvalidArgumentWith("'num_hidden_layers' = 2147483647"));
  EXPECT_THAT(ParseDrafterConfig(DrafterConfig(R"("num_hidden_layers": 1,
                                          "num_target_layers": 2147483647)"))
                  .status(),
              IsInvalidArgumentWith("'num_target_layers' = 2147483647"));
  EXPECT_THAT(
      ParseQwen3Config(TargetConfig(R"("num_hidden_layers": 1025)")).status(),
      IsInvalidArgumentWith("out of range [1, 1024]"));
  EXPECT_TRUE(ParseDrafterConfig(DrafterConfig(R"("num_hidden_layers": 2,
                                                  "num_target_layers": 1024)"))
                  .ok());
}

TEST(HostileConfigTest, ScalarIdsGetTheSameRangeChecksAsLists) {
  for (const char* bad : {"-5", "4294967297", "2147483648", "1.5", "\"3\"",
                          "18446744073709551615"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(
        ParseQwen3Config(TargetConfig(absl::StrCat(R"("eos_token_id": )", bad)))
            .status(),
        IsInvalidArgumentWith("eos_token_id"));
    EXPECT_THAT(ParseQwen3Config(TargetConfig(absl::StrCat(
                                     R"("eos_token_id": [1, )", bad, "]")))
                    .status(),
                IsInvalidArgumentWith("eos_token_id[1]"));
    const std::string layers =
        R"("num_hidden_layers": 2, "num_target_layers": 4)";
    EXPECT_THAT(ParseDrafterConfig(
                    DrafterConfig(layers, absl::StrCat(R"("mask_token_id": 1,
                                              "target_layer_ids": )",
                                                       bad)))
                    .status(),
                IsInvalidArgumentWith("target_layer_ids"));
  }
  auto ok = ParseQwen3Config(TargetConfig(R"("eos_token_id": 7)"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->eos_token_ids, std::vector<int>{7});
}

TEST(HostileConfigTest, ListLengthsAreBounded) {
  std::string ids = "[0";
  for (int i = 0; i < 1024; ++i) ids += ",0";
  ids += "]";
  EXPECT_THAT(
      ParseQwen3Config(TargetConfig(absl::StrCat(R"("eos_token_id": )", ids)))
          .status(),
      IsInvalidArgumentWith("over the limit of 1024"));
}

TEST(HostileConfigTest, NumericDtypeIsAnError) {
  EXPECT_THAT(ParseQwen3Config(TargetConfig(R"("torch_dtype": 16)")).status(),
              IsInvalidArgumentWith("'torch_dtype' must be a string"));
  EXPECT_THAT(ParseQwen3Config(TargetConfig(R"("dtype": [1])")).status(),
              IsInvalidArgumentWith("'dtype' must be a string"));
  EXPECT_TRUE(ParseQwen3Config(TargetConfig(R"("torch_dtype": null)")).ok());
}

TEST(HostileConfigTest, DeepNestingAnywhereIsAnError) {
  EXPECT_THAT(ParseQwen3Config(TargetConfig(absl::StrCat(R"("rope_scaling": )",
                                                         Nested(100000))))
                  .status(),
              IsInvalidArgumentWith("config.json: JSON nested deeper"));
}

TEST(HostileConfigTest, FifoConfigIsRefusedNotWaitedOn) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.Join("config.json").c_str(), 0600), 0);
  auto c = LoadQwen3Config(dir.path());
  EXPECT_THAT(c.status(), AllOf(IsInvalidArgumentWith("not a regular file"),
                                IsInvalidArgumentWith("config.json")));
  EXPECT_FALSE(LoadDrafterConfig(dir.path()).ok());
}

TEST(HostileConfigTest, HugeConfigIsRefusedBeforeReading) {
  TempDir dir;
  const std::string path = dir.Join("config.json");
  WriteFile(path, "{}");
  ASSERT_EQ(::truncate(path.c_str(), 64 << 20), 0);  // Sparse.
  EXPECT_THAT(LoadQwen3Config(dir.path()).status(),
              IsInvalidArgumentWith("over the limit"));
}

// --- model.safetensors and its shard index

TEST(HostileSafetensorsTest, HeaderNestingIsBoundedToTheFormat) {
  const std::string entry =
      R"({"t":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})";
  EXPECT_THAT(ParseSafetensors(RawSafetensors(entry, "x")),
              IsInvalidArgumentWith("hostile.safetensors: header: JSON "
                                    "nested deeper than 3"));
  EXPECT_THAT(ParseSafetensors(RawSafetensors(absl::StrCat(
                  R"({"__metadata__":{"k":)", Nested(50000), "}}"))),
              IsInvalidArgumentWith("nested deeper"));
  EXPECT_TRUE(
      ParseSafetensors(
          RawSafetensors(
              R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"))
          .ok());
}

TEST(HostileSafetensorsTest, HeaderMustBeInProportionToTheData) {
  // 2 MiB of header (padding is valid JSON whitespace) over one byte of
  // data: more than the 1 MiB slack plus the data size.
  std::string header =
      R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header.append(2u << 20, ' ');
  EXPECT_THAT(ParseSafetensors(RawSafetensors(header, "x")),
              IsInvalidArgumentWith("out of proportion"));
  // The same header is fine over enough data.
  std::string data(2u << 20, 'x');
  std::string header_ok = R"({"t":{"dtype":"U8","shape":[2097152],)"
                          R"("data_offsets":[0,2097152]}})";
  header_ok.append(2u << 20, ' ');
  EXPECT_TRUE(ParseSafetensors(RawSafetensors(header_ok, data)).ok());
}

TEST(HostileSafetensorsTest, NestedShardIndexIsAnErrorNamingTheIndex) {
  TempDir dir;
  WriteFile(dir.Join("model.safetensors.index.json"),
            absl::StrCat(R"({"metadata": )", Nested(100000),
                         R"(, "weight_map": {}})"));
  auto archive = WeightArchive::OpenDirectory(dir.path());
  EXPECT_THAT(archive.status(),
              AllOf(IsInvalidArgumentWith("model.safetensors.index.json"),
                    IsInvalidArgumentWith("nested deeper")));
}

TEST(HostileSafetensorsTest, FifoWeightsAreRefusedNotWaitedOn) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.Join("model.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(WeightArchive::OpenDirectory(dir.path()).status(),
              IsInvalidArgumentWith("not a regular file"));

  TempDir sharded;
  WriteFile(sharded.Join("model.safetensors.index.json"),
            R"({"weight_map": {"t": "shard.safetensors"}})");
  ASSERT_EQ(::mkfifo(sharded.Join("shard.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(WeightArchive::OpenDirectory(sharded.path()).status(),
              AllOf(IsInvalidArgumentWith("not a regular file"),
                    IsInvalidArgumentWith("shard.safetensors")));
  ASSERT_EQ(::unlink(sharded.Join("model.safetensors.index.json").c_str()), 0);
  ASSERT_EQ(
      ::mkfifo(sharded.Join("model.safetensors.index.json").c_str(), 0600), 0);
  EXPECT_THAT(WeightArchive::OpenDirectory(sharded.path()).status(),
              IsInvalidArgumentWith("not a regular file"));
}

}  // namespace
}  // namespace dedit
