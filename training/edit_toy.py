#!/usr/bin/env python3
"""A toy language where editing must help (docs/RESULTS.md, "The editing
toy"): generated sequences of overlapping multi-token words in a fixed
carrier, whose per-slot most likely tokens spell a non-word.

The language. G groups, each with seven tokens of its own (a b c x y z q)
from the target's vocabulary and four three-token words over them:

    (a, b, c) 0.35   (a, y, z) 0.20   (x, b, z) 0.25   (x, y, q) 0.20

Slot by slot the most likely tokens are a (0.55), b (0.60) and z (0.45):
(a, b, z), which is no word. A sequence is a chain of units, each a word of
the current group drawn independently, then the group's carrier: five fixed
tokens, after which the next group (g + 1 mod G) follows. Only the words
are random, so everything a drafter can gain past a word depends on
drafting the word as a whole: a per-slot (marginal) draft never gets past
one, the joint draft (a, b, c) does 35% of the time.

Sequences are written as `dedit-train distill` records (a prompt of two
units, then the continuation), so the unchanged drafter trainer trains on
them with the target as the feature extractor. The language is a pure
function of the tokenizer and --language_seed; the sequences of --seed.

  edit_toy.py generate --tokenizer TARGET/tokenizer.json --out DIR
                       [--train 4096] [--heldout 64] [--units 30] [--seed 1]
      -> DIR/spec.json (the language), DIR/train.bin, DIR/heldout.bin
  edit_toy.py score --spec DIR/spec.json --data DIR/heldout.bin
                    --drafts DRAFTS.jsonl [--causal_drafts TWIN.jsonl]
                    [--same_weights_causal MASKED.jsonl]
      -> one JSON object: tau per pass, the neighbour oracle's gain at the
         ambiguous slots, and the analytic ceiling (the Bayes-optimal joint
         block) and marginal tau (the best per-slot draft) at the same
         anchors. DRAFTS.jsonl comes from `dedit-train drafts`.
  edit_toy.py ceiling --spec DIR/spec.json [--window 16]
      -> the analytic taus averaged over a unit's phases, and the neighbour
         oracle's analytic accuracy per word slot (oracle_ceilings): the
         per-slot draft's, the best from the earlier slots only (a causal
         editor's ceiling) and from all the others (any editor's).
  edit_toy.py report --sweep OUT
      -> markdown tables of a sweep's runs (scripts/edit_toy.sh --train),
         per variant the mean and 95% interval over its seeds, and each
         bidirectional variant's P3 against its causal-trained twins',
         paired by seed.

tau is the mean accepted length of a block anchored at every position of
the continuation: the longest prefix of the draft that matches the sampled
sequence, plus one (the bonus), as `dedit-train drafter`'s held-out tau.
"""

import argparse
import glob
import itertools
import json
import os
import random
import re
import struct
import sys

MAGIC = b"DEDDIS01"  # training/distill.cc
SHAPES = {  # (slot-1, slot-2, slot-3 token names), probability
    # The joint fix of the per-slot draft (a, b, z) reads left to right:
    # given a and b, c.
    "left": [(("a", "b", "c"), 0.35), (("a", "y", "z"), 0.20),
             (("x", "b", "z"), 0.25), (("x", "y", "q"), 0.20)],
    # The per-slot draft (u, b, z) is best fixed at its first slot, from
    # the slots after it: (x, b, z) 0.4 is the most likely word, but slot 1
    # alone says u (0.5). A causal editor cannot see why; the best it can
    # do from u is (u, b, q).
    "right": [(("a", "y", "c"), 0.10), (("x", "b", "z"), 0.40),
              (("u", "b", "q"), 0.30), (("u", "y", "c"), 0.20)],
}
WORD_LEN = 3
CARRIER_LEN = 5
UNIT = WORD_LEN + CARRIER_LEN
PROMPT_UNITS = 2


