#include "common/base/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/bounded_json.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace dedit {
namespace {

using Json = nlohmann::json;

// Bounds on sizes that the loaders turn into allocations or loops before
// any weight is read (docs/ARCHITECTURE.md, "Hostile model folders"). The
// largest released models have under 200 layers and a handful of EOS ids.
constexpr int kMaxLayers = 1024;
constexpr size_t kMaxListLength = 1024;
constexpr int kMaxBlockSize = 1024;
constexpr int kMaxSeedNgram =
    64;  // a lookup key longer than this finds nothing
// config.json is a few KB; anything this large is not one.
constexpr uint64_t kMaxConfigBytes = 16u << 20;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", what));
}

absl::StatusOr<Json> ParseObject(const std::string& text) {
  ASSIGN_OR_RETURN(Json j, ParseBoundedJson(text, "config.json"));
  if (!j.is_object()) return Invalid("top level is not an object");
  return j;
}

// The integer value of `v` when it is a JSON integer in [min, max].
// Distinguishes unsigned from signed storage, so that 2^32 + 1 is out of
// range rather than truncated to 1.
absl::StatusOr<int> ToBoundedInt(const Json& v, absl::string_view where,
                                 int min, int max) {
  if (!v.is_number_integer()) {
    return Invalid(absl::StrCat("'", where, "' must be an integer, got ",
                                JsonForError(v)));
  }
  const bool in_range =
      v.is_number_unsigned()
          ? v.get<uint64_t>() >= static_cast<uint64_t>(std::max(min, 0)) &&
                v.get<uint64_t>() <= static_cast<uint64_t>(max)
          : v.get<int64_t>() >= min && v.get<int64_t>() <= max;
  if (!in_range) {
    return Invalid(absl::StrCat("'", where, "' = ", JsonForError(v),
                                " is out of range [", min, ", ", max, "]"));
  }
  return static_cast<int>(v.get<int64_t>());
}

// Reads an integer field in [min, max]. `required` fields must be present;
// optional ones keep `*out` unchanged when absent.
absl::Status GetInt(const Json& j, const char* key, bool required, int min,
                    int max, int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return Invalid(absl::StrCat("missing '", key, "'"));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(*out, ToBoundedInt(*it, key, min, max));
  return absl::OkStatus();
}

absl::Status GetInt(const Json& j, const char* key, bool required, int min,
                    int* out) {
  return GetInt(j, key, required, min, std::numeric_limits<int>::max(), out);
}

absl::Status GetDouble(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return Invalid(absl::StrCat("'", key, "' must be a number"));
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || v <= 0) {
    return Invalid(absl::StrCat("'", key, "' must be positive and finite"));
  }
  *out = v;
  return absl::OkStatus();
}

