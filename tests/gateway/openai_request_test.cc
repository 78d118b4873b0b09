// OpenAI request bodies → GenerateRequest, and the error objects (no
// processes; openai_gateway_test.cc runs the real thing).
#include "gateway/openai_request.h"

#include <grpcpp/support/status.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gateway/openai_response.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using json = nlohmann::json;

ServedModel Served() {
  ServedModel m;
  m.name = "tiny";
  m.max_tokens_limit = 1000;
  m.default_chat_max_tokens = 300;
  return m;
}

std::optional<ApiError> Parse(Endpoint endpoint, const json& body,
                              OpenAiRequest* out) {
  return ParseOpenAiRequest(endpoint, body.dump(), Served(), out);
}

TEST(OpenAiRequestTest, CompletionFieldsReachTheGenerateRequest) {
  OpenAiRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions,
                     {{"model", "tiny"},
                      {"prompt", "Hello"},
                      {"max_tokens", 7},
                      {"temperature", 0.5},
                      {"top_p", 0.9},
                      {"top_k", 5},
                      {"seed", 42},
                      {"stop", "\n"},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}},
                      {"window", 4},
                      {"passes", 2},
                      {"disable_speculation", true}},
                     &r));
  const v1::GenerateRequest& g = r.generate;
  EXPECT_EQ(g.text(), "Hello");
  EXPECT_EQ(g.model(), "tiny");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 5);
  EXPECT_TRUE(g.sampling().has_seed());
  EXPECT_EQ(g.sampling().seed(), 42u);
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "\n");
  EXPECT_EQ(g.window(), 4);
  EXPECT_EQ(g.passes(), 2);
  EXPECT_TRUE(g.disable_speculation());
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequestTest, SpeculativeMethodByName) {
  const std::vector<std::pair<std::string, v1::SpeculativeMethod>> names = {
      {"model", v1::SPECULATIVE_METHOD_MODEL},
      {"ngram", v1::SPECULATIVE_METHOD_NGRAM},
      {"hybrid", v1::SPECULATIVE_METHOD_HYBRID}};
  for (const auto& [name, method] : names) {
    OpenAiRequest r;
    ASSERT_FALSE(Parse(Endpoint::kCompletions,
                       {{"prompt", "x"}, {"speculative_method", name}}, &r))
        << name;
    EXPECT_EQ(r.generate.speculative_method(), method) << name;
  }
  OpenAiRequest r;
  auto error = Parse(Endpoint::kCompletions,
                     {{"prompt", "x"}, {"speculative_method", "eagle"}}, &r);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->message.find("model, ngram or hybrid"), std::string::npos)
      << error->message;
  EXPECT_EQ(error->param, "speculative_method");
}

TEST(OpenAiRequestTest, OpenAiDefaults) {
  OpenAiRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions, {{"prompt", "x"}}, &r));
  EXPECT_EQ(r.generate.max_tokens(), 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(r.generate.sampling().temperature(), 1.0f);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_FALSE(r.stream);
  OpenAiRequest c;
  ASSERT_FALSE(Parse(Endpoint::kChatCompletions,
                     {{"messages", {{{"role", "user"}, {"content", "hi"}}}}},
                     &c));
  EXPECT_EQ(c.generate.max_tokens(), 300);
  EXPECT_TRUE(c.generate.chat().enable_thinking());  // Qwen3's default
}

TEST(OpenAiRequestTest, ChatMessagesPartsAndThinking) {
  OpenAiRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChatCompletions,
                     {{"messages",
                       {{{"role", "system"}, {"content", "Be brief."}},
                        {{"role", "user"},
                         {"content",
                          {{{"type", "text"}, {"text", "a"}},
                           {{"type", "text"}, {"text", "b"}}}}},
                        {{"role", "assistant"},
                         {"content", nullptr},
                         {"tool_calls", json::array()}}}},
                      {"max_completion_tokens", 9},
                      {"chat_template_kwargs", {{"enable_thinking", false}}}},
                     &r));
  const v1::ChatMessages& chat = r.generate.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(1).content(), "ab");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_FALSE(chat.enable_thinking());
  EXPECT_EQ(r.generate.max_tokens(), 9);
}

