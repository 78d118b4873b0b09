#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace dedit {
namespace {

constexpr uint8_t kIdExists = 1;
constexpr uint8_t kIdSpecial = 2;
// Same bound as BpeModel's: ids index dense tables.
constexpr int32_t kMaxAddedTokenId = (1 << 24) - 1;
// Real tokenizer.json files are 2-35 MB (Qwen3: 11 MB). Parsing costs about
// ten times the file size in memory, so a file far past the real ones is
// refused before it is read.
constexpr uint64_t kMaxTokenizerJsonBytes = 64u << 20;

// The decoder turns ids back into text; only ByteLevel gives the exact
// inverse of a byte-level vocabulary, so anything else is refused rather
// than decoded wrongly.
absl::Status CheckDecoder(const nlohmann::json& doc) {
  auto it = doc.find("decoder");
  if (it == doc.end() || it->is_null()) {
    return absl::InvalidArgumentError(
        "decoder: missing (a ByteLevel decoder is required)");
  }
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder: expected an object, got ", it->type_name()));
  }
  ASSIGN_OR_RETURN(std::string type,
                   JsonRequiredString(*it, "type", "decoder"));
  if (type != "ByteLevel") {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoder.type: unsupported decoder '", type, "' (only ByteLevel)"));
  }
  return absl::OkStatus();
}

// A post-processor that adds tokens (TemplateProcessing, BertProcessing...)
// would change the ids; ByteLevel's only adjusts offsets.
absl::Status CheckPostProcessor(const nlohmann::json& doc) {
  auto it = doc.find("post_processor");
  if (it == doc.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "post_processor: expected an object, got ", it->type_name()));
  }
  ASSIGN_OR_RETURN(std::string type,
                   JsonRequiredString(*it, "type", "post_processor"));
  if (type != "ByteLevel") {
    return absl::InvalidArgumentError(
        absl::StrCat("post_processor.type: unsupported post-processor '", type,
                     "' (only ByteLevel or null)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(
    const nlohmann::json& doc) {
  std::vector<AddedToken> tokens;
  auto list = doc.find("added_tokens");
  if (list == doc.end() || list->is_null()) return tokens;
  if (!list->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "added_tokens: expected an array, got ", list->type_name()));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& entry = (*list)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected an object"));
    }
    AddedToken token;
    auto id = entry.find("id");
    if (id == entry.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".id: missing"));
    }
    ASSIGN_OR_RETURN(token.id, JsonToTokenId(*id, where + ".id"));
    if (token.id > kMaxAddedTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".id: ", token.id, " is too large"));
    }
    ASSIGN_OR_RETURN(token.content,
                     JsonRequiredString(entry, "content", where));
    if (token.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".content: empty"));
    }
    if (token.content.size() > kMaxAddedTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".content: ", token.content.size(),
          " bytes, over the added-token limit of ", kMaxAddedTokenBytes));
    }
    ASSIGN_OR_RETURN(token.special,
                     JsonOptionalBool(entry, "special", false, where));
    ASSIGN_OR_RETURN(token.single_word,
                     JsonOptionalBool(entry, "single_word", false, where));
    ASSIGN_OR_RETURN(token.lstrip,
                     JsonOptionalBool(entry, "lstrip", false, where));
    ASSIGN_OR_RETURN(token.rstrip,
                     JsonOptionalBool(entry, "rstrip", false, where));
    // HF's default: special tokens are matched verbatim, others normalized.
    ASSIGN_OR_RETURN(token.normalized, JsonOptionalBool(entry, "normalized",
                                                        !token.special, where));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadFileToString(path, kMaxTokenizerJsonBytes));
  auto tokenizer = FromJson(text);
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), path);
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view json_text) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  RETURN_IF_ERROR(tokenizer->Load(json_text));
  return tokenizer;
}

