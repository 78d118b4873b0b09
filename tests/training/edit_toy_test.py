#!/usr/bin/env python3
"""training/edit_toy.py: the language is what the editing toy needs (per
group, the per-slot most likely tokens spell no word), the records are
`dedit-train distill` records, the analytic taus agree with sampling, and
the scorer counts accepted prefixes, edits and the ambiguous slots.

  edit_toy_test.py REPO_ROOT
"""

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "training"))
import edit_toy  # noqa: E402

TOKENIZER = os.path.join(ROOT, "checkpoints", "tiny", "target",
                         "tokenizer.json")


class EditToyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="edit_toy_test_")
        subprocess.run([sys.executable,
                        os.path.join(ROOT, "training", "edit_toy.py"),
                        "generate", "--tokenizer", TOKENIZER, "--out",
                        cls.dir, "--train", "40", "--heldout", "8",
                        "--units", "6"], check=True, capture_output=True)
        with open(os.path.join(cls.dir, "spec.json")) as f:
            cls.spec = json.load(f)
        cls.right = edit_toy.make_language(TOKENIZER, 8, 0, "right")

    def test_the_per_slot_argmax_spells_no_word(self):
        for spec in (self.spec, self.right):
            self.check_language(spec)

    def check_language(self, spec):
        seen = set()
        for g in spec["groups"]:
            words = [tuple(w["tokens"]) for w in g["words"]]
            self.assertAlmostEqual(sum(w["p"] for w in g["words"]), 1.0)
            argmax = []
            for k in range(3):
                votes = {}
                for w in g["words"]:
                    votes[w["tokens"][k]] = votes.get(w["tokens"][k], 0) + w["p"]
                argmax.append(max(votes, key=votes.get))
            self.assertNotIn(tuple(argmax), words)
            tokens = {t for w in words for t in w} | set(g["carrier"])
            self.assertEqual(len(tokens),
                             {"left": 7, "right": 8}[spec["shapes"]] + 5)
            self.assertFalse(tokens & seen, "groups share a token")
            seen |= tokens

    def test_the_right_words_are_fixed_at_their_first_slot(self):
        # A block anchored before a word: the Bayes-optimal block starts
        # with another token than the per-slot draft (u), so an editor
        # must change slot 1 from what follows it; on the left words it
        # keeps slot 1 (a) and fixes slot 3.
        for spec, keeps_first in ((self.spec, True), (self.right, False)):
            seq = edit_toy.sample_sequence(spec, 4, random.Random(3))
            g0 = edit_toy.group_at(spec, seq)
            occ = edit_toy.block_structure(spec, g0, 23, seq, 15)
            best = max(itertools.product(*[[t for t, _ in c]
                                           for _, _, c in occ]),
                       key=lambda d: edit_toy.expected_accepted(occ, d))
            votes = edit_toy.slot_votes(occ[0][2], 0)
            self.assertEqual(best[0][0] == max(votes, key=votes.get),
                             keeps_first, spec["shapes"])

    def test_records_are_distill_records_of_units(self):
        train = edit_toy.read_records(os.path.join(self.dir, "train.bin"))
        held = edit_toy.read_records(os.path.join(self.dir, "heldout.bin"))
        self.assertEqual((len(train), len(held)), (40, 8))
        unit = self.spec["unit"]
        for prompt_len, tokens in train + held:
            self.assertEqual(prompt_len, 2 * unit)
            self.assertEqual(len(tokens), 8 * unit)
            g = edit_toy.group_at(self.spec, tokens)
            for u in range(8):
                grp = self.spec["groups"][(g + u) % len(self.spec["groups"])]
                piece = tokens[u * unit:(u + 1) * unit]
                self.assertIn(piece[:3], [w["tokens"] for w in grp["words"]])
                self.assertEqual(piece[3:], grp["carrier"])
        self.assertNotEqual(train[:8], held, "held-out repeats training")

    def test_analytic_taus_match_sampling(self):
        # At every phase of a unit, the ceiling's and the marginal draft's
        # expected accepted lengths against many sampled continuations.
        rng = random.Random(7)
        n = 15
        base = edit_toy.sample_sequence(self.spec, 6, rng)
        g0 = edit_toy.group_at(self.spec, base)
        for anchor in range(16, 24):
            occ = edit_toy.block_structure(self.spec, g0, anchor, base, n)
            best, marg = edit_toy.ceiling_and_marginal(occ)
            self.assertGreater(best, marg - 1e-12)
            drafts = {}
            for name, target in (("best", best), ("marginal", marg)):
                # The draft achieving `target`: search the product again.
                cands = itertools.product(*[[t for t, _ in c]
                                            for _, _, c in occ])
                if name == "best":
                    d = max(cands, key=lambda d: edit_toy.expected_accepted(
                        occ, d))
                else:
                    d = []
                    for _, length, c in occ:
                        toks = []
                        for k in range(length):
                            votes = edit_toy.slot_votes(c, k)
                            toks.append(max(votes, key=votes.get))
                        d.append(tuple(toks))
                drafts[name] = [t for part in d for t in part]
            total = {"best": 0, "marginal": 0}
            trials = 3000
            for _ in range(trials):
                # Resample the words after the anchor's known prefix.
                seq = list(base[:anchor + 1])
                tail = edit_toy.sample_sequence(self.spec, 6, rng)
                # Align the resampled tail's groups with base's.
                while edit_toy.group_at(self.spec, tail) != g0:
                    tail = edit_toy.sample_sequence(self.spec, 6, rng)
                unit = self.spec["unit"]
                start = anchor - anchor % unit
                if anchor % unit < 2:  # inside a word: keep its known part
                    word = base[start:start + 3]
                    while tail[start:start + anchor % unit + 1] != \
                            word[:anchor % unit + 1]:
                        tail = edit_toy.sample_sequence(self.spec, 6, rng)
                        while edit_toy.group_at(self.spec, tail) != g0:
                            tail = edit_toy.sample_sequence(self.spec, 6, rng)
                seq += tail[anchor + 1:anchor + 1 + n]
                truth = seq[anchor + 1:]
                for name in total:
                    total[name] += edit_toy.accepted(drafts[name], truth)
            self.assertAlmostEqual(total["best"] / trials, best, delta=0.25,
                                   msg=f"anchor {anchor}")
            self.assertAlmostEqual(total["marginal"] / trials, marg,
                                   delta=0.25, msg=f"anchor {anchor}")

    def test_the_joint_draft_beats_the_per_slot_one(self):
        out = subprocess.run([sys.executable,
                              os.path.join(ROOT, "training", "edit_toy.py"),
                              "ceiling", "--spec",
                              os.path.join(self.dir, "spec.json")],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        self.assertGreater(r["ceiling_tau"] / r["marginal_tau"], 1.3)
        # The left words: the per-slot draft spells (a, b, z); the truth at
        # slots 1-2 fixes slot 3 (a causal editor's +55 points there), and
        # every slot is fixed by the other two.
        slots = r["oracle_by_word_slot"]
        for k, (p1, left) in {"1": (0.55, 0.55), "2": (0.60, 0.60),
                              "3": (0.45, 1.0)}.items():
            self.assertAlmostEqual(slots[k]["p1"], p1, msg=k)
            self.assertAlmostEqual(slots[k]["left"], left, msg=k)
            self.assertAlmostEqual(slots[k]["full"], 1.0, msg=k)
        self.assertAlmostEqual(r["left_oracle_gain_points"], 55 / 3)
        self.assertAlmostEqual(r["full_oracle_gain_points"], 140 / 3)

    def test_oracle_ceilings_of_the_right_words(self):
        # (u, b, z) per slot; slot 1 needs the later slots: from (y, c) it
        # is u 2:1 against a, so even the full oracle stays at 0.9 there.
        slots = edit_toy.oracle_ceilings(edit_toy.SHAPES["right"])
        self.assertAlmostEqual(slots["1"]["p1"], 0.5)
        self.assertAlmostEqual(slots["1"]["left"], 0.5)
        self.assertAlmostEqual(slots["1"]["full"], 0.9)
        self.assertAlmostEqual(slots["2"]["left"], 0.8)
        self.assertAlmostEqual(slots["3"]["p1"], 0.4)
        self.assertAlmostEqual(slots["3"]["left"], 1.0)

    def test_score_counts_prefixes_edits_and_ambiguous_slots(self):
        records = edit_toy.read_records(os.path.join(self.dir, "heldout.bin"))
        n = 15
        perfect, empty = [], []
        for prompt_len, tokens in records:
            anchors = list(range(prompt_len, len(tokens) - 1))
            truth = [(tokens[a + 1:a + 1 + n] + [0] * n)[:n] for a in anchors]
            wrong = [[-1] * n for _ in anchors]
            # P1 wrong everywhere, P2 and P3 right: every edit extends.
            perfect.append({"anchors": anchors,
                            "passes": [wrong, truth, truth],
                            "oracle": truth})
            empty.append({"anchors": anchors, "passes": [truth, wrong, wrong],
                          "oracle": wrong})
        up = edit_toy.score(self.spec, records, perfect)
        down = edit_toy.score(self.spec, records, empty)
        blocks = sum(len(t) - 1 - p for p, t in records)
        self.assertEqual(up["blocks"], blocks)
        self.assertEqual(up["p1_tau"], 1.0)
        self.assertEqual(up["extending_edits"], 1.0)
        self.assertEqual(up["shortening_edits"], 0.0)
        self.assertEqual(down["shortening_edits"], 1.0)
        # Truth accepts every slot up to the end of the sequence.
        mean = sum(min(n, len(t) - 1 - a) for p, t in records
                   for a in range(p, len(t) - 1)) / blocks
        self.assertAlmostEqual(up["p3_tau"], 1 + mean)
        self.assertAlmostEqual(down["p1_tau"], 1 + mean)
        self.assertEqual(up["oracle_gain_points"], 100.0)
        self.assertEqual(down["oracle_gain_points"], -100.0)
        # Ambiguous slots: the word tokens the known prefix leaves open, two
        # or three per word a block covers, more than one per block.
        self.assertGreater(up["ambiguous_slots"], blocks)
        # Per slot of a word: every word slot is open somewhere, and the
        # counts add up to the whole.
        slots = up["ambiguous_by_word_slot"]
        self.assertEqual(sorted(slots), ["1", "2", "3"])
        self.assertEqual(sum(c["slots"] for c in slots.values()),
                         up["ambiguous_slots"])
        for c in slots.values():
            self.assertGreater(c["slots"], 0)
            self.assertEqual(c["oracle_gain_points"], 100.0)
            self.assertEqual(c["p1_accuracy"], 0.0)
            self.assertEqual(c["p3_accuracy"], 1.0)
        self.assertLessEqual(up["ceiling_tau"], 1 + mean + 1e-9)
        self.assertGreater(up["ceiling_tau"], up["marginal_tau"])

    def test_report_groups_seeds_and_pairs_causal_twins(self):
        # A sweep of eval.json files: the right words' seeds group into one
        # variant (the seed sits before -right), and each bidirectional run
        # is paired with the causal twin of its own seed and words.
        sweep = tempfile.mkdtemp(prefix="edit_toy_report_")
        self.addCleanup(shutil.rmtree, sweep)
        p3 = {"d2-mix-s1": 6.0, "d2-mix-s2": 6.5, "d2-causal-s1": 6.25,
              "d2-mix-s1-right": 6.5, "d2-mix-s2-right": 6.75,
              "d2-causal-s1-right": 5.0, "d2-causal-s2-right": 5.5,
              "d2-blend90w0-s1": 7.0, "d2-blend90w0-causal-s1": 6.5,
              "d2-blend90w0-causal-s2": 6.0}
        for run, p in p3.items():
            os.makedirs(os.path.join(sweep, run))
            with open(os.path.join(sweep, run, "eval.json"), "w") as f:
                json.dump({"p1_tau": 5.0, "p3_tau": p, "extending_edits": 0.1,
                           "shortening_edits": 0.0}, f)
        self.assertEqual(edit_toy.variant_of("d2-mix-s2-right"),
                         "d2-mix-right")
        self.assertEqual(edit_toy.variant_of("d4-blend90-s3"), "d4-blend90")
        self.assertEqual(edit_toy.causal_twin_of("d2-causal-s2-right"),
                         "d2-mix-s2-right")
        self.assertEqual(edit_toy.causal_twin_of("d2-blend90w0-causal-s1"),
                         "d2-blend90w0-s1")
        self.assertIsNone(edit_toy.causal_twin_of("d2-blend90-s1"))
        out = subprocess.run([sys.executable,
                              os.path.join(ROOT, "training", "edit_toy.py"),
                              "report", "--sweep", sweep],
                             check=True, capture_output=True, text=True).stdout
        rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:]
                for line in out.splitlines() if line.startswith("| d")}
        self.assertIn("d2-mix-right (2)", rows)
        self.assertIn("d2-causal-right (2)", rows)
        self.assertIn("d2-mix (2)", rows)
        self.assertNotIn("d2-mix-s1-right (1)", rows)
        # Left words: only seed 1 has a twin (6.0 against 6.25); right
        # words: both seeds (6.5, 6.75 against 5.0, 5.5).
        pairs = [line for line in out.splitlines()
                 if line.startswith("| d2-mix") and line.count("|") == 5]
        self.assertEqual(pairs[0], "| d2-mix (1) | 6.000 | 6.250 | -0.250 |")
        self.assertTrue(pairs[1].startswith(
            "| d2-mix-right (2) | 6.625 ± "), pairs[1])
        self.assertIn("| 1.375 ± ", pairs[1])
        # Any variant's -causal twin pairs with it; a twin whose
        # bidirectional run is missing (seed 2) pairs with nothing.
        self.assertIn("| d2-blend90w0 (1) | 7.000 | 6.500 | 0.500 |",
                      out.splitlines())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
