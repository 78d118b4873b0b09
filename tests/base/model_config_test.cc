#include "common/base/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using ::testing::HasSubstr;

// A real z-lab DFlash config (Qwen3-4B-DFlash-b16), as published.
constexpr char kZLabDFlashConfig[] = R"({
  "architectures": ["DFlashDraftModel"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
  "block_size": 16,
  "bos_token_id": 151643,
  "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
  "dtype": "bfloat16",
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2560,
  "initializer_range": 0.02,
  "intermediate_size": 9728,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
  "max_position_embeddings": 40960,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 36,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "transformers_version": "4.57.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen3_0_6B[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_size": 1024,
  "intermediate_size": 3072, "max_position_embeddings": 40960,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 151936
})";

TEST(ModelConfigTest, ParsesRealZLabDFlashConfig) {
  auto c = ParseDrafterConfig(kZLabDFlashConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->block_size, 16);
  EXPECT_EQ(c->mask_token_id, 151669);
  EXPECT_EQ(c->target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(c->num_target_layers, 36);
  EXPECT_EQ(c->layers.num_hidden_layers, 5);
  EXPECT_EQ(c->layers.hidden_size, 2560);
  EXPECT_EQ(c->layers.head_dim, 128);
  EXPECT_EQ(c->layers.dtype, "bfloat16");
  EXPECT_EQ(c->num_passes, 1);  // plain DFlash: P1 only
  EXPECT_FALSE(c->has_dedit_config);
}

TEST(ModelConfigTest, ParsesQwen3Target) {
  auto c = ParseQwen3Config(kQwen3_0_6B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, 28);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{151645}));
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
}

TEST(ModelConfigTest, RopeParametersAndDtypeSpelling) {
  auto c = ParseQwen3Config(R"({"vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
    "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"},
    "dtype": "bfloat16", "eos_token_id": [1, 2]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 5000.0);
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 2}));
}

TEST(ModelConfigTest, DEditConfigAndNestedBlockSize) {
  std::string text = kZLabDFlashConfig;
  const std::string key = "\"dflash_config\": {";
  text.replace(text.find(key), key.size(),
               "\"dedit_config\": {\"num_passes\": 3, \"causal_editor\": true},"
               " \"dflash_config\": {\"block_size\": 32, ");
  auto c = ParseDrafterConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->block_size, 32);
  EXPECT_EQ(c->num_passes, 3);
  EXPECT_TRUE(c->causal_editor);
  EXPECT_TRUE(c->has_dedit_config);
}

// A lookup-seeded drafter's dedit_config.lookup_seed_ngram: read, written
// back only when set, and bounded.
TEST(ModelConfigTest, LookupSeedNgramIsReadWrittenAndBounded) {
  auto c = ParseDrafterConfig(kZLabDFlashConfig);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->lookup_seed_ngram, 0);
  c->has_dedit_config = true;
  EXPECT_EQ(DrafterConfigToJson(*c).find("lookup_seed_ngram"),
            std::string::npos);
  c->lookup_seed_ngram = 2;
  const std::string text = DrafterConfigToJson(*c);
  auto back = ParseDrafterConfig(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->lookup_seed_ngram, 2);
  for (const char* bad : {"-1", "65", "\"2\""}) {
    std::string t = text;
    const std::string key = "\"lookup_seed_ngram\": 2";
    ASSERT_NE(t.find(key), std::string::npos);
    t.replace(t.find(key), key.size(),
              std::string("\"lookup_seed_ngram\": ") + bad);
    auto parsed = ParseDrafterConfig(t);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::HasSubstr("lookup_seed_ngram"))
        << bad;
  }
}

