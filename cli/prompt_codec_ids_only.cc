// PromptCodec for builds without the tokenizer (scripts/device_check.sh:
// no PCRE2 or ICU on the GPU image): token ids only; text is refused.
#include "cli/prompt_codec.h"

namespace dedit {

struct PromptCodec::Impl {};

PromptCodec::PromptCodec() = default;
PromptCodec::~PromptCodec() = default;

absl::Status PromptCodec::Load(const std::string& path, bool required) {
  if (!required) return absl::OkStatus();
  return absl::UnimplementedError(
      "this dedit-generate is built without the tokenizer: --tokenizer " +
      path + " cannot be loaded; send token ids");
}

absl::StatusOr<std::vector<int32_t>> PromptCodec::EncodeText(const std::string&,
                                                             bool) const {
  return absl::UnimplementedError(
      "this dedit-generate is built without the tokenizer: send token ids");
}

absl::StatusOr<std::vector<int32_t>> PromptCodec::EncodeChat(
    const std::vector<Message>&) const {
  return EncodeText("", true);
}

std::string PromptCodec::Decode(const std::vector<int32_t>&) const {
  return "";
}

}  // namespace dedit
