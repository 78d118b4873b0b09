// Text in and out of dedit-generate: the target's tokenizer.json and the
// Qwen3 chat template (common/tokenizer/), behind a small interface so that
// the GPU check (scripts/device_check.sh), which builds without PCRE2 and
// ICU, links prompt_codec_ids_only.cc instead and runs on token ids alone.
// CMake builds link prompt_codec.cc.
#ifndef DEDIT_CLI_PROMPT_CODEC_H_
#define DEDIT_CLI_PROMPT_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dedit {

class PromptCodec {
 public:
  // (role, content) of one chat message.
  using Message = std::pair<std::string, std::string>;

  PromptCodec();
  ~PromptCodec();

  // Loads the tokenizer at `path` if it exists; NOT_FOUND if it does not
  // and `required`. Without one, only token ids work.
  absl::Status Load(const std::string& path, bool required);

  // Plain text, or the text as one user message of the chat template.
  absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& text,
                                                  bool chat) const;
  // The Qwen3 chat template, thinking off (as the DFlash/DEdit evaluation
  // protocol runs Qwen3), with the generation prompt.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(
      const std::vector<Message>& messages) const;
  // "" without a tokenizer or for ids it cannot decode.
  std::string Decode(const std::vector<int32_t>& ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dedit

#endif  // DEDIT_CLI_PROMPT_CODEC_H_
