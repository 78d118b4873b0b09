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
#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status.h"
#include "cli/command_flags.h"
#include "model/cpu_flags.h"
#include "model/in_process.h"
#include "nlohmann/json.hpp"
#ifdef DEDIT_HAVE_TOKENIZER
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#endif

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
ABSL_FLAG(int, hybrid_min_ngram, 3,
          "hybrid method: shortest suffix whose earlier occurrence makes a "
          "round a lookup");
ABSL_FLAG(double, hybrid_short_match_below, 0.5,
          "hybrid method: shorter suffixes too once the model's rounds of a "
          "sequence accept fewer tokens than this (a moving mean)");
ABSL_FLAG(double, min_draft_confidence, 0,
          "model drafts are cut before their first slot whose confidence "
          "is below this; a draft cut to nothing makes the round a decode "
          "step and the sequence skips the drafter for a few rounds (0 = "
          "off)");
ABSL_FLAG(int, verify_chunk, 0,
          "model drafts are verified this many block rows at a time, the "
          "rest of a draft next round when every verified token was "
          "accepted (0 = whole drafts; at least 2 otherwise)");
ABSL_FLAG(int, max_speculative_batch, 0,
          "a round of more running prompts than this speculates for none "
          "of them: each decodes one token (0 = no limit)");
ABSL_FLAG(bool, adaptive_speculation, false,
          "speculate only while drafted rounds give more tokens per second "
          "than plain decoding (measured per prompt as it runs)");
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
          "the machine's cores; model/cpu_flags.h)");

