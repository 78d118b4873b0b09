#!/usr/bin/env python3
"""The chat task suite: generated instances of seven task families, and the
scorer of a model's answers to them.

Every user message uses exactly these formats (docs/ARCHITECTURE.md §6), so
any prompt written in them is in the suite's distribution:

  add       Add A and B.                      A, B up to 5 digits
  multiply  Multiply A by B.                  A up to 4 digits, B up to 2
  sort      Sort: 5, 12, 3, 9                 3-12 numbers below 1000
  reverse   Reverse: word word word           3-8 words
  json      To JSON: key=value; key=value     2-5 pairs, numbers stay numbers
  rename    Rename OLD to NEW:\\n<function>    a 4-16 line Python function
  continue  Continue:\\n<first lines>          the first lines of a function

Conversations use the Qwen3 chat template with enable_thinking off: the
tiny tokenizer has no think tokens, so the empty think block is not
rendered at all (`render_chat`, and the router/CLI's --chat paths with
enable_thinking=false on a tokenizer without <think>). An answer is the
assistant turn's content.

Answers (the format is ours): arithmetic shows its column steps before the
result in a fixed, zero-padded layout (see `columns`), so that a small model
computes rather than recalls and every digit it reads sits at a fixed
distance. reverse shows its steps too (see `answer_reverse`): the words
numbered in order, then numbered backwards, then the reversed list. The
other families answer with the result alone.

Functions come from the same corpus files and the same train/held-out
split as `dedit-train` (FNV-1a of the path, 1 file in `heldout_every` held
out): training instances only from training files, held-out instances only
from held-out files and with fresh values (another seed).

  chat_tasks.py generate --out DIR [--train 20000] [--heldout 35]
                        [--weights sort=3,rename=3,add=0.25]
                        [--fixed_share 0.2] [--rename_min_uses 3]
                        [--reverse_min_words 5] ...
      -> DIR/train.jsonl, DIR/heldout.jsonl: one instance per line,
         {"family", "user", "answer", "text"} where text is the rendered
         conversation (prompt + answer + <|im_end|>), what the target
         trains on.
  chat_tasks.py score HELDOUT.jsonl ANSWERS.jsonl
      -> per-family accuracy; ANSWERS has {"answer": "..."} per line in
         the same order (the model's assistant content).
  chat_tasks.py check FAMILY USER < ANSWER
      -> exit 0 when ANSWER is right for the user message (the reference is
         computed from the message itself); make demo uses it.
"""
import argparse
import ast
import io
import json
import os
import random
import re
import sys
import tokenize

FAMILIES = ["add", "multiply", "sort", "reverse", "json", "rename", "continue"]
CORPUS_ROOTS = ["/usr/lib/python3.11"]
EXCLUDE_DIRS = {"__pycache__", "test", "tests", "idle_test", "pydoc_data",
                "site-packages", "dist-packages"}
MAX_FILE_BYTES = 512 * 1024


# training/corpus.cc's Fnv1a, constants included (its offset is not FNV's
# standard basis, but it defines the split of the shipped models).
FNV_OFFSET = 1469598103934665603
FNV_PRIME = 1099511628211


def fnv1a(text):
    h = FNV_OFFSET
    for c in text.encode("utf-8"):
        h ^= c
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def render_chat(user, answer=None):
    """Qwen3 template, enable_thinking off, no think block (tiny tokenizer)."""
    text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    if answer is not None:
        text += f"{answer}<|im_end|>\n"
    return text


# --- arithmetic with column steps --------------------------------------------
#
# Fixed layout: operands are restated zero-padded to the family's widest
# operand, every column clause has the same number of tokens (each digit and
# sign is its own token under the Qwen3 pre-tokenizer) and results are
# zero-padded too, so that every digit an answer reads sits at a fixed
# distance from where it is written. A small model then needs relative-
# position lookups only, no counting; the final number is still the value
# (the scorer reads it as an integer).

