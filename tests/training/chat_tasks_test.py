#!/usr/bin/env python3
"""training/chat_tasks.py: instances follow the task suite's user formats,
their reference answers score 100%, wrong answers score 0, answers are
scored as a user would read them, the held-out functions never come from
training files, and held-out instances use no word training shows."""
import json
import random
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "training", "chat_tasks.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import chat_tasks  # noqa: E402
from script_checks import SKIP, Checks, have_corpus  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], check=True,
                          capture_output=True, text=True).stdout


def wrong(inst):
    """A wrong answer to `inst`: a digit of the result changed, two items
    swapped, a value changed, or the function left unrenamed."""
    family, answer, user = inst["family"], inst["answer"], inst["user"]
    if family in ("add", "multiply"):
        value = str(chat_tasks.last_number(answer))
        bad = str(int(value) + 1)
        return answer[:answer.rindex(value)] + bad
    if family == "sort":
        xs = answer.split(", ")
        return ", ".join([xs[-1]] + xs[1:-1] + [xs[0]]) if xs[0] != xs[-1] \
            else answer + ", 1000"
    if family == "reverse":
        steps, _, listed = answer.rpartition("Reversed: ")
        ws = listed.split()
        return (steps + "Reversed: " + " ".join(ws[1:] + ws[:1])
                if len(set(ws)) > 1 else "nothing")
    if family == "json":
        obj = json.loads(answer)
        key = next(iter(obj))
        obj[key] = [obj[key]]
        return json.dumps(obj)
    if family == "rename":
        return user.split("\n", 1)[1]
    return answer


def vocab_words(inst):
    """The words an instance drew from the vocabulary."""
    user = inst["user"]
    if inst["family"] == "reverse":
        return set(chat_tasks.reverse_words(user))
    if inst["family"] == "json":
        words = set()
        for item in user[len("To JSON: "):].split("; "):
            k, v = item.split("=", 1)
            words.add(k)
            if not v.isdigit():
                words.add(v)
        return words
    if inst["family"] == "rename":
        new = user.split("\n", 1)[0].split(" to ")[1].rstrip(":")
        return set(new.split("_"))
    return set()


def check_user_scoring(check):
    """A user's reading: the result in a sentence is right; extra words
    around a JSON object or a renamed function do not matter."""
    c = chat_tasks.correct
    add = {"family": "add", "answer": chat_tasks.answer_add(12, 30),
           "user": "Add 12 and 30."}
    check(c(add, "The sum is 42."), "add: the result in a sentence")
    check(not c(add, "The sum is 420."), "add: a longer number is not it")
    check(not c(add, "42? No: 43"), "add: the last number is the answer")
    srt = {"family": "sort", "answer": "3, 9, 12", "user": "Sort: 12, 3, 9"}
    check(c(srt, "Sorted: 3, 9, 12"), "sort: the list in a sentence")
    check(not c(srt, "13, 9, 12"), "sort: a different list")
    rev = {"family": "reverse", "user": "Reverse: ab cd ef",
           "answer": chat_tasks.answer_reverse(["ab", "cd", "ef"])}
    check(rev["answer"] == "1 ab 2 cd 3 ef. 3 ef 2 cd 1 ab. Reversed: ef cd ab",
          f"reverse: the steps, then the list: {rev['answer']!r}")
    check(c(rev, "ef cd ab"), "reverse: the bare list, without the steps")
    check(chat_tasks.answer_reverse(["ab", "cd", "ef"], steps=False) ==
          "ef cd ab", "reverse, list format: the reversed list alone")
    check(c(rev, "Reversed, it reads ef cd ab."), "reverse: the list in a sentence")
    check(not c(rev, "1 ab 2 cd 3 ef. 3 ef 2 cd 1 ab. Reversed: ef ab cd"),
          "reverse: right steps, a wrong list")
    check(not c(rev, "ef cd abx"), "reverse: a longer last word is not it")
    js = {"family": "json", "answer": json.dumps({"mode": "teal", "n": 88}),
          "user": "To JSON: mode=teal; n=88"}
    check(c(js, 'Here: {"n": 88, "mode": "teal"} done'),
          "json: the first object, keys in any order")
    check(not c(js, '{"mode": "teal", "n": "88"}'), "json: a number as text")
    ren = {"family": "rename", "user": "Rename f to go:\ndef f(x):\n"
           "    return f(x)  # f",
           "answer": "def go(x):\n    return go(x)  # f"}
    check(c(ren, "Sure:\ndef go(x):\n    return go(x)  # f"),
          "rename: new name, the old one only where kept (a comment)")
    check(not c(ren, "def go(x):\n    return f(x)  # f"),
          "rename: the old name left in code")
    check(not c(ren, "def fo(x):\n    return fo(x)"), "rename: no new name")


