# Writes the distill records whose prompt is one of the given chat families.
import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import struct, sys, json
src, dst, fams = sys.argv[1], sys.argv[2], sys.argv[3].split(',')
tok = json.load(open('checkpoints/tiny/target/tokenizer.json'))
vocab = {i: s for s, i in tok['model']['vocab'].items()}
for a in tok['added_tokens']: vocab[a['id']] = a['content']
keys = {'rename': 'Rename', 'continue': 'Continue:'}
b = open(src, 'rb').read(); o = 8; out = [b[:8]]; n = kept = 0
while o + 8 <= len(b):
    pl, m = struct.unpack_from('<II', b, o)
    ids = struct.unpack_from('<%di' % m, b, o + 8)
    text = ''.join(vocab.get(i, '') for i in ids[:pl])
    if any(keys[f] in text for f in fams):
        out.append(b[o:o + 8 + 4 * m]); kept += 1
    o += 8 + 4 * m; n += 1
open(dst, 'wb').write(b''.join(out))
print(kept, 'of', n)
