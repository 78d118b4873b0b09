# Slot-1 attention of a drafter on held-out copy answers (docs/RESULTS.md,
# "why the drafter does not copy"): where slot 1 attends, its share on the
# anchor's earlier occurrences, and the one-token lookup's accuracy.
# usage (repository root): EXP=... python3 probe.py [pair folder] [drafter folder] [records]

import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import sys, json, struct, numpy as np, torch
sys.path.insert(0, 'tests/golden')
import make_golden as mg
mg.DT = torch.float32
def load(path):
    raw = open(path, 'rb').read(); (n,) = struct.unpack('<Q', raw[:8])
    h = json.loads(raw[8:8 + n]); d = raw[8 + n:]; out = {}
    for k, e in h.items():
        if k == '__metadata__': continue
        b, end = e['data_offsets']
        if e['dtype'] == 'BF16':
            a = np.frombuffer(d[b:end], dtype='<u2').astype(np.uint32) << 16
            a = a.view(np.float32)
        else: a = np.frombuffer(d[b:end], dtype='<f4')
        out[k] = torch.from_numpy(a.reshape(e['shape']).copy())
    return out
TD = sys.argv[1] if len(sys.argv) > 1 else 'checkpoints/tiny'
DD = sys.argv[2] if len(sys.argv) > 2 else TD + '/drafter'
tcfg = json.load(open(TD + '/target/config.json')); dcfg = json.load(open(DD + '/config.json'))
tw = load(TD + '/target/model.safetensors'); dw = load(DD + '/model.safetensors')
if 'lm_head.weight' not in tw: tw['lm_head.weight'] = tw['model.embed_tokens.weight']
T = mg.Qwen3Reference(tcfg, tw); D = mg.DFlashReference(dcfg, dw, T)
lids = dcfg['dflash_config']['target_layer_ids']
# records
b = open(EXP + '/copy-heldout.bin', 'rb').read(); o = 8; recs = []
while o + 8 <= len(b):
    pl, m = struct.unpack_from('<II', b, o)
    recs.append((pl, list(struct.unpack_from('<%di' % m, b, o + 8)))); o += 8 + 4 * m
# Attention capture: monkeypatch attention to record probs for the block queries.
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
MASK = dcfg['dflash_config']['mask_token_id']
tot = hit = ng = 0; uni=[]; perhead={}; rel={}; l1=[]; mass_match = []; mass_next = []
for ri, (pl, ids) in enumerate(recs[:int(sys.argv[3]) if len(sys.argv) > 3 else 12]):
    ids = ids[:400]
    T.reset(); _, outs = T.forward(torch.tensor(ids))
    feats = torch.cat([outs[i] for i in lids], -1)
    for a in range(pl + 8, len(ids) - 1, 7):
        D.reset(); D.append_context(feats[:a])
        cap.clear()
        blk = torch.tensor([ids[a]] + [MASK] * 15)
        if dcfg.get('dedit_config', {}).get('anchor_input'):
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
            for h in range(cap[L].shape[0]): perhead.setdefault((L, h), []).append(cap[L][h, 1, :a][match].sum().item() / max(cap[L][h, 1, :a].sum().item(), 1e-9))
        l1.append(cap[0][:, 1, a].mean().item())
        for L in range(len(cap)):
            for h in range(cap[L].shape[0]):
                row = cap[L][h, 1]
                rel.setdefault((L, h), []).append([row[a-1].item(), row[a-2].item(), row[a-3].item(), row[:a-3].sum().item(), row[a].item(), row[a+1].item(), row[a+2:].sum().item()])
        j = max([i for i in range(a) if ids[i] == ids[a]], default=None); ng += j is not None and ids[j + 1] == ids[a + 1]
print('slot1 acc %.3f over %d anchors' % (hit / tot, tot))
print('last-layer slot-1 attention mass on rows whose token == anchor: %.3f; on rows just before them: %.3f' % (np.mean(mass_match), np.mean(mass_next)))
print('uniform mass on matching rows %.3f; share of context attention on matching rows per (layer, head) %s' % (np.mean(uni), {k: round(np.mean(v),3) for k, v in perhead.items()}))
print('layer-1 slot-1 attention to slot 0: %.3f; 1-gram last-occurrence copy acc %.3f' % (np.mean(l1), ng / tot))
print('slot-1 attention: ctx a-1, a-2, a-3, older ctx, slot0, slot1(self), later slots')
for k,v in rel.items(): print(k, np.round(np.mean(v,0),3))