TEST(ModelConfigTest, SeedLogitBonusIsReadWrittenAndBounded) {
  auto c = ParseDrafterConfig(kZLabDFlashConfig);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->seed_logit_bonus, 0);
  c->has_dedit_config = true;
  c->lookup_seed_ngram = 2;
  EXPECT_EQ(DrafterConfigToJson(*c).find("seed_logit_bonus"),
            std::string::npos);
  c->seed_logit_bonus = 6.5;
  const std::string text = DrafterConfigToJson(*c);
  auto back = ParseDrafterConfig(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seed_logit_bonus, 6.5);
  const std::string key = "\"seed_logit_bonus\": 6.5";
  ASSERT_NE(text.find(key), std::string::npos);
  for (const char* bad : {"-1", "64.5", "\"6\"", "true"}) {
    std::string t = text;
    t.replace(t.find(key), key.size(),
              std::string("\"seed_logit_bonus\": ") + bad);
    auto parsed = ParseDrafterConfig(t);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::HasSubstr("seed_logit_bonus"))
        << bad;
  }
  // A bonus without a seed would do nothing: refused, naming both.
  std::string unseeded = text;
  const std::string seed_key = "\"lookup_seed_ngram\": 2";
  ASSERT_NE(unseeded.find(seed_key), std::string::npos);
  unseeded.replace(unseeded.find(seed_key), seed_key.size(),
                   "\"lookup_seed_ngram\": 0");
  auto parsed = ParseDrafterConfig(unseeded);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              ::testing::HasSubstr("lookup_seed_ngram"));
}

TEST(ModelConfigTest, DefaultLayerIdsMatchDFlash) {
  EXPECT_EQ(DefaultTargetLayerIds(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(DefaultTargetLayerIds(4, 2), (std::vector<int>{1, 1}));
}

TEST(ModelConfigTest, RoundTripsThroughJson) {
  auto c = ParseDrafterConfig(kZLabDFlashConfig);
  ASSERT_TRUE(c.ok());
  c->has_dedit_config = true;
  c->num_passes = 4;
  auto back = ParseDrafterConfig(DrafterConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->target_layer_ids, c->target_layer_ids);
  EXPECT_EQ(back->num_passes, 4);
  EXPECT_EQ(back->layers.head_dim, 128);
}

struct BadCase {
  const char* json;
  const char* message;
};

TEST(ModelConfigTest, MalformedConfigsAreClearErrors) {
  const BadCase cases[] = {
      {"", "invalid JSON"},
      {"[1,2]", "not an object"},
      {"{\"vocab_size\": 10}", "missing 'hidden_size'"},
      {R"({"vocab_size": "ten", "hidden_size": 8})", "'vocab_size' must be"},
      {R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 3,
          "num_key_value_heads": 2})",
       "not a multiple"},
      {R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 3})",
       "must be even"},
      {R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": -1, "num_attention_heads": 2})",
       "out of range"},
      {R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2,
          "torch_dtype": "int8"})",
       "unsupported dtype"},
      {R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2,
          "rms_norm_eps": -1})",
       "rms_norm_eps"},
  };
  for (const BadCase& bad : cases) {
    auto c = ParseQwen3Config(bad.json);
    ASSERT_FALSE(c.ok()) << bad.json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(bad.message));
  }
}

TEST(ModelConfigTest, MalformedDrafterConfigs) {
  std::string no_dflash = kQwen3_0_6B;
  auto c = ParseDrafterConfig(no_dflash.replace(
      no_dflash.find("\"model_type\""), 0, "\"num_target_layers\": 28, "));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("dflash_config"));

  std::string bad_layer = kZLabDFlashConfig;
  bad_layer.replace(bad_layer.find("[1, 9, 17, 25, 33]"), 18, "[1, 9, 40]");
  c = ParseDrafterConfig(bad_layer);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("layer 40"));

  std::string bad_mask = kZLabDFlashConfig;
  bad_mask.replace(bad_mask.find("151669"), 6, "999999");
  c = ParseDrafterConfig(bad_mask);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("mask_token_id"));
}

TEST(ModelConfigTest, DrafterMustMatchTarget) {
  auto drafter = ParseDrafterConfig(kZLabDFlashConfig);
  auto target = ParseQwen3Config(kQwen3_0_6B);
  ASSERT_TRUE(drafter.ok() && target.ok());
  absl::Status s = CheckDrafterMatchesTarget(*drafter, *target);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("hidden_size"));
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  auto c = LoadQwen3Config("/nonexistent/dir");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dedit
