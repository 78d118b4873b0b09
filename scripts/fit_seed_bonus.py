#!/usr/bin/env python3
"""Fit a lookup-seeded drafter's trust in its seed on training prompts.

A lookup-seeded DEdit drafter (dedit_config.lookup_seed_ngram) reads the
prompt lookup's copy as P1's block input, but the network alone keeps too
little of a right copy (docs/RESULTS.md, "Trusting the seed").
dedit_config.seed_logit_bonus adds a constant to the logit of the seed's
token at every slot the seed covers, in every pass. This script picks that
constant: it samples --per_family instances per family from the task
suite's *training* split (never the held-out one), decodes them greedily
in process with one copy of the drafter per candidate bonus (same weights,
only the config differs), and takes the bonus with the highest tau at
--window, K = 1 (ties go to the smaller bonus). Output equals target-only
greedy for every candidate (eval_chat_tasks.py checks it), so the fit only
chooses what is proposed.

  scripts/fit_seed_bonus.py --build build --target checkpoints/tiny/target \\
      --drafter checkpoints/tiny/drafter-seeded --tasks TASKS_DIR \\
      [--grid 0,2,4,6,8,12,16] [--per_family 35] [--window 16] [--write]

Prints one JSON report (tau per candidate, overall and per family, and the
chosen bonus); --write stores the chosen bonus in the drafter's
config.json (a bonus of 0 removes the key). Refit after any further
training: training moves the network's own calibration.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_BONUS = 64  # common/base/model_config.h kMaxSeedLogitBonus


def sample_training(tasks_dir, per_family, seed):
    """per_family instances of each family of train.jsonl, seeded reservoir
    sampling (the file is large; it is read once, line by line)."""
    rng = random.Random(seed)
    reservoirs, seen = {}, {}
    with open(os.path.join(tasks_dir, "train.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            inst = json.loads(line)
            fam = inst["family"]
            n = seen[fam] = seen.get(fam, 0) + 1
            res = reservoirs.setdefault(fam, [])
            if len(res) < per_family:
                res.append(line)
            else:
                j = rng.randrange(n)
                if j < per_family:
                    res[j] = line
    return [line for fam in sorted(reservoirs) for line in reservoirs[fam]]


def drafter_copy(src, dst, bonus):
    """`src` with its config's seed_logit_bonus set to `bonus` (every other
    file linked, not copied)."""
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.abspath(os.path.join(src, name)),
                       os.path.join(dst, name))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    write_config(dst, config, bonus)


def write_config(drafter, config, bonus):
    """Writes `config` with dedit_config.seed_logit_bonus = `bonus` (0
    removes the key) as `drafter`/config.json; returns its path."""
    de = config.setdefault("dedit_config", {})
    if bonus > 0:
        de["seed_logit_bonus"] = bonus
    else:
        de.pop("seed_logit_bonus", None)
    path = os.path.join(drafter, "config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--tasks", required=True,
                    help="task suite folder with train.jsonl")
    ap.add_argument("--grid", default="0,2,4,6,8,12,16")
    ap.add_argument("--per_family", type=int, default=35)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--max_tokens", type=int, default=448)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", action="store_true",
                    help="store the chosen bonus in the drafter's config.json")
    a = ap.parse_args()

    grid = sorted({float(x) for x in a.grid.split(",") if x.strip()})
    if not grid or grid[0] < 0 or grid[-1] > MAX_BONUS:
        sys.exit(f"fit_seed_bonus.py: --grid must hold values in [0, {MAX_BONUS}]")
    if not 1 <= a.per_family <= 1000:
        sys.exit("fit_seed_bonus.py: --per_family must be in [1, 1000]")
    with open(os.path.join(a.drafter, "config.json")) as f:
        config = json.load(f)
    if not config.get("dedit_config", {}).get("lookup_seed_ngram", 0):
        sys.exit(f"fit_seed_bonus.py: {a.drafter} is not lookup-seeded "
                 "(dedit_config.lookup_seed_ngram), so a seed bonus does nothing")

    with tempfile.TemporaryDirectory(prefix="fit_seed_bonus.") as tmp:
        tasks = os.path.join(tmp, "tasks")
        os.makedirs(tasks)
        # eval_chat_tasks.py reads heldout.jsonl: here it holds the sample
        # of the training split.
        with open(os.path.join(tasks, "heldout.jsonl"), "w") as f:
            f.writelines(sample_training(a.tasks, a.per_family, a.seed))
        names, configs = {}, ["ar=ar"]
        for i, b in enumerate(grid):
            d = os.path.join(tmp, f"drafter{i}")
            drafter_copy(a.drafter, d, b)
            names[f"b{i}"] = b
            configs.append(f"b{i}=model:w={a.window}:k=1:drafter={d}")
        cmd = [sys.executable, os.path.join(HERE, "eval_chat_tasks.py"),
               "--build", a.build, "--target", a.target, "--tasks", tasks,
               "--drafter", a.drafter, "--max_tokens", str(a.max_tokens),
               "--threads", str(a.threads), "--interleave", "1",
               "--configs", ",".join(configs)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"fit_seed_bonus.py: eval_chat_tasks.py failed: "
                     f"{p.stderr.strip()[-2000:]}")
        report = json.loads(p.stdout)
    if not report.get("lossless"):
        sys.exit("fit_seed_bonus.py: a candidate's output differed from "
                 "target-only greedy")
    spec = report["speculation"]
    tau = {names[k]: {fam: v["tau"] for fam, v in spec[k].items()}
           for k in names}
    best = max(grid, key=lambda b: (round(tau[b]["overall"], 4), -b))
    out = {"split": "train", "per_family": a.per_family,
           "window": a.window, "passes": 1, "seed": a.seed,
           "tau": {str(b): tau[b] for b in grid}, "chosen": best}
    if a.write:
        out["written"] = write_config(a.drafter, config, best)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
