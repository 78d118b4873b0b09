# Writes the distill records whose prompt is one of the given chat families.
# usage (repository root): python3 filter.py IN.bin OUT.bin rename,continue
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import read_records, vocab  # noqa: E402

src, dst, fams = sys.argv[1], sys.argv[2], sys.argv[3].split(',')
v = vocab()
keys = {'rename': 'Rename', 'continue': 'Continue:'}
header, recs = read_records(src)
kept = [raw for pl, ids, raw in recs
        if any(keys[f] in ''.join(v.get(i, '') for i in ids[:pl]) for f in fams)]
open(dst, 'wb').write(header + b''.join(kept))
print(len(kept), 'of', len(recs))
