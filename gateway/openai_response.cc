#include "gateway/openai_response.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dedit {
namespace {

using json = nlohmann::json;

std::string NewId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat(
      "%s-%016x%08x",
      endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", rng(),
      static_cast<uint32_t>(rng()));
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* FinishReason(v1::FinishReason reason) {
  // CONTEXT_LIMIT ends the generation for want of room, as OpenAI's length.
  return reason == v1::FINISH_REASON_STOP ? "stop" : "length";
}

std::string Event(const json& data) {
  return absl::StrCat(
      "data: ",
      data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      "\n\n");
}

constexpr char kDone[] = "data: [DONE]\n\n";

}  // namespace

OpenAiResponse::OpenAiResponse(Endpoint endpoint, std::string model,
                               bool include_usage)
    : endpoint_(endpoint),
      model_(std::move(model)),
      include_usage_(include_usage),
      id_(NewId(endpoint)),
      created_(UnixSeconds()) {}

json OpenAiResponse::Usage(const v1::GenerateResponse& last) {
  const v1::Usage& u = last.usage();
  const v1::AcceptanceStats& a = last.acceptance();
  json edits = json::array();
  for (const v1::EditOutcomes& e : a.edit_outcomes()) {
    edits.push_back({{"pass", e.pass()},
                     {"extended", e.extended()},
                     {"unchanged", e.unchanged()},
                     {"shortened", e.shortened()}});
  }
  json acceptance = {
      {"rounds", a.rounds()},
      {"drafted_rounds", a.drafted_rounds()},
      {"fallback_rounds", a.fallback_rounds()},
      {"lookup_rounds", a.lookup_rounds()},
      {"cut_rounds", a.cut_rounds()},
      {"skipped_rounds", a.skipped_rounds()},
      {"reused_rounds", a.reused_rounds()},
      {"paused_rounds", a.paused_rounds()},
      {"draft_tokens", a.draft_tokens()},
      {"accepted_tokens", a.accepted_tokens()},
      {"mean_acceptance_length", a.mean_acceptance_length()},
      {"accepted_per_position",
       json(std::vector<int64_t>(a.accepted_per_position().begin(),
                                 a.accepted_per_position().end()))},
      {"edit_outcomes", edits}};
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"time_to_first_token_seconds", u.time_to_first_token_seconds()},
          {"duration_seconds", u.duration_seconds()},
          {"acceptance", acceptance}};
}

json OpenAiResponse::Chunk(json choice) const {
  json chunk = {{"id", id_},
                {"object", endpoint_ == Endpoint::kChatCompletions
                               ? "chat.completion.chunk"
                               : "text_completion"},
                {"created", created_},
                {"model", model_},
                {"choices", json::array({std::move(choice)})}};
  if (include_usage_) chunk["usage"] = nullptr;
  return chunk;
}

json OpenAiResponse::FinishFields(json choice) const {
  choice["finish_reason"] = FinishReason(last_.finish_reason());
  // vLLM's extension: the stop string (or "token:<id>") that ended it.
  choice["stop_reason"] =
      last_.stop_reason().empty() ? json() : json(last_.stop_reason());
  return choice;
}

std::string OpenAiResponse::StreamEvents(const v1::GenerateResponse& message) {
  std::string out;
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  auto choice = [&](json delta_or_text) {
    json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (chat) {
      c["delta"] = std::move(delta_or_text);
    } else {
      c["text"] = std::move(delta_or_text);
    }
    return c;
  };
  if (chat && !role_sent_) {
    role_sent_ = true;
    out += Event(Chunk(choice({{"role", "assistant"}, {"content", ""}})));
  }
  if (!message.text().empty()) {
    out += Event(Chunk(choice(chat ? json{{"content", message.text()}}
                                   : json(message.text()))));
  }
  if (message.finished()) {
    last_ = message;
    out += Event(Chunk(FinishFields(choice(chat ? json::object() : json("")))));
  }
  return out;
}

std::string OpenAiResponse::StreamEnd() const {
  std::string out;
  if (include_usage_) {
    json chunk = Chunk(json());
    chunk["choices"] = json::array();
    chunk["usage"] = Usage(last_);
    out += Event(chunk);
  }
  return out + kDone;
}

std::string OpenAiResponse::StreamError(const ApiError& error) {
  return absl::StrCat("data: ", error.Body(), "\n\n", kDone);
}

void OpenAiResponse::Append(const v1::GenerateResponse& message) {
  text_ += message.text();
  if (message.finished()) last_ = message;
}

std::string OpenAiResponse::Body() const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  json body = {{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", json::array({FinishFields(choice)})},
               {"usage", Usage(last_)}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dedit
