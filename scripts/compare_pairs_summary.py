#!/usr/bin/env python3
"""The tables of scripts/compare_pairs.sh: two pairs' eval_chat_tasks.py
reports on each split, side by side.

Overall tau is total tokens over total rounds, so it weighs each family by
how many tokens its target writes. Two targets that answer a family in
different formats (the continued target writes reverse answers with
numbered steps, five times longer than the shipped target's) then move
the overall tau with no change in the drafters. So beside the raw overall
this prints:
  * per family tau for each pair, with each target's answer tokens;
  * "old from families" and "new on old answers": tokens / sum(tokens_f /
    tau_f) over the families with the old target's answer tokens, from
    the old and the new pair's per-family tau: the overall each pair's
    drafters reach on the old answer mix (both from the per-family tau, so
    they compare with each other, not with the raw overall, which can
    count rounds differently, e.g. the drafted rounds alone for a cut);
  * "without F" (--exclude): the same over the other families, each pair
    with its own tokens.

  compare_pairs_summary.py OUT_DIR [--exclude reverse]

reads OUT_DIR/{old,new}-{pool,fixed}.json.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "training"))
from chat_tasks import FAMILIES  # noqa: E402


def overall_tau(spec, families, weights=None):
    """Tokens over rounds across `families` of one configuration's report
    (spec[family] = {"tau", "tokens"}); `weights` (family -> tokens)
    replaces the report's own tokens, each family keeping its tau."""
    tokens = rounds = 0.0
    for f in families:
        if f not in spec or spec[f]["tau"] <= 0:
            continue
        t = weights[f] if weights is not None else spec[f]["tokens"]
        tokens += t
        rounds += t / spec[f]["tau"]
    return tokens / rounds if rounds else 0.0


def family_rows(old, new, name):
    """The per-family table rows of configuration `name`."""
    o, n = old["speculation"][name], new["speculation"].get(name, {})
    rows = []
    for f in FAMILIES:
        if f not in o:
            continue
        nf = n.get(f, {})
        rows.append((f, o[f]["tokens"], nf.get("tokens", 0), o[f]["tau"],
                     nf.get("tau", 0.0)))
    return rows


def mixed_overall(old, new, name, exclude=()):
    """(old from families, new on old answers, old without, new without)."""
    o, n = old["speculation"][name], new["speculation"].get(name, {})
    fams = [f for f in FAMILIES if f in o and f in n]
    kept = [f for f in fams if f not in exclude]
    old_tokens = {f: o[f]["tokens"] for f in fams}
    return (overall_tau(o, fams), overall_tau(n, fams, old_tokens),
            overall_tau(o, kept), overall_tau(n, kept))


def speedup_range(x):
    s = x.get("speedup_per_slice") or []
    return f"{min(s):.2f}-{max(s):.2f}" if s else ""


def print_split(split, old, new, exclude):
    acc = lambda r: (f"{r['accuracy']['overall']['correct']}"
                     f"/{r['accuracy']['overall']['instances']}")
    print(f"\n{split} split: answers right old {acc(old)}, new {acc(new)}; "
          f"lossless old {old['lossless']}, new {new['lossless']}")
    without = "+".join(exclude)
    print("| configuration | old tau | new tau | old from families | "
          f"new on old answers | old without {without} | "
          f"new without {without} | old speedup | new speedup | "
          "old per slice | new per slice |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in old["speculation"]:
        o = old["speculation"][name]["overall"]
        n = new["speculation"].get(name, {}).get("overall", {})
        o_mix, n_mix, o_wo, n_wo = mixed_overall(old, new, name, exclude)
        print(f"| {name} | {o['tau']:.2f} | {n.get('tau', 0):.2f} | "
              f"{o_mix:.2f} | {n_mix:.2f} | {o_wo:.2f} | {n_wo:.2f} | "
              f"{o['speedup']:.2f}x | {n.get('speedup', 0):.2f}x | "
              f"{speedup_range(o)} | {speedup_range(n)} |")
    print(f"\n{split} split, tau per family (old / new; answer tokens "
          "old / new in the first row)")
    names = [m for m in old["speculation"] if m != "ar"]
    print("| | " + " | ".join(FAMILIES) + " |")
    print("|---" * (len(FAMILIES) + 1) + "|")
    if names:
        rows = family_rows(old, new, names[0])
        print("| answer tokens | " + " | ".join(
            f"{r[1]} / {r[2]}" for r in rows) + " |")
    for name in names:
        rows = family_rows(old, new, name)
        print(f"| {name} | " + " | ".join(
            f"{r[3]:.2f} / {r[4]:.2f}" for r in rows) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--exclude", default="reverse",
                    help="comma-separated families left out of the "
                    "'without' overall (default reverse)")
    args = ap.parse_args()
    exclude = tuple(f for f in args.exclude.split(",") if f)
    for f in exclude:
        if f not in FAMILIES:
            ap.error(f"--exclude: unknown family {f!r}")
    for split in ("pool", "fixed"):
        r = {}
        for side in ("old", "new"):
            with open(os.path.join(args.out, f"{side}-{split}.json")) as f:
                r[side] = json.load(f)
        print_split(split, r["old"], r["new"], exclude)


if __name__ == "__main__":
    main()
