#!/usr/bin/env python3
"""scripts/compare_pairs_summary.py on hand-made reports: the overall on
the old answer mix is the old overall when the new per-family tau is the
old one, whatever tokens the new target wrote; it moves with the new tau
alone; the "without" overall leaves the family out; the tables print for
both splits, and an unknown family is refused.

  compare_pairs_summary_test.py
"""
import json
import os
import subprocess
import sys
import tempfile

from script_checks import Checks

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import compare_pairs_summary as summary  # noqa: E402


def report(per_family, correct=5):
    """A report with one configuration, w16k1: per_family maps a family to
    (tokens, tau); overall is tokens over rounds."""
    spec = {f: {"tau": tau, "tokens": tokens, "speedup": 1.0}
            for f, (tokens, tau) in per_family.items()}
    tokens = sum(t for t, _ in per_family.values())
    rounds = sum(t / tau for t, tau in per_family.values())
    spec["overall"] = {"tau": tokens / rounds, "tokens": tokens,
                       "speedup": 1.0, "speedup_per_slice": [0.9, 1.1]}
    ar = {f: {"tau": 1.0, "tokens": t, "speedup": 1.0}
          for f, (t, _) in per_family.items()}
    ar["overall"] = {"tau": 1.0, "tokens": tokens, "speedup": 1.0}
    return {"accuracy": {"overall": {"correct": correct, "instances": 10}},
            "lossless": True, "speculation": {"ar": ar, "w16k1": spec}}


def main():
    check = Checks()
    old = report({"add": (1000, 8.0), "reverse": (300, 3.0),
                  "json": (800, 5.0)})
    # The same drafters on a target whose reverse answers are 5x longer.
    same = report({"add": (1000, 8.0), "reverse": (1500, 3.0),
                   "json": (800, 5.0)})
    o_mix, n_mix, o_wo, n_wo = summary.mixed_overall(
        old, same, "w16k1", exclude=("reverse",))
    check(same["speculation"]["w16k1"]["overall"]["tau"] <
          old["speculation"]["w16k1"]["overall"]["tau"] - 0.5,
          "the raw overall falls with the longer reverse answers")
    check(abs(o_mix - old["speculation"]["w16k1"]["overall"]["tau"]) < 1e-9,
          "old from families is the old overall")
    check(abs(n_mix - o_mix) < 1e-9,
          f"same per-family tau, same overall on the old mix ({n_mix} "
          f"against {o_mix})")
    check(abs(o_wo - n_wo) < 1e-9, "same tau without reverse")
    check(abs(o_wo - 1800 / (1000 / 8 + 800 / 5)) < 1e-9,
          "without reverse is tokens over rounds of add and json")

    worse = report({"add": (1000, 8.0), "reverse": (300, 3.0),
                    "json": (800, 4.0)})
    _, w_mix, _, _ = summary.mixed_overall(old, worse, "w16k1")
    check(abs(w_mix - 2100 / (1000 / 8 + 300 / 3 + 800 / 4)) < 1e-9,
          "the new per-family tau on the old tokens")
    check(w_mix < o_mix, "a lower json tau lowers the overall on the old mix")

    with tempfile.TemporaryDirectory() as d:
        for split in ("pool", "fixed"):
            for side, r in (("old", old), ("new", worse)):
                with open(os.path.join(d, f"{side}-{split}.json"), "w") as f:
                    json.dump(r, f)
        script = os.path.join(SCRIPTS, "compare_pairs_summary.py")
        out = subprocess.run([sys.executable, script, d],
                             capture_output=True, text=True)
        check(out.returncode == 0, f"summary ran: {out.stderr}")
        for split in ("pool", "fixed"):
            check(f"{split} split, tau per family" in out.stdout,
                  f"the {split} family table")
        check("| w16k1 | 8.00 / 8.00 | 3.00 / 3.00 | 5.00 / 4.00 |"
              in out.stdout, "w16k1's tau per family, old / new")
        check("1000 / 1000" in out.stdout, "the answer tokens row")
        bad = subprocess.run([sys.executable, script, d, "--exclude", "jsn"],
                             capture_output=True, text=True)
        check(bad.returncode != 0 and "unknown family 'jsn'" in bad.stderr,
              "an unknown family is refused by name")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
