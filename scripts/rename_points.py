#!/usr/bin/env python3
"""Why rename fails: the target at each substitution point, teacher-forced.

For every held-out rename instance (training/chat_tasks.py) and every place
where the reference answer writes the new name, the prompt is the chat
prompt plus the reference answer up to that place (cut before the spaces
in front of the name: the tokenizer's pieces carry their leading spaces).
The target decodes a few tokens greedily (dedit-generate --ar), and the
continuation is counted as the new name, the old name (a copy of the
function without the substitution), or other. "first" is a name's first
substitution point in the answer, "later" the ones after it, where the
new name is already in the answer to copy from.

  scripts/rename_points.py --build build --target DIR --tasks TASKS_DIR

TASKS_DIR holds heldout.jsonl (chat_tasks.py generate). Prints one JSON
object: {"first": {"new": N, "old": N, "other": N}, "later": {...}}.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "training"))
import chat_tasks  # noqa: E402


def run(cmd, stdin_text):
    return subprocess.run(cmd, input=stdin_text, capture_output=True,
                          text=True, check=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--target", required=True)
    ap.add_argument("--tasks", required=True, help="folder with heldout.jsonl")
    a = ap.parse_args()
    instances = [json.loads(l)
                 for l in open(os.path.join(a.tasks, "heldout.jsonl"))]
    prompts, points = [], []
    for inst in instances:
        if inst["family"] != "rename":
            continue
        old, new = chat_tasks.rename_names(inst["user"])
        ref = inst["answer"]
        for n, m in enumerate(re.finditer(r"\b%s\b" % re.escape(new), ref)):
            cut = m.start()
            while cut > 0 and ref[cut - 1] in " \t":
                cut -= 1
            prompts.append(chat_tasks.render_chat(inst["user"]) + ref[:cut])
            points.append(("first" if n == 0 else "later", old, new,
                           ref[cut:m.start()]))
    if not prompts:
        sys.exit(f"rename_points.py: no rename instance in {a.tasks}")
    ids = json.loads(run([os.path.join(a.build, "cli", "dedit-cli"),
                          "tokenize", "--tokenizer",
                          os.path.join(a.target, "tokenizer.json")],
                         json.dumps(prompts)))
    out = run([os.path.join(a.build, "cli", "dedit-generate"), "--target",
               a.target, "--json", "--threads", "1", "--max_tokens", "8",
               "--ar"], "".join(json.dumps(x) + "\n" for x in ids))
    rows = [json.loads(l) for l in out.splitlines() if l]
    counts = collections.defaultdict(
        lambda: collections.Counter(new=0, old=0, other=0))
    for (where, old, new, spaces), row in zip(points, rows):
        text = row["text"]
        kind = "other"
        if text.startswith(spaces + new):
            kind = "new"
        elif text.startswith(spaces + old):
            kind = "old"
        counts[where][kind] += 1
    print(json.dumps({k: dict(v) for k, v in counts.items()}))


if __name__ == "__main__":
    main()