def columns(x, y, width, sep="+"):
    """Column clauses `a+b+c=ss` from the right over `width` digits of the
    zero-padded x and y, and the (width + 1)-digit padded sum."""
    dx, dy = str(x).zfill(width)[::-1], str(y).zfill(width)[::-1]
    carry, clauses, digits = 0, [], []
    for i in range(width):
        s = int(dx[i]) + int(dy[i]) + carry
        clauses.append(f"{dx[i]}{sep}{dy[i]}+{carry}={s:02d}")
        digits.append(str(s % 10))
        carry = s // 10
    total = str(carry) + "".join(reversed(digits))
    assert int(total) == x + y
    return clauses, total


def answer_add(a, b):
    clauses, total = columns(a, b, 5)
    return (f"A={a:05d} B={b:05d}. {' '.join(clauses)}. "
            f"A+B={total}")


def answer_reverse(words, steps=True):
    """`1 a 2 b 3 c. 3 c 2 b 1 a. Reversed: c b a` (steps=False: the bare
    list `c b a`, the first suite's format). Reversing a list of
    words it has never seen is copying from the prompt: the numbered copy
    turns each backward step into "find the word after the number one
    less than the last", which a small model does from the numbers alone,
    where the bare list asks it to count words of 1-4 BPE pieces backwards
    (docs/log/2026-12-06-target-continuations.md, "Reverse by length"; its
    seventh session: 450 steps on the bare list took the shipped target's
    reverse from 30/35 to 11/35 on unseen words)."""
    backward = " ".join(reversed(words))
    if not steps:
        return backward
    numbered = [f"{i} {w}" for i, w in enumerate(words, 1)]
    return (f"{' '.join(numbered)}. {' '.join(reversed(numbered))}. "
            f"Reversed: {backward}")


def reverse_words(user):
    """The words of a `Reverse: ...` message, in its order."""
    return user[len("Reverse: "):].split()


def reversed_list(user):
    """The reversed word list a `Reverse: ...` message asks for."""
    return " ".join(reversed(reverse_words(user)))


def partial_product(a, d):
    """Clauses `a*d+c=ss` from the right over 4 digits, and the 5-digit
    padded product."""
    da = str(a).zfill(4)[::-1]
    carry, clauses, digits = 0, [], []
    for i in range(4):
        s = int(da[i]) * d + carry
        clauses.append(f"{da[i]}*{d}+{carry}={s:02d}")
        digits.append(str(s % 10))
        carry = s // 10
    product = str(carry) + "".join(reversed(digits))
    assert int(product) == a * d
    return clauses, product


def answer_multiply(a, b):
    b1, b0 = divmod(b, 10)
    c0, p0 = partial_product(a, b0)
    c1, p1 = partial_product(a, b1)
    x, y = "0" + p0, p1 + "0"  # 6 digits each; the tens partial shifted
    clauses, total = columns(int(x), int(y), 6)
    total = total[1:]  # 9999 * 99 < 10**6: the seventh digit is always 0
    assert int(total) == a * b
    return (f"A={a:04d} B={b:02d}. {b0}: {' '.join(c0)} -> {p0}. "
            f"{b1}: {' '.join(c1)} -> {p1}. {x}+{y}: {' '.join(clauses)}. "
            f"A*B={total}")


# --- Python functions from the corpus ----------------------------------------

def corpus_files(split, heldout_every):
    for root in CORPUS_ROOTS:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDE_DIRS)
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                if size == 0 or size > MAX_FILE_BYTES:
                    continue
                held = heldout_every > 0 and fnv1a(path) % heldout_every == 0
                if held == (split == "heldout"):
                    yield path