TEST(OpenAiRequestTest, NeutralValuesAreAccepted) {
  OpenAiRequest r;
  EXPECT_FALSE(Parse(Endpoint::kChatCompletions,
                     {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                      {"presence_penalty", 0},
                      {"frequency_penalty", 0.0},
                      {"logit_bias", json::object()},
                      {"user", "u"},
                      {"n", 1},
                      {"logprobs", false},
                      {"top_logprobs", 0},
                      {"tools", json::array()},
                      {"tool_choice", "none"},
                      {"response_format", {{"type", "text"}}},
                      {"stop", nullptr},
                      {"seed", nullptr}},
                     &r));
  EXPECT_FALSE(Parse(Endpoint::kCompletions,
                     {{"prompt", {"one"}},
                      {"echo", false},
                      {"best_of", 1},
                      {"logprobs", nullptr},
                      {"suffix", nullptr}},
                     &r));
}

TEST(OpenAiRequestTest, UnsupportedValuesName400Fields) {
  struct Case {
    Endpoint endpoint;
    json body;
    std::string param;
    int status = 400;
  };
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  const Case cases[] = {
      {Endpoint::kCompletions, {{"prompt", "x"}, {"n", 2}}, "n"},
      {Endpoint::kCompletions, {{"prompt", "x"}, {"logprobs", 1}}, "logprobs"},
      {Endpoint::kCompletions, {{"prompt", {"a", "b"}}}, "prompt"},
      {Endpoint::kCompletions, {{"prompt", "x"}, {"echo", true}}, "echo"},
      {Endpoint::kCompletions, {{"prompt", 3}}, "prompt"},
      {Endpoint::kCompletions, {{"max_tokens", 4}}, "prompt"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"max_tokens", 1.5}},
       "max_tokens"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"max_tokens", 0}},
       "max_tokens"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"temperature", "hot"}},
       "temperature"},
      {Endpoint::kCompletions, {{"prompt", "x"}, {"stop", {1}}}, "stop"},
      {Endpoint::kCompletions, {{"prompt", "x"}, {"window", 0}}, "window"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"stream_options", json::object()}},
       "stream_options"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"messages", msgs}},
       "messages"},
      {Endpoint::kCompletions,
       {{"prompt", "x"}, {"model", "big"}},
       "model",
       404},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"logprobs", true}},
       "logprobs"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"tools", {{{"type", "function"}}}}},
       "tools"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"tool_choice", "required"}},
       "tool_choice"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"presence_penalty", 1}},
       "presence_penalty"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"logit_bias", {{"1", 5}}}},
       "logit_bias"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"response_format", {{"type", "json_object"}}}},
       "response_format"},
      {Endpoint::kChatCompletions,
       {{"messages",
         {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "messages"},
      {Endpoint::kChatCompletions,
       {{"messages", {{{"role", "user"}, {"content", "x"}, {"name", "bob"}}}}},
       "messages"},
      {Endpoint::kChatCompletions,
       {{"messages", msgs}, {"max_tokens", 3}, {"max_completion_tokens", 4}},
       "max_completion_tokens"},
  };
  for (const Case& c : cases) {
    OpenAiRequest r;
    const std::optional<ApiError> e = Parse(c.endpoint, c.body, &r);
    ASSERT_TRUE(e.has_value()) << c.body.dump();
    EXPECT_EQ(e->http_status, c.status) << c.body.dump();
    EXPECT_EQ(e->param, c.param) << c.body.dump() << ": " << e->message;
    const json body = json::parse(e->Body());
    EXPECT_TRUE(body["error"].contains("message"));
    EXPECT_TRUE(body["error"].contains("type"));
    EXPECT_TRUE(body["error"].contains("code"));
    EXPECT_EQ(body["error"]["param"], c.param);
  }
}

TEST(OpenAiRequestTest, MalformedBodiesAre400) {
  OpenAiRequest r;
  for (const char* body : {"", "{", "[1]", "\"x\"", "{\"prompt\": \"\xff\"}"}) {
    const std::optional<ApiError> e =
        ParseOpenAiRequest(Endpoint::kCompletions, body, Served(), &r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http_status, 400);
  }
}

// A value out of the wire's range is refused with the value as sent, not
// a clamped one the router would report.
TEST(OpenAiRequestTest, OutOfRangeValuesAreReportedAsSent) {
  OpenAiRequest r;
  auto e = Parse(Endpoint::kCompletions,
                 {{"prompt", "x"}, {"max_tokens", int64_t{1} << 31}}, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("got 2147483648"), std::string::npos) << e->message;
  e = Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"max_tokens", 1001}},
            &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("[1, 1000], got 1001"), std::string::npos)
      << e->message;
  const int64_t huge = int64_t{1} << 32;
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", {1, huge}}}, "prompt"},
           {{{"prompt", "x"}, {"window", huge}}, "window"},
           {{{"prompt", "x"}, {"passes", huge}}, "passes"},
           {{{"prompt", "x"}, {"top_k", -huge}}, "top_k"},
           {{{"prompt", "x"}, {"stop_token_ids", {huge}}}, "stop_token_ids"}}) {
    e = Parse(Endpoint::kCompletions, body, &r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param);
    EXPECT_NE(e->message.find(std::to_string(param == "top_k" ? -huge : huge)),
              std::string::npos)
        << e->message;
  }
}

