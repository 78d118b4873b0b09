# Can one attention head of the drafter's shape find "where the anchor
# occurred before" from the drafter's context rows? Optimise that head's
# q/k projections and norms directly on the matching objective.
import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import sys, json, struct, numpy as np, torch
sys.path.insert(0, HERE); sys.argv = ['x']
exec(open(os.path.join(HERE, 'probe.py')).read().split('# Attention capture')[0])
torch.manual_seed(0)
theta = float(__import__('os').environ.get('THETA', dcfg['rope_theta']))
hd = dcfg['head_dim']; eps = 1e-6
w = {k: v.float() for k, v in dw.items()}
emb = tw['model.embed_tokens.weight'].float()
data = []
for pl, ids in recs[:40]:
    ids = ids[:400]
    T.reset(); _, outs = T.forward(torch.tensor(ids))
    feats = torch.cat([outs[i] for i in lids], -1).float()
    ctx = mg.rms_norm(feats @ w['fc.weight'].t(), w['hidden_norm.weight'], eps)
    data.append((ids, pl, ctx))
split = 30
p = 'layers.0.'
qw = w[p + 'self_attn.q_proj.weight'][:hd].clone().requires_grad_()
kw = w[p + 'self_attn.k_proj.weight'][:hd].clone().requires_grad_()
qn = w[p + 'self_attn.q_norm.weight'].clone().requires_grad_()
kn = w[p + 'self_attn.k_norm.weight'].clone().requires_grad_()
ln = w[p + 'input_layernorm.weight']
def rope(x, pos):
    c, s = mg.rope_cos_sin(pos, hd, theta); return x * c.float() + mg.rotate_half(x) * s.float()
MASK = dcfg['dflash_config']['mask_token_id']; MASKV = emb[MASK]
def batch_mass(items):
    ms = []
    for ids, pl, ctx in items:
        t = torch.tensor(ids)
        anchors = torch.arange(pl + 4, len(ids) - 1)
        keys = rope(mg.rms_norm(ctx @ kw.t(), kn, eps), torch.arange(len(ids)))
        xin = mg.rms_norm(MASKV + emb[t[anchors]], ln, eps)
        q = rope(mg.rms_norm(xin @ qw.t(), qn, eps), anchors + 1)
        sc = (q @ keys.t()) / hd ** 0.5
        allowed = torch.arange(len(ids))[None, :] < anchors[:, None]
        pr = torch.softmax(sc.masked_fill(~allowed, -1e9), -1)
        match = (t[None, :] == t[anchors][:, None]) & allowed
        has = match.any(-1)
        ms.append((pr * match).sum(-1)[has])
    return torch.cat(ms)
opt = torch.optim.Adam([qw, kw, qn, kn], lr=float(__import__('os').environ.get('LR', 3e-3)))
for step in range(301):
    m = batch_mass(data[:split]); loss = -(m + 1e-6).log().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        with torch.no_grad(): mh = batch_mass(data[split:])
        print(step, 'train mass %.3f held-out mass %.3f (median %.3f)' % (m.mean(), mh.mean(), mh.median()), 'gains q %.2f k %.2f' % (qn.abs().mean(), kn.abs().mean()), flush=True)