def functions(split, heldout_every, min_lines=4, max_lines=16):
    """(source, identifiers) of top-level and method functions, ASCII only."""
    out = []
    for path in corpus_files(split, heldout_every):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            start = node.lineno - 1
            if node.decorator_list:
                start = node.decorator_list[0].lineno - 1
            body = lines[start:node.end_lineno]
            if not min_lines <= len(body) <= max_lines:
                continue
            indent = len(body[0]) - len(body[0].lstrip())
            body = [l[indent:] if l[:indent].strip() == "" else l for l in body]
            text = "\n".join(body)
            if not text.isascii() or "\t" in text:
                continue
            names = sorted({t.string for t in _tokens(text)
                            if t.type == tokenize.NAME
                            and t.string not in KEYWORDS and len(t.string) > 1})
            if names:
                out.append((text, names))
    return out


KEYWORDS = set(__import__("keyword").kwlist) | {"self", "cls", "True", "False",
                                                 "None"}


def _tokens(text):
    try:
        return list(tokenize.generate_tokens(io.StringIO(text + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []


def rename(text, old, new):
    """`text` with every NAME token `old` replaced (strings, comments kept)."""
    lines = text.split("\n")
    for tok in sorted(_tokens(text), key=lambda t: t.start, reverse=True):
        if tok.type == tokenize.NAME and tok.string == old:
            (row, col), (_, end) = tok.start, tok.end
            line = lines[row - 1]
            lines[row - 1] = line[:col] + new + line[end:]
    return "\n".join(lines)


# --- instances ----------------------------------------------------------------

# The vocabulary of reverse, json and rename. "fixed" is the original suite:
# about sixty words and twenty keys that every split draws from, so a
# held-out instance is a fresh combination of memorised words. "pool"
# (the default) draws from thousands of words: the lower-case words and
# identifiers of the corpus files, and generated pseudo-words; a word's
# hash puts it in the training or the held-out pool, so held-out instances
# use only words the training instances never show, and copying them
# from the prompt is the only way to answer.
FIXED_WORDS = ("apple river stone cloud table green quick light window paper "
               "garden silver orange music ocean forest yellow pencil candle "
               "bridge winter summer rabbit castle little bottle market planet "
               "number letter simple circle square dragon butter travel sister "
               "mirror rocket jacket flower guitar animal circle doctor camera "
               "island spring autumn school friend family button engine "
               "basket").split()
FIXED_KEYS = ("name id count size port host user mode level limit color width "
              "height depth speed score price title owner path city year").split()
VOCABS = ("pool", "fixed")
HELDOUT_WORD_EVERY = 5  # one word in five is held out
PSEUDO_WORDS = 6000
_ONSETS = ("b c d f g h j k l m n p r s t v w z br cl dr fl gr pl pr sk sl sn "
           "st tr ch sh th").split()
_VOWELS = "a e i o u ai ea ou oo".split()
_CODAS = ["", "", "", "n", "r", "l", "s", "t", "x", "m", "nd", "rk", "st"]


# The tokenizer that counts a pseudo-word's pieces: the shipped pair's (a
# continuation keeps its model's tokenizer, train_tiny.sh).
PIECES_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "checkpoints", "tiny", "target",
                                "tokenizer.json")
MAX_PSEUDO_PIECES = 4


def bpe_merge_ranks(tokenizer_path=PIECES_TOKENIZER):
    """{(left, right): rank} of a byte-level BPE tokenizer.json's merges."""
    with open(tokenizer_path, encoding="utf-8") as f:
        merges = json.load(f)["model"]["merges"]
    return {tuple(m.split(" ") if isinstance(m, str) else m): i
            for i, m in enumerate(merges)}


def bpe_pieces(text, ranks):
    """The byte-level BPE pieces of one pre-token `text` (lower-case ASCII
    letters, "\u0120" for a leading space). A few lines of BPE rather than
    a library: Debian packages no Python binding of HF tokenizers, and the
    suite must be generated without a build (dedit-cli tokenize, the
    engine's tokenizer, checks it: tests/training/chat_tasks_test.py). For
    ASCII letters the byte-level alphabet is the letters themselves."""
    symbols = list(text)
    while len(symbols) > 1:
        pairs = [(ranks.get(p, len(ranks)), i)
                 for i, p in enumerate(zip(symbols, symbols[1:]))]
        rank, _ = min(pairs)
        if rank == len(ranks):
            break
        merged, i = [], 0
        while i < len(symbols):
            if (i + 1 < len(symbols) and
                    ranks.get((symbols[i], symbols[i + 1])) == rank):
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def word_pieces(word, ranks):
    """How many BPE pieces " word" (after a space, as in a sentence)
    encodes to."""
    return len(bpe_pieces("\u0120" + word, ranks))


def retokenized(word, ranks):
    """Whether `word` bare (after a quote, as a JSON key) is not " word"
    (after a space, as in a json request) with the space taken off its
    first piece: copying such a key means writing other tokens than the
    request's. Every key the continuation-8 target got wrong on unseen
    words was one (8 of the held-out split's 41; none of its 94 others;
    docs/log/2026-12-06-target-continuations.md, "2026-12-07")."""
    spaced = bpe_pieces("\u0120" + word, ranks)
    return bpe_pieces(word, ranks) != [spaced[0][1:]] + spaced[1:]


def pseudo_words(count, seed=11, max_pieces=MAX_PSEUDO_PIECES):
    """`count` distinct pronounceable non-words of 1-3 syllables and 1 to
    `max_pieces` BPE pieces under the shipped tokenizer (a drawn word with
    more is skipped: untrimmed, 59% of them had 5-11), the same on
    every machine."""
    ranks = bpe_merge_ranks()
    rng = random.Random(seed)
    out = set()
    while len(out) < count:
        syllables = rng.randint(1, 3)
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) +
                       rng.choice(_CODAS) for _ in range(syllables))
        if word_pieces(word, ranks) <= max_pieces:
            out.add(word)
    return sorted(out)


