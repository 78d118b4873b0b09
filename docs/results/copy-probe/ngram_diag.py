# For each answer position a (token a known = anchor), predict token a+1 by
# the last earlier occurrence of the last n tokens ending at a; report hit rate
# per n and coverage, per family.
# usage (repository root): python3 ngram_diag.py RECORDS.bin
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import records, vocab  # noqa: E402

v = vocab()
stats = {}
for pl, ids in records(sys.argv[1]):
    m = len(ids)
    text = ''.join(v.get(i, '') for i in ids[:pl])
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
