# Trains layer 1's first head's q/k (and their norms) of the shipped
# drafter, with the anchor input, to attend where the anchor occurred
# before, on the TRAIN copy records; writes the drafter (anchor_input on)
# to the folder given.
# usage (repository root): EXP=... [N=120] [STEPS=300] python3 init_copy_head.py OUT
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EXP, LookupHead, Pair, mg, records  # noqa: E402

out = sys.argv[1]
pair = Pair()
torch.manual_seed(0)
head = LookupHead(pair)
data = pair.items(records(EXP + '/copy.bin')[:int(os.environ.get('N', 120))])
opt = torch.optim.Adam(head.params(), lr=3e-3)
for step in range(int(os.environ.get('STEPS', 300))):
    idx = np.random.choice(len(data), 16, replace=False)
    m = head.mass([data[i] for i in idx]); loss = -(m + 1e-6).log().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0: print(step, 'mass %.3f' % m.mean().item(), flush=True)
# Head 0 uses kv head 0 (group 2): the k rows of kv head 0 also serve head 1;
# q_norm and k_norm are shared by every head of the layer.
weights = {k: v.clone() for k, v in pair.w.items()}
head.store(weights)
os.makedirs(out, exist_ok=True)
mg.write_safetensors(out + '/model.safetensors', weights)
cfg = dict(pair.dcfg); cfg['dedit_config'] = dict(cfg['dedit_config'], anchor_input=True); cfg['torch_dtype'] = 'float32'
json.dump(cfg, open(out + '/config.json', 'w'), indent=2)
if os.path.exists(pair.drafter_dir + '/tokenizer.json'):
    shutil.copy(pair.drafter_dir + '/tokenizer.json', out + '/tokenizer.json')
print('wrote', out)