TEST(ApiErrorTest, TransportErrorsNameNoAddress) {
  const ApiError e = ApiErrorFromGrpc(
      grpc::Status(grpc::StatusCode::UNAVAILABLE,
                   "failed to connect to all addresses; last error: UNKNOWN: "
                   "ipv4:10.0.3.7:50050: Failed to connect to remote host"),
      Endpoint::kCompletions);
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.message.find("10.0.3.7"), std::string::npos) << e.message;
  // The router's own reasons stay.
  EXPECT_EQ(ApiErrorFromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                          "no stack is serving"),
                             Endpoint::kCompletions)
                .message,
            "no stack is serving");
}

TEST(ApiErrorTest, RouterStatusesMapToHttp) {
  auto map = [](grpc::StatusCode code, const std::string& message) {
    return ApiErrorFromGrpc(grpc::Status(code, message),
                            Endpoint::kChatCompletions);
  };
  ApiError e = map(grpc::StatusCode::INVALID_ARGUMENT,
                   "sampling.temperature must be >= 0");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_EQ(map(grpc::StatusCode::INVALID_ARGUMENT,
                "chat.messages[0].role 'x' is not one of ...")
                .param,
            "messages");
  EXPECT_EQ(map(grpc::StatusCode::INVALID_ARGUMENT,
                "prompt of 2000 tokens exceeds the context limit")
                .param,
            "messages");
  EXPECT_EQ(map(grpc::StatusCode::RESOURCE_EXHAUSTED, "kv full").http_status,
            429);
  EXPECT_EQ(map(grpc::StatusCode::UNAVAILABLE, "down").http_status, 503);
  EXPECT_EQ(map(grpc::StatusCode::DEADLINE_EXCEEDED, "late").http_status, 504);
  EXPECT_EQ(map(grpc::StatusCode::INTERNAL, "bug").http_status, 500);
}

TEST(OpenAiResponseTest, StreamChunksAndUsage) {
  OpenAiResponse response(Endpoint::kChatCompletions, "tiny",
                          /*include_usage=*/true);
  v1::GenerateResponse a;
  a.set_text("Hel");
  v1::GenerateResponse b;
  b.set_text("lo");
  b.set_finished(true);
  b.set_finish_reason(v1::FINISH_REASON_STOP);
  b.mutable_usage()->set_prompt_tokens(5);
  b.mutable_usage()->set_completion_tokens(2);
  b.mutable_acceptance()->set_rounds(1);
  const std::string events = response.StreamEvents(a) +
                             response.StreamEvents(b) + response.StreamEnd();
  std::vector<json> chunks;
  size_t at = 0;
  while ((at = events.find("data: ", at)) != std::string::npos) {
    const size_t end = events.find("\n\n", at);
    const std::string data = events.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    chunks.push_back(json::parse(data));
  }
  ASSERT_EQ(chunks.size(), 5u);  // role, "Hel", "lo", finish, usage
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(chunks[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunks[3]["usage"].is_null());
  EXPECT_TRUE(chunks[4]["choices"].empty());
  EXPECT_EQ(chunks[4]["usage"]["total_tokens"], 7);
  EXPECT_EQ(chunks[4]["usage"]["acceptance"]["rounds"], 1);
  EXPECT_EQ(events.substr(events.size() - 14), "data: [DONE]\n\n");
}

}  // namespace
}  // namespace dedit