absl::Status Tokenizer::Load(absl::string_view json_text) {
  ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(json_text, "tokenizer.json"));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: expected an object, got ", doc.type_name()));
  }
  auto model = doc.find("model");
  if (model == doc.end()) return absl::InvalidArgumentError("model: missing");
  ASSIGN_OR_RETURN(model_, BpeModel::FromJson(*model));
  const nlohmann::json null_json;
  auto normalizer = doc.find("normalizer");
  ASSIGN_OR_RETURN(
      normalizer_,
      ParseNormalizer(normalizer == doc.end() ? null_json : *normalizer));
  auto pre_tokenizer = doc.find("pre_tokenizer");
  ASSIGN_OR_RETURN(pre_tokenizer_, ParsePreTokenizer(pre_tokenizer == doc.end()
                                                         ? null_json
                                                         : *pre_tokenizer));
  RETURN_IF_ERROR(CheckDecoder(doc));
  RETURN_IF_ERROR(CheckPostProcessor(doc));

  ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(doc));
  std::vector<std::string> normalized_contents(added.size());
  for (size_t i = 0; i < added.size(); ++i) {
    if (!added[i].normalized || normalizer_ == nullptr) {
      normalized_contents[i] = added[i].content;
      continue;
    }
    normalized_contents[i] = added[i].content;
    RETURN_IF_ERROR(normalizer_->Normalize(&normalized_contents[i]));
    // Normalization can lengthen a token (NFKD expands some characters
    // 18-fold); the matcher's bound is on the pattern it matches.
    if (normalized_contents[i].size() > kMaxAddedTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "added_tokens[", i, "].content: ", normalized_contents[i].size(),
          " bytes once normalized, over the added-token limit of ",
          kMaxAddedTokenBytes));
    }
  }

  // The id -> bytes table that Decode and the streaming detokenizer read.
  vocab_size_ = model_->id_limit();
  for (const AddedToken& t : added)
    vocab_size_ = std::max(vocab_size_, t.id + 1);
  std::vector<const std::string*> token_of(vocab_size_, nullptr);
  id_flags_.assign(vocab_size_, 0);
  for (int32_t id = 0; id < model_->id_limit(); ++id) {
    token_of[id] = model_->IdToToken(id);
  }
  // Added tokens take precedence, as in HF's id_to_token. With duplicate
  // contents or ids the first entry wins, as in the matcher.
  for (const AddedToken& t : added) {
    token_of[t.id] = &t.content;
    if (t.special) id_flags_[t.id] |= kIdSpecial;
    added_token_ids_.emplace(t.content, t.id);
    added_token_contents_.emplace(t.id, t.content);
  }
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  token_offsets_.assign(vocab_size_ + 1, 0);
  for (int32_t id = 0; id < vocab_size_; ++id) {
    token_offsets_[id] = static_cast<uint32_t>(token_bytes_.size());
    if (token_of[id] == nullptr) continue;
    id_flags_[id] |= kIdExists;
    // HF's ByteLevel decoder keeps a token's raw UTF-8 when one of its
    // characters is outside the alphabet (e.g. a CJK added token).
    if (!alphabet.AppendDecoded(*token_of[id], &token_bytes_)) {
      token_bytes_.append(*token_of[id]);
    }
  }
  token_offsets_[vocab_size_] = static_cast<uint32_t>(token_bytes_.size());
  added_ = std::make_unique<AddedVocabulary>(std::move(added),
                                             std::move(normalized_contents));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(
    absl::string_view text, const EncodeOptions& options) const {
  RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  RETURN_IF_ERROR(EncodeText(text, options, &ids));
  return ids;
}

absl::Status Tokenizer::EncodeText(absl::string_view text,
                                   const EncodeOptions& options,
                                   std::vector<int32_t>* ids) const {
  std::vector<AddedVocabulary::Segment> raw_segments;
  std::vector<AddedVocabulary::Segment> normalized_segments;
  std::string normalized;
  added_->Split(text, AddedVocabulary::kRawText, options.split_special_tokens,
                &raw_segments);
  for (const AddedVocabulary::Segment& segment : raw_segments) {
    if (segment.token_id >= 0) {
      ids->push_back(segment.token_id);
      continue;
    }
    normalized.assign(text.data() + segment.begin, segment.end - segment.begin);
    if (normalizer_ != nullptr)
      RETURN_IF_ERROR(normalizer_->Normalize(&normalized));
    if (!added_->HasTokensFor(AddedVocabulary::kNormalizedText)) {
      RETURN_IF_ERROR(EncodeNormalized(normalized, ids));
      continue;
    }
    added_->Split(normalized, AddedVocabulary::kNormalizedText,
                  options.split_special_tokens, &normalized_segments);
    for (const AddedVocabulary::Segment& inner : normalized_segments) {
      if (inner.token_id >= 0) {
        ids->push_back(inner.token_id);
      } else {
        RETURN_IF_ERROR(
            EncodeNormalized(absl::string_view(normalized)
                                 .substr(inner.begin, inner.end - inner.begin),
                             ids));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeNormalized(absl::string_view text,
                                         std::vector<int32_t>* ids) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string> pieces;
  pieces.emplace_back(text);
  if (pre_tokenizer_ != nullptr) {
    RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces));
  }
  for (const std::string& piece : pieces) model_->Tokenize(piece, ids);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(
    absl::Span<const int32_t> ids, const DecodeOptions& options) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_ || !(id_flags_[id] & kIdExists)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " at position ", i,
                       " is not in the vocabulary (size ", vocab_size_, ")"));
    }
    if (options.skip_special_tokens && (id_flags_[id] & kIdSpecial)) continue;
    bytes.append(token_bytes_, token_offsets_[id],
                 token_offsets_[id + 1] - token_offsets_[id]);
  }
  if (!FindInvalidUtf8(bytes).has_value()) return bytes;
  std::string text;
  text.reserve(bytes.size() + 8);
  AppendUtf8Lossy(bytes, &text);
  return text;
}

absl::StatusOr<absl::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || !(id_flags_[id] & kIdExists)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
  }
  return absl::string_view(token_bytes_)
      .substr(token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  auto it = added_token_ids_.find(token);
  if (it != added_token_ids_.end()) return it->second;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  auto it = added_token_contents_.find(id);
  if (it != added_token_contents_.end()) return it->second;
  const std::string* token = model_->IdToToken(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::IsSpecialToken(int32_t id) const {
  return id >= 0 && id < vocab_size_ && (id_flags_[id] & kIdSpecial);
}

}  // namespace dedit
