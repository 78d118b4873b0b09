# Slot-1 attention of a drafter on held-out copy answers (docs/RESULTS.md,
# "why the drafter does not copy"): where slot 1 attends, its share on the
# anchor's earlier occurrences, and the one-token lookup's accuracy.
# usage (repository root): EXP=... python3 probe.py [pair folder] [drafter folder] [records]
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EXP, MAX_TOKENS, Pair, mg, records  # noqa: E402

pair = Pair(sys.argv[1] if len(sys.argv) > 1 else 'checkpoints/tiny',
            sys.argv[2] if len(sys.argv) > 2 else None)
T, D, MASK = pair.T, pair.D, pair.mask
anchor_input = pair.dcfg.get('dedit_config', {}).get('anchor_input')

# Attention capture: the reference's attention, recording each head's probs.
cap = []
def attention(q, k, v, allowed):
    tq, H, hd = q.shape; G = H // k.shape[1]
    out = torch.empty(tq, H, hd); P = []
    for h in range(H):
        s = (q[:, h] @ k[:, h // G].t()) * hd ** -0.5
        p = torch.softmax(s.masked_fill(~allowed, float('-inf')), -1); P.append(p)
        out[:, h] = p @ v[:, h // G]
    cap.append(torch.stack(P)); return out.reshape(tq, H * hd)
mg.attention = attention

tot = hit = ng = 0; uni=[]; perhead={}; rel={}; l1=[]; mass_match = []; mass_next = []
recs = records(EXP + '/copy-heldout.bin')
for ri, (pl, ids) in enumerate(recs[:int(sys.argv[3]) if len(sys.argv) > 3 else 12]):
    ids = ids[:MAX_TOKENS]
    feats = pair.features(ids)
    for a in range(pl + 8, len(ids) - 1, 7):
        D.reset(); D.append_context(feats[:a])
        cap.clear()
        blk = torch.tensor([ids[a]] + [MASK] * 15)
        if anchor_input:
            emb = T.embed
            T.embed = lambda b_: (lambda x: torch.cat([x[:1], x[1:] + x[:1]]))(emb(b_))
            lg = D.draft(blk); T.embed = emb
        else:
            lg = D.draft(blk)
        pred = lg[1].argmax().item(); tot += 1; hit += pred == ids[a + 1]
        # layer-2 (last) attention of slot 1, averaged over heads, over context rows
        p = cap[-1][:, 1, :a].mean(0)
        ctx = torch.tensor(ids[:a])
        match = (ctx == ids[a]); nxt = torch.zeros(a, dtype=torch.bool); nxt[:-1] = match[1:]
        mass_match.append(p[match].sum().item()); mass_next.append(p[nxt].sum().item())
        uni.append(match.float().mean().item())
        for L in range(len(cap)):
            for h in range(cap[L].shape[0]):
                row = cap[L][h, 1]
                perhead.setdefault((L, h), []).append(row[:a][match].sum().item() / max(row[:a].sum().item(), 1e-9))
                rel.setdefault((L, h), []).append([row[a-1].item(), row[a-2].item(), row[a-3].item(), row[:a-3].sum().item(), row[a].item(), row[a+1].item(), row[a+2:].sum().item()])
        l1.append(cap[0][:, 1, a].mean().item())
        j = max([i for i in range(a) if ids[i] == ids[a]], default=None); ng += j is not None and ids[j + 1] == ids[a + 1]
print('slot1 acc %.3f over %d anchors' % (hit / tot, tot))
print('last-layer slot-1 attention mass on rows whose token == anchor: %.3f; on rows just before them: %.3f' % (np.mean(mass_match), np.mean(mass_next)))
print('uniform mass on matching rows %.3f; share of context attention on matching rows per (layer, head) %s' % (np.mean(uni), {k: round(np.mean(v),3) for k, v in perhead.items()}))
print('layer-1 slot-1 attention to slot 0: %.3f; 1-gram last-occurrence copy acc %.3f' % (np.mean(l1), ng / tot))
print('slot-1 attention: ctx a-1, a-2, a-3, older ctx, slot0, slot1(self), later slots')
for k,v in rel.items(): print(k, np.round(np.mean(v,0),3))
