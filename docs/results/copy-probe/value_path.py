# With init14's lookup head (layer 1's first head, anchor input), can a
# value/output path on the drafter's context rows predict slot 1 (token
# a+1)? Trains v, o (and the head's q/k) on TRAIN copy records, reports
# held-out accuracy.
# usage (repository root): EXP=... [STEPS=400] python3 value_path.py
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EPS, EXP, LookupHead, Pair, mg, records  # noqa: E402

pair = Pair('checkpoints/tiny', EXP + '/init14')
torch.manual_seed(0)
head = LookupHead(pair)
emb, fn = pair.emb, pair.w['norm.weight']
train = pair.items(records(EXP + '/copy.bin')[:120])
held = pair.items(records(EXP + '/copy-heldout.bin')[:40])
vw = (torch.randn(128, 128) * 0.05).requires_grad_(); ow = (torch.randn(128, 128) * 0.05).requires_grad_()
def run(items):
    L, H = [], []
    for ids, pl, ctx in items:
        t, anchors, x, pr, _ = head.attend(ids, pl, ctx)
        h = x + (pr @ (ctx @ vw.t())) @ ow.t()
        logits = mg.rms_norm(h, fn, EPS) @ emb.t()
        y = t[anchors + 1]
        L.append(torch.nn.functional.cross_entropy(logits, y, reduction='none')); H.append((logits.argmax(-1) == y).float())
    return torch.cat(L).mean(), torch.cat(H).mean()
opt = torch.optim.Adam(head.params() + [vw, ow], lr=3e-3)
steps = int(os.environ.get('STEPS', 400))
for step in range(steps):
    idx = np.random.choice(len(train), 16, replace=False)
    loss, acc = run([train[i] for i in idx]); opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0 or step == steps - 1:
        with torch.no_grad(): hl, ha = run(held)
        print(step, 'train loss %.2f acc %.3f | held-out loss %.2f acc %.3f' % (loss.item(), acc.item(), hl.item(), ha.item()), flush=True)