def corpus_words():
    """The lower-case words (3-10 letters, not Python keywords) of every
    corpus file, both splits: what text and code are made of."""
    words = set()
    for split in ("train", "heldout"):
        for path in corpus_files(split, 20):
            try:
                with open(path, encoding="utf-8") as f:
                    words.update(re.findall(r"\b[a-z]{3,10}\b", f.read()))
            except (UnicodeDecodeError, OSError):
                continue
    return sorted(words - KEYWORDS)


def word_split(word):
    """'heldout' for one word in HELDOUT_WORD_EVERY, else 'train'."""
    return ("heldout" if fnv1a("word:" + word) % HELDOUT_WORD_EVERY == 0
            else "train")


def retokenized_groups(words):
    """The words of `words` that are retokenized(), grouped by the first
    piece of " word", groups and words sorted."""
    ranks = bpe_merge_ranks()
    groups = {}
    for w in words:
        if retokenized(w, ranks):
            groups.setdefault(bpe_pieces("\u0120" + w, ranks)[0],
                              []).append(w)
    return [sorted(groups[p]) for p in sorted(groups)]


_POOLS = {}


def vocabulary(vocab, split):
    """(words, keys) that `split` draws from under `vocab`."""
    if vocab == "fixed":
        return FIXED_WORDS, FIXED_KEYS
    if split not in _POOLS:
        words = sorted(set(corpus_words()) | set(pseudo_words(PSEUDO_WORDS)))
        for s in ("train", "heldout"):
            _POOLS[s] = [w for w in words if word_split(w) == s]
    pool = _POOLS[split]
    return pool, pool


def name_uses(text):
    """{name: occurrences as a NAME token} in `text`."""
    uses = {}
    for t in _tokens(text):
        if t.type == tokenize.NAME:
            uses[t.string] = uses.get(t.string, 0) + 1
    return uses


def rename_names(user):
    """(old, new) of a rename instance's user message."""
    head = user.split("\n", 1)[0]
    return re.fullmatch(r"Rename (\w+) to (\w+):", head).groups()


