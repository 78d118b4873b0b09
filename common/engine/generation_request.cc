#include "common/engine/generation_request.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dedit {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status CheckPrompt(const std::vector<int32_t>& prompt,
                         const RequestRules& rules) {
  if (prompt.empty()) return Invalid("prompt is empty");
  if (rules.vocab_size > 0) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= rules.vocab_size) {
        return Invalid(absl::StrCat("prompt token_ids[", i, "] = ", prompt[i],
                                    " is outside the vocabulary [0, ",
                                    rules.vocab_size, ")"));
      }
    }
  }
  const int64_t length = static_cast<int64_t>(prompt.size());
  if (length >= rules.max_context) {
    return Invalid(absl::StrCat("prompt of ", length,
                                " tokens exceeds the context limit: at most ",
                                rules.max_context - 1, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status CheckSpeculation(const GenerationRequest& r,
                              const RequestRules& rules) {
  if (r.window < 1) {
    return Invalid(absl::StrCat("window must be >= 1, got ", r.window));
  }
  if (r.passes < 0 || r.passes > rules.max_passes) {
    return Invalid(absl::StrCat("passes (K) must be in [0, ", rules.max_passes,
                                "], got ", r.passes));
  }
  if (r.method == DraftMethod::kNgram && r.passes > 1) {
    return Invalid(absl::StrCat(
        "passes (K) must be 0 or 1 with the n-gram method (it has one "
        "pass), got ",
        r.passes));
  }
  if (r.method != DraftMethod::kNgram && rules.drafter_block_size > 0 &&
      r.passes > 0 && r.window > rules.drafter_block_size) {
    return Invalid(absl::StrCat("window ", r.window,
                                " exceeds the drafter's block size ",
                                rules.drafter_block_size));
  }
  if (r.method != DraftMethod::kModel && r.window > rules.ngram_max_window) {
    return Invalid(absl::StrCat("window ", r.window,
                                " exceeds the n-gram method's largest window ",
                                rules.ngram_max_window));
  }
  return absl::OkStatus();
}

}  // namespace

const char* DraftMethodName(DraftMethod method) {
  switch (method) {
    case DraftMethod::kModel:
      return "model";
    case DraftMethod::kNgram:
      return "ngram";
    case DraftMethod::kHybrid:
      return "hybrid";
  }
  return "unknown";
}

bool DraftMethodFromName(absl::string_view name, DraftMethod* method) {
  for (DraftMethod m :
       {DraftMethod::kModel, DraftMethod::kNgram, DraftMethod::kHybrid}) {
    if (name == DraftMethodName(m)) {
      *method = m;
      return true;
    }
  }
  return false;
}

absl::Status ValidateRequest(const GenerationRequest& r,
                             const RequestRules& rules) {
  RETURN_IF_ERROR(CheckPrompt(r.prompt, rules));
  if (r.max_new_tokens <= 0 || r.max_new_tokens > rules.max_new_tokens_limit) {
    return Invalid(absl::StrCat("max_tokens must be in [1, ",
                                rules.max_new_tokens_limit, "], got ",
                                r.max_new_tokens));
  }
  RETURN_IF_ERROR(ValidateSamplingParams(r.sampling));
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    const int32_t t = r.stop_token_ids[i];
    if (t < 0 || (rules.vocab_size > 0 && t >= rules.vocab_size)) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "] = ", t,
                                  " is outside the vocabulary"));
    }
  }
  return CheckSpeculation(r, rules);
}

}  // namespace dedit
