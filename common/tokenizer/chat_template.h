// The Qwen3 chat template, rendered in C++ instead of by a Jinja engine.
//
// Output is identical to HF's apply_chat_template(tokenize=False) with the
// template shipped in Qwen3's tokenizer_config.json, for conversations
// without tool definitions:
//   - a leading system message: "<|im_start|>system\n{content}<|im_end|>\n";
//   - user (and non-leading system) turns:
//     "<|im_start|>{role}\n{content}<|im_end|>\n";
//   - assistant turns: reasoning is taken from `reasoning_content`, or split
//     out of "<think>...</think>" in the content. It is kept (as
//     "<think>\n{reasoning}\n</think>\n\n") only for assistant turns after
//     the last real user query, i.e. the turn being continued in a
//     multi-step tool call; earlier turns show the answer only;
//   - consecutive tool turns are wrapped into one user turn, each as
//     "\n<tool_response>\n{content}\n</tool_response>";
//   - add_generation_prompt appends "<|im_start|>assistant\n", and with
//     enable_thinking=false also the empty think block
//     "<think>\n\n</think>\n\n" (ids 151667, 271, 151668, 271).
// A role other than system/user/assistant/tool is INVALID_ARGUMENT.
// Tool definitions ("# Tools" system preamble) and assistant tool_calls are
// not rendered yet.
//
//   std::vector<ChatMessage> chat = {{"system", "Be brief."},
//                                    {"user", "Hi!"}};
//   ChatTemplateOptions options;
//   options.enable_thinking = false;
//   ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
//                    EncodeQwen3Chat(*tokenizer, chat, options));
#ifndef DEDIT_TOKENIZER_CHAT_TEMPLATE_H_
#define DEDIT_TOKENIZER_CHAT_TEMPLATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool".
  std::string content;
  // Assistant reasoning given separately (OpenAI-style APIs); when set, the
  // content is used as is instead of being split at "</think>".
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  // false appends the empty think block after the generation prompt, which
  // is how Qwen3 is told not to reason (the evaluation protocol's setting).
  bool enable_thinking = true;
  // Whether enable_thinking = false renders that empty block. Always true
  // in RenderQwen3Chat's HF-identical output; EncodeQwen3Chat clears it
  // for a tokenizer without a <think> token (see there).
  bool render_empty_think_block = true;
  // Whether special-token text inside message content (say
  // "<|im_start|>system") is encoded as that special token. Off by default:
  // then only the template's own <|im_start|>/<|im_end|> are special ids,
  // so a user cannot forge a turn. HF's apply_chat_template matches them
  // (true); vLLM users ask for the same switch.
  bool special_tokens_in_content = false;
};

// Byte ranges [begin, end) of message text in a rendered prompt.
using ContentRanges = std::vector<std::pair<size_t, size_t>>;

// The prompt text. INVALID_ARGUMENT for an unknown role, naming the message.
absl::StatusOr<std::string> RenderQwen3Chat(
    absl::Span<const ChatMessage> messages, const ChatTemplateOptions& options);
// Also notes where message text (content, reasoning) lies in the prompt.
absl::StatusOr<std::string> RenderQwen3Chat(
    absl::Span<const ChatMessage> messages, const ChatTemplateOptions& options,
    ContentRanges* content_ranges);

// RenderQwen3Chat followed by Tokenizer::Encode. The template's special
// tokens are matched; special-token text inside message content only with
// `special_tokens_in_content` (HF matches it; the default does not, and is
// otherwise identical). INVALID_ARGUMENT also for content that is not valid
// UTF-8.
//
// Convention for tokenizers without think tokens (the bundled tiny models,
// docs/TOKENIZER.md): a model that cannot think is always asked with
// thinking off, and the empty think block, which such a tokenizer would
// spell as plain text the model never saw, is not rendered. The prompt then
// ends with "<|im_start|>assistant\n", as in training/chat_tasks.py. Every
// chat path (the router, dedit-generate --chat) encodes through here.
absl::StatusOr<std::vector<int32_t>> EncodeQwen3Chat(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_CHAT_TEMPLATE_H_
