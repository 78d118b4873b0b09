#!/usr/bin/env python3
"""Markdown tables from a scripts/train_tiny.sh work folder.

    scripts/summarize_training.py WORK_DIR

Reads WORK_DIR/timings.txt, WORK_DIR/target-state/log.jsonl, every
WORK_DIR/<drafter>-state/log.jsonl and WORK_DIR/eval-<drafter>.json, and
prints the tables that docs/RESULTS.md and the model cards quote: stage wall
times, the target's held-out loss, the drafters' ProposalMix rates over
training, and each evaluation (tau per pass count, speedup, edit outcomes,
losslessness). Standard library only.
"""
import glob
import json
import os
import sys


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def timings(work):
    path = os.path.join(work, "timings.txt")
    if not os.path.exists(path):
        return
    print("| stage | wall time | exit |")
    print("|---|---|---|")
    for line in open(path):
        parts = line.split()
        if len(parts) >= 3 and parts[1].endswith("s") and parts[2].startswith("rc="):
            secs = int(parts[1][:-1])
            print(f"| {parts[0]} | {secs // 60} min {secs % 60:02d} s | {parts[2][3:]} |")
    print()


def target_log(work):
    path = os.path.join(work, "target-state", "log.jsonl")
    if not os.path.exists(path):
        return
    rows = read_jsonl(path)
    print("Target held-out loss (train loss = mean of the 50 steps before):")
    print()
    print("| step | train loss | held-out loss |")
    print("|---|---|---|")
    for i, r in enumerate(rows):
        if "heldout_loss" in r:
            window = [x["loss"] for x in rows[max(0, i - 49):i + 1]]
            print(f"| {r['step']} | {mean(window):.3f} | {r['heldout_loss']:.3f} |")
    print()


def drafter_log(work, name):
    path = os.path.join(work, f"{name}-state", "log.jsonl")
    if not os.path.exists(path):
        return
    rows = read_jsonl(path)
    if not rows:
        return
    print(f"`{name}` training (averages over 50-step spans; rates in %):")
    print()
    print("| steps | loss P1 | loss P2 | P1 acc | GT-selection | overwrite | P2 acc |")
    print("|---|---|---|---|---|---|---|")
    n = len(rows)
    spans = [(0, 50), (n // 2 - 25, n // 2 + 25), (n - 50, n)]
    for a, b in spans:
        a, b = max(0, a), min(n, b)
        chunk = rows[a:b]
        if not chunk:
            continue
        print(f"| {chunk[0]['step']}-{chunk[-1]['step']} "
              f"| {mean([r['loss_p1'] for r in chunk]):.3f} "
              f"| {mean([r['loss_p2'] for r in chunk]):.3f} "
              f"| {100 * mean([r['p1_accuracy'] for r in chunk]):.1f} "
              f"| {100 * mean([r['gt_selection'] for r in chunk]):.1f} "
              f"| {100 * mean([r['overwrite'] for r in chunk]):.1f} "
              f"| {100 * mean([r['p2_accuracy'] for r in chunk]):.1f} |")
    evals = [r for r in rows if "heldout_tau_p1" in r]
    if evals:
        print()
        print("| step | held-out tau P1 | P2 | P3 (trainer's offline estimate) |")
        print("|---|---|---|---|")
        for r in evals:
            print(f"| {r['step']} | {r['heldout_tau_p1']:.3f} | "
                  f"{r['heldout_tau_p2']:.3f} | {r['heldout_tau_p3']:.3f} |")
    print()


def eval_report(work, name):
    path = os.path.join(work, f"eval-{name}.json")
    if not os.path.exists(path):
        return
    d = json.load(open(path))
    base = d["baseline"]
    print(f"`{name}` evaluation: {d['num_prompts']} {d['prompt_split']} prompts of "
          f"{d['prompt_tokens']} tokens, {d['max_new_tokens']} new tokens, "
          f"W = {d['window']}, T = 0, batch 1; target-only baseline "
          f"{base['tokens_per_s']:.0f} tok/s.")
    print()
    print("| editor | K | tau | tok/s | speedup | lossless | edits P_k vs final (ext/unch/short) |")
    print("|---|---|---|---|---|---|---|")
    for r in d["runs"]:
        edits = "; ".join(
            f"P{e['pass']}: {e['extended']}/{e['unchanged']}/{e['shortened']}"
            for e in r["edit_outcomes"]) or "-"
        print(f"| {r['editor']} | {r['passes']} | {r['tau']:.3f} | "
              f"{r['tokens_per_s']:.0f} | {r['speedup']:.2f}x | "
              f"{'yes' if r['lossless'] else 'NO'} | {edits} |")
    print()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    work = sys.argv[1]
    timings(work)
    target_log(work)
    names = sorted(os.path.basename(p)[:-len("-state")]
                   for p in glob.glob(os.path.join(work, "drafter*-state")))
    for name in names:
        drafter_log(work, name)
        eval_report(work, name)


if __name__ == "__main__":
    main()
