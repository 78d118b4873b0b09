#!/usr/bin/env python3
"""scripts/rename_points.py on the bundled target: one count per
substitution point of the reference answers (a name's first point under
"first", the rest under "later"), and a clear error for a task file
without renames.

  rename_points_test.py BUILD_DIR CHECKPOINTS_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from script_checks import SKIP, Checks, have_corpus

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "rename_points.py")
sys.path.insert(0, os.path.join(ROOT, "training"))
import chat_tasks  # noqa: E402


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
                        "--heldout", "3"], check=True, capture_output=True)
        held = [json.loads(l)
                for l in open(os.path.join(tasks, "heldout.jsonl"))]
        first = later = 0
        for inst in held:
            if inst["family"] != "rename":
                continue
            new = chat_tasks.rename_names(inst["user"])[1]
            n = len(re.findall(r"\b%s\b" % re.escape(new), inst["answer"]))
            first += n > 0
            later += max(n - 1, 0)
        p = subprocess.run([sys.executable, SCRIPT, "--build", build,
                            "--target", os.path.join(checkpoints, "target"),
                            "--tasks", tasks], capture_output=True, text=True)
        check(p.returncode == 0, f"exits 0: {p.stderr[-500:]}")
        if p.returncode == 0:
            r = json.loads(p.stdout)
            check(sum(r["first"].values()) == first,
                  f"first points {r['first']} against {first}")
            check(sum(r.get("later", {}).values()) == later,
                  f"later points {r.get('later')} against {later}")
            check(set(r["first"]) == {"new", "old", "other"},
                  f"the kinds counted: {sorted(r['first'])}")
        # No rename instance: an error that names the task folder.
        none = os.path.join(d, "none")
        os.makedirs(none)
        with open(os.path.join(none, "heldout.jsonl"), "w") as f:
            for inst in held:
                if inst["family"] != "rename":
                    f.write(json.dumps(inst) + "\n")
        p = subprocess.run([sys.executable, SCRIPT, "--build", build,
                            "--target", os.path.join(checkpoints, "target"),
                            "--tasks", none], capture_output=True, text=True)
        check(p.returncode != 0 and "no rename instance" in p.stderr
              and none in p.stderr, f"no renames: {p.returncode} {p.stderr}")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
