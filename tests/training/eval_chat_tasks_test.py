#!/usr/bin/env python3
"""scripts/eval_chat_tasks.py on the bundled pair: every configuration is
lossless, and timing the configurations in turns over slices of the
instances (--interleave) changes only the timing: each configuration's
outputs and acceptance are the ones it has when it runs over all instances
in one go, and the report gives one speedup per slice.

  eval_chat_tasks_test.py BUILD_DIR CHECKPOINTS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from script_checks import SKIP, Checks, have_corpus

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "eval_chat_tasks.py")


def main():
    build, checkpoints = sys.argv[1], sys.argv[2]
    if not have_corpus():
        return SKIP
    check = Checks()

    with tempfile.TemporaryDirectory() as d:
        tasks = os.path.join(d, "tasks")
        subprocess.run([sys.executable,
                        os.path.join(ROOT, "training", "chat_tasks.py"),
                        "generate", "--out", tasks, "--train", "1",
                        "--heldout", "2"], check=True, capture_output=True)
        configs = ("ar=ar,ngram=ngram:w=8,"
                   f"seeded=model:w=8:k=2:drafter={checkpoints}/drafter-seeded,"
                   f"cut=model:w=8:k=1:conf=0.3:drafter={checkpoints}/drafter")

        answers = os.path.join(d, "answers.jsonl")

        def report(interleave):
            p = subprocess.run(
                [sys.executable, SCRIPT, "--build", build, "--target",
                 os.path.join(checkpoints, "target"), "--tasks", tasks,
                 "--configs", configs, "--max_tokens", "40",
                 "--interleave", str(interleave)] +
                (["--answers_out", answers] if interleave == 3 else []),
                capture_output=True, text=True)
            check(p.returncode == 0,
                  f"--interleave {interleave} exits 0: {p.stderr[-500:]}")
            return json.loads(p.stdout) if p.returncode == 0 else None

        one, three = report(1), report(3)
        if one is None or three is None:
            return 1
        for r, name in ((one, "1"), (three, "3")):
            check(r["lossless"] is True, f"--interleave {name}: lossless")
        for cfg in ("ar", "ngram", "seeded", "cut"):
            a, b = one["speculation"][cfg], three["speculation"][cfg]
            for family in a:
                for key in ("tau", "tokens", "tokens_per_round"):
                    check(a[family].get(key) == b[family].get(key),
                          f"{cfg} {family} {key}: {a[family].get(key)} in "
                          f"one go, {b[family].get(key)} interleaved")
            check(a["overall"].get("accepted_per_position") ==
                  b["overall"].get("accepted_per_position"),
                  f"{cfg}: acceptance per position")
            check(len(a["overall"]["speedup_per_slice"]) == 1,
                  f"{cfg}: one slice in one go")
            slices = b["overall"]["speedup_per_slice"]
            check(len(slices) == 3 and all(s > 0 for s in slices),
                  f"{cfg}: a positive speedup for each of 3 slices: {slices}")
        # --answers_out: one line per held-out instance, in order, whose
        # verdicts are the ones the accuracy report counts.
        rows = [json.loads(l) for l in open(answers)]
        heldout = [json.loads(l)
                   for l in open(os.path.join(tasks, "heldout.jsonl"))]
        check([r["user"] for r in rows] == [h["user"] for h in heldout],
              "--answers_out: one line per held-out instance, in order")
        for family, acc in three["accuracy"].items():
            if family == "overall":
                continue
            got = sum(bool(r["correct"]) for r in rows
                      if r["family"] == family)
            check(got == acc["correct"],
                  f"--answers_out {family}: {got} correct lines, "
                  f"{acc['correct']} in the report")
        check(three["speculation"]["seeded"]["overall"]["tau"] > 1,
              "the seeded drafter gets drafts accepted")
        bad = subprocess.run(
            [sys.executable, SCRIPT, "--build", build, "--target",
             os.path.join(checkpoints, "target"), "--tasks", tasks,
             "--interleave", "0"], capture_output=True, text=True)
        check(bad.returncode != 0 and "--interleave" in bad.stderr,
              f"--interleave 0 is refused by name: {bad.stderr[-300:]}")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
