#include "engine/speculative_engine.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/acceptance.h"

namespace dedit {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Contains(const std::vector<int32_t>& ids, int32_t t) {
  return std::find(ids.begin(), ids.end(), t) != ids.end();
}

// Options::min_draft_confidence: the longest rounds a sequence skips the
// drafter after drafts cut to nothing in a row.
constexpr int kMaxSkippedRounds = 8;
// Options::adaptive_speculation: the longest pause between probes, and the
// weight of the newest round in the moving means.
constexpr int kMaxPausedRounds = 16;
constexpr double kAdaptiveWeight = 0.3;

double MovingMean(double mean, double x) {
  return mean < 0 ? x : (1 - kAdaptiveWeight) * mean + kAdaptiveWeight * x;
}

// Cuts the proposal (the last pass) before its first slot below
// `min_confidence`; a slot without a confidence counts as confident.
// Returns whether anything was cut.
bool CutUnconfident(double min_confidence, DraftResult* draft) {
  DraftPass& last = draft->passes.back();
  size_t keep = 0;
  while (keep < last.tokens.size() &&
         (keep >= last.confidences.size() ||
          last.confidences[keep] >= min_confidence)) {
    ++keep;
  }
  if (keep == last.tokens.size()) return false;
  last.tokens.resize(keep);
  if (last.confidences.size() > keep) last.confidences.resize(keep);
  return true;
}

}  // namespace

absl::Status ValidateVerifyChunk(int chunk, absl::string_view flag) {
  if (chunk == 0 || (chunk >= 2 && chunk <= kMaxVerifyChunk)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be 0 (verify whole drafts) or in [2, ",
                   kMaxVerifyChunk, "], got ", chunk));
}

