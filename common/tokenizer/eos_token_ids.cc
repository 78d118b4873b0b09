#include "common/tokenizer/eos_token_ids.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/json_util.h"

namespace dedit {
namespace {

// generation_config.json, config.json and tokenizer_config.json are KBs
// (a tokenizer_config.json with a long chat template, ~1 MB at most).
constexpr uint64_t kMaxSideFileBytes = 16u << 20;
// Stop-id lists are deduplicated by linear search, and real ones hold one to
// three ids.
constexpr size_t kMaxEosTokenIds = 1024;

// Contents of model_dir/name, or nullopt when the file does not exist.
absl::StatusOr<std::optional<std::string>> ReadOptionalFile(
    const std::string& model_dir, const char* name) {
  auto text =
      ReadFileToString(absl::StrCat(model_dir, "/", name), kMaxSideFileBytes);
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  if (!text.ok()) return text.status();
  return std::optional<std::string>(*std::move(text));
}

void AppendUnique(int32_t id, std::vector<int32_t>* ids) {
  if (std::find(ids->begin(), ids->end(), id) == ids->end()) ids->push_back(id);
}

// tokenizer_config.json "eos_token": a string, an AddedToken-like object
// {"content": ...}, null or absent.
absl::StatusOr<std::optional<std::string>> ParseEosTokenString(
    absl::string_view json_text) {
  ASSIGN_OR_RETURN(nlohmann::json doc,
                   ParseJson(json_text, "tokenizer_config.json"));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: expected an object");
  }
  auto it = doc.find("eos_token");
  if (it == doc.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string())
    return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    ASSIGN_OR_RETURN(
        std::string content,
        JsonRequiredString(*it, "content", "tokenizer_config.json eos_token"));
    return std::optional<std::string>(content);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer_config.json eos_token: expected a string or object, got ",
      it->type_name()));
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseEosTokenIdField(
    absl::string_view json_text, absl::string_view file_name) {
  ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(json_text, file_name));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": expected an object"));
  }
  std::vector<int32_t> ids;
  auto it = doc.find("eos_token_id");
  if (it == doc.end() || it->is_null()) return ids;
  const std::string where = absl::StrCat(file_name, " eos_token_id");
  if (it->is_array()) {
    if (it->size() > kMaxEosTokenIds) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", it->size(),
                                                     " ids, over the limit of ",
                                                     kMaxEosTokenIds));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(
          int32_t id,
          JsonToTokenId((*it)[i], absl::StrCat(where, "[", i, "]")));
      AppendUnique(id, &ids);
    }
    return ids;
  }
  ASSIGN_OR_RETURN(int32_t id, JsonToTokenId(*it, where));
  ids.push_back(id);
  return ids;
}

absl::StatusOr<std::vector<int32_t>> LoadEosTokenIds(
    const std::string& model_dir, const Tokenizer& tokenizer) {
  std::vector<int32_t> eos;
  for (const char* name : {"generation_config.json", "config.json"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> text,
                     ReadOptionalFile(model_dir, name));
    if (!text.has_value()) continue;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     ParseEosTokenIdField(*text, name));
    for (int32_t id : ids) {
      if (id >= tokenizer.vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " eos_token_id ", id,
                         " is outside the tokenizer's vocabulary (size ",
                         tokenizer.vocab_size(), ")"));
      }
      AppendUnique(id, &eos);
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> config,
                   ReadOptionalFile(model_dir, "tokenizer_config.json"));
  if (config.has_value()) {
    ASSIGN_OR_RETURN(std::optional<std::string> token,
                     ParseEosTokenString(*config));
    if (token.has_value()) {
      const std::optional<int32_t> id = tokenizer.TokenToId(*token);
      if (!id.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json eos_token '", *token,
                         "' is not in the tokenizer"));
      }
      AppendUnique(*id, &eos);
    }
  }
  if (eos.empty()) {
    return absl::NotFoundError(absl::StrCat(
        model_dir,
        ": no EOS token id in generation_config.json, config.json or "
        "tokenizer_config.json"));
  }
  return eos;
}

}  // namespace dedit
