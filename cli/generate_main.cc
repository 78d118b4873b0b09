// dedit-generate: runs the in-process engine (target + DEdit drafter) and
// prints the output with acceptance statistics.
//
//   dedit-generate --target checkpoints/tiny/target --drafter
//   checkpoints/tiny/drafter \
//       --prompt_ids 1,2,3 --window 16 --passes 3 --max_tokens 64
//   dedit-generate ... --ar                      # target-only baseline
//   dedit-generate ... --json < prompts.jsonl    # one JSON object per line
//
// With --json each input line is a JSON array of token ids, or an object
// {"ids": [...]} / {"text": "..."} / {"messages": [{"role", "content"}]}
// (text and messages need the target's tokenizer.json); each output line is
// one JSON object with tokens, text, rounds, mean_acceptance_length,
// accepted_per_position, per-pass edit_outcomes and timings.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/command_flags.h"
#include "cli/prompt_codec.h"
#include "common/base/status.h"
#include "common/engine/speculation_flags.h"
#include "common/model/cpu/cpu_flags.h"
#include "common/model/in_process.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, target, "", "target model folder (HF format)");
ABSL_FLAG(std::string, drafter, "",
          "DEdit/DFlash drafter folder; empty → target-only");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json (default: <target>/tokenizer.json)");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated prompt token ids");
ABSL_FLAG(std::string, prompt, "", "prompt text (needs a tokenizer)");
ABSL_FLAG(bool, chat, false, "wrap --prompt in the Qwen3 chat template");
ABSL_FLAG(int, window, 16, "W: block size (1 → target-only)");
ABSL_FLAG(int, passes, 0,
          "K: drafter passes (0 → the checkpoint's num_passes)");
ABSL_FLAG(std::string, method, "model",
          "who drafts: model (--drafter), ngram (prompt lookup, no model; "
          "--drafter may be omitted) or hybrid (per round: prompt lookup "
          "when the last --hybrid_min_ngram tokens occurred before, else "
          "the model)");