bool SpeculativeEngine::WellFormedDraft(const Drafter& drafter,
                                        const DraftRequest& request,
                                        const DraftResult& draft) const {
  if (draft.passes.size() != static_cast<size_t>(request.passes)) return false;
  const size_t full = static_cast<size_t>(request.window - 1);
  for (const DraftPass& pass : draft.passes) {
    if (pass.tokens.size() > full ||
        (pass.tokens.size() < full && !drafter.proposes_short_blocks())) {
      return false;
    }
    for (int32_t t : pass.tokens) {
      if (t < 0 || (options_.vocab_size > 0 && t >= options_.vocab_size)) {
        return false;
      }
    }
  }
  return true;
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContextLimit:
      return "context_limit";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

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

const char* EditOutcomeName(EditOutcome outcome) {
  switch (outcome) {
    case EditOutcome::kExtended:
      return "extended";
    case EditOutcome::kUnchanged:
      return "unchanged";
    case EditOutcome::kShortened:
      return "shortened";
  }
  return "unknown";
}

double AcceptanceSummary::mean_acceptance_length() const {
  if (drafted_rounds == 0) return 0;
  return 1.0 + static_cast<double>(accepted_tokens) / drafted_rounds;
}

void AcceptanceSummary::Add(const RoundRecord& r) {
  ++rounds;
  if (r.fallback) ++fallback_rounds;
  if (r.looked_up) ++lookup_rounds;
  if (r.cut) ++cut_rounds;
  if (r.skipped) ++skipped_rounds;
  if (r.reused) ++reused_rounds;
  if (r.paused) ++paused_rounds;
  draft_seconds += r.draft_seconds;
  verify_seconds += r.verify_seconds;
  if (r.window < 2) return;
  ++drafted_rounds;
  draft_tokens += r.window - 1;
  accepted_tokens += r.accepted;
  if (accepted_per_position.size() < static_cast<size_t>(r.window - 1)) {
    accepted_per_position.resize(r.window - 1, 0);
  }
  for (int i = 0; i < r.accepted; ++i) ++accepted_per_position[i];
  if (edit_outcomes.size() < r.edits.size()) {
    edit_outcomes.resize(r.edits.size(), {0, 0, 0});
  }
  for (size_t k = 0; k < r.edits.size(); ++k) {
    ++edit_outcomes[k][static_cast<int>(r.edits[k])];
  }
}

AcceptanceSummary Summarize(const std::vector<RoundRecord>& rounds) {
  AcceptanceSummary s;
  for (const RoundRecord& r : rounds) s.Add(r);
  return s;
}

SpeculativeEngine::SpeculativeEngine(Verifier* verifier, Drafter* drafter,
                                     Options options)
    : verifier_(verifier),
      drafter_(drafter),
      options_(std::move(options)),
      ngram_(options_.ngram),
      hybrid_lookup_(
          {options_.hybrid_min_ngram,
           std::max(options_.ngram.max_ngram, options_.hybrid_min_ngram),
           options_.ngram.max_window}) {}

bool SpeculativeEngine::LooksUp(DraftMethod method) {
  return method == DraftMethod::kNgram || method == DraftMethod::kHybrid;
}

Drafter* SpeculativeEngine::DrafterFor(const Sequence& seq) {
  return seq.request.method == DraftMethod::kNgram
             ? static_cast<Drafter*>(&ngram_)
             : drafter_;
}

bool SpeculativeEngine::SpeculationPays(Sequence& seq) {
  if (seq.plain_seconds < 0) return false;  // measure a plain round first
  if (seq.pause_rounds > 0) {
    if (--seq.pause_rounds == 0) seq.probe = true;
    return false;
  }
  if (seq.probe || seq.spec_seconds < 0) {
    seq.probe = false;
    return true;
  }
  // Tokens per second drafting against one token per plain round.
  if (seq.spec_tokens * seq.plain_seconds >= seq.spec_seconds) {
    seq.next_pause = 1;
    return true;
  }
  seq.pause_rounds = seq.next_pause - 1;  // this round is the first
  if (seq.pause_rounds == 0) seq.probe = true;
  seq.next_pause = std::min(seq.next_pause * 2, kMaxPausedRounds);
  return false;
}

bool SpeculativeEngine::FeedsContext(const Sequence& seq) const {
  if (drafter_ == nullptr) return false;
  // A session's turns share one sequence, and a later turn may draft with
  // the model whatever this one does.
  if (seq.request.keep || seq.request.continue_sequence != 0) return true;
  return seq.request.method != DraftMethod::kNgram && seq.request.passes > 0 &&
         seq.request.window >= 2;
}

absl::StatusOr<SequenceId> SpeculativeEngine::Submit(GenerationRequest request,
                                                     TokenCallback on_tokens) {
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty");
  }
  if (options_.vocab_size > 0) {
    for (int32_t t : request.prompt) {
      if (t < 0 || t >= options_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prompt token id ", t, " is outside the vocabulary [0, ",
            options_.vocab_size, ")"));
      }
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= options_.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", request.prompt.size(),
                     " tokens leaves no room in the context limit of ",
                     options_.max_context));
  }
  if (request.max_new_tokens <= 0 ||
      request.max_new_tokens > options_.max_new_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens must be in [1, ", options_.max_new_tokens_limit,
        "], got ", request.max_new_tokens));
  }
  if (request.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("window must be >= 1, got ", request.window));
  }
  if (request.passes < 0 || request.passes > options_.max_passes) {
    return absl::InvalidArgumentError(absl::StrCat("passes must be in [0, ",
                                                   options_.max_passes,
                                                   "], got ", request.passes));
  }
  if (request.method == DraftMethod::kNgram) {
    RETURN_IF_ERROR(NgramDrafter::Validate(options_.ngram));
    if (request.passes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the n-gram method has one pass, got passes ", request.passes));
    }
  } else if (drafter_ != nullptr && request.passes > 0 &&
             request.window > drafter_->block_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window ", request.window, " exceeds the drafter's block size ",
        drafter_->block_size()));
  }
  if (request.method == DraftMethod::kHybrid) {
    RETURN_IF_ERROR(NgramDrafter::Validate({options_.hybrid_min_ngram,
                                            options_.hybrid_min_ngram,
                                            options_.ngram.max_window}));
  }
  if (LooksUp(request.method) && request.window > options_.ngram.max_window) {
    return absl::InvalidArgumentError(
        absl::StrCat("window ", request.window,
                     " exceeds the n-gram method's largest window ",
                     options_.ngram.max_window));
  }
  RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  // A continuation takes over its kept sequence: it prefills only the
  // prompt after the longest common prefix with the kept tokens (at least
  // one token, which samples the first new one).
  SequenceId id = 0;
  std::vector<int32_t> kept_tokens;
  int64_t reuse = 0;
  bool cache_lost = false;
  if (request.continue_sequence != 0) {
    auto k = kept_.find(request.continue_sequence);
    if (k == kept_.end()) {
      cache_lost = true;
    } else {
      const std::vector<int32_t>& held = k->second;
      const size_t limit = std::min(held.size(), request.prompt.size() - 1);
      while (static_cast<size_t>(reuse) < limit &&
             held[reuse] == request.prompt[reuse]) {
        ++reuse;
      }
      if (reuse > 0) {
        id = k->first;
        kept_tokens = std::move(k->second);
        kept_.erase(k);
      } else {
        // Nothing in common: a new sequence is as cheap.
        (void)ReleaseKept(k->first);
      }
    }
  }
  if (id == 0) id = next_id_++;
  Sequence& seq = sequences_[id];
  seq.result.id = id;
  seq.result.prompt_tokens = static_cast<int>(request.prompt.size());
  seq.result.cache_lost = cache_lost;
  seq.reuse = reuse;
  seq.kept_tokens = std::move(kept_tokens);
  seq.request = std::move(request);
  seq.on_tokens = std::move(on_tokens);
  seq.known = seq.request.prompt;
  pending_.push_back(id);
  return id;
}

