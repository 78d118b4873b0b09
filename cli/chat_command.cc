#include "cli/chat_command.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "cli/router_call.h"
#include "common/base/status.h"
#include "proto/grpc_status.h"

namespace dedit {

absl::Status RunChat(const ChatCommandOptions& options, std::istream& in,
                     std::ostream& out, std::ostream& stats_out) {
  const GenerateCommandOptions& o = options.generate;
  v1::SessionRequest request;
  v1::SessionOpen* open = request.mutable_open();
  RETURN_IF_ERROR(SetGenerationFields(o, open));
  open->set_enable_thinking(o.enable_thinking);
  std::unique_ptr<v1::Generation::Stub> stub = RouterStub(o);
  grpc::ClientContext context;
  SetCommandDeadline(o, &context);
  auto stream = stub->Session(&context);
  auto fail = [&]() -> absl::Status {
    stream->WritesDone();
    v1::SessionResponse ignored;
    while (stream->Read(&ignored)) {
    }
    const grpc::Status status = stream->Finish();
    return status.ok() ? absl::UnavailableError("session ended")
                       : FromGrpcStatus(status);
  };
  v1::SessionResponse response;
  if (!stream->Write(request) || !stream->Read(&response) ||
      !response.has_opened()) {
    return fail();
  }
  bool system_pending = !options.system.empty();
  std::string line;
  while (true) {
    out << options.prompt_marker << std::flush;
    if (!std::getline(in, line)) break;
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text == "/quit" || text == "/exit") break;
    if (text.empty()) continue;
    request.Clear();
    v1::SessionTurn* turn = request.mutable_turn();
    turn->set_max_tokens(o.max_tokens);
    for (const std::string& stop : o.stop) turn->add_stop(stop);
    if (system_pending) {
      v1::ChatMessage* m = turn->mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(options.system);
      system_pending = false;
    }
    v1::ChatMessage* m = turn->mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(std::string(text));
    if (!stream->Write(request)) return fail();
    const auto t0 = std::chrono::steady_clock::now();
    int tokens = 0;
    v1::GenerateResponse last;
    bool finished = false;
    bool refused = false;
    while (!finished && stream->Read(&response)) {
      if (response.has_turn_error()) {
        // The turn failed alone; the session goes on with its history.
        stats_out << "[turn refused: " << response.turn_error().message()
                  << "]\n";
        stats_out.flush();
        refused = true;
        break;
      }
      const v1::GenerateResponse& r = response.response();
      tokens += r.token_ids_size();
      out << r.text() << std::flush;
      if (r.finished()) {
        last = r;
        finished = true;
      }
    }
    if (refused) {
      // A system message that came with the refused turn is sent again.
      system_pending =
          system_pending || (!options.system.empty() && response.turn() == 1);
      continue;
    }
    if (!finished) return fail();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    const v1::AcceptanceStats& a = last.acceptance();
    const v1::Usage& u = last.usage();
    out << '\n';
    stats_out << absl::StrFormat(
        "[turn %d: %d tokens, %.1f tokens/s, mean acceptance length %.2f, "
        "prompt %d tokens (%d cached%s), finish %s]\n",
        response.turn(), tokens, seconds > 0 ? tokens / seconds : 0.0,
        a.mean_acceptance_length(), u.prompt_tokens(), u.cached_prompt_tokens(),
        u.cache_lost() ? ", cache lost" : "",
        FinishReasonName(last.finish_reason()));
    stats_out.flush();
  }
  out << '\n';
  request.Clear();
  request.mutable_close();
  stream->Write(request);
  stream->WritesDone();
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  return status.ok() ? absl::OkStatus() : FromGrpcStatus(status);
}

}  // namespace dedit