def main():
    if not have_corpus():
        return SKIP
    check = Checks()

    with tempfile.TemporaryDirectory() as d:
        run("generate", "--out", d, "--train", "20", "--heldout", "10")
        train = [json.loads(l) for l in open(os.path.join(d, "train.jsonl"))]
        held = [json.loads(l) for l in open(os.path.join(d, "heldout.jsonl"))]
        check(len(train) == 140 and len(held) == 70, "instance counts")
        for fam in chat_tasks.FAMILIES:
            check(sum(i["family"] == fam for i in held) == 10,
                  f"{fam}: 10 held-out instances")
        prefixes = {"add": "Add ", "multiply": "Multiply ", "sort": "Sort: ",
                    "reverse": "Reverse: ", "json": "To JSON: ",
                    "rename": "Rename ", "continue": "Continue:\n"}
        for inst in train + held:
            check(inst["user"].startswith(prefixes[inst["family"]]),
                  f"format of {inst['user'][:30]!r}")
            check(inst["text"].endswith(inst["answer"] + "<|im_end|>\n"),
                  "rendered text ends with the answer")
        # Reference answers are right; wrong ones are not.
        ref = os.path.join(d, "ref.jsonl")
        with open(ref, "w") as f:
            for inst in held:
                f.write(json.dumps({"answer": inst["answer"]}) + "\n")
        report = json.loads(run("score", os.path.join(d, "heldout.jsonl"), ref))
        check(report["overall"]["accuracy"] == 1.0, f"reference scores {report}")
        check("continue" not in report, "continue is scored by loss only")
        # `check` computes the reference from the user message alone: it
        # accepts every generated answer and refuses a wrong one.
        for inst in held:
            if inst["family"] == "continue":
                continue
            for answer, want in ((inst["answer"], 0),
                                 (wrong(inst), 1)):
                p = subprocess.run([sys.executable, SCRIPT, "check",
                                    inst["family"], inst["user"]],
                                   input=answer, capture_output=True,
                                   text=True)
                check(p.returncode == want,
                      f"check {inst['family']} {inst['user'][:30]!r}: "
                      f"{p.stdout[:80]}")
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as f:
            for inst in held:
                f.write(json.dumps({"answer": wrong(inst)}) + "\n")
        report = json.loads(run("score", os.path.join(d, "heldout.jsonl"), bad))
        for fam in ("add", "multiply", "sort", "reverse", "json", "rename"):
            check(report[fam]["accuracy"] == 0.0, f"{fam}: a wrong answer scores 0")

    check_user_scoring(check)
    # The vocabulary pools: held-out instances use only words that no
    # training instance shows (and the pools are disjoint).
    train_pool = set(chat_tasks.vocabulary("pool", "train")[0])
    held_pool = set(chat_tasks.vocabulary("pool", "heldout")[0])
    check(len(held_pool) > 1000 and len(train_pool) > 1000, "pool sizes")
    check(not (train_pool & held_pool), "disjoint word pools")
    # Generated pseudo-words are 1-4 BPE pieces (after a space, as in a
    # message), counted by the generator's own BPE and, where the build is
    # given, by the engine's tokenizer.
    pseudo = chat_tasks.pseudo_words(chat_tasks.PSEUDO_WORDS)
    ranks = chat_tasks.bpe_merge_ranks()
    counted = [chat_tasks.word_pieces(w, ranks) for w in pseudo]
    check(len(pseudo) == chat_tasks.PSEUDO_WORDS and
          set(counted) <= {1, 2, 3, 4} and counted.count(4) > 1000,
          f"pseudo-word pieces {sorted(set(counted))}")
    # A key is retokenized when its bare spelling (after a quote) is not
    # the spaced one (after "; " in the request) less the space.
    check(chat_tasks.bpe_pieces("\u0120memory", ranks) == ["\u0120memory"]
          and chat_tasks.bpe_pieces("memory", ranks) == ["me", "mory"] and
          chat_tasks.retokenized("memory", ranks) and
          not chat_tasks.retokenized("noost", ranks),
          "' memory' is one piece and 'memory' two; 'noost' keeps its pieces")
    check(chat_tasks.word_pieces("noost", ranks) == 3 and
          chat_tasks.word_pieces("faiflourk", ranks) == 5,
          "pieces of ' noost' (' no','o','st') and ' faiflourk'")
    if len(sys.argv) > 1:
        cli = os.path.join(sys.argv[1], "cli", "dedit-cli")
        ids = json.loads(subprocess.run(
            [cli, "tokenize", "--tokenizer", chat_tasks.PIECES_TOKENIZER],
            input=json.dumps([" " + w for w in pseudo]), capture_output=True,
            text=True, check=True).stdout)
        off = [w for w, i, n in zip(pseudo, ids, counted) if len(i) != n]
        check(not off, f"the engine's tokenizer counts other pieces: {off[:5]}")
    with tempfile.TemporaryDirectory() as d:
        run("generate", "--out", d, "--train", "200", "--heldout", "40")
        train = [json.loads(l) for l in open(os.path.join(d, "train.jsonl"))]
        held = [json.loads(l) for l in open(os.path.join(d, "heldout.jsonl"))]
        train_words = set().union(*map(vocab_words, train))
        held_words = set().union(*map(vocab_words, held))
        check(held_words and held_words <= held_pool, "held-out words pooled")
        check(train_words <= train_pool, "training words pooled")
        check(not (train_words & held_words),
              f"held-out shares words with training: "
              f"{sorted(train_words & held_words)[:5]}")
        # The training-only knobs: a share of original words (only those
        # in the training pool) and renames of names used several times
        # leave the held-out split byte-identical and still unseen.
        e = os.path.join(d, "knobs")
        run("generate", "--out", e, "--train", "200", "--heldout", "40",
            "--fixed_share", "0.5", "--rename_min_uses", "3",
            "--reverse_min_words", "6", "--json_retokenized_share", "1")
        check(open(os.path.join(e, "heldout.jsonl")).read() ==
              open(os.path.join(d, "heldout.jsonl")).read(),
              "training knobs change the held-out split")
        knob = [json.loads(l) for l in open(os.path.join(e, "train.jsonl"))]
        knob_words = set().union(*map(vocab_words, knob))
        check(knob_words <= train_pool and not (knob_words & held_words),
              "--fixed_share draws a held-out word")
        fixed_in = set(chat_tasks.FIXED_WORDS) & knob_words
        check(len(fixed_in) >= 10, f"--fixed_share used {len(fixed_in)} "
              "original words")
        # --json_retokenized_share 1: every training json instance has a
        # key that tokenizes otherwise bare (without the knob, some not).
        def has_hard_key(inst):
            return any(chat_tasks.retokenized(k, ranks)
                       for k in json.loads(inst["answer"]))
        knob_json = [i for i in knob if i["family"] == "json"]
        plain_json = [i for i in train if i["family"] == "json"]
        check(knob_json and all(map(has_hard_key, knob_json)),
              "--json_retokenized_share 1: a retokenized key in every "
              "json instance")
        check(not all(map(has_hard_key, plain_json)),
              "without --json_retokenized_share some json instances have "
              "no retokenized key")
        # --reverse_format list: reverse answers are the reversed list
        # alone, in both splits; every other instance is unchanged.
        f = os.path.join(d, "list")
        run("generate", "--out", f, "--train", "200", "--heldout", "40",
            "--reverse_format", "list")
        for split in ("train", "heldout"):
            steps = [json.loads(l) for l in open(os.path.join(d, split + ".jsonl"))]
            listed = [json.loads(l) for l in open(os.path.join(f, split + ".jsonl"))]
            check(len(steps) == len(listed), f"{split}: list format counts")
            for a, b in zip(steps, listed):
                if a["family"] == "reverse":
                    check(b["user"] == a["user"] and
                          b["answer"] == chat_tasks.reversed_list(a["user"])
                          and chat_tasks.correct(b, b["answer"]),
                          f"list format: {b['answer']!r} for {a['user']!r}")
                else:
                    check(a == b, f"list format changed a {a['family']} "
                          "instance")
        reversed_lengths = {len(i["user"].split()) - 1 for i in knob
                            if i["family"] == "reverse"}
        check(reversed_lengths and min(reversed_lengths) >= 6,
              f"--reverse_min_words 6 listed {sorted(reversed_lengths)} words")
        for inst in knob:
            if inst["family"] != "rename":
                continue
            head, src = inst["user"].split("\n", 1)
            old_name = head[len("Rename "):].split(" to ")[0]
            uses = chat_tasks.name_uses(src)
            check(uses[old_name] >= 3 or
                  uses[old_name] == max(uses[n] for n in uses
                                        if n not in chat_tasks.KEYWORDS
                                        and len(n) > 1),
                  f"--rename_min_uses 3 renamed {old_name!r} "
                  f"({uses[old_name]} uses)")
    # Arithmetic steps compute the right result; renames touch names only.
    check(chat_tasks.answer_add(99999, 1).endswith("A+B=100000"), "add carry")
    check(chat_tasks.answer_multiply(9999, 99).endswith("A*B=989901"),
          "multiply")
    rng = random.Random(7)
    for _ in range(2000):
        a, b = rng.randint(0, 99999), rng.randint(0, 99999)
        check(chat_tasks.last_number(chat_tasks.answer_add(a, b)) == a + b,
              f"add {a} {b}")
        a, b = rng.randint(0, 9999), rng.randint(0, 99)
        check(chat_tasks.last_number(chat_tasks.answer_multiply(a, b)) == a * b,
              f"multiply {a} {b}")
    # The layout is fixed: every add answer has the same length, and so does
    # every multiply answer.
    check(len({len(chat_tasks.answer_add(rng.randint(0, 99999),
                                          rng.randint(0, 99999)))
               for _ in range(200)}) == 1, "add layout")
    check(len({len(chat_tasks.answer_multiply(rng.randint(0, 9999),
                                               rng.randint(0, 99)))
               for _ in range(200)}) == 1, "multiply layout")
    src = "def f(x):\n    y = x  # x stays in comments\n    return 'x' + y"
    check(chat_tasks.rename(src, "x", "value") ==
          "def f(value):\n    y = value  # x stays in comments\n    return 'x' + y",
          "rename keeps strings and comments")
    # The split is dedit-train's: a held-out file is never a training file.
    train_files = set(chat_tasks.corpus_files("train", 20))
    held_files = set(chat_tasks.corpus_files("heldout", 20))
    check(held_files and not (train_files & held_files), "disjoint file split")
    # Same hash as training/corpus.cc (its offset constant included, which
    # is not FNV's standard one: the split follows the C++ code).
    import re
    cc = open(os.path.join(HERE, "..", "..", "training", "corpus.cc")).read()
    m = re.search(r"uint64_t h = (\d+)ull;\s*for \(unsigned char c : text\) \{\s*"
                  r"h \^= c;\s*h \*= (\d+)ull;", cc)
    check(m is not None and int(m.group(1)) == chat_tasks.FNV_OFFSET
          and int(m.group(2)) == chat_tasks.FNV_PRIME, "hash as in corpus.cc")

    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