absl::Status SpeculativeEngine::Cancel(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("no running request ", id));
  }
  Finish(id, FinishReason::kCancelled);
  return absl::OkStatus();
}

int SpeculativeEngine::WindowFor(const Sequence& seq) const {
  // A hybrid sequence whose model drafter failed (or that has none) still
  // has its lookups; Step makes its other rounds target-only.
  const bool has_drafter = LooksUp(seq.request.method) || drafter_ != nullptr;
  const bool failed =
      seq.drafter_failed && seq.request.method != DraftMethod::kHybrid;
  if (!has_drafter || failed || seq.request.passes == 0) return 1;
  const int64_t remaining = seq.request.max_new_tokens -
                            static_cast<int64_t>(seq.result.tokens.size());
  const int64_t room = options_.max_context - seq.start;
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({seq.request.window, remaining, room})));
}

bool SpeculativeEngine::Emit(Sequence& seq,
                             const std::vector<int32_t>& tokens) {
  std::vector<int32_t> emitted;
  FinishReason finish = FinishReason::kNone;
  for (int32_t t : tokens) {
    if ((!seq.request.ignore_eos && Contains(options_.eos_token_ids, t)) ||
        Contains(seq.request.stop_token_ids, t)) {
      seq.result.stop_token = t;
      finish = FinishReason::kStop;
      break;
    }
    emitted.push_back(t);
    seq.result.tokens.push_back(t);
    seq.known.push_back(t);
    if (static_cast<int>(seq.result.tokens.size()) >=
        seq.request.max_new_tokens) {
      finish = FinishReason::kLength;
      break;
    }
  }
  if (finish == FinishReason::kNone && seq.start + 1 > options_.max_context) {
    finish = FinishReason::kContextLimit;
  }
  if (seq.on_tokens && !emitted.empty()) seq.on_tokens(seq.result.id, emitted);
  if (finish != FinishReason::kNone) {
    Finish(seq.result.id, finish);
    return true;
  }
  return false;
}