def make_instance(family, rng, funcs, words=FIXED_WORDS, keys=FIXED_KEYS,
                  rename_min_uses=1, reverse_min_words=3, hard_keys=(),
                  reverse_steps=True):
    if family == "add":
        a, b = rng.randint(0, 99999), rng.randint(0, 99999)
        return f"Add {a} and {b}.", answer_add(a, b)
    if family == "multiply":
        a, b = rng.randint(0, 9999), rng.randint(0, 99)
        return f"Multiply {a} by {b}.", answer_multiply(a, b)
    if family == "sort":
        xs = [rng.randint(0, 999) for _ in range(rng.randint(3, 12))]
        return ("Sort: " + ", ".join(map(str, xs)),
                ", ".join(map(str, sorted(xs))))
    if family == "reverse":
        ws = [rng.choice(words)
              for _ in range(rng.randint(reverse_min_words, 8))]
        return "Reverse: " + " ".join(ws), answer_reverse(ws, reverse_steps)
    if family == "json":
        picked = rng.sample(keys, rng.randint(2, 5))
        if hard_keys:
            # Training only: one key that tokenizes otherwise bare, its
            # spaced first piece drawn uniformly (hard_keys: the words
            # grouped by that piece), so that every piece's bare spelling
            # is shown, not mostly those of the common pieces.
            hard = rng.choice(rng.choice(hard_keys))
            if hard not in picked:
                picked[rng.randrange(len(picked))] = hard
        pairs = {}
        for k in picked:
            pairs[k] = (rng.randint(0, 9999) if rng.random() < 0.5
                        else rng.choice(words))
        user = "To JSON: " + "; ".join(f"{k}={v}" for k, v in pairs.items())
        return user, json.dumps(pairs)
    text, names = rng.choice(funcs)
    if family == "rename":
        if rename_min_uses > 1:
            # Training only: a name used several times, so that more of
            # the answer's tokens are substitutions rather than copies
            # (a one-use name leaves one decision point in ~100 tokens).
            uses = name_uses(text)
            many = [n for n in names if uses.get(n, 0) >= rename_min_uses]
            names = many or [max(names, key=lambda n: (uses.get(n, 0), n))]
        old = rng.choice(names)
        new = rng.choice(words) + "_" + rng.choice(words)
        return f"Rename {old} to {new}:\n{text}", rename(text, old, new)
    if family == "continue":
        lines = text.split("\n")
        cut = rng.randint(1, max(1, len(lines) // 2))
        return ("Continue:\n" + "\n".join(lines[:cut]),
                "\n".join(lines[cut:]))
    raise ValueError(family)


def parse_weights(text):
    """'sort=3,rename=3,add=0.25' -> {family: weight}; unnamed families 1."""
    weights = {f: 1.0 for f in FAMILIES}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name not in weights:
            sys.exit(f"chat_tasks.py: --weights: unknown family {name!r} "
                     f"(families: {', '.join(FAMILIES)})")
        try:
            weights[name] = float(value)
        except ValueError:
            sys.exit(f"chat_tasks.py: --weights: {name}={value!r} is not a "
                     "number")
        if not 0 <= weights[name] <= 100:
            sys.exit(f"chat_tasks.py: --weights: {name} must be in [0, 100]")
    return weights


def family_order(count, weights):
    """round(count x weight) instances of each family, interleaved so that
    every prefix of the file has the families in proportion."""
    quota = {f: int(round(count * weights[f])) for f in FAMILIES}
    total = sum(quota.values())
    if total == 0:
        sys.exit("chat_tasks.py: --weights leave no training instances")
    done = {f: 0 for f in FAMILIES}
    order = []
    for i in range(total):
        # the family furthest behind its share of the first i+1 instances
        family = max(FAMILIES, key=lambda f: (quota[f] * (i + 1) / total
                                              - done[f], -FAMILIES.index(f)))
        done[family] += 1
        order.append(family)
    return order


def generate(args):
    os.makedirs(args.out, exist_ok=True)
    weights = parse_weights(args.weights)
    for split, count, seed in (("train", args.train, args.seed),
                               ("heldout", args.heldout, args.seed + 1000003)):
        funcs = functions(split, args.heldout_every)
        if not funcs:
            sys.exit(f"chat_tasks.py: no {split} functions under {CORPUS_ROOTS}")
        rng = random.Random(seed)
        words, keys = vocabulary(args.vocab, split)
        train = split == "train"
        # --fixed_share: that share of the training instances draws from
        # the original word and key lists (the words of them that are in
        # the training pool, so held-out words stay unseen), so that the
        # original split does not regress while the pool is learned.
        fixed = ([w for w in FIXED_WORDS if w in set(words)],
                 [k for k in FIXED_KEYS if k in set(keys)])
        mix = random.Random(seed + 7)
        hard = random.Random(seed + 13)
        hard_pools = {}
        path = os.path.join(args.out, f"{split}.jsonl")
        # Held-out sets stay balanced (the same number per family) and
        # identical whatever the training weights are.
        order = (family_order(count, weights) if split == "train"
                 else [FAMILIES[i % len(FAMILIES)]
                       for i in range(count * len(FAMILIES))])
        with open(path + ".tmp", "w") as f:
            for family in order:
                w, k = words, keys
                if (train and args.fixed_share > 0 and args.vocab == "pool"
                        and mix.random() < args.fixed_share):
                    w, k = fixed
                hard_keys = ()
                if (train and family == "json" and
                        args.json_retokenized_share > 0 and
                        hard.random() < args.json_retokenized_share):
                    if id(k) not in hard_pools:
                        hard_pools[id(k)] = retokenized_groups(k)
                    hard_keys = hard_pools[id(k)]
                user, answer = make_instance(
                    family, rng, funcs, w, k,
                    args.rename_min_uses if train else 1,
                    args.reverse_min_words if train else 3, hard_keys,
                    args.reverse_format == "steps")
                f.write(json.dumps({"family": family, "user": user,
                                    "answer": answer,
                                    "text": render_chat(user, answer)}) + "\n")
        os.replace(path + ".tmp", path)
        print(f"{path}: {len(order)} instances "
              f"({len(funcs)} {split} functions)")


# --- scoring ------------------------------------------------------------------

def last_number(text):
    m = re.findall(r"-?\d+", text)
    return int(m[-1]) if m else None


def numbers(text):
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _count(text, phrase):
    """How often `phrase` occurs in `text` as a whole word or number."""
    return len(re.findall(r"(?<![\w])" + re.escape(phrase) + r"(?![\w])",
                          text))


def _contains(text, phrase):
    return _count(text, phrase) > 0


def first_json_object(text):
    """The first {...} in `text` that parses as JSON, or None."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def correct(instance, answer, user=None):
    """Whether `answer` is right, judged as a user would read it:
    add, multiply: the answer's last number is the result (leading zeros
    allowed: the suite's answers are zero-padded);
    sort: the reference string appears in it; reverse: the reversed list
    appears in it (with or without the steps); json: the first
    {...} in it parses to the reference object; rename: the new name
    appears and the old one does not, as whole words, except where the
    reference keeps it (strings and comments are not renamed; `user`, the
    request, names both; instance["user"] when not given)."""
    family, ref = instance["family"], instance["answer"]
    if family in ("add", "multiply"):
        return last_number(answer) == last_number(ref)
    if family == "sort":
        return _contains(answer, ref.strip())
    if family == "reverse":
        return _contains(answer, reversed_list(user or instance["user"]))
    if family == "json":
        return first_json_object(answer) == json.loads(ref)
    if family == "rename":
        old, new = rename_names(user or instance["user"])
        return (_contains(answer, new) and
                _count(answer, old) <= _count(ref, old))
    return None  # continue: loss only


def reference(family, user):
    """The reference answer to a user message in the suite's formats (what
    make_instance would have answered), or None for `continue`."""
    if family == "add":
        a, b = map(int, re.fullmatch(r"Add (\d+) and (\d+)\.", user).groups())
        return answer_add(a, b)
    if family == "multiply":
        a, b = map(int, re.fullmatch(r"Multiply (\d+) by (\d+)\.",
                                     user).groups())
        return answer_multiply(a, b)
    if family == "sort":
        xs = numbers(user[len("Sort: "):])
        return ", ".join(map(str, sorted(xs)))
    if family == "reverse":
        return answer_reverse(reverse_words(user))
    if family == "json":
        pairs = {}
        for item in user[len("To JSON: "):].split("; "):
            k, v = item.split("=", 1)
            pairs[k] = int(v) if re.fullmatch(r"\d+", v) else v
        return json.dumps(pairs)
    if family == "rename":
        old, new = rename_names(user)
        return rename(user.split("\n", 1)[1], old, new)
    return None


def check(args):
    """Exit 0 when the answer on stdin is correct for the user message."""
    answer = sys.stdin.read()
    ref = reference(args.family, args.user)
    ok = correct({"family": args.family, "answer": ref}, answer, args.user)
    print("correct" if ok else f"wrong; expected:\n{ref}")
    sys.exit(0 if ok else 1)


def score(args):
    instances = [json.loads(l) for l in open(args.heldout)]
    answers = [json.loads(l)["answer"] for l in open(args.answers)]
    if len(answers) != len(instances):
        sys.exit(f"chat_tasks.py: {len(answers)} answers for "
                 f"{len(instances)} instances")
    per = {}
    for inst, ans in zip(instances, answers):
        ok = correct(inst, ans)
        if ok is None:
            continue
        hit, total = per.get(inst["family"], (0, 0))
        per[inst["family"]] = (hit + int(ok), total + 1)
    hits = sum(h for h, _ in per.values())
    total = sum(t for _, t in per.values())
    report = {f: {"correct": h, "instances": t, "accuracy": h / t}
              for f, (h, t) in per.items()}
    report["overall"] = {"correct": hits, "instances": total,
                         "accuracy": hits / total if total else 0.0}
    print(json.dumps(report, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--train", type=int, default=20000,
                   help="training instances per family")
    g.add_argument("--heldout", type=int, default=35,
                   help="held-out instances per family")
    g.add_argument("--heldout_every", type=int, default=20)
    g.add_argument("--weights", default="",
                   help="training instances per family relative to --train, "
                        "e.g. sort=3,rename=3,add=0.25 (held-out stays "
                        "balanced)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--vocab", choices=VOCABS, default="pool",
                   help="pool: held-out instances use only words training "
                        "never shows; fixed: the original ~60 words")
    g.add_argument("--fixed_share", type=float, default=0.0,
                   help="pool vocabulary: this share of the training "
                        "instances uses the original words that are in the "
                        "training pool (held-out is unchanged)")
    g.add_argument("--rename_min_uses", type=int, default=1,
                   help="training rename instances rename a name used at "
                        "least this often in the function (held-out: any)")
    g.add_argument("--reverse_min_words", type=int, default=3,
                   choices=range(3, 9), metavar="{3..8}",
                   help="training reverse instances list this many to 8 "
                        "words (held-out: 3 to 8)")
    g.add_argument("--reverse_format", choices=["steps", "list"],
                   default="steps",
                   help="reverse answers: steps (numbered forward, numbered "
                        "backward, then the list) or list (the reversed list "
                        "alone)")
    g.add_argument("--json_retokenized_share", type=float, default=0.0,
                   help="this share of the training json instances has a "
                        "key that tokenizes otherwise bare than after a "
                        "space (held-out is unchanged)")
    s = sub.add_parser("score")
    s.add_argument("heldout")
    s.add_argument("answers")
    c = sub.add_parser("check", help="check one answer (stdin) to USER")
    c.add_argument("family", choices=FAMILIES[:-1])
    c.add_argument("user")
    args = ap.parse_args()
    {"generate": generate, "score": score, "check": check}[args.command](args)


if __name__ == "__main__":
    main()
