# With init14's lookup head (layer 0 head 0, anchor input), can a value/output
# path on the drafter's context rows predict slot 1 (token a+1)? Trains v, o
# (and the head's q/k) on TRAIN copy records, reports held-out accuracy.
import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import sys, os, json, struct, numpy as np, torch
sys.argv = ['x', 'checkpoints/tiny', EXP + '/init14']
exec(open(os.path.join(HERE, 'probe.py')).read().split('# Attention capture')[0])
torch.manual_seed(0)
hd = dcfg['head_dim']; eps = 1e-6; theta = dcfg['rope_theta']
w = {k: v.float() for k, v in dw.items()}
emb = tw['model.embed_tokens.weight'].float()
MASK = dcfg['dflash_config']['mask_token_id']
def load_recs(path):
    b = open(path, 'rb').read(); o = 8; rs = []
    while o + 8 <= len(b):
        pl, m = struct.unpack_from('<II', b, o); rs.append((pl, list(struct.unpack_from('<%di' % m, b, o + 8)))); o += 8 + 4 * m
    return rs
def prep(rs, n):
    out = []
    for pl, ids in rs[:n]:
        ids = ids[:400]; T.reset(); _, outs = T.forward(torch.tensor(ids))
        feats = torch.cat([outs[i] for i in lids], -1).float()
        out.append((ids, pl, mg.rms_norm(feats @ w['fc.weight'].t(), w['hidden_norm.weight'], eps)))
    return out
train = prep(load_recs(EXP + '/copy.bin'), 120); held = prep(load_recs(EXP + '/copy-heldout.bin'), 40)
p = 'layers.0.'
qw = w[p + 'self_attn.q_proj.weight'][:hd].clone().requires_grad_(); kw = w[p + 'self_attn.k_proj.weight'][:hd].clone().requires_grad_()
qn = w[p + 'self_attn.q_norm.weight'].clone().requires_grad_(); kn = w[p + 'self_attn.k_norm.weight'].clone().requires_grad_()
vw = (torch.randn(128, 128) * 0.05).requires_grad_(); ow = (torch.randn(128, 128) * 0.05).requires_grad_()
ln = w[p + 'input_layernorm.weight']; fn = w['norm.weight']
def rope(x, pos):
    c, s = mg.rope_cos_sin(pos, hd, theta); return x * c.float() + mg.rotate_half(x) * s.float()
def run(items):
    L, H = [], []
    for ids, pl, ctx in items:
        t = torch.tensor(ids); anchors = torch.arange(pl + 4, len(ids) - 1)
        keys = rope(mg.rms_norm(ctx @ kw.t(), kn, eps), torch.arange(len(ids)))
        x = emb[MASK] + emb[t[anchors]]
        q = rope(mg.rms_norm(mg.rms_norm(x, ln, eps) @ qw.t(), qn, eps), anchors + 1)
        allowed = torch.arange(len(ids))[None, :] < anchors[:, None]
        pr = torch.softmax(((q @ keys.t()) / hd ** 0.5).masked_fill(~allowed, -1e9), -1)
        h = x + (pr @ (ctx @ vw.t())) @ ow.t()
        logits = mg.rms_norm(h, fn, eps) @ emb.t()
        y = t[anchors + 1]
        L.append(torch.nn.functional.cross_entropy(logits, y, reduction='none')); H.append((logits.argmax(-1) == y).float())
    return torch.cat(L).mean(), torch.cat(H).mean()
opt = torch.optim.Adam([qw, kw, qn, kn, vw, ow], lr=3e-3)
for step in range(int(os.environ.get('STEPS', 400))):
    idx = np.random.choice(len(train), 16, replace=False)
    loss, acc = run([train[i] for i in idx]); opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0 or step == int(os.environ.get('STEPS', 400)) - 1:
        with torch.no_grad(): hl, ha = run(held)
        print(step, 'train loss %.2f acc %.3f | held-out loss %.2f acc %.3f' % (loss.item(), acc.item(), hl.item(), ha.item()), flush=True)
