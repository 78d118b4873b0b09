#include "gateway/openai_request.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dedit {
namespace {

using json = nlohmann::json;

const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

ApiError WrongType(const std::string& param, const char* expected,
                   const json& v) {
  return ApiError::Invalid(
      absl::StrCat(param, " must be ", expected, ", got ", TypeName(v)), param);
}

ApiError Unsupported(const std::string& param, const std::string& why) {
  return ApiError::Invalid(
      absl::StrCat(param, ": ", why, " (not supported by this server)"), param);
}

// Reads one optional field of the request object; absent and null read as
// "not given". Each accessor returns an error for a wrong type.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  const json* Get(const std::string& name) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<ApiError> Bool(const std::string& name,
                               std::optional<bool>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }
  std::optional<ApiError> Int(const std::string& name,
                              std::optional<int64_t>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return ApiError::Invalid(absl::StrCat(name, " is out of range"), name);
    }
    *out = v->get<int64_t>();
    return std::nullopt;
  }
  std::optional<ApiError> Number(const std::string& name,
                                 std::optional<double>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    *out = v->get<double>();
    return std::nullopt;
  }
  std::optional<ApiError> String(const std::string& name,
                                 std::optional<std::string>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return WrongType(name, "a string", *v);
    *out = v->get<std::string>();
    return std::nullopt;
  }
  // The first field of the object that no accessor asked for.
  std::optional<std::string> Unknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (seen_.count(it.key()) == 0) return it.key();
    }
    return std::nullopt;
  }

 private:
  const json& object_;
  std::set<std::string> seen_;
};

#define RETURN_IF_API_ERROR(expr)                       \
  do {                                                  \
    if (std::optional<ApiError> e_ = (expr)) return e_; \
  } while (0)

// `v` for an int32 field of the wire. Out of its range, an error naming
// `param` and the value as the client sent it: clamped, the router would
// see, and report, another value than the one sent.
std::optional<ApiError> ToInt32(const std::string& param, int64_t v,
                                int32_t* out) {
  if (v < std::numeric_limits<int32_t>::min() ||
      v > std::numeric_limits<int32_t>::max()) {
    return ApiError::Invalid(absl::StrCat(param, " = ", v, " is out of range"),
                             param);
  }
  *out = static_cast<int32_t>(v);
  return std::nullopt;
}

