# Pieces the copy-probe scripts share (README.md): the pair in the Python
# reference of the engine's math (tests/golden/make_golden.py), the
# distillation records, the drafter's context rows, and one lookup head
# (layer 1's first head, its queries carrying the anchor's embedding) with
# its attention share on the anchor's earlier occurrences.
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, 'tests/golden')
import make_golden as mg  # noqa: E402

mg.DT = torch.float32
EXP = os.environ.get('EXP', 'build/copy-exp')  # copy.bin, copy-heldout.bin (filter.py)
EPS = 1e-6
MAX_TOKENS = 400  # each record is cut to this many tokens


def load_safetensors(path):
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


def read_records(path):
    """A distill file's records as (prompt length, token ids), with the raw
    bytes of each (header and ids) for filter.py."""
    b = open(path, 'rb').read(); o = 8; recs = []
    while o + 8 <= len(b):
        pl, m = struct.unpack_from('<II', b, o)
        recs.append((pl, list(struct.unpack_from('<%di' % m, b, o + 8)), b[o:o + 8 + 4 * m]))
        o += 8 + 4 * m
    return b[:8], recs


def records(path):
    return [(pl, ids) for pl, ids, _ in read_records(path)[1]]


def vocab():
    tok = json.load(open('checkpoints/tiny/target/tokenizer.json'))
    v = {i: s for s, i in tok['model']['vocab'].items()}
    for a in tok['added_tokens']: v[a['id']] = a['content']
    return v


class Pair:
    """The target and a drafter (default: the shipped pair)."""

    def __init__(self, target_dir='checkpoints/tiny', drafter_dir=None):
        drafter_dir = drafter_dir or target_dir + '/drafter'
        self.drafter_dir = drafter_dir
        self.tcfg = json.load(open(target_dir + '/target/config.json'))
        self.dcfg = json.load(open(drafter_dir + '/config.json'))
        self.tw = load_safetensors(target_dir + '/target/model.safetensors')
        self.dw = load_safetensors(drafter_dir + '/model.safetensors')
        if 'lm_head.weight' not in self.tw:
            self.tw['lm_head.weight'] = self.tw['model.embed_tokens.weight']
        self.T = mg.Qwen3Reference(self.tcfg, self.tw)
        self.D = mg.DFlashReference(self.dcfg, self.dw, self.T)
        self.lids = self.dcfg['dflash_config']['target_layer_ids']
        self.mask = self.dcfg['dflash_config']['mask_token_id']
        self.w = {k: v.float() for k, v in self.dw.items()}
        self.emb = self.tw['model.embed_tokens.weight'].float()

    def features(self, ids):
        """The target's features of `ids` (the drafter's feature layers)."""
        self.T.reset(); _, outs = self.T.forward(torch.tensor(ids))
        return torch.cat([outs[i] for i in self.lids], -1)

    def context_rows(self, ids):
        """hidden_norm(fc(features)): what every drafter layer projects."""
        return mg.rms_norm(self.features(ids).float() @ self.w['fc.weight'].t(),
                           self.w['hidden_norm.weight'], EPS)

    def items(self, recs):
        return [(ids[:MAX_TOKENS], pl, self.context_rows(ids[:MAX_TOKENS])) for pl, ids in recs]


class LookupHead:
    """Layer 1's first head (trainable copies of its q/k rows and the norms),
    slot 1 of a block at every answer anchor from the prompt's end + 4, its
    query carrying the anchor's embedding (the anchor input)."""

    def __init__(self, pair, theta=None):
        w, p = pair.w, 'layers.0.'
        self.pair, self.p = pair, p
        self.hd = pair.dcfg['head_dim']
        self.theta = theta if theta is not None else pair.dcfg['rope_theta']
        self.qw = w[p + 'self_attn.q_proj.weight'][:self.hd].clone().requires_grad_()
        self.kw = w[p + 'self_attn.k_proj.weight'][:self.hd].clone().requires_grad_()
        self.qn = w[p + 'self_attn.q_norm.weight'].clone().requires_grad_()
        self.kn = w[p + 'self_attn.k_norm.weight'].clone().requires_grad_()
        self.ln = w[p + 'input_layernorm.weight']

    def params(self):
        return [self.qw, self.kw, self.qn, self.kn]

    def rope(self, x, pos):
        c, s = mg.rope_cos_sin(pos, self.hd, self.theta)
        return x * c.float() + mg.rotate_half(x) * s.float()

    def attend(self, ids, pl, ctx):
        """(tokens, anchors, slot-1 inputs, attention over the rows, allowed)."""
        emb = self.pair.emb
        t = torch.tensor(ids); anchors = torch.arange(pl + 4, len(ids) - 1)
        keys = self.rope(mg.rms_norm(ctx @ self.kw.t(), self.kn, EPS), torch.arange(len(ids)))
        x = emb[self.pair.mask] + emb[t[anchors]]
        q = self.rope(mg.rms_norm(mg.rms_norm(x, self.ln, EPS) @ self.qw.t(), self.qn, EPS), anchors + 1)
        allowed = torch.arange(len(ids))[None, :] < anchors[:, None]
        pr = torch.softmax(((q @ keys.t()) / self.hd ** 0.5).masked_fill(~allowed, -1e9), -1)
        return t, anchors, x, pr, allowed

    def mass(self, items):
        """Attention share on the anchor's earlier occurrences, per anchor
        that has one."""
        ms = []
        for ids, pl, ctx in items:
            t, anchors, _, pr, allowed = self.attend(ids, pl, ctx)
            match = (t[None, :] == t[anchors][:, None]) & allowed
            ms.append((pr * match).sum(-1)[match.any(-1)])
        return torch.cat(ms)

    def store(self, weights):
        """Writes the head back into a copy of the drafter's weights."""
        p, hd = self.p, self.hd
        weights[p + 'self_attn.q_proj.weight'][:hd] = self.qw.detach()
        weights[p + 'self_attn.k_proj.weight'][:hd] = self.kw.detach()
        weights[p + 'self_attn.q_norm.weight'] = self.qn.detach()
        weights[p + 'self_attn.k_norm.weight'] = self.kn.detach()
