#!/usr/bin/env python3
"""Where a services round's time goes, from the services' own histograms.

  round_breakdown.py snap ROUTER_METRICS TARGET_METRICS > before.json
  ... run a bench client ...
  round_breakdown.py report before.json ROUTER_METRICS TARGET_METRICS LABEL

(ROUTER_METRICS, TARGET_METRICS: host:port of their /metrics.) `report`
prints one JSON line with the means over the rounds run in between:
  round_ms         the router's whole engine step (dedit_round_duration_seconds,
                   phase total: draft + target call + token delivery)
  target_call_ms   the router's Target.Step call as it saw it (phase verify)
  draft_call_ms    the router's Drafter.Draft call (phase draft), if any
  target_forward_ms  the target's forward (dedit_target_forward_duration_seconds)
so target_call_ms - target_forward_ms is the gRPC hop and the target's
thread hand-offs, and a client's time per round minus round_ms is the
router's loop wake-up and the stream to the client.
"""
import json
import re
import sys
import urllib.request

SERIES = {
    "round": ("dedit_round_duration_seconds", 'phase="total"'),
    "target_call": ("dedit_round_duration_seconds", 'phase="verify"'),
    "draft_call": ("dedit_round_duration_seconds", 'phase="draft"'),
    "target_forward": ("dedit_target_forward_duration_seconds", ""),
}


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        return r.read().decode()


def sums(router, target):
    text = {"router": scrape(router), "target": scrape(target)}
    out = {}
    for key, (name, label) in SERIES.items():
        body = text["target" if key == "target_forward" else "router"]
        total = {"sum": 0.0, "count": 0.0}
        for part in ("sum", "count"):
            for line in body.splitlines():
                m = re.match(rf"{name}_{part}(\{{[^}}]*\}})?\s+(\S+)", line)
                if m and label in (m.group(1) or ""):
                    total[part] += float(m.group(2))
        out[key] = total
    return out


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "snap":
        print(json.dumps(sums(sys.argv[2], sys.argv[3])))
        return
    if len(sys.argv) == 6 and sys.argv[1] == "report":
        before = json.load(open(sys.argv[2]))
        after = sums(sys.argv[3], sys.argv[4])
        row = {"config": sys.argv[5]}
        for key in SERIES:
            count = after[key]["count"] - before[key]["count"]
            if key == "round":
                row["rounds"] = int(count)
            if count > 0:
                row[f"{key}_ms"] = round(
                    1000 * (after[key]["sum"] - before[key]["sum"]) / count, 4)
        print(json.dumps(row))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