// Fields OpenAI defines whose only supported value is the neutral one.
std::optional<ApiError> CheckNeutralFields(Fields& f, Endpoint endpoint) {
  std::optional<int64_t> n;
  RETURN_IF_API_ERROR(f.Int("n", &n));
  if (n && *n != 1) return Unsupported("n", "only n = 1 is served");
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> penalty;
    RETURN_IF_API_ERROR(f.Number(name, &penalty));
    if (penalty && *penalty != 0) {
      return Unsupported(name, "only 0 is served");
    }
  }
  std::optional<double> repetition;
  RETURN_IF_API_ERROR(f.Number("repetition_penalty", &repetition));
  if (repetition && *repetition != 1) {
    return Unsupported("repetition_penalty", "only 1 is served");
  }
  if (const json* bias = f.Get("logit_bias")) {
    if (!bias->is_object()) return WrongType("logit_bias", "an object", *bias);
    if (!bias->empty()) return Unsupported("logit_bias", "must be empty");
  }
  std::optional<std::string> user;
  RETURN_IF_API_ERROR(f.String("user", &user));
  if (endpoint == Endpoint::kCompletions) {
    // Completions: logprobs is the number of alternatives (0 already asks
    // for the sampled tokens' log-probabilities); echo, best_of, suffix.
    if (const json* logprobs = f.Get("logprobs")) {
      if (!(logprobs->is_boolean() && !logprobs->get<bool>())) {
        return Unsupported("logprobs", "log-probabilities are not returned");
      }
    }
    std::optional<bool> echo;
    RETURN_IF_API_ERROR(f.Bool("echo", &echo));
    if (echo.value_or(false)) return Unsupported("echo", "must be false");
    std::optional<int64_t> best_of;
    RETURN_IF_API_ERROR(f.Int("best_of", &best_of));
    if (best_of && *best_of != 1) return Unsupported("best_of", "must be 1");
    std::optional<std::string> suffix;
    RETURN_IF_API_ERROR(f.String("suffix", &suffix));
    if (suffix && !suffix->empty()) {
      return Unsupported("suffix", "insertion is not served");
    }
    return std::nullopt;
  }
  std::optional<bool> logprobs;
  RETURN_IF_API_ERROR(f.Bool("logprobs", &logprobs));
  if (logprobs.value_or(false)) {
    return Unsupported("logprobs", "log-probabilities are not returned");
  }
  std::optional<int64_t> top_logprobs;
  RETURN_IF_API_ERROR(f.Int("top_logprobs", &top_logprobs));
  if (top_logprobs.value_or(0) != 0) {
    return Unsupported("top_logprobs", "log-probabilities are not returned");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* tools = f.Get(name)) {
      if (!tools->is_array()) return WrongType(name, "an array", *tools);
      if (!tools->empty()) return Unsupported(name, "tool calling");
    }
  }
  if (const json* choice = f.Get("tool_choice")) {
    if (!(choice->is_string() && (*choice == "none" || *choice == "auto"))) {
      return Unsupported("tool_choice", "tool calling");
    }
  }
  if (const json* call = f.Get("function_call")) {
    if (!(call->is_string() && (*call == "none" || *call == "auto"))) {
      return Unsupported("function_call", "tool calling");
    }
  }
  std::optional<bool> parallel;
  RETURN_IF_API_ERROR(f.Bool("parallel_tool_calls", &parallel));
  if (const json* format = f.Get("response_format")) {
    if (!format->is_object()) {
      return WrongType("response_format", "an object", *format);
    }
    if (format->size() != 1 || format->value("type", json()) != "text") {
      return Unsupported("response_format",
                         "only {\"type\": \"text\"} is served");
    }
  }
  std::optional<bool> store;
  RETURN_IF_API_ERROR(f.Bool("store", &store));
  if (store.value_or(false)) return Unsupported("store", "must be false");
  if (const json* metadata = f.Get("metadata")) {
    if (!metadata->is_object()) {
      return WrongType("metadata", "an object", *metadata);
    }
    if (!metadata->empty()) return Unsupported("metadata", "must be empty");
  }
  if (const json* modalities = f.Get("modalities")) {
    if (*modalities != json::array({"text"})) {
      return Unsupported("modalities", "only [\"text\"] is served");
    }
  }
  for (const char* name :
       {"audio", "prediction", "reasoning_effort", "web_search_options"}) {
    if (f.Get(name) != nullptr) return Unsupported(name, "must be absent");
  }
  std::optional<std::string> tier;
  RETURN_IF_API_ERROR(f.String("service_tier", &tier));
  if (tier && *tier != "auto" && *tier != "default") {
    return Unsupported("service_tier", "only auto and default are served");
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(Fields& f, v1::GenerateRequest* out) {
  const json* prompt = f.Get("prompt");
  if (prompt == nullptr) {
    return ApiError::Invalid("prompt is required", "prompt");
  }
  // A list of one string, or a list of token ids; a list of several prompts
  // is a batch, which would need n > 1 choices.
  const json* one = prompt;
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() != 1) {
      return Unsupported("prompt", "a batch of several prompts");
    }
    one = &(*prompt)[0];
  }
  if (one->is_string()) {
    out->set_text(one->get<std::string>());
    return std::nullopt;
  }
  if (one->is_array()) {
    auto* ids = out->mutable_token_ids()->mutable_ids();
    for (const json& id : *one) {
      if (!id.is_number_integer()) {
        return ApiError::Invalid(
            "prompt must be a string, a list of one string or a list of "
            "token ids",
            "prompt");
      }
      int32_t t = 0;
      RETURN_IF_API_ERROR(ToInt32("prompt", id.get<int64_t>(), &t));
      ids->Add(t);
    }
    return std::nullopt;
  }
  return WrongType("prompt", "a string or an array", *one);
}

