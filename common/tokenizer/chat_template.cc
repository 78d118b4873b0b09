#include "common/tokenizer/chat_template.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dedit {
namespace {

constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n'), which the
// template applies to reasoning and answers.
absl::string_view LStripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
absl::string_view RStripNewlines(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
absl::string_view StripNewlines(absl::string_view s) {
  return RStripNewlines(LStripNewlines(s));
}

// s.split(sep)[-1] and s.split(sep)[0].
absl::string_view AfterLast(absl::string_view s, absl::string_view sep) {
  const size_t pos = s.rfind(sep);
  return pos == absl::string_view::npos ? s : s.substr(pos + sep.size());
}
absl::string_view BeforeFirst(absl::string_view s, absl::string_view sep) {
  const size_t pos = s.find(sep);
  return pos == absl::string_view::npos ? s : s.substr(0, pos);
}

bool IsToolResponseWrapped(absl::string_view content) {
  return absl::StartsWith(content, "<tool_response>") &&
         absl::EndsWith(content, "</tool_response>");
}

absl::Status CheckRoles(absl::Span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" &&
        role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat message ", i, ": unknown role '", role,
                       "' (expected system, user, assistant or tool)"));
    }
  }
  return absl::OkStatus();
}

// An assistant turn's reasoning and answer, as the template derives them.
struct AssistantParts {
  absl::string_view reasoning;
  absl::string_view content;
};

AssistantParts SplitReasoning(const ChatMessage& message) {
  AssistantParts parts{absl::string_view(), message.content};
  if (message.reasoning_content.has_value()) {
    parts.reasoning = *message.reasoning_content;
  } else if (absl::StrContains(message.content, kThinkClose)) {
    parts.reasoning = LStripNewlines(AfterLast(
        RStripNewlines(BeforeFirst(message.content, kThinkClose)), kThinkOpen));
    parts.content = LStripNewlines(AfterLast(message.content, kThinkClose));
  }
  return parts;
}

// Appends message text (not template text) to `out`, noting its byte
// range when `ranges` is set.
void AppendContent(absl::string_view text, std::string* out,
                   ContentRanges* ranges) {
  if (ranges != nullptr && !text.empty()) {
    ranges->push_back({out->size(), out->size() + text.size()});
  }
  out->append(text.data(), text.size());
}

void RenderAssistant(const AssistantParts& parts, bool keep_reasoning,
                     std::string* out, ContentRanges* ranges) {
  absl::StrAppend(out, "<|im_start|>assistant\n");
  if (keep_reasoning) {
    absl::StrAppend(out, "<think>\n");
    AppendContent(StripNewlines(parts.reasoning), out, ranges);
    absl::StrAppend(out, "\n</think>\n\n");
    AppendContent(LStripNewlines(parts.content), out, ranges);
  } else {
    AppendContent(parts.content, out, ranges);
  }
  absl::StrAppend(out, "<|im_end|>\n");
}

// The special tokens the template itself writes.
constexpr absl::string_view kTemplateSpecials[] = {"<|im_start|>",
                                                   "<|im_end|>"};

