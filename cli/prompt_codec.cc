#include "cli/prompt_codec.h"

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {

struct PromptCodec::Impl {
  std::unique_ptr<Tokenizer> tokenizer;

  absl::Status Need(absl::string_view what) const {
    if (tokenizer != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(what, " need a tokenizer.json"));
  }
};

PromptCodec::PromptCodec() : impl_(std::make_unique<Impl>()) {}
PromptCodec::~PromptCodec() = default;

absl::Status PromptCodec::Load(const std::string& path, bool required) {
  // stat, never open, to test for presence: opening a FIFO blocks, and
  // FromFile refuses anything that is not a regular file.
  if (PathExists(path)) {
    ASSIGN_OR_RETURN(impl_->tokenizer, Tokenizer::FromFile(path));
  } else if (required) {
    return absl::NotFoundError("tokenizer not found: " + path);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptCodec::EncodeText(
    const std::string& text, bool chat) const {
  if (chat) return EncodeChat({{"user", text}});
  RETURN_IF_ERROR(impl_->Need("text prompts"));
  return impl_->tokenizer->Encode(text);
}

absl::StatusOr<std::vector<int32_t>> PromptCodec::EncodeChat(
    const std::vector<Message>& messages) const {
  RETURN_IF_ERROR(impl_->Need("chat prompts"));
  std::vector<ChatMessage> chat;
  for (const auto& [role, content] : messages) chat.push_back({role, content});
  ChatTemplateOptions options;
  options.enable_thinking = false;
  return EncodeQwen3Chat(*impl_->tokenizer, chat, options);
}

std::string PromptCodec::Decode(const std::vector<int32_t>& ids) const {
  if (impl_->tokenizer == nullptr) return "";
  auto text = impl_->tokenizer->Decode(ids);
  return text.ok() ? *text : "";
}

}  // namespace dedit
