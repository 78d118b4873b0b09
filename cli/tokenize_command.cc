#include "cli/tokenize_command.h"

#include <cstdint>
#include <istream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {
namespace {

absl::StatusOr<nlohmann::json> ReadInputArray(std::istream& in) {
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(text, "input"));
  if (!doc.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: expected a JSON array, got ", doc.type_name()));
  }
  return doc;
}

absl::Status Encode(const Tokenizer& tokenizer, const nlohmann::json& input,
                    const EncodeOptions& options, nlohmann::json* output) {
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = absl::StrCat("input[", i, "]");
    if (!input[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected a string, got ", input[i].type_name()));
    }
    auto ids =
        tokenizer.Encode(input[i].get_ref<const std::string&>(), options);
    if (!ids.ok()) return Annotate(ids.status(), where);
    output->push_back(*std::move(ids));
  }
  return absl::OkStatus();
}

absl::Status Decode(const Tokenizer& tokenizer, const nlohmann::json& input,
                    const DecodeOptions& options, nlohmann::json* output) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = absl::StrCat("input[", i, "]");
    if (!input[i].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected an array of token ids, got ",
                       input[i].type_name()));
    }
    ids.clear();
    for (size_t j = 0; j < input[i].size(); ++j) {
      ASSIGN_OR_RETURN(
          int32_t id,
          JsonToTokenId(input[i][j], absl::StrCat(where, "[", j, "]")));
      ids.push_back(id);
    }
    auto text = tokenizer.Decode(ids, options);
    if (!text.ok()) return Annotate(text.status(), where);
    output->push_back(*std::move(text));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTokenizeCommand(const TokenizeCommandOptions& options,
                                std::istream& in, std::ostream& out) {
  if (options.tokenizer_path.empty()) {
    return absl::InvalidArgumentError("--tokenizer is required");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromFile(options.tokenizer_path));
  ASSIGN_OR_RETURN(nlohmann::json input, ReadInputArray(in));
  nlohmann::json output = nlohmann::json::array();
  if (options.decode) {
    DecodeOptions decode_options;
    decode_options.skip_special_tokens = options.skip_special_tokens;
    RETURN_IF_ERROR(Decode(*tokenizer, input, decode_options, &output));
  } else {
    EncodeOptions encode_options;
    encode_options.split_special_tokens = options.split_special_tokens;
    RETURN_IF_ERROR(Encode(*tokenizer, input, encode_options, &output));
  }
  // Decoded text is valid UTF-8 by construction; `replace` only guarantees
  // that dump() cannot throw.
  out << output.dump(-1, ' ', /*ensure_ascii=*/false,
                     nlohmann::json::error_handler_t::replace)
      << "\n";
  if (!out) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

}  // namespace dedit
