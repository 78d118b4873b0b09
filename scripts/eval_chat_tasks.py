#!/usr/bin/env python3
"""Answer accuracy and speculation per family on the chat task suite.

Renders every held-out instance's prompt (training/chat_tasks.py), encodes
it with the target's tokenizer (dedit-cli tokenize), decodes it greedily
in process (dedit-generate --json) target-only and with each speculative
method asked for, checks that every speculative output equals the
target-only one token for token, scores the answers
(chat_tasks.py score) and prints one JSON report:

  {"accuracy": {family: {correct, instances, accuracy}, "overall": ...},
   "speculation": {method: {family: {tau, speedup, tokens, tokens_per_s,
                                    ms_per_round, ...}}},
   "lossless": true}

  scripts/eval_chat_tasks.py --build build --target DIR --tasks TASKS_DIR
      [--drafter DIR] [--methods ar,ngram,model] [--window 8]
      [--max_tokens 448] [--threads 1] [--limit N] [--interleave 5]
      [--router HOST:PORT --stubs build/proto/python]

--configs replaces --methods with named configurations, each
NAME=METHOD[:w=W][:k=K][:causal][:drafter=DIR][:min=N][:short=X][:conf=C]
[:pt=N][:cp=KERNEL][:chunk=N][:adaptive][:rport=N],
e.g.
  --configs ar=ar,ngram=ngram:w=16,k1=model:w=16:k=1,causal3=model:k=3:causal
METHOD is ar, ngram, model or hybrid (per round, prompt lookup when the
last N tokens, default 3, occurred before, shorter matches too once the
model's rounds accept under X tokens, default 0.5, else the model; `min`
and `short` are in-process only, the router has flags for them). `conf`
(model and hybrid, in-process only; the router's --min_draft_confidence)
cuts the model's drafts before their first slot less confident than C.
`pt` (in-process only) is dedit-generate's --product_threads (default
--product-threads, 0: follow --threads); `cp` (in-process only) its --cpu_products (blas,
f32, bf16 or auto; default --cpu-products, auto). Compare kernels in runs of
their own (--cpu-products, --kv-cache-dtype): the baseline and the lossless check take the
ar configuration's outputs, and bf16 products decode their own greedy
text. `chunk` (model and hybrid, in-process only; the
router's --verify_chunk) verifies the model's drafts N block rows per
round, the rest of a draft next round. `adaptive` (in-process only; the
router's --adaptive_speculation) speculates only while drafted rounds
give more tokens per second than plain ones. `rport` (with --router) sends
that configuration's requests to the router on port N of --router's
host instead, e.g. a second router over the same target and drafter
started with other flags (--verify_chunk, --min_draft_confidence).
so that one run holds a whole table (the baseline is the config named ar,
else the first). Each configuration's report also has the acceptance per
draft position and the edit outcomes (extended / unchanged / shortened)
per edit pass, summed over the instances.

With --router the same prompts also go through a running dedit-router
(scripts/serve.sh) for each method, and "speculation_services" reports tau
and speedup per family there (client-side time from first to last token),
with the outputs checked against the in-process target-only ones.

Speedup is decode tokens/s of the method over target-only in the same run
(prefill excluded); do not report numbers taken while training runs. The
configurations take turns over --interleave slices of the instances, so
that a slow spell of the machine is shared; "speedup_per_slice" (overall)
gives each slice's speedup, the spread within the run.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "training"))
import chat_tasks  # noqa: E402


def run(cmd, stdin_text):
    p = subprocess.run(cmd, input=stdin_text, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"eval_chat_tasks.py: {' '.join(cmd[:2])} failed "
                 f"({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--target", required=True)
    ap.add_argument("--tasks", required=True, help="folder with heldout.jsonl")
    ap.add_argument("--drafter", default="")
    ap.add_argument("--methods", default="ar,ngram",
                    help="ar (target-only), ngram, model (needs --drafter)")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--passes", type=int, default=0)
    ap.add_argument("--max_tokens", type=int, default=448)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--product-threads", type=int, default=0,
                    help="dedit-generate --product_threads for every "
                         "configuration without pt=N (0: follow --threads)")
    ap.add_argument("--cpu-products", default="auto",
                    help="dedit-generate --cpu_products for every "
                         "configuration without cp=KERNEL")
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="dedit-generate --kv_cache_dtype (auto or bf16) for "
                         "every configuration; like --cpu-products, compare "
                         "in runs of their own")
    ap.add_argument("--answers_out", default="",
                    help="also write the target-only answers there, one "
                    "JSON line per held-out instance with its family, "
                    "prompt, reference and whether it scored")
    ap.add_argument("--limit", type=int, default=0,
                    help="first N instances per family (0 = all)")
    ap.add_argument("--interleave", type=int, default=5,
                    help="time the configurations in turns over this many "
                         "slices of the instances (1 = each over all "
                         "instances in one go)")
    ap.add_argument("--configs", default="",
                    help="named configurations (see above); replaces "
                         "--methods")
    ap.add_argument("--router", default="",
                    help="also measure through this dedit-router")
    ap.add_argument("--stubs", default="",
                    help="generated Python stubs (build/proto/python)")
    a = ap.parse_args()
    if a.interleave < 1:
        sys.exit("eval_chat_tasks.py: --interleave must be at least 1")

    cli = os.path.join(a.build, "cli", "dedit-cli")
    gen = os.path.join(a.build, "cli", "dedit-generate")
    heldout = [json.loads(l) for l in open(os.path.join(a.tasks,
                                                        "heldout.jsonl"))]
    if a.limit > 0:
        seen = {}
        kept = []
        for inst in heldout:
            seen[inst["family"]] = seen.get(inst["family"], 0) + 1
            if seen[inst["family"]] <= a.limit:
                kept.append(inst)
        heldout = kept
    prompts = [chat_tasks.render_chat(inst["user"]) for inst in heldout]
    ids = json.loads(run([cli, "tokenize", "--tokenizer",
                          os.path.join(a.target, "tokenizer.json")],
                         json.dumps(prompts)))

    configs = parse_configs(a)
    # Configurations are timed in turns over slices of the instances (a
    # fixed shuffle dealt round-robin, so that each slice mixes the
    # families however the file orders them), each slice starting with the
    # next configuration, so that a slow spell of this shared machine
    # falls on every configuration instead of on whichever ran then;
    # per-slice speedups in the report show the spread within the run.
    order = list(range(len(heldout)))
    random.Random(0).shuffle(order)
    slices = [sorted(order[s::a.interleave])
              for s in range(min(a.interleave, len(heldout)))]
    def in_turns(fetch):
        """{name: one row per instance}, fetch(config, prompt ids) giving
        the rows of one slice."""
        names = list(configs)
        out = {name: [None] * len(heldout) for name in names}
        for si, pick in enumerate(slices):
            for name in names[si % len(names):] + names[:si % len(names)]:
                rows = fetch(configs[name], [ids[i] for i in pick])
                if len(rows) != len(pick):
                    sys.exit(f"eval_chat_tasks.py: {name}: {len(rows)} "
                             f"results for {len(pick)} prompts")
                for i, row in zip(pick, rows):
                    out[name][i] = row
        return out

    results = in_turns(lambda c, p: generate_rows(
        a, gen, c, "".join(json.dumps(x) + "\n" for x in p)))

    base_method = "ar" if "ar" in results else next(iter(results))
    base = results[base_method]
    services = in_turns(lambda c, p: router_rows(a, c, p)) if a.router else {}
    # Instances whose output differs from the baseline's, per config.
    mismatches = {}
    for where, group in (("", results), ("services:", services)):
        for name, rows in group.items():
            bad = sum(r["tokens"] != b["tokens"] for r, b in zip(rows, base))
            if bad:
                mismatches[where + name] = bad
    lossless = not mismatches
    with tempfile.TemporaryDirectory() as d:
        answers = os.path.join(d, "answers.jsonl")
        with open(answers, "w") as f:
            for row in base:
                f.write(json.dumps({"answer": row["text"]}) + "\n")
        accuracy = json.loads(run([sys.executable,
                                   os.path.join(HERE, "..", "training",
                                                "chat_tasks.py"),
                                   "score",
                                   os.path.join(a.tasks, "heldout.jsonl")
                                   if a.limit == 0 else _write(d, heldout),
                                   answers], ""))
        if a.answers_out:
            with open(a.answers_out, "w") as f:
                for inst, row in zip(heldout, base):
                    f.write(json.dumps({
                        "family": inst["family"], "user": inst["user"],
                        "reference": inst["answer"], "answer": row["text"],
                        "correct": chat_tasks.correct(inst, row["text"])})
                            + "\n")

    def rate(rows):
        tokens = sum(max(len(r["tokens"]) - 1, 0) for r in rows)
        seconds = sum(r["timings"]["decode_s"] for r in rows)
        return tokens / seconds if seconds > 0 else 0.0, tokens

    def per_family(results):
        speculation = {}
        base = results.get("ar", next(iter(results.values())))
        for method, rows in results.items():
            per = {}
            for family in chat_tasks.FAMILIES + ["overall"]:
                pick = [i for i, inst in enumerate(heldout)
                        if family == "overall" or inst["family"] == family]
                if not pick:
                    continue
                m_rows = [rows[i] for i in pick]
                b_rows = [base[i] for i in pick]
                drafted = sum(r["drafted_rounds"] for r in m_rows)
                tau = (sum(r["mean_acceptance_length"] * r["drafted_rounds"]
                           for r in m_rows) / drafted) if drafted else 1.0
                m_rate, tokens = rate(m_rows)
                b_rate, _ = rate(b_rows)
                per[family] = {"tau": round(tau, 3),
                               "speedup": round(m_rate / b_rate, 3) if b_rate else 0,
                               "tokens": tokens}
                # chunk=N splits one draft's verification over several
                # rounds (the reused ones), so tau per round falls while
                # the tokens per Draft call stay those of the whole draft.
                reused = sum(r.get("reused_rounds", 0) for r in m_rows)
                if reused and drafted > reused:
                    per[family]["tau_per_draft"] = round(
                        tau * drafted / (drafted - reused), 3)
                # Tokens per round over all rounds: tau counts drafted
                # rounds only, and the n-gram method skips the draft when
                # its lookup misses, so tau flatters it against a drafter
                # that always proposes.
                rounds = sum(r.get("rounds", 0) for r in m_rows)
                if rounds:
                    per[family]["tokens_per_round"] = round(tokens / rounds, 3)
                # Absolute figures, for services-vs-in-process comparisons
                # (same run): decode tokens/s, and ms per round.
                per[family]["tokens_per_s"] = round(m_rate, 1)
                if rounds and m_rate:
                    per[family]["ms_per_round"] = round(
                        1000.0 * tokens / m_rate / rounds, 4)
            per["overall"].update(acceptance_details(rows))
            per["overall"]["speedup_per_slice"] = []
            for pick in slices:
                b_rate = rate([base[i] for i in pick])[0]
                m_rate = rate([rows[i] for i in pick])[0]
                per["overall"]["speedup_per_slice"].append(
                    round(m_rate / b_rate, 3) if b_rate else 0)
            speculation[method] = per
        return speculation

    report = {"accuracy": accuracy, "speculation": per_family(results),
              "lossless": lossless, "mismatches": mismatches,
              "baseline": base_method,
              "configs": configs}
    if services:
        report["speculation_services"] = per_family(services)
    print(json.dumps(report, indent=1))
    return 0 if lossless else 1


def generate_rows(a, gen, c, lines):
    """dedit-generate --json rows for the prompt lines under config c."""
    cmd = [gen, "--target", a.target, "--json", "--threads",
           str(a.threads), "--max_tokens", str(a.max_tokens),
           "--product_threads", str(c["pt"]),
           "--cpu_products", c.get("cp", a.cpu_products),
           "--kv_cache_dtype", a.kv_cache_dtype]
    if c.get("adaptive"):
        cmd += ["--adaptive_speculation"]
    if c["method"] == "ar":
        cmd += ["--ar"]
    elif c["method"] == "ngram":
        cmd += ["--method", "ngram", "--window", str(c["w"])]
    else:
        cmd += ["--drafter", c["drafter"], "--window", str(c["w"])]
        if c["method"] == "hybrid":
            cmd += ["--method", "hybrid",
                    "--hybrid_min_ngram", str(c["min"]),
                    "--hybrid_short_match_below", str(c["short"])]
        if c["k"] > 0:
            cmd += ["--passes", str(c["k"])]
        if c["conf"] > 0:
            cmd += ["--min_draft_confidence", str(c["conf"])]
        if c["chunk"] > 0:
            cmd += ["--verify_chunk", str(c["chunk"])]
        if c["causal"]:
            cmd += ["--causal_editor"]
    return [json.loads(l) for l in run(cmd, lines).splitlines() if l]


def parse_configs(a):
    """{name: {method, w, k, causal, drafter}} from --configs, else from
    --methods with --window/--passes/--drafter."""
    configs = {}
    if a.configs:
        for item in a.configs.split(","):
            name, _, spec = item.partition("=")
            parts = spec.split(":")
            c = {"method": parts[0], "w": a.window, "k": a.passes,
                 "causal": False, "drafter": a.drafter, "min": 3,
                 "short": 0.5, "conf": 0.0, "pt": a.product_threads,
                 "cp": a.cpu_products, "chunk": 0, "rport": 0,
                 "adaptive": False}
            for opt in parts[1:]:
                key, _, value = opt.partition("=")
                if key in ("w", "k", "min", "pt", "chunk", "rport"):
                    c[key] = int(value)
                elif key in ("short", "conf"):
                    c[key] = float(value)
                elif key in ("causal", "adaptive"):
                    c[key] = True
                elif key in ("drafter", "cp"):
                    c[key] = value
                else:
                    sys.exit(f"eval_chat_tasks.py: unknown option {opt!r} "
                             f"in config {item!r}")
            configs[name] = c
    else:
        for method in a.methods.split(","):
            configs[method] = {"method": method, "w": a.window, "k": a.passes,
                               "causal": False, "drafter": a.drafter,
                               "min": 3, "short": 0.5, "conf": 0.0,
                               "pt": a.product_threads,
                               "cp": a.cpu_products}
    for name, c in configs.items():
        if c["method"] not in ("ar", "ngram", "model", "hybrid"):
            sys.exit(f"eval_chat_tasks.py: {name}: unknown method "
                     f"{c['method']}")
        if c["method"] in ("model", "hybrid") and not c["drafter"]:
            sys.exit(f"eval_chat_tasks.py: {name}: method {c['method']} "
                     f"needs --drafter or drafter=DIR")
    return configs


def acceptance_details(rows):
    """Accepted drafts per window position and edit outcomes per pass,
    summed over the rows that report them (in-process rows do)."""
    positions, edits = [], {}
    for r in rows:
        for i, n in enumerate(r.get("accepted_per_position", [])):
            if i >= len(positions):
                positions.append(0)
            positions[i] += n
        for e in r.get("edit_outcomes", []):
            acc = edits.setdefault(e["pass"], {"extended": 0, "unchanged": 0,
                                               "shortened": 0})
            for key in acc:
                acc[key] += e[key]
    out = {"drafted_rounds": sum(r.get("drafted_rounds", 0) for r in rows),
           "lookup_rounds": sum(r.get("lookup_rounds", 0) for r in rows),
           "cut_rounds": sum(r.get("cut_rounds", 0) for r in rows),
           "skipped_rounds": sum(r.get("skipped_rounds", 0) for r in rows),
           "reused_rounds": sum(r.get("reused_rounds", 0) for r in rows),
           "paused_rounds": sum(r.get("paused_rounds", 0) for r in rows)}
    if positions:
        out["accepted_per_position"] = positions
    if edits:
        out["edit_outcomes"] = [{"pass": p, **v} for p, v in
                                sorted(edits.items())]
    return out


def router_rows(a, c, prompt_ids):
    """One request per prompt through the router, rows shaped like
    dedit-generate --json's (tokens, decode time, acceptance); config c as
    parse_configs makes (the router's drafter is the one it serves)."""
    import time
    sys.path.insert(0, a.stubs)
    try:
        import grpc
        from dedit.v1 import generation_pb2, services_pb2_grpc
    except ImportError as e:
        sys.exit(f"eval_chat_tasks.py: --router needs Debian's python3-grpcio "
                 f"and protobuf (run it with /usr/bin/python3): {e}")
    address = a.router
    if c["rport"]:
        address = f"{a.router.rsplit(':', 1)[0]}:{c['rport']}"
    stub = services_pb2_grpc.GenerationStub(grpc.insecure_channel(address))
    rows = []
    for ids in prompt_ids:
        req = generation_pb2.GenerateRequest(max_tokens=a.max_tokens)
        req.token_ids.ids.extend(ids)
        if c["method"] == "ar":
            req.disable_speculation = True
        elif c["method"] == "ngram":
            req.speculative_method = generation_pb2.SPECULATIVE_METHOD_NGRAM
            req.window = c["w"]
        else:
            req.speculative_method = (
                generation_pb2.SPECULATIVE_METHOD_HYBRID
                if c["method"] == "hybrid"
                else generation_pb2.SPECULATIVE_METHOD_MODEL)
            req.window = c["w"]
            req.passes = c["k"]
        tokens, first, last, final = [], None, None, None
        for resp in stub.Generate(req, timeout=600):
            now = time.perf_counter()
            if resp.token_ids:
                first = first if first is not None else now
                last = now
                tokens.extend(resp.token_ids)
            if resp.finished:
                final = resp
        acc = final.acceptance
        rows.append({"tokens": tokens,
                     "timings": {"decode_s": (last - first) if first else 0.0},
                     "drafted_rounds": acc.drafted_rounds,
                     "lookup_rounds": acc.lookup_rounds,
                     "reused_rounds": acc.reused_rounds,
                     "cut_rounds": acc.cut_rounds,
                     "skipped_rounds": acc.skipped_rounds,
                     "paused_rounds": acc.paused_rounds,
                     "rounds": acc.rounds,
                     "mean_acceptance_length": acc.mean_acceptance_length})
    return rows


def _write(d, instances):
    path = os.path.join(d, "heldout_subset.jsonl")
    with open(path, "w") as f:
        for inst in instances:
            f.write(json.dumps(inst) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
