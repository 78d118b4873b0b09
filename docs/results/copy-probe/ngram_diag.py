# For each answer position a (token a known = anchor), predict token a+1 by
# the last earlier occurrence of the last n tokens ending at a; report hit rate
# per n and coverage, per family.
import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import struct, sys, json
tok = json.load(open('checkpoints/tiny/target/tokenizer.json'))
vocab = {i: s for s, i in tok['model']['vocab'].items()}
for a in tok['added_tokens']: vocab[a['id']] = a['content']
b = open(sys.argv[1], 'rb').read(); o = 8
stats = {}
while o + 8 <= len(b):
    pl, m = struct.unpack_from('<II', b, o)
    ids = struct.unpack_from('<%di' % m, b, o + 8); o += 8 + 4 * m
    text = ''.join(vocab.get(i, '') for i in ids[:pl])
    fam = 'rename' if 'Rename' in text else 'continue' if 'Continue:' in text else 'other'
    for n in (1, 2, 3, 4):
        s = stats.setdefault((fam, n), [0, 0, 0])
        for a in range(pl, m - 1):
            s[0] += 1
            key = ids[a - n + 1:a + 1]
            found = None
            for j in range(a - 1, n - 2, -1):
                if ids[j - n + 1:j + 1] == key: found = ids[j + 1]; break
            if found is not None:
                s[1] += 1; s[2] += found == ids[a + 1]
for (fam, n), (t, c, h) in sorted(stats.items()):
    print(fam, 'n=%d' % n, 'positions', t, 'matched %.1f%%' % (100 * c / t), 'right %.1f%% of all' % (100 * h / t), '(%.1f%% of matched)' % (100 * h / max(c, 1)))