void SpeculativeEngine::Finish(SequenceId id, FinishReason reason,
                               absl::Status status) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  Sequence& seq = it->second;
  seq.result.finish = reason;
  seq.result.status = std::move(status);
  if (seq.first_token_time > 0) {
    seq.result.decode_seconds = NowSeconds() - seq.first_token_time;
  }
  // A session's sequence stays (with its drafter context) when the request
  // ends normally: with what it holds once prefilled, else, for a
  // continuation not prefilled yet, with what it held before.
  bool kept = false;
  if (seq.request.keep && reason != FinishReason::kError) {
    const bool running =
        std::find(running_.begin(), running_.end(), id) != running_.end();
    std::vector<int32_t> held;
    if (running) {
      held.assign(seq.tokens.begin(), seq.tokens.begin() + seq.start);
    } else {
      held = std::move(seq.kept_tokens);
    }
    if (!held.empty() && verifier_->Keep(id).ok()) {
      kept_[id] = std::move(held);
      kept = true;
    }
  }
  seq.result.kept = kept;
  if (!kept) {
    // Release errors (e.g. a sequence the target never created) are not
    // the request's concern: it is finished either way.
    (void)verifier_->Release(id);
    // The model drafter holds context for the sequences the verifier side
    // fed it (the n-gram method keeps no state).
    if (FeedsContext(seq)) (void)drafter_->Release(id);
  }
  finished_.push_back(std::move(seq.result));
  sequences_.erase(it);
  running_.erase(std::remove(running_.begin(), running_.end(), id),
                 running_.end());
  pending_.erase(std::remove(pending_.begin(), pending_.end(), id),
                 pending_.end());
}

