#include "common/engine/speculative_engine.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/engine/acceptance.h"

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

// How the final proposal's accepted prefix compares with what each earlier
// pass alone would have achieved. Target choices are valid up to slot
// `accepted` (the correction), so pass k's own accepted length is known
// exactly up to accepted + 1, and only over the `verified` slots (a cut or
// chunked draft verifies fewer than pass k proposed).
std::vector<EditOutcome> EditOutcomes(const std::vector<DraftPass>& passes,
                                      const VerifyOutcome& out, int verified) {
  std::vector<EditOutcome> edits;
  for (size_t k = 0; k + 1 < passes.size(); ++k) {
    const int acc_k = std::min(
        AcceptedPrefixLength(passes[k].tokens, out.target_tokens), verified);
    const int capped = std::min(acc_k, out.accepted + 1);
    edits.push_back(capped < out.accepted    ? EditOutcome::kExtended
                    : capped == out.accepted ? EditOutcome::kUnchanged
                                             : EditOutcome::kShortened);
  }
  return edits;
}

}  // namespace

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
      ngram_(options_.speculation.ngram),
      hybrid_lookup_({options_.speculation.hybrid_min_ngram,
                      std::max(options_.speculation.ngram.max_ngram,
                               options_.speculation.hybrid_min_ngram),
                      options_.speculation.ngram.max_window}),
      batch_pause_(options_.speculation.max_speculative_batch) {}

SpeculativeEngine::Sequence::Sequence(const SpeculativeEngine& engine)
    : hybrid(&engine.hybrid_lookup_, &engine.ngram_,
             engine.options_.speculation.hybrid_short_match_below),
      confidence(engine.options_.speculation.min_draft_confidence),
      adaptive(engine.options_.speculation.adaptive_speculation),
      chunked(engine.options_.speculation.verify_chunk) {}

bool SpeculativeEngine::LooksUp(DraftMethod method) {
  return method == DraftMethod::kNgram || method == DraftMethod::kHybrid;
}

Drafter* SpeculativeEngine::DrafterFor(const Sequence& seq) {
  return seq.request.method == DraftMethod::kNgram
             ? static_cast<Drafter*>(&ngram_)
             : drafter_;
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
  RequestRules rules;
  rules.vocab_size = options_.vocab_size;
  rules.max_context = options_.max_context;
  rules.max_new_tokens_limit = options_.max_new_tokens_limit;
  rules.max_passes = options_.max_passes;
  rules.drafter_block_size = drafter_ != nullptr ? drafter_->block_size() : 0;
  rules.ngram_max_window = options_.speculation.ngram.max_window;
  RETURN_IF_ERROR(ValidateRequest(request, rules));
  const SpeculationOptions& spec = options_.speculation;
  if (request.method == DraftMethod::kNgram) {
    RETURN_IF_ERROR(NgramDrafter::Validate(spec.ngram));
  } else if (request.method == DraftMethod::kHybrid) {
    RETURN_IF_ERROR(NgramDrafter::Validate(
        {spec.hybrid_min_ngram, spec.hybrid_min_ngram, spec.ngram.max_window}));
  }
  Continuation kept;
  if (request.continue_sequence != 0) {
    kept = TakeKept(request.continue_sequence, request.prompt);
  }
  const SequenceId id = kept.id != 0 ? kept.id : next_id_++;
  Sequence& seq = sequences_.try_emplace(id, *this).first->second;
  seq.result.id = id;
  seq.result.prompt_tokens = static_cast<int>(request.prompt.size());
  seq.result.cache_lost = kept.cache_lost;
  seq.reuse = kept.reuse;
  seq.kept_tokens = std::move(kept.kept_tokens);
  seq.request = std::move(request);
  seq.on_tokens = std::move(on_tokens);
  seq.known = seq.request.prompt;
  pending_.push_back(id);
  return id;
}