def make_language(tokenizer_path, groups, language_seed, shapes="left"):
    """The spec: per group its words (token ids, probability) and carrier."""
    word_shapes = SHAPES[shapes]
    with open(tokenizer_path, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    # Byte-level BPE: "Ġ" marks a leading space. Words start with a spaced
    # piece and continue with inner pieces; carriers are spaced pieces.
    spaced = sorted(t for t in vocab if re.fullmatch("Ġ[a-z]{3,}", t))
    inner = sorted(t for t in vocab if re.fullmatch("[a-z]{3,}", t))
    rng = random.Random(language_seed)
    rng.shuffle(spaced)
    rng.shuffle(inner)
    # Per group: the spaced pieces start words (a, x, u) and make the
    # carrier; inner pieces continue words (b, y, c, z, q).
    used = {n for shape, _ in word_shapes for n in shape}
    starts = "".join(n for n in "axu" if n in used)
    inner_names = "byczq"
    n_spaced, n_inner = len(starts) + CARRIER_LEN, len(inner_names)
    need_spaced = groups * n_spaced
    need_inner = groups * n_inner
    if len(spaced) < need_spaced or len(inner) < need_inner:
        sys.exit(f"edit_toy: the vocabulary has too few word pieces for "
                 f"{groups} groups")
    spec = {"groups": [], "unit": UNIT, "word_len": WORD_LEN,
            "prompt_units": PROMPT_UNITS, "language_seed": language_seed,
            "shapes": shapes}
    for g in range(groups):
        s = spaced[g * n_spaced:(g + 1) * n_spaced]
        i = inner[g * n_inner:(g + 1) * n_inner]
        names = dict(zip(starts, s))
        names.update(zip(inner_names, i))
        carrier = s[len(starts):]
        spec["groups"].append({
            "words": [{"tokens": [vocab[names[n]] for n in shape],
                       "text": "".join(names[n] for n in shape)
                       .replace("Ġ", " "), "p": p}
                      for shape, p in word_shapes],
            "carrier": [vocab[t] for t in carrier],
            "carrier_text": "".join(carrier).replace("Ġ", " "),
        })
    return spec


def sample_sequence(spec, units, rng):
    groups = spec["groups"]
    g = rng.randrange(len(groups))
    tokens = []
    for _ in range(PROMPT_UNITS + units):
        words = groups[g]["words"]
        word = rng.choices(words, weights=[w["p"] for w in words])[0]
        tokens += word["tokens"] + groups[g]["carrier"]
        g = (g + 1) % len(groups)
    return tokens


def write_records(path, records):
    with open(path, "wb") as f:
        f.write(MAGIC)
        for prompt_len, tokens in records:
            f.write(struct.pack("<II", prompt_len, len(tokens)))
            f.write(struct.pack(f"<{len(tokens)}i", *tokens))


def read_records(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        sys.exit(f"edit_toy: {path} is no distill file")
    out, at = [], 8
    while at + 8 <= len(data):
        prompt_len, n = struct.unpack_from("<II", data, at)
        at += 8
        if at + 4 * n > len(data):
            break
        out.append((prompt_len, list(struct.unpack_from(f"<{n}i", data, at))))
        at += 4 * n
    return out


def cmd_generate(args):
    spec = make_language(args.tokenizer, args.groups, args.language_seed,
                         args.shapes)
    spec["units"] = args.units
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    prompt_len = PROMPT_UNITS * UNIT
    for name, n, seed in (("train", args.train, args.seed),
                          ("heldout", args.heldout, args.seed + 1000003)):
        if n <= 0:
            continue
        rng = random.Random(seed)
        write_records(os.path.join(args.out, name + ".bin"),
                      [(prompt_len, sample_sequence(spec, args.units, rng))
                       for _ in range(n)])
    print(json.dumps({"out": args.out, "train": args.train,
                      "heldout": args.heldout, "groups": len(spec["groups"]),
                      "sample": " | ".join(
                          w["text"] + " /" + g["carrier_text"]
                          for g in spec["groups"][:2] for w in g["words"][:1])}))


# --- The analytic model --------------------------------------------------

def group_at(spec, tokens):
    """The group of the sequence's first unit (its first token's group)."""
    for g, grp in enumerate(spec["groups"]):
        if any(w["tokens"][0] == tokens[0] for w in grp["words"]):
            return g
    raise ValueError("a sequence that does not start with a word")


def block_structure(spec, g0, anchor, known, n):
    """Slots 1..n after `anchor` (a position whose unit-0 group is g0):
    a list of occurrences, each (first slot, length, candidates) where
    candidates is [(tokens, p)] of what the occurrence can be, conditioned
    on the known tokens (a word the anchor is inside of); carrier tokens
    are occurrences of one certain candidate."""
    groups = spec["groups"]
    occ = []
    slot = 1
    while slot <= n:
        pos = anchor + slot
        unit, phase = divmod(pos, UNIT)
        grp = groups[(g0 + unit) % len(groups)]
        if phase < WORD_LEN:
            start = pos - phase
            seen = known[start:anchor + 1] if start <= anchor else []
            cands = [(w["tokens"][phase:], w["p"]) for w in grp["words"]
                     if w["tokens"][:len(seen)] == seen]
            total = sum(p for _, p in cands)
            merged = {}
            for t, p in cands:
                merged[tuple(t)] = merged.get(tuple(t), 0) + p / total
            length = WORD_LEN - phase
        else:
            merged = {tuple(grp["carrier"][phase - WORD_LEN:]): 1.0}
            length = UNIT - phase
        length = min(length, n - slot + 1)
        cut = {}
        for t, p in merged.items():
            cut[t[:length]] = cut.get(t[:length], 0) + p
        occ.append((slot, length, sorted(cut.items(), key=lambda c: -c[1])))
        slot += length
    return occ


def expected_accepted(occ, draft):
    """E[longest matching prefix] of `draft` (one token tuple per
    occurrence) against the occurrences' distribution."""
    total, alive = 0.0, 1.0
    for (_, length, cands), d in zip(occ, draft):
        for m in range(1, length + 1):
            total += alive * sum(p for t, p in cands if t[:m] == d[:m])
        alive *= sum(p for t, p in cands if t == d)
        if alive == 0:
            break
    return total


def slot_votes(cands, k):
    """The probability of each token at position k of an occurrence."""
    votes = {}
    for t, p in cands:
        votes[t[k]] = votes.get(t[k], 0) + p
    return votes


def ceiling_and_marginal(occ):
    """The Bayes-optimal joint block's expected accepted length, and that
    of the per-slot argmax draft (what a perfect P1 proposes)."""
    best = max(expected_accepted(occ, d)
               for d in itertools.product(*[[t for t, _ in c]
                                            for _, _, c in occ]))
    marginal = []
    for _, length, cands in occ:
        d = []
        for k in range(length):
            votes = slot_votes(cands, k)
            d.append(max(votes, key=votes.get))
        marginal.append(tuple(d))
    return best, expected_accepted(occ, marginal)


def slot_certainty(occ, n):
    """Per slot 1..n, the largest marginal probability of its token."""
    out = [1.0] * n
    for first, length, cands in occ:
        for k in range(length):
            out[first - 1 + k] = max(slot_votes(cands, k).values())
    return out


def oracle_ceilings(words):
    """The neighbour oracle's best accuracy at each word slot, for words
    [(tokens, p)]: the probed slot holds P1's guess and the rest of the
    word the truth. Per slot (1-based): `p1`, the per-slot draft's (the
    most likely token there, what a P1 that cannot tell the words apart
    proposes); `left`, the best guess from the truth at the word's earlier
    slots only (what a causal editor can reach); `full`, the best guess
    from the truth at all its other slots (any editor's ceiling, since
    P1's guess there is the same for every word). The carrier around a
    word is fixed, so it tells nothing more."""
    def best(k, known):
        # The most likely token at slot k among the words that agree with
        # the truth at the slots in `known`, summed over the truths.
        agree = {}
        for tokens, p in words:
            agree.setdefault(tuple(tokens[j] for j in known), []).append(
                (tokens, p))
        return sum(max(slot_votes(c, k).values()) for c in agree.values())

    n = len(words[0][0])
    return {str(k + 1): {"p1": best(k, []),
                         "left": best(k, list(range(k))),
                         "full": best(k, [j for j in range(n) if j != k])}
            for k in range(n)}


def cmd_ceiling(args):
    with open(args.spec) as f:
        spec = json.load(f)
    n = args.window - 1
    rng = random.Random(0)
    seq = sample_sequence(spec, 8, rng)
    best = marg = 0.0
    for anchor in range(PROMPT_UNITS * UNIT, PROMPT_UNITS * UNIT + UNIT):
        occ = block_structure(spec, group_at(spec, seq), anchor, seq, n)
        b, m = ceiling_and_marginal(occ)
        best += b / UNIT
        marg += m / UNIT
    # Every group has the same word shapes, so group 0 stands for all.
    slots = oracle_ceilings([(w["tokens"], w["p"])
                             for w in spec["groups"][0]["words"]])
    # The oracle's gain in points over the per-slot draft, averaged over a
    # word's slots (score's oracle_gain_points counts each ambiguous slot
    # once, and a word's slots are about equally often in a block).
    gain = {kind: 100 * sum(c[kind] - c["p1"] for c in slots.values()) /
            len(slots) for kind in ("left", "full")}
    print(json.dumps({"window": args.window, "ceiling_tau": 1 + best,
                      "marginal_tau": 1 + marg,
                      "oracle_by_word_slot": slots,
                      "left_oracle_gain_points": gain["left"],
                      "full_oracle_gain_points": gain["full"]}))


# --- Scoring drafts ------------------------------------------------------

def read_drafts(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def accepted(draft, truth):
    k = 0
    while k < len(truth) and draft[k] == truth[k]:
        k += 1
    return k


def score(spec, records, drafts):
    """tau per pass, and P1's and the oracle's accuracy at the ambiguous
    slots (the generator's marginal there is below 1), with the analytic
    taus at the same anchors."""
    if len(drafts) != len(records):
        sys.exit(f"edit_toy: {len(drafts)} draft records for "
                 f"{len(records)} sequences")
    passes = len(drafts[0]["passes"])
    acc = [0.0] * passes
    blocks = 0
    best = marg = 0.0
    # Per slot of a word (1..WORD_LEN; their sums are the totals): where
    # the editor revises and where it keeps its input (a ProposalMix
    # editor learns to trust the slots P1 is sure of, which the oracle
    # probes too).
    by_slot = {j: {"n": 0, "p1": 0, "oracle": 0, "p3": 0}
               for j in range(1, WORD_LEN + 1)}
    last = min(passes, 3) - 1  # the edits compared: P1 against P3
    extending = shortening = 0
    for (prompt_len, tokens), d in zip(records, drafts):
        g0 = group_at(spec, tokens)
        for b, anchor in enumerate(d["anchors"]):
            truth = tokens[anchor + 1:anchor + 1 + len(d["passes"][0][b])]
            n = len(truth)
            if n == 0:
                continue
            blocks += 1
            got = [accepted(d["passes"][p][b][:n], truth)
                   for p in range(passes)]
            for p in range(passes):
                acc[p] += got[p]
            extending += got[last] > got[0]
            shortening += got[last] < got[0]
            occ = block_structure(spec, g0, anchor, tokens, n)
            b_, m_ = ceiling_and_marginal(occ)
            best += b_
            marg += m_
            certain = slot_certainty(occ, n)
            for k in range(n):
                if certain[k] < 1.0:
                    hits = {"n": 1,
                            "p1": d["passes"][0][b][k] == truth[k],
                            "oracle": d["oracle"][b][k] == truth[k],
                            "p3": (passes >= 3 and
                                   d["passes"][2][b][k] == truth[k])}
                    # Only word slots are ever uncertain.
                    slot = by_slot[(anchor + 1 + k) % UNIT + 1]
                    for key, hit in hits.items():
                        slot[key] += hit
    amb = {key: sum(c[key] for c in by_slot.values())
           for key in ("n", "p1", "oracle", "p3")}
    out = {f"p{p + 1}_tau": 1 + acc[p] / blocks for p in range(passes)}
    out.update({
        "blocks": blocks,
        # Blocks whose accepted length the edit passes (P1 -> P3) made
        # longer or shorter.
        "extending_edits": extending / blocks,
        "shortening_edits": shortening / blocks,
        # Of the blocks whose accepted length changed, the share made
        # shorter: how often an edit that matters is a harmful one.
        "shortening_share": shortening / max(extending + shortening, 1),
        "ceiling_tau": 1 + best / blocks,
        "marginal_tau": 1 + marg / blocks,
        "ambiguous_slots": amb["n"],
        "ambiguous_p1_accuracy": amb["p1"] / max(amb["n"], 1),
        "ambiguous_p3_accuracy": amb["p3"] / max(amb["n"], 1),
        "ambiguous_oracle_accuracy": amb["oracle"] / max(amb["n"], 1),
    })
    out["oracle_gain_points"] = 100 * (out["ambiguous_oracle_accuracy"] -
                                       out["ambiguous_p1_accuracy"])
    out["ambiguous_by_word_slot"] = {
        str(j): {"slots": c["n"],
                 **{f"{key}_accuracy": c[key] / max(c["n"], 1)
                    for key in ("p1", "p3", "oracle")},
                 "oracle_gain_points": 100 * (c["oracle"] - c["p1"]) /
                 max(c["n"], 1)}
        for j, c in by_slot.items()}
    return out


def cmd_score(args):
    with open(args.spec) as f:
        spec = json.load(f)
    records = read_records(args.data)
    out = score(spec, records, read_drafts(args.drafts))
    if args.causal_drafts:
        causal = score(spec, records, read_drafts(args.causal_drafts))
        out["causal_p3_tau"] = causal["p3_tau"]
        out["causal_twin"] = causal
    if args.same_weights_causal:
        masked = score(spec, records, read_drafts(args.same_weights_causal))
        out["same_weights_causal_p3_tau"] = masked["p3_tau"]
    p1, p3, ceil = out["p1_tau"], out.get("p3_tau"), out["ceiling_tau"]
    if p3 is not None:
        out["p3_over_p1"] = p3 / p1
        out["headroom_closed"] = (p3 - p1) / (ceil - p1) if ceil > p1 else 0
    print(json.dumps(out))


def mean_and_interval(values):
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    t975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}.get(n, 2.0)
    return mean, t975 * (var / n) ** 0.5


def mean_cell(values):
    """A table cell: the mean, and +- its 95% interval over more than one
    value."""
    m, h = mean_and_interval(values)
    return f"{m:.3f} ± {h:.3f}" if len(values) > 1 else f"{m:.3f}"


def variant_of(run):
    """A sweep run's variant: its name without the seed, which comes last
    or before the word shapes (d2-mix-s2 -> d2-mix, d2-mix-s2-right ->
    d2-mix-right)."""
    return re.sub(r"-s[0-9]+(?=-right$|$)", "", run)


def causal_twin_of(name):
    """The bidirectional run whose causal-trained twin NAME is, or None:
    d<D>-causal-s<N>[-right] is d<D>-mix's twin, and any variant's twin is
    its name with -causal before the seed (d2-blend90-causal-s1 ->
    d2-blend90-s1), as scripts/edit_toy.sh names them."""
    m = re.fullmatch(r"(d[0-9]+)-causal-(s[0-9]+(?:-right)?)", name)
    if m:
        return f"{m[1]}-mix-{m[2]}"
    m = re.fullmatch(r"(d[0-9]+-.+)-causal-(s[0-9]+(?:-right)?)", name)
    return f"{m[1]}-{m[2]}" if m else None


def causal_pairs(runs):
    """{variant: ([P3 of the bidirectional runs], [P3 of their causal-
    trained twins])} for the runs whose twin (causal_twin_of: the same
    seed, depth and words) was run too, paired seed by seed."""
    pairs = {}
    for twin in sorted(runs):
        name = causal_twin_of(twin)
        if name in runs:
            bi, ca = pairs.setdefault(variant_of(name), ([], []))
            bi.append(runs[name]["p3_tau"])
            ca.append(runs[twin]["p3_tau"])
    return pairs


def cmd_report(args):
    """A markdown table of a sweep's runs (OUT/RUN/eval.json), then each
    variant over its seeds as mean +- the 95% interval, then each
    bidirectional variant's P3 against its causal twins' (causal_pairs)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(args.sweep, "*", "eval.json"))):
        with open(path) as f:
            r = json.load(f)
        changed = r["extending_edits"] + r["shortening_edits"]
        r.setdefault("shortening_share",  # eval.json written before it
                     r["shortening_edits"] / changed if changed else 0.0)
        runs[os.path.basename(os.path.dirname(path))] = r
    if not runs:
        sys.exit(f"edit_toy: no */eval.json under {args.sweep}")
    cols = ["p1_tau", "p2_tau", "p3_tau", "p4_tau", "p3_over_p1",
            "ceiling_tau", "headroom_closed", "oracle_gain_points",
            "same_weights_causal_p3_tau", "extending_edits",
            "shortening_edits", "shortening_share"]
    print("| run | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in runs.items():
        print(f"| {name} | " + " | ".join(
            f"{r[c]:.3f}" if c in r else "-" for c in cols) + " |")
    variants = {}
    for name, r in runs.items():
        variants.setdefault(variant_of(name), []).append(r)
    print()
    print("| variant (seeds) | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for v, rs in variants.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rs if c in r]
            if not vals:
                cells.append("-")
                continue
            cells.append(mean_cell(vals))
        print(f"| {v} ({len(rs)}) | " + " | ".join(cells) + " |")
    pairs = causal_pairs(runs)
    if pairs:
        print()
        print("| bidirectional vs causal-trained twin, P3 (seeds) | "
              "bidirectional | causal twin | difference |")
        print("|---|---|---|---|")
        for v, (bi, ca) in pairs.items():
            diff = [b - c for b, c in zip(bi, ca)]
            cells = [mean_cell(vals) for vals in (bi, ca, diff)]
            print(f"| {v} ({len(bi)}) | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--tokenizer", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--train", type=int, default=4096)
    g.add_argument("--heldout", type=int, default=64)
    g.add_argument("--units", type=int, default=30,
                   help="units after the two-unit prompt")
    g.add_argument("--groups", type=int, default=8)
    g.add_argument("--seed", type=int, default=1,
                   help="seed of the sequences (held-out: another stream)")
    g.add_argument("--shapes", choices=sorted(SHAPES), default="left",
                   help="the words: left (the per-slot draft is fixed left "
                   "to right) or right (its first slot needs the later ones)")
    g.add_argument("--language_seed", type=int, default=0,
                   help="seed of the language (which tokens, which words)")
    g.set_defaults(fn=cmd_generate)
    s = sub.add_parser("score")
    s.add_argument("--spec", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--drafts", required=True)
    s.add_argument("--causal_drafts", default="",
                   help="the causal-trained twin's drafts")
    s.add_argument("--same_weights_causal", default="",
                   help="the drafter's drafts with the causal edit mask")
    s.set_defaults(fn=cmd_score)
    c = sub.add_parser("ceiling")
    c.add_argument("--spec", required=True)
    c.add_argument("--window", type=int, default=16)
    c.set_defaults(fn=cmd_ceiling)
    r = sub.add_parser("report")
    r.add_argument("--sweep", required=True,
                   help="scripts/edit_toy.sh --train's OUT")
    r.set_defaults(fn=cmd_report)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