// Encodes the rendered prompt so that only the template's own special
// tokens (outside `ranges`) become special ids; text between them, message
// content included, is encoded with special tokens split as plain text.
// For content without special-token text the ids equal Encode(prompt).
absl::StatusOr<std::vector<int32_t>> EncodeTemplateSpecialsOnly(
    const Tokenizer& tokenizer, const std::string& prompt,
    const ContentRanges& ranges) {
  struct Special {
    size_t begin, end;
    int32_t id;
  };
  std::vector<Special> specials;
  for (absl::string_view token : kTemplateSpecials) {
    const std::optional<int32_t> id = tokenizer.TokenToId(std::string(token));
    if (!id.has_value()) continue;  // spelled as text by this tokenizer
    const absl::string_view text(prompt);
    for (size_t pos = text.find(token); pos != absl::string_view::npos;
         pos = text.find(token, pos + token.size())) {
      const size_t end = pos + token.size();
      bool in_content = false;
      for (const auto& [b, e] : ranges) {
        if (pos < e && end > b) in_content = true;
      }
      if (!in_content) specials.push_back({pos, end, *id});
    }
  }
  std::sort(
      specials.begin(), specials.end(),
      [](const Special& a, const Special& b) { return a.begin < b.begin; });
  EncodeOptions text_only;
  text_only.split_special_tokens = true;
  std::vector<int32_t> ids;
  size_t at = 0;
  auto encode_text = [&](size_t end) -> absl::Status {
    if (end <= at) return absl::OkStatus();
    ASSIGN_OR_RETURN(
        std::vector<int32_t> piece,
        tokenizer.Encode(absl::string_view(prompt).substr(at, end - at),
                         text_only));
    ids.insert(ids.end(), piece.begin(), piece.end());
    return absl::OkStatus();
  };
  for (const Special& s : specials) {
    RETURN_IF_ERROR(encode_text(s.begin));
    ids.push_back(s.id);
    at = s.end;
  }
  RETURN_IF_ERROR(encode_text(prompt.size()));
  return ids;
}

}  // namespace

absl::StatusOr<std::string> RenderQwen3Chat(
    absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  return RenderQwen3Chat(messages, options, nullptr);
}

absl::StatusOr<std::string> RenderQwen3Chat(
    absl::Span<const ChatMessage> messages, const ChatTemplateOptions& options,
    ContentRanges* content_ranges) {
  RETURN_IF_ERROR(CheckRoles(messages));
  const size_t n = messages.size();
  std::string out;
  if (n > 0 && messages[0].role == "system") {
    absl::StrAppend(&out, "<|im_start|>system\n");
    AppendContent(messages[0].content, &out, content_ranges);
    absl::StrAppend(&out, "<|im_end|>\n");
  }
  // The last "real" user query: tool results wrapped as user messages do
  // not count. Reasoning is shown only for assistant turns after it.
  size_t last_query_index = n == 0 ? 0 : n - 1;
  for (size_t i = n; i-- > 0;) {
    if (messages[i].role == "user" &&
        !IsToolResponseWrapped(messages[i].content)) {
      last_query_index = i;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user" || (message.role == "system" && i != 0)) {
      absl::StrAppend(&out, "<|im_start|>", message.role, "\n");
      AppendContent(message.content, &out, content_ranges);
      absl::StrAppend(&out, "<|im_end|>\n");
    } else if (message.role == "assistant") {
      const AssistantParts parts = SplitReasoning(message);
      // Jinja: loop.last or (not loop.last and reasoning_content).
      const bool keep_reasoning =
          i > last_query_index && (i + 1 == n || !parts.reasoning.empty());
      RenderAssistant(parts, keep_reasoning, &out, content_ranges);
    } else if (message.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") {
        absl::StrAppend(&out, "<|im_start|>user");
      }
      absl::StrAppend(&out, "\n<tool_response>\n");
      AppendContent(message.content, &out, content_ranges);
      absl::StrAppend(&out, "\n</tool_response>");
      if (i + 1 == n || messages[i + 1].role != "tool") {
        absl::StrAppend(&out, "<|im_end|>\n");
      }
    }
  }
  if (options.add_generation_prompt) {
    absl::StrAppend(&out, "<|im_start|>assistant\n");
    if (!options.enable_thinking && options.render_empty_think_block) {
      absl::StrAppend(&out, "<think>\n\n</think>\n\n");
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> EncodeQwen3Chat(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  ChatTemplateOptions o = options;
  if (!tokenizer.TokenToId(std::string(kThinkOpen)).has_value()) {
    o.enable_thinking = false;
    o.render_empty_think_block = false;
  }
  ContentRanges ranges;
  ASSIGN_OR_RETURN(std::string prompt, RenderQwen3Chat(messages, o, &ranges));
  auto ids = o.special_tokens_in_content
                 ? tokenizer.Encode(prompt)
                 : EncodeTemplateSpecialsOnly(tokenizer, prompt, ranges);
  if (!ids.ok()) return Annotate(ids.status(), "chat prompt");
  return ids;
}

}  // namespace dedit