SpeculativeEngine::Continuation SpeculativeEngine::TakeKept(
    SequenceId kept, const std::vector<int32_t>& prompt) {
  // A continuation takes over its kept sequence: it prefills only the
  // prompt after the longest common prefix with the kept tokens (at least
  // one token, which samples the first new one).
  Continuation c;
  auto k = kept_.find(kept);
  if (k == kept_.end()) {
    c.cache_lost = true;
    return c;
  }
  const std::vector<int32_t>& held = k->second;
  const size_t limit = std::min(held.size(), prompt.size() - 1);
  while (static_cast<size_t>(c.reuse) < limit &&
         held[c.reuse] == prompt[c.reuse]) {
    ++c.reuse;
  }
  if (c.reuse == 0) {
    // Nothing in common: a new sequence is as cheap.
    (void)ReleaseKept(k->first);
    return c;
  }
  c.id = k->first;
  c.kept_tokens = std::move(k->second);
  kept_.erase(k);
  return c;
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

double SpeculativeEngine::Now() const {
  return options_.clock ? options_.clock() : NowSeconds();
}

void SpeculativeEngine::Finish(SequenceId id, FinishReason reason,
                               absl::Status status) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  Sequence& seq = it->second;
  seq.result.finish = reason;
  seq.result.status = std::move(status);
  if (seq.first_token_time > 0) {
    seq.result.decode_seconds = Now() - seq.first_token_time;
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
  // 1. Plan each running sequence's block (the policies choose where it
  // comes from), then draft: one batched call per drafter.
  const bool over_batch = batch_pause_.Pauses(running_.size());
  std::vector<Round> rounds;
  for (SequenceId id : running_) rounds.push_back(PlanRound(id, over_batch));
  DraftRounds(rounds);

  // 2. Verify: one target step verifies every block and prefills every new
  // prompt.
  const std::vector<SequenceId> prefill_ids(pending_.begin(), pending_.end());
  const std::vector<PrefillWork> prefills = PrefillWorkFor(prefill_ids);
  const std::vector<VerifyWork> verifies = VerifyWorkFor(rounds);
  if (prefills.empty() && verifies.empty()) return absl::OkStatus();
  const double t0 = Now();
  auto step = verifier_->Step(prefills, verifies);
  const double verify_seconds = Now() - t0;
  last_step_.prefills = static_cast<int>(prefills.size());
  last_step_.verifies = static_cast<int>(verifies.size());
  last_step_.verify_seconds = verify_seconds;
  pending_.clear();
  absl::Status failed = step.status();
  if (failed.ok() && !step->prefill_status.empty() &&
      step->prefill_status.size() != prefill_ids.size()) {
    failed = absl::InternalError(
        "verifier returned a prefill status count that does not match");
  }
  if (!failed.ok()) {
    for (SequenceId id : prefill_ids) Finish(id, FinishReason::kError, failed);
    for (const Round& r : rounds) Finish(r.id, FinishReason::kError, failed);
    return failed;
  }

  // 3. Commit what the target accepted, and 4. stream it (Emit).
  CommitPrefills(prefill_ids, *step, verify_seconds);
  for (size_t i = 0; i < rounds.size(); ++i) {
    CommitRound(rounds[i], verifies[i], step->verified[i], verify_seconds);
  }
  return absl::OkStatus();
}

SpeculativeEngine::Round SpeculativeEngine::PlanRound(SequenceId id,
                                                      bool over_batch) {
  Sequence& seq = sequences_.at(id);
  Round round;
  round.id = id;
  int w = WindowFor(seq);
  // A held rest not used this round is dropped: the next speculative round
  // drafts afresh.
  std::vector<int32_t> held = seq.chunked.TakeHeld();
  if (w >= 2 && over_batch) {
    round.record.paused = true;
    w = 1;
  }
  if (w >= 2 && !held.empty()) {
    // The rest of the model's last draft: this round's block, no Draft call.
    if (held.size() > static_cast<size_t>(w - 1)) held.resize(w - 1);
    round.draft = DraftResult{{DraftPass{std::move(held), {}}}};
    round.record.reused = true;
    return round;
  }
  if (w >= 2 && seq.request.method == DraftMethod::kHybrid) {
    std::vector<int32_t> proposal = seq.hybrid.Propose(seq.known, w - 1);
    if (!proposal.empty()) {
      round.draft = NgramDrafter::AsDraft(std::move(proposal));
      round.record.looked_up = true;
      return round;
    }
    if (drafter_ == nullptr || seq.drafter_failed) w = 1;
  }
  if (w >= 2 && DrafterFor(seq) == drafter_ && seq.confidence.SkipsRound()) {
    round.record.skipped = true;
    w = 1;
  }
  if (w >= 2 && !seq.adaptive.Drafts()) {
    round.record.paused = true;
    w = 1;
  }
  round.window = w;
  return round;
}

void SpeculativeEngine::DraftRounds(std::vector<Round>& rounds) {
  std::map<Drafter*, std::vector<DraftRequest>> requests;
  std::map<Drafter*, std::vector<Round*>> asked;
  for (Round& round : rounds) {
    if (round.draft.has_value() || round.window < 2) continue;
    Sequence& seq = sequences_.at(round.id);
    Drafter* drafter = DrafterFor(seq);
    const int w = round.window;
    const std::vector<int32_t>* known =
        seq.request.method == DraftMethod::kNgram ? &seq.known : nullptr;
    DraftRequest r{round.id, seq.start,          seq.bonus,
                   w,        seq.request.passes, known};
    if (const int n = drafter->lookup_seed_ngram(); n > 0) {
      r.seed = NgramDrafter(LookupSeedOptions(n, w)).Propose(seq.known, w - 1);
    }
    requests[drafter].push_back(std::move(r));
    asked[drafter].push_back(&round);
  }
  for (auto& [drafter, batch] : requests) {
    const double t0 = Now();
    auto result = drafter->Draft(batch);
    const double seconds = Now() - t0;
    last_step_.drafts += static_cast<int>(batch.size());
    last_step_.draft_seconds += seconds;
    const bool batch_ok = result.ok() && result->size() == batch.size();
    for (size_t i = 0; i < batch.size(); ++i) {
      Round& round = *asked[drafter][i];
      round.called_drafter = true;
      round.draft_seconds = seconds;
      if (batch_ok && WellFormedDraft(*drafter, batch[i], (*result)[i])) {
        TakeDraft(drafter, round, std::move((*result)[i]));
        continue;
      }
      // Output is lossless whatever the drafter does, so a failed or
      // malformed draft only costs speed: the request continues target-only.
      sequences_.at(round.id).drafter_failed = true;
      round.record.fallback = true;
    }
  }
}

void SpeculativeEngine::TakeDraft(Drafter* drafter, Round& round,
                                  DraftResult draft) {
  if (drafter == drafter_) {
    const ConfidenceCut::Cut cut =
        sequences_.at(round.id).confidence.Apply(&draft);
    round.record.cut = cut != ConfidenceCut::Cut::kWhole;
    // Nothing left to verify: the round is a decode step.
    if (cut == ConfidenceCut::Cut::kEmpty) return;
    round.modeled = true;
  }
  round.draft = std::move(draft);
}

std::vector<PrefillWork> SpeculativeEngine::PrefillWorkFor(
    const std::vector<SequenceId>& ids) const {
  std::vector<PrefillWork> prefills;
  for (SequenceId id : ids) {
    const Sequence& seq = sequences_.at(id);
    prefills.push_back(
        {id,
         std::vector<int32_t>(seq.request.prompt.begin() + seq.reuse,
                              seq.request.prompt.end()),
         seq.request.sampling, seq.reuse, FeedsContext(seq)});
  }
  return prefills;
}

std::vector<VerifyWork> SpeculativeEngine::VerifyWorkFor(
    std::vector<Round>& rounds) {
  std::vector<VerifyWork> verifies;
  for (Round& round : rounds) {
    Sequence& seq = sequences_.at(round.id);
    VerifyWork v{round.id, seq.start, {seq.bonus}};
    if (round.draft.has_value()) {
      const std::vector<int32_t>& proposal = round.draft->passes.back().tokens;
      // A long model draft (or the rest of one) is verified a chunk at a
      // time; a lookup's block is verified whole.
      const size_t verified = round.modeled || round.record.reused
                                  ? seq.chunked.Verified(proposal)
                                  : proposal.size();
      v.block.insert(v.block.end(), proposal.begin(),
                     proposal.begin() + verified);
    }
    verifies.push_back(std::move(v));
  }
  return verifies;
}

void SpeculativeEngine::CommitPrefills(const std::vector<SequenceId>& ids,
                                       const TargetStepResult& step,
                                       double seconds) {
  const double now = Now();
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& seq = sequences_.at(ids[i]);
    if (!step.prefill_status.empty() && !step.prefill_status[i].ok()) {
      if (absl::IsNotFound(step.prefill_status[i]) && seq.reuse > 0) {
        // The kept KV is gone (evicted or expired on the target): prefill
        // the whole prompt next step.
        seq.reuse = 0;
        seq.kept_tokens.clear();
        seq.result.cache_lost = true;
        pending_.push_back(ids[i]);
        continue;
      }
      Finish(ids[i], FinishReason::kError, step.prefill_status[i]);
      continue;
    }
    seq.start = static_cast<int64_t>(seq.request.prompt.size());
    seq.bonus = step.first_tokens[i];
    seq.result.reused_tokens = seq.reuse;
    seq.kept_tokens.clear();
    if (seq.request.keep) {
      seq.tokens = seq.request.prompt;
      seq.tokens.push_back(seq.bonus);
    }
    seq.result.prefill_seconds = seconds;
    seq.first_token_time = now;
    running_.push_back(ids[i]);
    Emit(seq, {seq.bonus});
  }
}