namespace dedit {
namespace {

using Json = nlohmann::json;

struct Prompt {
  std::vector<int32_t> ids;
};

#ifdef DEDIT_HAVE_TOKENIZER
std::unique_ptr<Tokenizer> g_tokenizer;

// Thinking off, as the DFlash/DEdit evaluation protocol runs Qwen3.
ChatTemplateOptions ChatOptions() {
  ChatTemplateOptions o;
  o.enable_thinking = false;
  return o;
}
#endif

absl::Status LoadTokenizerIfPresent() {
#ifdef DEDIT_HAVE_TOKENIZER
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) path = absl::GetFlag(FLAGS_target) + "/tokenizer.json";
  // stat, never open, to test for presence: opening a FIFO blocks, and
  // FromFile refuses anything that is not a regular file.
  if (PathExists(path)) {
    ASSIGN_OR_RETURN(g_tokenizer, Tokenizer::FromFile(path));
  } else if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    return absl::NotFoundError("tokenizer not found: " + path);
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& text,
                                                bool chat) {
#ifdef DEDIT_HAVE_TOKENIZER
  if (g_tokenizer == nullptr) {
    return absl::FailedPreconditionError("text prompts need a tokenizer.json");
  }
  if (chat) {
    const std::vector<ChatMessage> messages = {{"user", text}};
    return EncodeQwen3Chat(*g_tokenizer, messages, ChatOptions());
  }
  return g_tokenizer->Encode(text);
#else
  return absl::UnimplementedError("built without the tokenizer");
#endif
}

std::string Decode(const std::vector<int32_t>& ids) {
#ifdef DEDIT_HAVE_TOKENIZER
  if (g_tokenizer != nullptr) {
    auto text = g_tokenizer->Decode(ids);
    if (text.ok()) return *text;
  }
#endif
  return "";
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

absl::StatusOr<std::vector<int32_t>> ParsePromptLine(const std::string& line) {
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("line is not JSON");
  if (j.is_array()) return ParseIds(j);
  if (!j.is_object())
    return absl::InvalidArgumentError("expected array or object");
  if (j.contains("ids")) return ParseIds(j["ids"]);
  if (j.contains("text") && j["text"].is_string()) {
    return EncodeText(j["text"].get<std::string>(), false);
  }
#ifdef DEDIT_HAVE_TOKENIZER
  if (j.contains("messages") && j["messages"].is_array()) {
    if (g_tokenizer == nullptr) {
      return absl::FailedPreconditionError("messages need a tokenizer.json");
    }
    std::vector<ChatMessage> chat;
    for (const Json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") ||
          !m["role"].is_string() || !m["content"].is_string()) {
        return absl::InvalidArgumentError(
            "message needs string role and content");
      }
      chat.push_back(
          {m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return EncodeQwen3Chat(*g_tokenizer, chat, ChatOptions());
  }
#endif
  return absl::InvalidArgumentError("expected ids, text or messages");
}

GenerationRequest MakeRequest(std::vector<int32_t> ids, int default_passes) {
  GenerationRequest r;
  r.prompt = std::move(ids);
  r.max_new_tokens = absl::GetFlag(FLAGS_max_tokens);
  r.window = absl::GetFlag(FLAGS_ar) ? 1 : absl::GetFlag(FLAGS_window);
  r.passes = absl::GetFlag(FLAGS_passes) > 0 ? absl::GetFlag(FLAGS_passes)
                                             : default_passes;
  // Run() has checked the name.
  (void)DraftMethodFromName(absl::GetFlag(FLAGS_method), &r.method);
  if (r.method == DraftMethod::kNgram) r.passes = 1;
  if (absl::GetFlag(FLAGS_ar)) r.passes = 0;
  r.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  r.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  r.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    r.sampling.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
    r.sampling.has_seed = true;
  }
  return r;
}

Json ResultJson(const GenerationResult& r) {
  AcceptanceSummary s = Summarize(r.rounds);
  Json j;
  j["tokens"] = r.tokens;
  j["text"] = Decode(r.tokens);
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

void PrintHuman(const GenerationResult& r) {
  AcceptanceSummary s = Summarize(r.rounds);
  std::printf("tokens:");
  for (int32_t t : r.tokens) std::printf(" %d", t);
  std::printf("\n");
  const std::string text = Decode(r.tokens);
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

int Run() {
  if (const absl::Status s = ApplyCpuKernelFlags(absl::GetFlag(FLAGS_threads));
      !s.ok()) {
    std::fprintf(stderr, "dedit-generate: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  InProcessStack::Options o;
  o.target_dir = absl::GetFlag(FLAGS_target);
  // The n-gram method needs no drafter; loading one would only add the
  // cost of streaming features to it.
  o.drafter_dir =
      absl::GetFlag(FLAGS_ar) || absl::GetFlag(FLAGS_method) == "ngram"
          ? ""
          : absl::GetFlag(FLAGS_drafter);
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  if (absl::GetFlag(FLAGS_causal_editor)) o.causal_editor = true;
  o.hybrid_min_ngram = absl::GetFlag(FLAGS_hybrid_min_ngram);
  o.hybrid_short_match_below = absl::GetFlag(FLAGS_hybrid_short_match_below);
  o.min_draft_confidence = absl::GetFlag(FLAGS_min_draft_confidence);
  if (!(o.min_draft_confidence >= 0 && o.min_draft_confidence <= 1)) {
    std::cerr << "dedit-generate: --min_draft_confidence must be in [0, 1]\n";
    return 2;
  }
  o.max_speculative_batch = absl::GetFlag(FLAGS_max_speculative_batch);
  o.adaptive_speculation = absl::GetFlag(FLAGS_adaptive_speculation);
  if (o.max_speculative_batch < 0) {
    std::cerr << "dedit-generate: --max_speculative_batch must be >= 0\n";
    return 2;
  }
  o.verify_chunk = absl::GetFlag(FLAGS_verify_chunk);
  if (absl::Status s = ValidateVerifyChunk(o.verify_chunk, "--verify_chunk");
      !s.ok()) {
    std::cerr << "dedit-generate: " << s.message() << "\n";
    return 2;
  }
  if (o.target_dir.empty()) {
    std::fprintf(stderr, "--target is required\n");
    return 2;
  }
  const std::string method = absl::GetFlag(FLAGS_method);
  DraftMethod parsed;
  if (!DraftMethodFromName(method, &parsed)) {
    std::fprintf(stderr, "--method must be model, ngram or hybrid, got '%s'\n",
                 method.c_str());
    return 2;
  }
  auto stack = InProcessStack::Load(o);
  if (!stack.ok()) {
    std::fprintf(stderr, "error: %s\n", stack.status().ToString().c_str());
    return 1;
  }
  absl::Status tok = LoadTokenizerIfPresent();
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.ToString().c_str());
    return 1;
  }
  const int default_passes =
      (*stack)->drafter() ? (*stack)->drafter()->config().num_passes : 0;
  SpeculativeEngine& engine = (*stack)->engine();

  if (!absl::GetFlag(FLAGS_json)) {
    std::vector<int32_t> ids;
    if (!absl::GetFlag(FLAGS_prompt).empty()) {
      auto enc =
          EncodeText(absl::GetFlag(FLAGS_prompt), absl::GetFlag(FLAGS_chat));
      if (!enc.ok()) {
        std::fprintf(stderr, "error: %s\n", enc.status().ToString().c_str());
        return 1;
      }
      ids = *enc;
    } else {
      for (absl::string_view part : absl::StrSplit(
               absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipEmpty())) {
        int32_t id;
        if (!absl::SimpleAtoi(part, &id)) {
          std::fprintf(stderr, "error: bad token id '%s'\n",
                       std::string(part).c_str());
          return 2;
        }
        ids.push_back(id);
      }
    }
    auto results = engine.Generate({MakeRequest(ids, default_passes)});
    if (!results.ok()) {
      std::fprintf(stderr, "error: %s\n", results.status().ToString().c_str());
      return 1;
    }
    PrintHuman((*results)[0]);
    return (*results)[0].status.ok() ? 0 : 1;
  }

  // JSON lines: batches of --batch prompts decoded together.
  const int batch = std::max(1, absl::GetFlag(FLAGS_batch));
  std::string line;
  std::vector<std::optional<GenerationRequest>> pending;
  std::vector<std::string> errors;
  int failures = 0;
  auto flush = [&] {
    std::vector<GenerationRequest> reqs;
    for (auto& p : pending)
      if (p) reqs.push_back(*p);
    std::vector<GenerationResult> results;
    absl::Status status;
    if (!reqs.empty()) {
      auto r = engine.Generate(reqs);
      if (r.ok())
        results = std::move(*r);
      else
        status = r.status();
    }
    size_t next = 0;
    for (size_t i = 0; i < pending.size(); ++i) {
      Json out;
      if (!pending[i]) {
        out["error"] = errors[i];
        ++failures;
      } else if (!status.ok()) {
        out["error"] = status.ToString();
        ++failures;
      } else {
        out = ResultJson(results[next++]);
      }
      std::cout << out.dump() << "\n";
    }
    std::cout.flush();
    pending.clear();
    errors.clear();
  };
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    auto ids = ParsePromptLine(line);
    if (ids.ok()) {
      pending.push_back(MakeRequest(*ids, default_passes));
      errors.push_back("");
    } else {
      pending.push_back(std::nullopt);
      errors.push_back(ids.status().ToString());
    }
    if (static_cast<int>(pending.size()) >= batch) flush();
  }
  flush();
  return failures == 0 ? 0 : 1;
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
  return dedit::Run();
}