// Message content: a string, or an array of {"type": "text", "text"} parts
// (concatenated); null only for an assistant turn.
std::optional<ApiError> MessageContent(const json& message,
                                       const std::string& param,
                                       std::string* out) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (message.value("role", "") == "assistant") return std::nullopt;
    return ApiError::Invalid(absl::StrCat(param, ".content is required"),
                             "messages");
  }
  if (it->is_string()) {
    *out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) {
    return ApiError::Invalid(
        absl::StrCat(param, ".content must be a string or an array of parts"),
        "messages");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    if (!part.is_object() || part.value("type", "") != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return ApiError::Invalid(
          absl::StrCat(param, ".content[", i,
                       "]: only {\"type\": \"text\", \"text\": ...} parts "
                       "are supported"),
          "messages");
    }
    out->append(part["text"].get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(Fields& f, v1::GenerateRequest* out) {
  const json* messages = f.Get("messages");
  if (messages == nullptr) {
    return ApiError::Invalid("messages is required", "messages");
  }
  if (!messages->is_array())
    return WrongType("messages", "an array", *messages);
  v1::ChatMessages* chat = out->mutable_chat();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return ApiError::Invalid(absl::StrCat(param, " must be an object"),
                               "messages");
    }
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& key = it.key();
      if (key == "role" || key == "content" || key == "tool_call_id") continue;
      const bool empty = it->is_null() || (it->is_array() && it->empty()) ||
                         (it->is_string() && it->get<std::string>().empty());
      if ((key == "name" || key == "tool_calls") && empty) continue;
      return ApiError::Invalid(
          absl::StrCat(param, ".", key, " is not supported by this server"),
          "messages");
    }
    if (!m.contains("role") || !m["role"].is_string()) {
      return ApiError::Invalid(absl::StrCat(param, ".role must be a string"),
                               "messages");
    }
    v1::ChatMessage* message = chat->add_messages();
    message->set_role(m["role"].get<std::string>());
    RETURN_IF_API_ERROR(MessageContent(m, param, message->mutable_content()));
  }
  // Qwen3's template thinks unless told otherwise (vLLM's default too).
  chat->set_enable_thinking(true);
  if (const json* kwargs = f.Get("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return WrongType("chat_template_kwargs", "an object", *kwargs);
    }
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      const std::string param = "chat_template_kwargs." + it.key();
      if (it.key() != "enable_thinking") {
        return Unsupported(param, "the Qwen3 template takes enable_thinking");
      }
      if (!it->is_boolean()) return WrongType(param, "a boolean", *it);
      chat->set_enable_thinking(it->get<bool>());
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseSampling(Fields& f, v1::GenerateRequest* out) {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k, seed;
  RETURN_IF_API_ERROR(f.Number("temperature", &temperature));
  RETURN_IF_API_ERROR(f.Number("top_p", &top_p));
  RETURN_IF_API_ERROR(f.Int("top_k", &top_k));
  RETURN_IF_API_ERROR(f.Int("seed", &seed));
  v1::SamplingParams* s = out->mutable_sampling();
  // OpenAI's defaults: temperature 1, top_p 1.
  s->set_temperature(static_cast<float>(temperature.value_or(1.0)));
  s->set_top_p(static_cast<float>(top_p.value_or(1.0)));
  // vLLM spells "off" -1; the router 0.
  int32_t k = 0;
  if (top_k && *top_k != -1) RETURN_IF_API_ERROR(ToInt32("top_k", *top_k, &k));
  s->set_top_k(k);
  if (seed) {
    s->set_has_seed(true);
    s->set_seed(static_cast<uint64_t>(*seed));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStops(Fields& f, v1::GenerateRequest* out) {
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      out->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return WrongType("stop", "a list of strings", s);
        out->add_stop(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or a list of strings", *stop);
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array", *ids);
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return WrongType("stop_token_ids", "a list of integers", id);
      }
      int32_t t = 0;
      RETURN_IF_API_ERROR(ToInt32("stop_token_ids", id.get<int64_t>(), &t));
      out->add_stop_token_ids(t);
    }
  }
  std::optional<bool> ignore_eos;
  RETURN_IF_API_ERROR(f.Bool("ignore_eos", &ignore_eos));
  out->set_ignore_eos(ignore_eos.value_or(false));
  return std::nullopt;
}

// dedit's extensions: window (W), passes (K), disable_speculation,
// speculative_method ("model", "ngram" or "hybrid").
std::optional<ApiError> ParseSpeculation(Fields& f, v1::GenerateRequest* out) {
  std::optional<int64_t> window, passes;
  std::optional<bool> disable;
  std::optional<std::string> method;
  RETURN_IF_API_ERROR(f.Int("window", &window));
  RETURN_IF_API_ERROR(f.Int("passes", &passes));
  RETURN_IF_API_ERROR(f.Bool("disable_speculation", &disable));
  RETURN_IF_API_ERROR(f.String("speculative_method", &method));
  // 0 means "the router's default" on the wire, so the lower bound is
  // checked here; the upper bounds (block size, max passes) by the router.
  if (window) {
    if (*window < 1) {
      return ApiError::Invalid(
          absl::StrCat("window must be >= 1, got ", *window), "window");
    }
    int32_t w = 0;
    RETURN_IF_API_ERROR(ToInt32("window", *window, &w));
    out->set_window(w);
  }
  if (passes) {
    if (*passes < 1) {
      return ApiError::Invalid(
          absl::StrCat("passes must be >= 1, got ", *passes), "passes");
    }
    int32_t k = 0;
    RETURN_IF_API_ERROR(ToInt32("passes", *passes, &k));
    out->set_passes(k);
  }
  out->set_disable_speculation(disable.value_or(false));
  if (method) {
    if (*method == "model") {
      out->set_speculative_method(v1::SPECULATIVE_METHOD_MODEL);
    } else if (*method == "ngram") {
      out->set_speculative_method(v1::SPECULATIVE_METHOD_NGRAM);
    } else if (*method == "hybrid") {
      out->set_speculative_method(v1::SPECULATIVE_METHOD_HYBRID);
    } else {
      return ApiError::Invalid(
          absl::StrCat(
              "speculative_method must be model, ngram or hybrid, got '",
              *method, "'"),
          "speculative_method");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseOpenAiRequest(Endpoint endpoint,
                                           std::string_view body,
                                           const ServedModel& served,
                                           OpenAiRequest* out) {
  const json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return ApiError::Invalid("the request body is not valid JSON", "");
  }
  if (!root.is_object()) {
    return ApiError::Invalid("the request body must be a JSON object", "");
  }
  Fields f(root);
  out->endpoint = endpoint;
  v1::GenerateRequest& g = out->generate;

  std::optional<std::string> model;
  RETURN_IF_API_ERROR(f.String("model", &model));
  if (model && !model->empty() && *model != served.name) {
    ApiError e = ApiError::Invalid(absl::StrCat("The model '", *model,
                                                "' does not exist; this server "
                                                "serves '",
                                                served.name, "'"),
                                   "model");
    e.http_status = 404;
    e.code = "model_not_found";
    return e;
  }
  out->model = served.name;
  g.set_model(served.name);

  std::optional<bool> stream;
  RETURN_IF_API_ERROR(f.Bool("stream", &stream));
  out->stream = stream.value_or(false);
  if (const json* options = f.Get("stream_options")) {
    if (!options->is_object()) {
      return WrongType("stream_options", "an object", *options);
    }
    if (!out->stream) {
      return ApiError::Invalid("stream_options is only allowed with stream",
                               "stream_options");
    }
    Fields o(*options);
    std::optional<bool> include_usage;
    if (auto e = o.Bool("include_usage", &include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
    out->include_usage = include_usage.value_or(false);
    if (std::optional<std::string> unknown = o.Unknown()) {
      return Unsupported("stream_options." + *unknown, "unknown option");
    }
  }

  if (endpoint == Endpoint::kCompletions) {
    RETURN_IF_API_ERROR(ParsePrompt(f, &g));
  } else {
    RETURN_IF_API_ERROR(ParseMessages(f, &g));
  }

  std::optional<int64_t> max_tokens, max_completion_tokens;
  RETURN_IF_API_ERROR(f.Int("max_tokens", &max_tokens));
  if (endpoint == Endpoint::kChatCompletions) {
    RETURN_IF_API_ERROR(f.Int("max_completion_tokens", &max_completion_tokens));
  }
  if (max_completion_tokens) {
    if (max_tokens && *max_tokens != *max_completion_tokens) {
      return ApiError::Invalid(
          "max_tokens and max_completion_tokens disagree; send one",
          "max_completion_tokens");
    }
    max_tokens = max_completion_tokens;
  }
  if (max_tokens) {
    // Both bounds here, so that the message shows the value as sent (the
    // wire's field is int32; the router checks its limit again).
    if (*max_tokens < 1 || *max_tokens > served.max_tokens_limit) {
      const char* param =
          max_completion_tokens ? "max_completion_tokens" : "max_tokens";
      return ApiError::Invalid(
          absl::StrCat(param, " must be in [1, ", served.max_tokens_limit,
                       "], got ", *max_tokens),
          param);
    }
    g.set_max_tokens(static_cast<int32_t>(*max_tokens));
  } else if (endpoint == Endpoint::kCompletions) {
    g.set_max_tokens(std::min(16, served.max_tokens_limit));
  } else {
    g.set_max_tokens(
        std::min(served.default_chat_max_tokens, served.max_tokens_limit));
  }

  RETURN_IF_API_ERROR(ParseSampling(f, &g));
  RETURN_IF_API_ERROR(ParseStops(f, &g));
  RETURN_IF_API_ERROR(ParseSpeculation(f, &g));
  RETURN_IF_API_ERROR(CheckNeutralFields(f, endpoint));
  if (std::optional<std::string> unknown = f.Unknown()) {
    return ApiError::Invalid(
        absl::StrCat("Unrecognized request argument supplied: ", *unknown),
        *unknown);
  }
  return std::nullopt;
}

}  // namespace dedit