// Reads an optional number in [min, max]; absent or null keeps `*out`.
absl::Status GetDouble(const Json& j, const char* key, double min, double max,
                       double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const double v = it->is_number() ? it->get<double>() : std::nan("");
  if (!std::isfinite(v) || v < min || v > max) {
    return Invalid(
        absl::StrCat("'", key, "' must be a number in [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status GetBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return Invalid(absl::StrCat("'", key, "' must be a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// Reads a field that is one integer or a list of them (at most
// kMaxListLength), each in [0, max]; both forms get the same checks.
absl::Status GetIntList(const Json& j, const char* key, int max,
                        std::vector<int>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  out->clear();
  if (!it->is_array()) {
    if (!it->is_number_integer()) {
      return Invalid(absl::StrCat("'", key, "' must be an integer or a list"));
    }
    ASSIGN_OR_RETURN(const int v, ToBoundedInt(*it, key, 0, max));
    out->push_back(v);
    return absl::OkStatus();
  }
  if (it->size() > kMaxListLength) {
    return Invalid(absl::StrCat("'", key, "' has ", it->size(),
                                " entries, over the limit of ",
                                kMaxListLength));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    ASSIGN_OR_RETURN(
        const int v,
        ToBoundedInt((*it)[i], absl::StrCat(key, "[", i, "]"), 0, max));
    out->push_back(v);
  }
  return absl::OkStatus();
}

absl::StatusOr<Qwen3Config> ParseQwen3Object(const Json& j) {
  Qwen3Config c;
  RETURN_IF_ERROR(GetInt(j, "vocab_size", true, 1, &c.vocab_size));
  RETURN_IF_ERROR(GetInt(j, "hidden_size", true, 1, &c.hidden_size));
  RETURN_IF_ERROR(
      GetInt(j, "intermediate_size", true, 1, &c.intermediate_size));
  RETURN_IF_ERROR(GetInt(j, "num_hidden_layers", true, 1, kMaxLayers,
                         &c.num_hidden_layers));
  RETURN_IF_ERROR(
      GetInt(j, "num_attention_heads", true, 1, &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  RETURN_IF_ERROR(
      GetInt(j, "num_key_value_heads", false, 1, &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid(absl::StrCat("num_attention_heads (", c.num_attention_heads,
                                ") is not a multiple of num_key_value_heads (",
                                c.num_key_value_heads, ")"));
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  RETURN_IF_ERROR(GetInt(j, "head_dim", false, 2, &c.head_dim));
  if (c.head_dim % 2 != 0 || c.head_dim < 2) {
    return Invalid(absl::StrCat("head_dim ", c.head_dim,
                                " must be even (rotary embedding)"));
  }
  RETURN_IF_ERROR(GetDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  // transformers v5 moved rope_theta into rope_parameters.
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && rp->is_object()) {
    RETURN_IF_ERROR(GetDouble(*rp, "rope_theta", &c.rope_theta));
  }
  RETURN_IF_ERROR(GetDouble(j, "rope_theta", &c.rope_theta));
  RETURN_IF_ERROR(GetInt(j, "max_position_embeddings", false, 1,
                         &c.max_position_embeddings));
  RETURN_IF_ERROR(GetBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return Invalid(absl::StrCat("'", key, "' must be a string such as ",
                                  "\"bfloat16\", got ", JsonForError(*it)));
    }
    c.dtype = it->get<std::string>();
  }
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16") {
    return Invalid(absl::StrCat("unsupported dtype '", c.dtype,
                                "' (float32, bfloat16, float16)"));
  }
  RETURN_IF_ERROR(GetInt(j, "bos_token_id", false, 0, &c.bos_token_id));
  RETURN_IF_ERROR(GetIntList(j, "eos_token_id", std::numeric_limits<int>::max(),
                             &c.eos_token_ids));
  for (int id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      return Invalid(
          absl::StrCat("eos_token_id ", id, " is outside the vocabulary"));
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<Qwen3Config> ParseQwen3Config(const std::string& json_text) {
  ASSIGN_OR_RETURN(Json j, ParseObject(json_text));
  return ParseQwen3Object(j);
}

std::vector<int> DefaultTargetLayerIds(int num_target_layers, int n) {
  std::vector<int> ids;
  if (n <= 0 || num_target_layers <= 0) return ids;
  if (n == 1) return {num_target_layers / 2};
  for (int i = 0; i < n; ++i) {
    const double v = 1.0 + i * (num_target_layers - 4.0) / (n - 1.0);
    int id = static_cast<int>(std::lround(v));
    if (id < 0) id = 0;
    if (id >= num_target_layers) id = num_target_layers - 1;
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<DrafterConfig> ParseDrafterConfig(const std::string& json_text) {
  ASSIGN_OR_RETURN(Json j, ParseObject(json_text));
  DrafterConfig c;
  ASSIGN_OR_RETURN(c.layers, ParseQwen3Object(j));
  RETURN_IF_ERROR(
      GetInt(j, "block_size", false, 1, kMaxBlockSize, &c.block_size));
  RETURN_IF_ERROR(GetInt(j, "num_target_layers", true, 1, kMaxLayers,
                         &c.num_target_layers));
  auto df = j.find("dflash_config");
  if (df == j.end() || !df->is_object()) {
    return Invalid("missing 'dflash_config' object (not a DFlash drafter)");
  }
  RETURN_IF_ERROR(
      GetInt(*df, "block_size", false, 1, kMaxBlockSize, &c.block_size));
  RETURN_IF_ERROR(GetInt(*df, "mask_token_id", true, 0, &c.mask_token_id));
  if (c.mask_token_id >= c.layers.vocab_size) {
    return Invalid(absl::StrCat("mask_token_id ", c.mask_token_id,
                                " is outside the vocabulary"));
  }
  RETURN_IF_ERROR(
      GetIntList(*df, "target_layer_ids", kMaxLayers - 1, &c.target_layer_ids));
  if (c.target_layer_ids.empty()) {
    // Older checkpoints leave the ids implicit: one per drafter layer.
    c.target_layer_ids =
        DefaultTargetLayerIds(c.num_target_layers, c.layers.num_hidden_layers);
  }
  for (int id : c.target_layer_ids) {
    if (id >= c.num_target_layers) {
      return Invalid(absl::StrCat("target_layer_ids: layer ", id,
                                  " >= num_target_layers ",
                                  c.num_target_layers));
    }
  }
  if (c.block_size < 2) {
    return Invalid("block_size must be at least 2 (bonus + one draft slot)");
  }
  auto de = j.find("dedit_config");
  if (de != j.end() && !de->is_null()) {
    if (!de->is_object()) return Invalid("'dedit_config' must be an object");
    c.has_dedit_config = true;
    RETURN_IF_ERROR(GetInt(*de, "num_passes", false, 1, &c.num_passes));
    RETURN_IF_ERROR(GetBool(*de, "causal_editor", &c.causal_editor));
    RETURN_IF_ERROR(GetInt(*de, "lookup_seed_ngram", false, 0, kMaxSeedNgram,
                           &c.lookup_seed_ngram));
    RETURN_IF_ERROR(GetDouble(*de, "seed_logit_bonus", 0, kMaxSeedLogitBonus,
                              &c.seed_logit_bonus));
    if (c.seed_logit_bonus > 0 && c.lookup_seed_ngram == 0) {
      return Invalid(
          "'seed_logit_bonus' needs a lookup-seeded drafter "
          "(lookup_seed_ngram > 0)");
    }
  }
  return c;
}

absl::Status CheckDrafterMatchesTarget(const DrafterConfig& drafter,
                                       const Qwen3Config& target) {
  if (drafter.layers.hidden_size != target.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("drafter hidden_size ", drafter.layers.hidden_size,
                     " differs from the target's ", target.hidden_size));
  }
  if (drafter.num_target_layers != target.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter was built for ", drafter.num_target_layers,
        " target layers, the target has ", target.num_hidden_layers));
  }
  if (drafter.mask_token_id >= target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter mask_token_id ", drafter.mask_token_id,
        " is outside the target vocabulary of ", target.vocab_size));
  }
  return absl::OkStatus();
}

namespace {
Json Qwen3ToJsonObject(const Qwen3Config& c) {
  Json j;
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.dtype;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  return j;
}
}  // namespace

std::string Qwen3ConfigToJson(const Qwen3Config& config) {
  return Qwen3ToJsonObject(config).dump(2) + "\n";
}

std::string DrafterConfigToJson(const DrafterConfig& config) {
  Json j = Qwen3ToJsonObject(config.layers);
  j["architectures"] = {"DFlashDraftModel"};
  j["block_size"] = config.block_size;
  j["num_target_layers"] = config.num_target_layers;
  j["dflash_config"] = {{"mask_token_id", config.mask_token_id},
                        {"target_layer_ids", config.target_layer_ids}};
  if (config.has_dedit_config) {
    j["dedit_config"] = {{"num_passes", config.num_passes},
                         {"causal_editor", config.causal_editor}};
    if (config.lookup_seed_ngram > 0) {
      j["dedit_config"]["lookup_seed_ngram"] = config.lookup_seed_ngram;
    }
    if (config.seed_logit_bonus > 0) {
      j["dedit_config"]["seed_logit_bonus"] = config.seed_logit_bonus;
    }
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<Qwen3Config> LoadQwen3Config(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadFileToString(dir + "/config.json", kMaxConfigBytes));
  auto c = ParseQwen3Config(text);
  if (!c.ok()) return Annotate(c.status(), dir);
  return c;
}

absl::StatusOr<DrafterConfig> LoadDrafterConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadFileToString(dir + "/config.json", kMaxConfigBytes));
  auto c = ParseDrafterConfig(text);
  if (!c.ok()) return Annotate(c.status(), dir);
  return c;
}

}  // namespace dedit
