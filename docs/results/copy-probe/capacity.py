# Can one attention head of the drafter's shape find "where the anchor
# occurred before" from the drafter's context rows? Optimise that head's
# q/k projections and norms directly on the matching objective, on 30
# held-out answers, and report the share on the other 10.
# usage (repository root): EXP=... [THETA=...] [LR=...] python3 capacity.py
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EXP, LookupHead, Pair, records  # noqa: E402

pair = Pair()
torch.manual_seed(0)
theta = os.environ.get('THETA')
head = LookupHead(pair, float(theta) if theta else None)
data = pair.items(records(EXP + '/copy-heldout.bin')[:40])
split = 30
opt = torch.optim.Adam(head.params(), lr=float(os.environ.get('LR', 3e-3)))
for step in range(301):
    m = head.mass(data[:split]); loss = -(m + 1e-6).log().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        with torch.no_grad(): mh = head.mass(data[split:])
        print(step, 'train mass %.3f held-out mass %.3f (median %.3f)' % (m.mean(), mh.mean(), mh.median()), 'gains q %.2f k %.2f' % (head.qn.abs().mean(), head.kn.abs().mean()), flush=True)