void SpeculativeEngine::CommitRound(Round& round, const VerifyWork& verified,
                                    const VerifyOutcome& out,
                                    double verify_seconds) {
  Sequence& seq = sequences_.at(round.id);
  RoundRecord& record = round.record;
  record.window = static_cast<int>(verified.block.size());
  record.accepted = out.accepted;
  record.verify_seconds = verify_seconds;
  if (seq.request.method == DraftMethod::kHybrid && !record.looked_up &&
      !record.reused && record.window >= 2) {
    seq.hybrid.RecordModelRound(out.accepted);
  }
  // A round that called a drafter (even one cut to nothing) is the cost of
  // speculating; the others of decoding plainly. A hybrid lookup is
  // neither: it is never paused.
  if (!record.looked_up) {
    if (record.window >= 2 || round.called_drafter) {
      seq.adaptive.RecordDrafted(out.accepted + 1,
                                 round.draft_seconds + verify_seconds);
    } else {
      seq.adaptive.RecordPlain(verify_seconds);
    }
  }
  std::vector<int32_t> committed(verified.block.begin() + 1,
                                 verified.block.begin() + 1 + out.accepted);
  committed.push_back(out.target_tokens[out.accepted]);
  seq.chunked.AfterVerify(
      out.accepted + 1 == static_cast<int>(verified.block.size()),
      committed.back());
  if (round.draft.has_value()) {
    record.draft_seconds = round.draft_seconds;
    record.edits = EditOutcomes(round.draft->passes, out, record.window - 1);
  }
  if (options_.on_round) options_.on_round(round.id, record);
  seq.result.rounds.push_back(std::move(record));
  seq.start += out.accepted + 1;
  seq.bonus = committed.back();
  if (seq.request.keep) {
    seq.tokens.insert(seq.tokens.end(), committed.begin(), committed.end());
  }
  Emit(seq, committed);
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
