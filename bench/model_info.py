#!/usr/bin/env python3
"""What a benchmark needs to know about the model pair it is pointed at.

Every bench script reads the pair's own config.json files through this file
instead of assuming a vocabulary, a window or a context length, so that it
works on any model (the bundled checkpoints/tiny pair with 2048 ids, a
generated random pair, a real Qwen3 + drafter).

  model_info.py limits TARGET_DIR [DRAFTER_DIR]
      -> prints shell assignments: VOCAB=.. MAX_POSITIONS=.. BLOCK_SIZE=..
  model_info.py fit TARGET_DIR DRAFTER_DIR WINDOW PROMPT_LEN MAX_NEW_TOKENS
      -> the same, plus WINDOW=.. (at most the drafter's block size) and
         MAX_NEW_TOKENS=.. (lowered so that prompt + tokens + window fit the
         context); each change is said on stderr
  model_info.py prompts TARGET_DIR COUNT LENGTH MAX_NEW_TOKENS WINDOW [SEED]
      -> COUNT JSON lines of LENGTH random ids inside the vocabulary; fails
         (exit 2, naming the numbers) when LENGTH + MAX_NEW_TOKENS + WINDOW
         does not fit the target's context.
"""
import json
import os
import random
import sys


def load(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def fail(msg):
    print(f"model_info.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("limits", "fit", "prompts"):
        fail("usage: model_info.py limits|fit|prompts TARGET_DIR ... "
             "(see the docstring)")
    target = load(argv[2])
    vocab = int(target["vocab_size"])
    max_positions = int(target.get("max_position_embeddings", 40960))
    if argv[1] in ("limits", "fit"):
        block = 1
        if len(argv) > 3 and argv[3]:
            block = int(load(argv[3]).get("block_size", 1))
        line = f"VOCAB={vocab} MAX_POSITIONS={max_positions} BLOCK_SIZE={block}"
        if argv[1] == "fit":
            if len(argv) < 7:
                fail("fit needs TARGET_DIR DRAFTER_DIR WINDOW PROMPT_LEN "
                     "MAX_NEW_TOKENS")
            window, prompt_len, max_new = (int(x) for x in argv[4:7])
            if window > block:
                print(f"model_info.py: W={window} > the drafter's block size "
                      f"{block}; using {block}", file=sys.stderr)
                window = block
            if prompt_len + max_new + window > max_positions:
                max_new = max_positions - prompt_len - window
                print(f"model_info.py: context of {max_positions}: max tokens "
                      f"lowered to {max_new}", file=sys.stderr)
            line += f" WINDOW={window} MAX_NEW_TOKENS={max_new}"
        print(line)
        return
    if len(argv) < 7:
        fail("prompts needs TARGET_DIR COUNT LENGTH MAX_NEW_TOKENS WINDOW [SEED]")
    count, length, max_new, window = (int(x) for x in argv[3:7])
    seed = int(argv[7]) if len(argv) > 7 else 1
    if length + max_new + window > max_positions:
        fail(f"prompt {length} + max_tokens {max_new} + window {window} exceeds "
             f"the target's context of {max_positions} positions")
    # Ids from the low end of the vocabulary, clear of the special tokens a
    # real tokenizer keeps at the top.
    hi = max(2, min(vocab, vocab - 16 if vocab > 64 else vocab))
    rng = random.Random(seed)
    for _ in range(count):
        print(json.dumps([rng.randrange(hi) for _ in range(length)]))


if __name__ == "__main__":
    main(sys.argv)