absl::Status SpeculativeEngine::Step() {
  last_step_ = StepStats();
  // 1. Draft every running sequence: one batched call per drafter (the
  // model drafter and, for requests that chose it, the n-gram method).
  std::vector<SequenceId> round_ids = running_;
  std::map<SequenceId, int> window;
  std::map<Drafter*, std::vector<DraftRequest>> draft_requests;
  std::map<SequenceId, DraftResult> drafts;
  std::set<SequenceId> looked_up, skipped, cut, paused;
  // Blocks Options::verify_chunk applies to: the model's drafts, and the
  // rests of earlier ones (`reused`).
  std::set<SequenceId> modeled, reused;
  const bool over_batch =
      options_.max_speculative_batch > 0 &&
      round_ids.size() > static_cast<size_t>(options_.max_speculative_batch);
  for (SequenceId id : round_ids) {
    Sequence& seq = sequences_.at(id);
    int w = WindowFor(seq);
    std::vector<int32_t> held = std::move(seq.held);
    seq.held.clear();
    if (w >= 2 && over_batch) {
      // Options::max_speculative_batch: a decode step; a held draft rest
      // is dropped (the next speculative round drafts afresh).
      paused.insert(id);
      w = 1;
    }
    if (w >= 2 && !held.empty()) {
      // The rest of the model's last draft, whose every verified token was
      // accepted: this round's block, with no Draft call.
      if (held.size() > static_cast<size_t>(w - 1)) held.resize(w - 1);
      DraftResult rest;
      rest.passes.push_back({std::move(held), {}});
      drafts[id] = std::move(rest);
      reused.insert(id);
      window[id] = w;
      continue;
    }
    if (w >= 2 && seq.request.method == DraftMethod::kHybrid) {
      // The lookup first: a match of hybrid_min_ngram tokens or more is
      // this round's block, with no drafter call; a shorter one only once
      // the model's drafts of this sequence have stopped paying. Otherwise
      // the model drafts, unless it failed earlier.
      std::vector<int32_t> proposal = hybrid_lookup_.Propose(seq.known, w - 1);
      if (proposal.empty() && seq.model_accepted_mean >= 0 &&
          seq.model_accepted_mean < options_.hybrid_short_match_below) {
        proposal = ngram_.Propose(seq.known, w - 1);
      }
      if (!proposal.empty()) {
        drafts[id] = NgramDrafter::AsDraft(std::move(proposal));
        looked_up.insert(id);
      } else if (drafter_ == nullptr || seq.drafter_failed) {
        w = 1;
      }
    }
    if (w >= 2 && looked_up.count(id) == 0 && DrafterFor(seq) == drafter_ &&
        seq.skip_model_rounds > 0) {
      // Backing off after drafts cut to nothing (min_draft_confidence).
      --seq.skip_model_rounds;
      skipped.insert(id);
      w = 1;
    }
    if (w >= 2 && looked_up.count(id) == 0 && options_.adaptive_speculation &&
        !SpeculationPays(seq)) {
      // A round that would call a drafter (a held rest or a hybrid lookup
      // costs no call) decodes plainly instead.
      paused.insert(id);
      w = 1;
    }
    window[id] = w;
    if (w >= 2 && looked_up.count(id) == 0) {
      const std::vector<int32_t>* known =
          seq.request.method == DraftMethod::kNgram ? &seq.known : nullptr;
      Drafter* drafter = DrafterFor(seq);
      std::vector<DraftRequest>& batch = draft_requests[drafter];
      batch.push_back({id, seq.start, seq.bonus, w, seq.request.passes, known});
      if (const int n = drafter->lookup_seed_ngram(); n > 0) {
        batch.back().seed =
            NgramDrafter(LookupSeedOptions(n, w)).Propose(seq.known, w - 1);
      }
    }
  }
  std::map<SequenceId, bool> fallback;
  std::map<SequenceId, double> draft_seconds;
  for (auto& [drafter, requests] : draft_requests) {
    const double t0 = NowSeconds();
    auto result = drafter->Draft(requests);
    const double seconds = NowSeconds() - t0;
    last_step_.drafts += static_cast<int>(requests.size());
    last_step_.draft_seconds += seconds;
    const bool batch_ok = result.ok() && result->size() == requests.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      const DraftRequest& r = requests[i];
      draft_seconds[r.sequence] = seconds;
      if (batch_ok && WellFormedDraft(*drafter, r, (*result)[i])) {
        DraftResult& draft = (*result)[i];
        if (drafter == drafter_ && options_.min_draft_confidence > 0 &&
            CutUnconfident(options_.min_draft_confidence, &draft)) {
          cut.insert(r.sequence);
          Sequence& seq = sequences_.at(r.sequence);
          if (draft.passes.back().tokens.empty()) {
            // Nothing left to verify: a decode step, and the next
            // model rounds of this sequence skip the drafter.
            seq.skip_model_rounds = seq.next_skip;
            seq.next_skip = std::min(seq.next_skip * 2, kMaxSkippedRounds);
            window[r.sequence] = 1;
            continue;
          }
        }
        if (drafter == drafter_) {
          sequences_.at(r.sequence).next_skip = 1;
          modeled.insert(r.sequence);
        }
        drafts[r.sequence] = std::move(draft);
        continue;
      }
      // Output is lossless whatever the drafter does, so a failed or
      // malformed draft only costs speed: the request continues target-only.
      sequences_.at(r.sequence).drafter_failed = true;
      window[r.sequence] = 1;
      fallback[r.sequence] = true;
    }
  }

  // 2. One target step: verify every block, prefill every new prompt.
  std::vector<PrefillWork> prefills;
  std::vector<SequenceId> prefill_ids(pending_.begin(), pending_.end());
  for (SequenceId id : prefill_ids) {
    const Sequence& seq = sequences_.at(id);
    prefills.push_back(
        {id,
         std::vector<int32_t>(seq.request.prompt.begin() + seq.reuse,
                              seq.request.prompt.end()),
         seq.request.sampling, seq.reuse, FeedsContext(seq)});
  }
  std::vector<VerifyWork> verifies;
  // Options::verify_chunk: drafted tokens past this round's chunk.
  std::map<SequenceId, std::vector<int32_t>> beyond_chunk;
  for (SequenceId id : round_ids) {
    const Sequence& seq = sequences_.at(id);
    VerifyWork v{id, seq.start, {seq.bonus}};
    auto d = drafts.find(id);
    if (d != drafts.end()) {
      const std::vector<int32_t>& proposal = d->second.passes.back().tokens;
      size_t verified = proposal.size();
      if (options_.verify_chunk >= 2 &&
          (modeled.count(id) > 0 || reused.count(id) > 0) &&
          verified > static_cast<size_t>(options_.verify_chunk - 1)) {
        verified = options_.verify_chunk - 1;
        beyond_chunk[id].assign(proposal.begin() + verified, proposal.end());
      }
      v.block.insert(v.block.end(), proposal.begin(),
                     proposal.begin() + verified);
    }
    verifies.push_back(std::move(v));
  }
  if (prefills.empty() && verifies.empty()) return absl::OkStatus();
  const double t0 = NowSeconds();
  auto step = verifier_->Step(prefills, verifies);
  const double verify_seconds = NowSeconds() - t0;
  last_step_.prefills = static_cast<int>(prefills.size());
  last_step_.verifies = static_cast<int>(verifies.size());
  last_step_.verify_seconds = verify_seconds;
  pending_.clear();
  if (!step.ok()) {
    for (SequenceId id : prefill_ids)
      Finish(id, FinishReason::kError, step.status());
    for (SequenceId id : round_ids)
      Finish(id, FinishReason::kError, step.status());
    return step.status();
  }

  // 3. Commit.
  const double now = NowSeconds();
  const bool has_prefill_status = !step->prefill_status.empty();
  if (has_prefill_status && step->prefill_status.size() != prefill_ids.size()) {
    const absl::Status bad = absl::InternalError(
        "verifier returned a prefill status count that does not match");
    for (SequenceId id : prefill_ids) Finish(id, FinishReason::kError, bad);
    for (SequenceId id : round_ids) Finish(id, FinishReason::kError, bad);
    return bad;
  }
  for (size_t i = 0; i < prefill_ids.size(); ++i) {
    if (has_prefill_status && !step->prefill_status[i].ok()) {
      Sequence& seq = sequences_.at(prefill_ids[i]);
      if (absl::IsNotFound(step->prefill_status[i]) && seq.reuse > 0) {
        // The kept KV is gone (evicted or expired on the target): prefill
        // the whole prompt next step.
        seq.reuse = 0;
        seq.kept_tokens.clear();
        seq.result.cache_lost = true;
        pending_.push_back(prefill_ids[i]);
        continue;
      }
      Finish(prefill_ids[i], FinishReason::kError, step->prefill_status[i]);
      continue;
    }
    Sequence& seq = sequences_.at(prefill_ids[i]);
    seq.start = static_cast<int64_t>(seq.request.prompt.size());
    seq.bonus = step->first_tokens[i];
    seq.result.reused_tokens = seq.reuse;
    seq.kept_tokens.clear();
    if (seq.request.keep) {
      seq.tokens = seq.request.prompt;
      seq.tokens.push_back(seq.bonus);
    }
    seq.result.prefill_seconds = verify_seconds;
    seq.first_token_time = now;
    running_.push_back(prefill_ids[i]);
    Emit(seq, {seq.bonus});
  }
  for (size_t i = 0; i < round_ids.size(); ++i) {
    const SequenceId id = round_ids[i];
    Sequence& seq = sequences_.at(id);
    const VerifyOutcome& out = step->verified[i];
    RoundRecord record;
    record.window = static_cast<int>(verifies[i].block.size());
    record.accepted = out.accepted;
    record.fallback = fallback.count(id) > 0;
    record.looked_up = looked_up.count(id) > 0;
    record.cut = cut.count(id) > 0;
    record.skipped = skipped.count(id) > 0;
    record.reused = reused.count(id) > 0;
    record.paused = paused.count(id) > 0;
    if (seq.request.method == DraftMethod::kHybrid && !record.looked_up &&
        !record.reused && record.window >= 2) {
      // A moving mean over about the last ten model rounds.
      seq.model_accepted_mean =
          seq.model_accepted_mean < 0
              ? out.accepted
              : 0.9 * seq.model_accepted_mean + 0.1 * out.accepted;
    }
    record.verify_seconds = verify_seconds;
    if (options_.adaptive_speculation && !record.looked_up) {
      // A round that drafted (even one cut to nothing) is the cost of
      // speculating; the others of decoding plainly. A hybrid lookup is
      // neither: it is never paused.
      auto drafted = draft_seconds.find(id);
      const double draft_s =
          drafted != draft_seconds.end() ? drafted->second : 0.0;
      if (record.window >= 2 || drafted != draft_seconds.end()) {
        seq.spec_tokens = MovingMean(seq.spec_tokens, out.accepted + 1);
        seq.spec_seconds =
            MovingMean(seq.spec_seconds, draft_s + verify_seconds);
      } else {
        seq.plain_seconds = MovingMean(seq.plain_seconds, verify_seconds);
      }
    }
    std::vector<int32_t> committed(
        verifies[i].block.begin() + 1,
        verifies[i].block.begin() + 1 + out.accepted);
    committed.push_back(out.target_tokens[out.accepted]);
    auto rest = beyond_chunk.find(id);
    if (rest != beyond_chunk.end() &&
        out.accepted + 1 == static_cast<int>(verifies[i].block.size()) &&
        committed.back() == rest->second.front()) {
      // The whole chunk was accepted and the target's next token is the
      // draft's: the rest of the draft is still a proposal for what follows.
      seq.held.assign(rest->second.begin() + 1, rest->second.end());
    }
    auto d = drafts.find(id);
    if (d != drafts.end()) {
      record.draft_seconds = draft_seconds[id];
      // Target choices are valid up to slot acc (the correction), so pass k's
      // own accepted length is known exactly up to acc + 1, and only over
      // the slots this round verified (a cut or chunked draft verifies
      // fewer than pass k proposed).
      const auto& passes = d->second.passes;
      const int verified = static_cast<int>(verifies[i].block.size()) - 1;
      for (size_t k = 0; k + 1 < passes.size(); ++k) {
        const int acc_k =
            std::min(AcceptedPrefixLength(passes[k].tokens, out.target_tokens),
                     verified);
        const int capped = std::min(acc_k, out.accepted + 1);
        record.edits.push_back(capped < out.accepted ? EditOutcome::kExtended
                               : capped == out.accepted
                                   ? EditOutcome::kUnchanged
                                   : EditOutcome::kShortened);
      }
    }
    if (options_.on_round) options_.on_round(id, record);
    seq.result.rounds.push_back(std::move(record));
    seq.start += out.accepted + 1;
    seq.bonus = committed.back();
    if (seq.request.keep) {
      seq.tokens.insert(seq.tokens.end(), committed.begin(), committed.end());
    }
    Emit(seq, committed);
  }
  return absl::OkStatus();
}

