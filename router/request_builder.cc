#include "router/request_builder.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/engine/generation_request.h"
#include "common/tokenizer/chat_template.h"

namespace dedit {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// Text that cannot fit the context is refused before it is tokenized:
// tokenizing tens of megabytes would hold the request's thread for seconds.
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
    case v1::GenerateRequest::kTokenIds:
      // Checked with the rest of the request (ValidateRequest).
      return std::vector<int32_t>(r.token_ids().ids().begin(),
                                  r.token_ids().ids().end());
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

absl::StatusOr<std::vector<std::string>> StopStrings(
    const v1::GenerateRequest& r, const RequestLimits& limits) {
  if (r.stop_size() > limits.max_stop_strings) {
    return Invalid(absl::StrCat("stop has ", r.stop_size(),
                                " strings; at most ", limits.max_stop_strings,
                                " (--max_stop_strings)"));
  }
  std::vector<std::string> stops;
  for (int i = 0; i < r.stop_size(); ++i) {
    if (r.stop(i).empty()) {
      return Invalid(absl::StrCat("stop[", i, "] is empty"));
    }
    if (r.stop(i).size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
      return Invalid(absl::StrCat(
          "stop[", i, "] is ", r.stop(i).size(), " bytes; at most ",
          limits.max_stop_string_bytes, " (--max_stop_string_bytes)"));
    }
    stops.push_back(r.stop(i));
  }
  return stops;
}

// Who drafts, then W and K where the request leaves them 0: the method's
// defaults (the model's default W clamped to the drafter's block size).
// What the request gives is checked by ValidateRequest, not clamped.
absl::Status ResolveSpeculation(const v1::GenerateRequest& r,
                                const RequestLimits& limits,
                                GenerationRequest* engine) {
  switch (r.speculative_method()) {
    case v1::SPECULATIVE_METHOD_UNSPECIFIED:
      engine->method = limits.default_method;
      break;
    case v1::SPECULATIVE_METHOD_MODEL:
      engine->method = DraftMethod::kModel;
      break;
    case v1::SPECULATIVE_METHOD_NGRAM:
      engine->method = DraftMethod::kNgram;
      break;
    case v1::SPECULATIVE_METHOD_HYBRID:
      engine->method = DraftMethod::kHybrid;
      break;
    default:
      return Invalid(absl::StrCat("speculative_method ", r.speculative_method(),
                                  " is unknown"));
  }
  if (engine->method == DraftMethod::kNgram) {
    engine->window =
        r.window() != 0 ? r.window() : std::max(1, limits.ngram_default_window);
    engine->passes = r.passes() != 0 ? r.passes() : 1;
    return absl::OkStatus();
  }
  int window = limits.default_window;
  if (limits.drafter_block_size > 0) {
    window = std::min(window, limits.drafter_block_size);
  }
  engine->window = r.window() != 0 ? r.window() : std::max(1, window);
  engine->passes = r.passes() != 0 ? r.passes() : limits.default_passes;
  return absl::OkStatus();
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
  out.engine.max_new_tokens = r.max_tokens();
  const v1::SamplingParams& s = r.sampling();
  out.engine.sampling.temperature = s.temperature();
  out.engine.sampling.top_k = s.top_k();
  out.engine.sampling.top_p = s.top_p() == 0 ? 1.0f : s.top_p();  // 0 = off
  out.engine.sampling.has_seed = s.has_seed();
  out.engine.sampling.seed = s.seed();
  ASSIGN_OR_RETURN(out.stop_strings, StopStrings(r, limits));
  out.engine.stop_token_ids.assign(r.stop_token_ids().begin(),
                                   r.stop_token_ids().end());
  out.engine.ignore_eos = r.ignore_eos();
  RETURN_IF_ERROR(ResolveSpeculation(r, limits, &out.engine));

  RequestRules rules;
  rules.vocab_size = limits.model.vocab_size;
  rules.max_context = limits.model.max_context;
  rules.max_new_tokens_limit = limits.max_tokens_limit;
  rules.max_passes = limits.max_passes;
  rules.drafter_block_size = limits.drafter_block_size;
  rules.ngram_max_window = limits.ngram_max_window;
  RETURN_IF_ERROR(ValidateRequest(out.engine, rules));
  out.speculate = !r.disable_speculation() && out.engine.window >= 2 &&
                  out.engine.passes >= 1;
  return out;
}

}  // namespace dedit
