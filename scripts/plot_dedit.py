#!/usr/bin/python3
"""Plots of the DEdit tables (docs/RESULTS.md) from one dedit-eval.json run.

  scripts/plot_dedit.py REPORT.json OUT_DIR [--log drafter-state/log.jsonl]

REPORT is what scripts/eval_chat_tasks.py --configs prints (train_tiny.sh
chat writes it to $WORK/dedit-eval.json; the first pair's is `git show
4ee83a5:checkpoints/tiny/drafter/dedit_eval.json`). Writes PNGs (Debian's
python3-matplotlib; run with /usr/bin/python3):

  dedit_tau.png        tau against passes K, for W = 16 and 32, with the
                       causal editor and the n-gram baseline
  dedit_positions.png  accepted drafts per window position (share of drafted
                       rounds that accepted at least k tokens)
  dedit_edits.png      edit outcomes per pass (extended / unchanged /
                       shortened), with and without ProposalMix
  dedit_training.png   (with --log) held-out slot-1 accuracy, tau and the
                       neighbour oracle during training
"""
import argparse
import json
import os
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def overall(report, name):
    return report["speculation"][name]["overall"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("out_dir")
    ap.add_argument("--log", default="")
    a = ap.parse_args()
    report = json.load(open(a.report))
    os.makedirs(a.out_dir, exist_ok=True)
    names = list(report["speculation"])

    # tau against K.
    fig, ax = plt.subplots(figsize=(6, 4))
    for prefix, label in (("w16k", "W=16"), ("w32k", "W=32"),
                          ("causal16k", "W=16, causal editor"),
                          ("mix16k", "twin with ProposalMix"),
                          ("nomix16k", "twin without ProposalMix")):
        pts = sorted((int(re.sub(r"\D", "", n[len(prefix):]) or 0),
                      overall(report, n)["tau"])
                     for n in names if re.fullmatch(prefix + r"\d+", n))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    for n in names:
        if n.startswith("ngram"):
            w = n[len("ngram"):]
            ax.axhline(overall(report, n)["tau"],
                       linestyle={"8": ":", "16": "--"}.get(w, "-."),
                       color="gray", label=f"n-gram, W={w}")
    ax.set_xlabel("passes K")
    ax.set_ylabel("tau (held-out chat instances)")
    ax.set_xticks([1, 2, 3, 4])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out_dir, "dedit_tau.png"), dpi=110)

    # Acceptance per position.
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        o = overall(report, n)
        pos = o.get("accepted_per_position")
        if not pos or not o.get("drafted_rounds") or n.startswith(
                ("mix", "nomix", "causal")):
            continue
        if not re.fullmatch(r"(w16k1|w16k2|w32k1|w32k2|ngram16|ngram32)", n):
            continue
        share = [p / o["drafted_rounds"] for p in pos]
        ax.plot(range(1, len(share) + 1), share, marker=".", label=n)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("share of rounds accepting >= k drafts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out_dir, "dedit_positions.png"), dpi=110)

    # Edit outcomes with and without ProposalMix.
    rows = []
    for n in names:
        m = re.fullmatch(r"(mix|nomix|w16)16?k(\d)", n) or re.fullmatch(
            r"(w16)k(\d)", n)
        if not m or int(m.group(2)) < 2:
            continue
        for e in overall(report, n).get("edit_outcomes", []):
            if e["pass"] == int(m.group(2)) - 1:
                total = e["extended"] + e["unchanged"] + e["shortened"]
                rows.append((f"{n} P{e['pass'] + 1}", e["extended"] / total,
                             e["shortened"] / total))
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r[1] for r in rows], 0.4,
               label="extended")
        ax.bar([x + 0.2 for x in xs], [r[2] for r in rows], 0.4,
               label="shortened")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r[0] for r in rows], rotation=45, ha="right",
                           fontsize=7)
        ax.set_ylabel("share of drafted rounds")
        ax.legend()
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out_dir, "dedit_edits.png"), dpi=110)

    if a.log:
        evals = [r for r in map(json.loads, open(a.log))
                 if "oracle_edit_accuracy" in r]
        fig, ax = plt.subplots(figsize=(6, 4))
        steps = [r["step"] for r in evals]
        for key, label in (("heldout_slot1_p1_w32", "slot-1 P1 accuracy"),
                           ("oracle_edit_accuracy", "oracle: edit accuracy"),
                           ("oracle_p1_accuracy", "oracle: P1 accuracy")):
            ax.plot(steps, [r.get(key, 0) for r in evals], label=label)
        ax2 = ax.twinx()
        # Per-anchor tau (blocks at uniform anchors) and, where the log has
        # it, tau in rounds as the engine counts it (WalkRounds).
        for key, style in (("heldout_tau_p1_w16", "--"),
                           ("heldout_tau_p2_w16", ":"),
                           ("heldout_rounds_tau_p1_w16", "-.")):
            if any(key in r for r in evals):
                ax2.plot(steps, [r.get(key, 0) for r in evals], style,
                         color="black", label=key.replace("heldout_", ""))
        ax.set_xlabel("step")
        ax.set_ylabel("accuracy")
        ax2.set_ylabel("held-out tau (W=16)")
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out_dir, "dedit_training.png"), dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
