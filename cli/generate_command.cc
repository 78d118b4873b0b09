#include "cli/generate_command.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "dedit/v1/services.grpc.pb.h"
#include "proto/grpc_status.h"

namespace dedit {
namespace {

constexpr char kUsage[] =
    "usage: dedit-cli generate --router HOST:PORT (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                          [--chat] [--thinking] [--max-tokens N]\n"
    "                          [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                          [--window W] [--passes K] [--no-speculation]\n"
    "                          [--stop STRING]... [--ignore-eos] [--model NAME]\n"
    "                          [--timeout-s S]\n";

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_CONTEXT_LIMIT: return "context_limit";
    default: return "unknown";
  }
}

}  // namespace

absl::Status RunGenerate(const GenerateCommandOptions& o, std::ostream& text_out,
                         std::ostream& stats_out) {
  auto channel =
      grpc::CreateChannel(o.router, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateRequest request;
  request.set_model(o.model);
  if (!o.prompt_ids.empty()) {
    request.mutable_token_ids()->mutable_ids()->Add(o.prompt_ids.begin(),
                                                    o.prompt_ids.end());
  } else if (o.chat) {
    v1::ChatMessage* m = request.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(o.prompt);
    request.mutable_chat()->set_enable_thinking(o.enable_thinking);
  } else {
    request.set_text(o.prompt);
  }
  request.set_max_tokens(o.max_tokens);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(o.temperature);
  s->set_top_k(o.top_k);
  s->set_top_p(o.top_p);
  if (o.seed >= 0) {
    s->set_has_seed(true);
    s->set_seed(static_cast<uint64_t>(o.seed));
  }
  request.set_window(o.window);
  request.set_passes(o.passes);
  request.set_disable_speculation(o.no_speculation);
  request.set_ignore_eos(o.ignore_eos);
  for (const std::string& stop : o.stop) request.add_stop(stop);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(o.timeout_s));
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  v1::GenerateResponse response, last;
  int tokens = 0;
  bool any_text = false;
  while (reader->Read(&response)) {
    tokens += response.token_ids_size();
    if (!response.text().empty()) {
      any_text = true;
      text_out << response.text();
    } else if (!any_text) {
      for (int32_t id : response.token_ids()) text_out << id << ' ';
    }
    text_out.flush();
    if (response.finished()) last = response;
  }
  const grpc::Status status = reader->Finish();
  text_out << '\n';
  if (!status.ok()) return FromGrpcStatus(status);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
  const v1::AcceptanceStats& a = last.acceptance();
  stats_out << absl::StrFormat(
      "[%d tokens, %.1f tokens/s, mean acceptance length %.2f, %d rounds "
      "(%d drafted, %d fallback), finish %s]\n",
      tokens, seconds > 0 ? tokens / seconds : 0.0, a.mean_acceptance_length(),
      a.rounds(), a.drafted_rounds(), a.fallback_rounds(),
      FinishName(last.finish_reason()));
  return absl::OkStatus();
}

int RunGenerateCommand(const std::vector<std::string>& args) {
  GenerateCommandOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto next = [&](std::string* out) {
      if (has_value) {
        *out = value;
        return true;
      }
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    auto bad = [&](const std::string& why) {
      std::fprintf(stderr, "dedit-cli generate: %s\n\n%s", why.c_str(), kUsage);
      return 2;
    };
    std::string v;
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "--chat") {
      o.chat = true;
    } else if (name == "--thinking") {
      o.enable_thinking = true;
    } else if (name == "--no-speculation") {
      o.no_speculation = true;
    } else if (name == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (!next(&v)) {
      return bad(name + " needs a value (or is unknown)");
    } else if (name == "--router") {
      o.router = v;
    } else if (name == "--model") {
      o.model = v;
    } else if (name == "--prompt") {
      o.prompt = v;
    } else if (name == "--prompt-ids") {
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(part, &id)) return bad("bad --prompt-ids");
        o.prompt_ids.push_back(id);
      }
    } else if (name == "--stop") {
      o.stop.push_back(v);
    } else if (name == "--max-tokens") {
      if (!absl::SimpleAtoi(v, &o.max_tokens)) return bad("bad --max-tokens");
    } else if (name == "--temperature") {
      if (!absl::SimpleAtof(v, &o.temperature)) return bad("bad --temperature");
    } else if (name == "--top-k") {
      if (!absl::SimpleAtoi(v, &o.top_k)) return bad("bad --top-k");
    } else if (name == "--top-p") {
      if (!absl::SimpleAtof(v, &o.top_p)) return bad("bad --top-p");
    } else if (name == "--seed") {
      if (!absl::SimpleAtoi(v, &o.seed)) return bad("bad --seed");
    } else if (name == "--window") {
      if (!absl::SimpleAtoi(v, &o.window)) return bad("bad --window");
    } else if (name == "--passes") {
      if (!absl::SimpleAtoi(v, &o.passes)) return bad("bad --passes");
    } else if (name == "--timeout-s") {
      if (!absl::SimpleAtoi(v, &o.timeout_s)) return bad("bad --timeout-s");
    } else {
      return bad("unknown flag '" + name + "'");
    }
  }
  if (o.prompt.empty() && o.prompt_ids.empty()) {
    std::fprintf(stderr, "dedit-cli generate: --prompt or --prompt-ids is required\n\n%s",
                 kUsage);
    return 2;
  }
  const absl::Status status = RunGenerate(o, std::cout, std::cerr);
  if (!status.ok()) {
    std::fprintf(stderr, "dedit-cli generate: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace dedit
