#include "common/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dedit {
namespace {

bool IsAscii(const std::string& text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// One of ICU's four standard forms. The ICU singletons are immutable and
// documented thread-safe.
class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* form, std::string name)
      : form_(form), name_(std::move(name)) {}

  absl::Status Normalize(std::string* text) const override {
    // ASCII is invariant under every form, and most text is ASCII.
    if (IsAscii(*text)) return absl::OkStatus();
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(text->data(),
                                 static_cast<int32_t>(text->size()));
    if (form_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
      return absl::OkStatus();
    }
    status = U_ZERO_ERROR;
    std::string out;
    out.reserve(text->size() + text->size() / 4);
    icu::StringByteSink<std::string> sink(&out);
    form_->normalizeUTF8(0, piece, sink, /*edits=*/nullptr, status);
    if (U_FAILURE(status)) {
      return absl::InternalError(
          absl::StrCat(name_, " normalization failed: ", u_errorName(status)));
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* form_;
  std::string name_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}

  absl::Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeUnicodeNormalizer(
    const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "NFC") form = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") form = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") form = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") form = icu::Normalizer2::getNFKDInstance(status);
  if (form == nullptr || U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat(
        "ICU has no ", type, " normalizer: ", u_errorName(status)));
  }
  return std::make_unique<UnicodeNormalizer>(form, type);
}

absl::StatusOr<std::unique_ptr<Normalizer>> ParseAt(const nlohmann::json& spec,
                                                    const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  if (!spec.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected an object or null, got ", spec.type_name()));
  }
  auto type_it = spec.find("type");
  if (type_it == spec.end() || !type_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".type: missing or not a string"));
  }
  const std::string type = type_it->get<std::string>();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return MakeUnicodeNormalizer(type);
  }
  if (type == "Sequence") {
    auto list = spec.find("normalizers");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".normalizers: missing or not an array"));
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<Normalizer> step,
          ParseAt((*list)[i], absl::StrCat(where, ".normalizers[", i, "]")));
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(
        new SequenceNormalizer(std::move(steps)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".type: unsupported normalizer '", type,
                   "' (supported: NFC, NFD, NFKC, NFKD, Sequence)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(
    const nlohmann::json& spec) {
  return ParseAt(spec, "normalizer");
}

absl::StatusOr<std::string> NormalizeNfc(const std::string& text) {
  ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> nfc,
                   MakeUnicodeNormalizer("NFC"));
  std::string out = text;
  RETURN_IF_ERROR(nfc->Normalize(&out));
  return out;
}

}  // namespace dedit
