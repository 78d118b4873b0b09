# Trains layer 0 head 0's q/k (and their norms) of the shipped drafter, with
# the anchor input, to attend where the anchor occurred before, on the TRAIN
# copy records; writes the drafter (anchor_input on) to sys.argv[1].
import os
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
HERE = os.path.dirname(os.path.abspath(__file__))
import sys, os, json, struct, shutil, numpy as np, torch
out = sys.argv[1]; sys.argv = ['x']
sys.path.insert(0, HERE)
exec(open(os.path.join(HERE, 'probe.py')).read().split('# Attention capture')[0].replace("'/copy-heldout.bin'", "'/copy.bin'"))
torch.manual_seed(0)
hd = dcfg['head_dim']; eps = 1e-6; theta = dcfg['rope_theta']
w = {k: v.float() for k, v in dw.items()}
emb = tw['model.embed_tokens.weight'].float()
MASK = dcfg['dflash_config']['mask_token_id']
data = []
for pl, ids in recs[:int(os.environ.get('N', 120))]:
    ids = ids[:400]
    T.reset(); _, outs = T.forward(torch.tensor(ids))
    feats = torch.cat([outs[i] for i in lids], -1).float()
    data.append((ids, pl, mg.rms_norm(feats @ w['fc.weight'].t(), w['hidden_norm.weight'], eps)))
p = 'layers.0.'
Q = w[p + 'self_attn.q_proj.weight']; K = w[p + 'self_attn.k_proj.weight']
qw = Q[:hd].clone().requires_grad_(); kw = K[:hd].clone().requires_grad_()
qn = w[p + 'self_attn.q_norm.weight'].clone().requires_grad_(); kn = w[p + 'self_attn.k_norm.weight'].clone().requires_grad_()
ln = w[p + 'input_layernorm.weight']
def rope(x, pos):
    c, s = mg.rope_cos_sin(pos, hd, theta); return x * c.float() + mg.rotate_half(x) * s.float()
def mass(items):
    ms = []
    for ids, pl, ctx in items:
        t = torch.tensor(ids); anchors = torch.arange(pl + 4, len(ids) - 1)
        keys = rope(mg.rms_norm(ctx @ kw.t(), kn, eps), torch.arange(len(ids)))
        q = rope(mg.rms_norm(mg.rms_norm(emb[MASK] + emb[t[anchors]], ln, eps) @ qw.t(), qn, eps), anchors + 1)
        allowed = torch.arange(len(ids))[None, :] < anchors[:, None]
        pr = torch.softmax(((q @ keys.t()) / hd ** 0.5).masked_fill(~allowed, -1e9), -1)
        match = (t[None, :] == t[anchors][:, None]) & allowed; has = match.any(-1)
        ms.append((pr * match).sum(-1)[has])
    return torch.cat(ms)
opt = torch.optim.Adam([qw, kw, qn, kn], lr=3e-3)
for step in range(int(os.environ.get('STEPS', 300))):
    idx = np.random.choice(len(data), 16, replace=False)
    m = mass([data[i] for i in idx]); loss = -(m + 1e-6).log().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0: print(step, 'mass %.3f' % m.mean().item(), flush=True)
# Head 0 uses kv head 0 (group 2): the k rows of kv head 0 also serve head 1.
dw2 = {k: v.float().clone() for k, v in dw.items()}
dw2[p + 'self_attn.q_proj.weight'][:hd] = qw.detach()
dw2[p + 'self_attn.k_proj.weight'][:hd] = kw.detach()
dw2[p + 'self_attn.q_norm.weight'] = qn.detach(); dw2[p + 'self_attn.k_norm.weight'] = kn.detach()
os.makedirs(out, exist_ok=True)
mg.write_safetensors(out + '/model.safetensors', dw2)
cfg = dict(dcfg); cfg['dedit_config'] = dict(cfg['dedit_config'], anchor_input=True); cfg['torch_dtype'] = 'float32'
json.dump(cfg, open(out + '/config.json', 'w'), indent=2)
shutil.copy(DD + '/tokenizer.json', out + '/tokenizer.json') if os.path.exists(DD + '/tokenizer.json') else None
print('wrote', out)
