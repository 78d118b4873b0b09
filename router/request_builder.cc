#include "router/request_builder.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "tokenizer/chat_template.h"

namespace dedit {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// Text that cannot fit the context is refused before it is tokenized
// (issue 15: tokenizing a 64 MB prompt took 14.6 s).
absl::Status CheckTextBytes(int64_t bytes, const RequestLimits& limits,
                            absl::string_view field) {
  if (limits.max_prompt_bytes > 0 && bytes > limits.max_prompt_bytes) {
    return Invalid(absl::StrCat(
        field, " of ", bytes, " bytes cannot fit the context limit of ",
        limits.model.max_context, " tokens: at most ", limits.max_prompt_bytes,
        " bytes (max context x --max_bytes_per_token)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const v1::GenerateRequest& r,
                                               const RequestLimits& limits,
                                               const Tokenizer* tokenizer) {
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kTokenIds: {
      std::vector<int32_t> ids(r.token_ids().ids().begin(),
                               r.token_ids().ids().end());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.model.vocab_size) {
          return Invalid(absl::StrCat("token_ids[", i, "] = ", ids[i],
                                      " is outside the vocabulary [0, ",
                                      limits.model.vocab_size, ")"));
        }
      }
      return ids;
    }
    case v1::GenerateRequest::kText: {
      if (r.text().empty()) return Invalid("prompt text is empty");
      RETURN_IF_ERROR(CheckTextBytes(static_cast<int64_t>(r.text().size()),
                                     limits, "prompt text"));
      if (tokenizer == nullptr) {
        return Invalid(
            "this router has no tokenizer: send the prompt as token_ids");
      }
      auto ids = tokenizer->Encode(r.text());
      if (!ids.ok()) return Annotate(ids.status(), "prompt text");
      return ids;
    }
    case v1::GenerateRequest::kChat: {
      const v1::ChatMessages& chat = r.chat();
      if (chat.messages().empty()) return Invalid("chat has no messages");
      int64_t content_bytes = 0;
      for (const v1::ChatMessage& m : chat.messages()) {
        content_bytes += static_cast<int64_t>(m.content().size());
      }
      RETURN_IF_ERROR(
          CheckTextBytes(content_bytes, limits, "chat.messages content"));
      std::vector<ChatMessage> messages;
      for (int i = 0; i < chat.messages_size(); ++i) {
        const v1::ChatMessage& m = chat.messages(i);
        if (m.role() != "system" && m.role() != "user" &&
            m.role() != "assistant" && m.role() != "tool") {
          return Invalid(
              absl::StrCat("chat.messages[", i, "].role '", m.role(),
                           "' is not one of system, user, assistant, tool"));
        }
        messages.push_back({m.role(), m.content()});
      }
      if (tokenizer == nullptr) {
        return Invalid("this router has no tokenizer: chat prompts need one");
      }
      ChatTemplateOptions options;
      options.add_generation_prompt = true;
      options.enable_thinking = chat.enable_thinking();
      options.special_tokens_in_content = limits.chat_special_tokens_in_content;
      auto ids = EncodeQwen3Chat(*tokenizer, messages, options);
      if (!ids.ok()) return Annotate(ids.status(), "chat");
      return ids;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return Invalid("a prompt is required (text, chat or token_ids)");
}

}  // namespace

int MaxTokenBytes(const Tokenizer& tokenizer) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::optional<std::string> token = tokenizer.IdToToken(id);
    if (token.has_value()) longest = std::max(longest, token->size());
  }
  return static_cast<int>(longest);
}