ABSL_FLAG(int, max_tokens, 64, "new tokens per prompt");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0 = greedy)");
ABSL_FLAG(int, top_k, 0, "top-k (0 = off)");
ABSL_FLAG(double, top_p, 1.0, "top-p (1 = off)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (-1 = random)");
ABSL_FLAG(bool, ar, false, "target-only autoregressive baseline (W = 1)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(bool, causal_editor, false, "force the causal editor (ablation)");
ABSL_FLAG(bool, json, false,
          "read prompts from stdin, one per line; print JSON lines");
ABSL_FLAG(int, batch, 1, "prompts decoded concurrently in --json mode");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype: float32 or bfloat16");
ABSL_FLAG(int, threads, 2,
          "CPU compute threads: libtorch's and the weight-product pool's (0 = "
          "the machine's cores; common/model/cpu/cpu_flags.h)");

namespace dedit {
namespace {

using Json = nlohmann::json;

// Everything the command line asks for, read from the flags once.
struct GenerateOptions {
  InProcessStack::Options stack;
  int threads = 2;
  std::string tokenizer_path;  // empty: <target>/tokenizer.json if present
  bool tokenizer_required = false;
  // One prompt (--prompt or --prompt_ids), or JSON lines from stdin.
  bool json = false;
  int batch = 1;
  std::string prompt;
  bool chat = false;
  std::string prompt_ids;
  // Every request's settings but its prompt; passes < 0 takes the
  // drafter's checkpoint K once it is loaded.
  GenerationRequest request;
};

absl::StatusOr<GenerateOptions> ReadFlags() {
  GenerateOptions o;
  o.threads = absl::GetFlag(FLAGS_threads);
  o.stack.target_dir = absl::GetFlag(FLAGS_target);
  if (o.stack.target_dir.empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  GenerationRequest& r = o.request;
  const std::string method = absl::GetFlag(FLAGS_method);
  if (!DraftMethodFromName(method, &r.method)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--method must be model, ngram or hybrid, got '", method, "'"));
  }
  const bool ar = absl::GetFlag(FLAGS_ar);
  // The n-gram method needs no drafter; loading one would only add the
  // cost of streaming features to it.
  if (!ar && r.method != DraftMethod::kNgram) {
    o.stack.drafter_dir = absl::GetFlag(FLAGS_drafter);
  }
  o.stack.device = absl::GetFlag(FLAGS_device);
  o.stack.dtype = absl::GetFlag(FLAGS_dtype);
  if (absl::GetFlag(FLAGS_causal_editor)) o.stack.causal_editor = true;
  ASSIGN_OR_RETURN(o.stack.speculation, SpeculationOptionsFromFlags());

  o.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  o.tokenizer_required = !o.tokenizer_path.empty();
  if (o.tokenizer_path.empty()) {
    o.tokenizer_path = o.stack.target_dir + "/tokenizer.json";
  }
  o.json = absl::GetFlag(FLAGS_json);
  o.batch = std::max(1, absl::GetFlag(FLAGS_batch));
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.chat = absl::GetFlag(FLAGS_chat);
  o.prompt_ids = absl::GetFlag(FLAGS_prompt_ids);

  r.max_new_tokens = absl::GetFlag(FLAGS_max_tokens);
  r.window = ar ? 1 : absl::GetFlag(FLAGS_window);
  r.passes = absl::GetFlag(FLAGS_passes) > 0 ? absl::GetFlag(FLAGS_passes) : -1;
  if (r.method == DraftMethod::kNgram) r.passes = 1;
  if (ar) r.passes = 0;
  r.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  r.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  r.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    r.sampling.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
    r.sampling.has_seed = true;
  }
  return o;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const Json& j) {
  if (!j.is_array()) return absl::InvalidArgumentError("ids must be an array");
  std::vector<int32_t> ids;
  for (const Json& v : j) {
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError("ids must be integers");
    }
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

// A --json input line: an array of ids, or {"ids"}, {"text"} or
// {"messages": [{"role", "content"}]}.
absl::StatusOr<std::vector<int32_t>> EncodeLine(const std::string& line,
                                                const PromptCodec& codec) {
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("line is not JSON");
  if (j.is_array()) return ParseIds(j);
  if (!j.is_object()) {
    return absl::InvalidArgumentError("expected array or object");
  }
  if (j.contains("ids")) return ParseIds(j["ids"]);
  if (j.contains("text") && j["text"].is_string()) {
    return codec.EncodeText(j["text"].get<std::string>(), false);
  }
  if (j.contains("messages") && j["messages"].is_array()) {
    std::vector<PromptCodec::Message> chat;
    for (const Json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") ||
          !m["role"].is_string() || !m["content"].is_string()) {
        return absl::InvalidArgumentError(
            "message needs string role and content");
      }
      chat.emplace_back(m["role"].get<std::string>(),
                        m["content"].get<std::string>());
    }
    return codec.EncodeChat(chat);
  }
  return absl::InvalidArgumentError("expected ids, text or messages");
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view list) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad token id '", part, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

Json ResultJson(const GenerationResult& r, const PromptCodec& codec) {
  AcceptanceSummary s = Summarize(r.rounds);
  Json j;
  j["tokens"] = r.tokens;
  j["text"] = codec.Decode(r.tokens);
  j["finish_reason"] = FinishReasonName(r.finish);
  if (!r.status.ok()) j["error"] = r.status.ToString();
  j["prompt_tokens"] = r.prompt_tokens;
  j["rounds"] = s.rounds;
  j["drafted_rounds"] = s.drafted_rounds;
  j["fallback_rounds"] = s.fallback_rounds;
  j["lookup_rounds"] = s.lookup_rounds;
  j["cut_rounds"] = s.cut_rounds;
  j["skipped_rounds"] = s.skipped_rounds;
  j["reused_rounds"] = s.reused_rounds;
  j["paused_rounds"] = s.paused_rounds;
  j["mean_acceptance_length"] = s.mean_acceptance_length();
  j["accepted_per_position"] = s.accepted_per_position;
  Json edits = Json::array();
  for (size_t k = 0; k < s.edit_outcomes.size(); ++k) {
    edits.push_back({{"pass", k + 1},
                     {"extended", s.edit_outcomes[k][0]},
                     {"unchanged", s.edit_outcomes[k][1]},
                     {"shortened", s.edit_outcomes[k][2]}});
  }
  j["edit_outcomes"] = edits;
  const double decode_tokens = r.tokens.size() > 1 ? r.tokens.size() - 1 : 0;
  j["timings"] = {
      {"prefill_s", r.prefill_seconds},
      {"decode_s", r.decode_seconds},
      {"draft_s", s.draft_seconds},
      {"verify_s", s.verify_seconds},
      // Decode throughput excludes the prefill and its first token, as the
      // DFlash/DEdit protocol does.
      {"decode_tokens_per_s",
       r.decode_seconds > 0 ? decode_tokens / r.decode_seconds : 0.0}};
  return j;
}

void PrintHuman(const GenerationResult& r, const PromptCodec& codec) {
  AcceptanceSummary s = Summarize(r.rounds);
  std::printf("tokens:");
  for (int32_t t : r.tokens) std::printf(" %d", t);
  std::printf("\n");
  const std::string text = codec.Decode(r.tokens);
  if (!text.empty()) std::printf("text: %s\n", text.c_str());
  if (!r.status.ok()) std::printf("error: %s\n", r.status.ToString().c_str());
  const double decode_tokens = r.tokens.size() > 1 ? r.tokens.size() - 1 : 0;
  std::printf(
      "finish=%s prompt=%d generated=%zu rounds=%lld "
      "mean_acceptance_length=%.3f "
      "fallback_rounds=%lld\n",
      FinishReasonName(r.finish), r.prompt_tokens, r.tokens.size(),
      static_cast<long long>(s.rounds), s.mean_acceptance_length(),
      static_cast<long long>(s.fallback_rounds));
  std::printf(
      "prefill=%.4fs decode=%.4fs (%.1f tok/s) draft=%.4fs verify=%.4fs\n",
      r.prefill_seconds, r.decode_seconds,
      r.decode_seconds > 0 ? decode_tokens / r.decode_seconds : 0.0,
      s.draft_seconds, s.verify_seconds);
  for (size_t k = 0; k < s.edit_outcomes.size(); ++k) {
    std::printf("P%zu vs final: extended=%lld unchanged=%lld shortened=%lld\n",
                k + 1, static_cast<long long>(s.edit_outcomes[k][0]),
                static_cast<long long>(s.edit_outcomes[k][1]),
                static_cast<long long>(s.edit_outcomes[k][2]));
  }
}

// The one prompt of --prompt or --prompt_ids, printed for a person.
int GenerateOne(const GenerateOptions& o, const PromptCodec& codec,
                SpeculativeEngine& engine) {
  auto ids = o.prompt.empty() ? ParseIdList(o.prompt_ids)
                              : codec.EncodeText(o.prompt, o.chat);
  if (!ids.ok()) {
    std::fprintf(stderr, "error: %s\n", ids.status().ToString().c_str());
    return o.prompt.empty() ? 2 : 1;
  }
  GenerationRequest request = o.request;
  request.prompt = std::move(*ids);
  auto results = engine.Generate({std::move(request)});
  if (!results.ok()) {
    std::fprintf(stderr, "error: %s\n", results.status().ToString().c_str());
    return 1;
  }
  PrintHuman((*results)[0], codec);
  return (*results)[0].status.ok() ? 0 : 1;
}

// JSON lines from stdin, decoded --batch prompts at a time; one JSON line
// out per line in (an "error" for a line that is not a prompt).
int GenerateJsonLines(const GenerateOptions& o, const PromptCodec& codec,
                      SpeculativeEngine& engine) {
  int failures = 0;
  std::vector<absl::StatusOr<GenerationRequest>> pending;
  auto flush = [&] {
    std::vector<GenerationRequest> requests;
    for (const auto& p : pending) {
      if (p.ok()) requests.push_back(*p);
    }
    absl::StatusOr<std::vector<GenerationResult>> results =
        std::vector<GenerationResult>();
    if (!requests.empty()) results = engine.Generate(std::move(requests));
    size_t next = 0;
    for (const auto& p : pending) {
      const absl::Status error = !p.ok() ? p.status() : results.status();
      if (!error.ok()) ++failures;
      const Json out = error.ok() ? ResultJson((*results)[next++], codec)
                                  : Json{{"error", error.ToString()}};
      std::cout << out.dump() << "\n";
    }
    std::cout.flush();
    pending.clear();
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    auto ids = EncodeLine(line, codec);
    if (ids.ok()) {
      GenerationRequest request = o.request;
      request.prompt = std::move(*ids);
      pending.push_back(std::move(request));
    } else {
      pending.push_back(ids.status());
    }
    if (static_cast<int>(pending.size()) >= o.batch) flush();
  }
  flush();
  return failures == 0 ? 0 : 1;
}

int Run(absl::StatusOr<GenerateOptions> options) {
  if (!options.ok()) {
    std::fprintf(stderr, "dedit-generate: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  GenerateOptions& o = *options;
  if (const absl::Status s = ApplyCpuKernelFlags(o.threads); !s.ok()) {
    std::fprintf(stderr, "dedit-generate: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  auto stack = InProcessStack::Load(o.stack);
  PromptCodec codec;
  const absl::Status loaded =
      stack.ok() ? codec.Load(o.tokenizer_path, o.tokenizer_required)
                 : stack.status();
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.ToString().c_str());
    return 1;
  }
  if (o.request.passes < 0) {
    const DEditDrafter* drafter = (*stack)->drafter();
    o.request.passes = drafter != nullptr ? drafter->config().num_passes : 0;
  }
  SpeculativeEngine& engine = (*stack)->engine();
  return o.json ? GenerateJsonLines(o, codec, engine)
                : GenerateOne(o, codec, engine);
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) {
  const dedit::CommandFlags command = {
      "dedit-generate",
      "--target DIR [--drafter DIR] (--prompt TEXT | --prompt_ids 1,2,3 |\n"
      "                      --json < prompts) [--window W] [--passes K]\n"
      "                      [--method model|ngram|hybrid] [--ar] ...",
      "Generates with the in-process stack (target, drafter and engine in\n"
      "one process): human-readable output, or with --json one JSON object\n"
      "per prompt line read from stdin.\n",
      {"target",
       "drafter",
       "tokenizer",
       "prompt_ids",
       "prompt",
       "chat",
       "window",
       "passes",
       "method",
       "ngram_min",
       "ngram_max",
       "ngram_max_window",
       "hybrid_min_ngram",
       "hybrid_short_match_below",
       "min_draft_confidence",
       "verify_chunk",
       "max_speculative_batch",
       "adaptive_speculation",
       "max_tokens",
       "temperature",
       "top_k",
       "top_p",
       "seed",
       "ar",
       "ignore_eos",
       "causal_editor",
       "json",
       "batch",
       "device",
       "dtype",
       "threads",
       "product_threads",
       "cpu_products",
       "kv_cache_dtype"}};
  if (std::optional<int> exit = dedit::ParseCommandFlags(
          command, argv[0], std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  return dedit::Run(dedit::ReadFlags());
}
