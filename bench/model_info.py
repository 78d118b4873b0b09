#!/usr/bin/env python3
"""What a benchmark needs to know about the model pair it is pointed at.

Every bench script reads the pair's own config.json files through this file
instead of assuming a vocabulary, a window or a context length, so that it
works on any model (the bundled checkpoints/tiny pair with 2048 ids, a
generated random pair, a real Qwen3 + drafter).

  model_info.py limits TARGET_DIR [DRAFTER_DIR]
      -> prints shell assignments: VOCAB=.. MAX_POSITIONS=.. BLOCK_SIZE=..
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
    if len(argv) < 3 or argv[1] not in ("limits", "prompts"):
        fail("usage: model_info.py limits|prompts TARGET_DIR ... (see the docstring)")
    target = load(argv[2])
    vocab = int(target["vocab_size"])
    max_positions = int(target.get("max_position_embeddings", 40960))
    if argv[1] == "limits":
        block = 1
        if len(argv) > 3 and argv[3]:
            block = int(load(argv[3]).get("block_size", 1))
        print(f"VOCAB={vocab} MAX_POSITIONS={max_positions} BLOCK_SIZE={block}")
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