absl::StatusOr<RouterRequest> BuildRouterRequest(const v1::GenerateRequest& r,
                                                 const RequestLimits& limits,
                                                 const Tokenizer* tokenizer) {
  if (!r.model().empty() && r.model() != limits.model.name) {
    return Invalid(absl::StrCat("unknown model '", r.model(),
                                "'; this router serves '", limits.model.name,
                                "'"));
  }
  RouterRequest out;
  ASSIGN_OR_RETURN(out.engine.prompt, PromptIds(r, limits, tokenizer));
  if (out.engine.prompt.empty()) return Invalid("prompt is empty");
  const int64_t prompt_len = static_cast<int64_t>(out.engine.prompt.size());
  if (prompt_len >= limits.model.max_context) {
    return Invalid(absl::StrCat("prompt of ", prompt_len,
                                " tokens exceeds the context limit: at most ",
                                limits.model.max_context - 1, " tokens"));
  }
  if (r.max_tokens() <= 0 || r.max_tokens() > limits.max_tokens_limit) {
    return Invalid(absl::StrCat("max_tokens must be in [1, ",
                                limits.max_tokens_limit, "], got ",
                                r.max_tokens()));
  }
  out.engine.max_new_tokens = r.max_tokens();

  const v1::SamplingParams& s = r.sampling();
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return Invalid("sampling.temperature must be >= 0");
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k must be >= 0");
  if (!std::isfinite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return Invalid("sampling.top_p must be in (0, 1] (0 = off)");
  }
  out.engine.sampling.temperature = s.temperature();
  out.engine.sampling.top_k = s.top_k();
  out.engine.sampling.top_p = s.top_p() == 0 ? 1.0f : s.top_p();
  out.engine.sampling.has_seed = s.has_seed();
  out.engine.sampling.seed = s.seed();

  if (r.stop_size() > limits.max_stop_strings) {
    return Invalid(absl::StrCat("stop has ", r.stop_size(),
                                " strings; at most ", limits.max_stop_strings,
                                " (--max_stop_strings)"));
  }
  for (int i = 0; i < r.stop_size(); ++i) {
    if (r.stop(i).empty())
      return Invalid(absl::StrCat("stop[", i, "] is empty"));
    if (r.stop(i).size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
      return Invalid(absl::StrCat(
          "stop[", i, "] is ", r.stop(i).size(), " bytes; at most ",
          limits.max_stop_string_bytes, " (--max_stop_string_bytes)"));
    }
    out.stop_strings.push_back(r.stop(i));
  }
  for (int i = 0; i < r.stop_token_ids_size(); ++i) {
    const int32_t t = r.stop_token_ids(i);
    if (t < 0 || t >= limits.model.vocab_size) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "] = ", t,
                                  " is outside the vocabulary"));
    }
    out.engine.stop_token_ids.push_back(t);
  }
  out.engine.ignore_eos = r.ignore_eos();

  // Speculation: who drafts, then W and K within that drafter's limits.
  switch (r.speculative_method()) {
    case v1::SPECULATIVE_METHOD_UNSPECIFIED:
      out.engine.method = limits.default_method;
      break;
    case v1::SPECULATIVE_METHOD_MODEL:
      out.engine.method = DraftMethod::kModel;
      break;
    case v1::SPECULATIVE_METHOD_NGRAM:
      out.engine.method = DraftMethod::kNgram;
      break;
    case v1::SPECULATIVE_METHOD_HYBRID:
      out.engine.method = DraftMethod::kHybrid;
      break;
    default:
      return Invalid(absl::StrCat("speculative_method ", r.speculative_method(),
                                  " is unknown"));
  }
  if (r.window() < 0) {
    return Invalid(absl::StrCat("window must be >= 1, got ", r.window()));
  }
  if (r.passes() < 0) {
    return Invalid(absl::StrCat("passes (K) must be >= 1, got ", r.passes()));
  }
  if (r.passes() > limits.max_passes) {
    return Invalid(absl::StrCat("passes (K) must be at most ",
                                limits.max_passes, ", got ", r.passes()));
  }
  if (out.engine.method == DraftMethod::kNgram) {
    if (r.passes() > 1) {
      return Invalid(absl::StrCat(
          "passes (K) must be 1 with the n-gram method, got ", r.passes()));
    }
    if (r.window() > limits.ngram_max_window) {
      return Invalid(absl::StrCat("window ", r.window(),
                                  " exceeds the n-gram method's largest "
                                  "window ",
                                  limits.ngram_max_window));
    }
    out.engine.window =
        std::max(1, r.window() > 0 ? r.window() : limits.ngram_default_window);
    out.engine.passes = 1;
    out.speculate = !r.disable_speculation() && out.engine.window >= 2;
    return out;
  }
  if (limits.drafter_block_size > 0 && r.window() > limits.drafter_block_size) {
    return Invalid(absl::StrCat("window ", r.window(),
                                " exceeds the drafter's block size ",
                                limits.drafter_block_size));
  }
  if (out.engine.method == DraftMethod::kHybrid &&
      r.window() > limits.ngram_max_window) {
    return Invalid(absl::StrCat("window ", r.window(),
                                " exceeds the n-gram method's largest "
                                "window ",
                                limits.ngram_max_window));
  }
  int window = r.window() > 0 ? r.window() : limits.default_window;
  if (limits.drafter_block_size > 0) {
    window = std::min(window, limits.drafter_block_size);
  }
  out.engine.window = std::max(1, window);
  out.engine.passes = r.passes() > 0 ? r.passes() : limits.default_passes;
  out.speculate = !r.disable_speculation() && out.engine.window >= 2 &&
                  out.engine.passes >= 1;
  return out;
}

}  // namespace dedit