std::vector<SequenceId> SpeculativeEngine::KeptSequences() const {
  std::vector<SequenceId> ids;
  for (const auto& [id, tokens] : kept_) ids.push_back(id);
  return ids;
}

absl::Status SpeculativeEngine::ReleaseKept(SequenceId id) {
  if (kept_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("no kept sequence ", id));
  }
  (void)verifier_->Release(id);
  if (drafter_ != nullptr) (void)drafter_->Release(id);
  return absl::OkStatus();
}

void SpeculativeEngine::ReleaseAllKept() {
  for (SequenceId id : KeptSequences()) (void)ReleaseKept(id);
}

std::vector<GenerationResult> SpeculativeEngine::TakeFinished() {
  std::vector<GenerationResult> out;
  out.swap(finished_);
  return out;
}

absl::StatusOr<std::vector<GenerationResult>> SpeculativeEngine::Generate(
    std::vector<GenerationRequest> requests) {
  std::vector<SequenceId> ids;
  for (GenerationRequest& r : requests) {
    ASSIGN_OR_RETURN(SequenceId id, Submit(std::move(r)));
    ids.push_back(id);
  }
  while (!idle()) {
    // A failed step finishes its requests with kError; keep serving the
    // rest and report per request.
    (void)Step();
  }
  std::map<SequenceId, GenerationResult> by_id;
  for (GenerationResult& r : TakeFinished()) by_id[r.id] = std::move(r);
  std::vector<GenerationResult> out;
  for (SequenceId id : ids) out.push_back(std::move(by_id[id]));
  return out;
}

}  // namespace dedit
