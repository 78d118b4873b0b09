#!/usr/bin/python3
"""End-to-end check of deploy/prometheus and deploy/grafana against live services.

Generates a tiny random model pair, starts dedit-drafter, dedit-target and
dedit-router on loopback (ephemeral ports), starts a real Prometheus server
(Debian's `prometheus`) with a scrape config derived from
deploy/prometheus/prometheus.yml (loopback targets, 1 s scrape/evaluation)
and our recording rules, runs a bounded streamed load through the router,
then evaluates EVERY PromQL expression of deploy/grafana/dedit.json (template
variables substituted) and of the recording rules through /api/v1/query and
asserts each returns data. A deliberately misspelled metric must come back
empty (self-check). Also runs `promtool check config/rules` and
`promtool test rules`.

  prometheus_e2e_test.py --target-bin B/target_service/dedit-target \
      --drafter-bin ... --router-bin ... --make-tiny-model-bin ... \
      --stubs B/proto/python --deploy-dir deploy
"""
import argparse
import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import yaml

PROCS = []          # (name, Popen, logpath)
TMP = None
KEEP = False


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _die_with_parent():
    # Children get SIGTERM if this test is killed (even by SIGKILL from ctest).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start(name, argv):
    logpath = os.path.join(TMP, name + ".log")
    f = open(logpath, "w")
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                         preexec_fn=_die_with_parent)
    PROCS.append((name, p, logpath))
    log(f"started {name} pid {p.pid}")
    return p


def cleanup():
    # Reverse start order: prometheus, router, target, drafter.
    for name, p, _ in reversed(PROCS):
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 10
    for name, p, _ in reversed(PROCS):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    PROCS.clear()
    if TMP and not KEEP:
        shutil.rmtree(TMP, ignore_errors=True)


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


def dump_logs():
    for name, _, path in PROCS:
        try:
            tail = open(path).read()[-3000:]
        except OSError:
            continue
        print(f"----- {name} log (tail) -----\n{tail}", file=sys.stderr)


def wait_ready_file(name, proc, path, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            try:
                return json.load(open(path))
            except ValueError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not become ready in {timeout}s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


class Prom:
    def __init__(self, base):
        self.base = base

    def get(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def query(self, expr):
        """Instant query; returns (result list, error string or None)."""
        try:
            body = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as e:
            try:
                body = json.load(e)
            except ValueError:
                return [], f"HTTP {e.code}"
            return [], body.get("error", f"HTTP {e.code}")
        if body.get("status") != "success":
            return [], body.get("error", "query failed")
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]], None
        return data["result"], None


# ---- PromQL extraction ------------------------------------------------------

TEMPLATE_VARS = {
    "__rate_interval": "1m", "__interval": "15s", "__range": "1m",
    "model": ".*", "instance": ".*",
}


def substitute(expr):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name not in TEMPLATE_VARS:
            raise KeyError(f"unknown template variable ${name} in {expr!r}")
        return TEMPLATE_VARS[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def dashboard_exprs(dash):
    """(where, expr) for every panel target and every templating query."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))  # rows
    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q or "")
        if m:
            # Grafana's label_values(selector, label): the selector must have
            # series carrying the label.
            out.append((f"variable ${v['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
        elif q:
            out.append((f"variable ${v['name']}", q))
    return out


def rule_exprs(rules):
    out = []
    for g in rules["groups"]:
        for r in g["rules"]:
            name = r.get("record") or r.get("alert")
            out.append((f"rule {name} (expr)", r["expr"]))
            if r.get("record"):
                out.append((f"rule {name} (recorded series)", r["record"]))
    return out


def check_all(prom, exprs):
    """Returns the list of failures: (where, expr, reason)."""
    failures = []
    for where, expr in exprs:
        e = substitute(expr)
        result, err = prom.query(e)
        if err:
            failures.append((where, e, "error: " + err))
        elif not result:
            failures.append((where, e, "empty result"))
    return failures


# ---- load -------------------------------------------------------------------

def load(stubs, router_addr, n_requests, concurrency, stop):
    sys.path.insert(0, stubs)
    import grpc
    from dedit.v1 import generation_pb2, services_pb2_grpc
    ch = grpc.insecure_channel(router_addr)
    stub = services_pb2_grpc.GenerationStub(ch)
    model = stub.ListModels(generation_pb2.ListModelsRequest(), timeout=30).models[0].name
    done = [0]
    errors = []
    lock = threading.Lock()

    def worker(wid):
        i = wid
        while not stop.is_set():
            with lock:
                if done[0] >= n_requests:
                    return
                done[0] += 1
            req = generation_pb2.GenerateRequest(
                model=model, max_tokens=48, ignore_eos=True,
                token_ids=generation_pb2.TokenIds(ids=[1 + (i % 50), 2, 3, 4 + (i % 7)]))
            req.sampling.temperature = 0.0
            try:
                last = None
                for resp in stub.Generate(req, timeout=60):
                    if resp.finished:
                        last = resp
                if last is None:
                    errors.append("no final message")
            except grpc.RpcError as e:
                errors.append(str(e))
            i += concurrency
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ch.close()
    return model, done[0], errors


def main():
    global TMP, KEEP
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-bin", required=True)
    ap.add_argument("--drafter-bin", required=True)
    ap.add_argument("--router-bin", required=True)
    ap.add_argument("--openai-bin", required=True)
    ap.add_argument("--make-tiny-model-bin", required=True)
    ap.add_argument("--stubs", required=True, help="generated Python stubs (build/proto/python)")
    ap.add_argument("--deploy-dir", default=os.path.join(os.path.dirname(__file__), "../../deploy"))
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    KEEP = args.keep
    deploy = os.path.abspath(args.deploy_dir)
    prom_dir = os.path.join(deploy, "prometheus")
    for tool in (args.prometheus, args.promtool):
        if not os.access(tool, os.X_OK):
            print(f"SKIP: {tool} not installed (apt-get install prometheus)")
            return 77

    TMP = tempfile.mkdtemp(prefix="dedit-deploy-test-")
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.time()

    # 1. Static checks of the shipped files.
    run([args.promtool, "check", "config", os.path.join(prom_dir, "prometheus.yml")])
    run([args.promtool, "check", "rules", os.path.join(prom_dir, "dedit.rules.yml")])
    run([args.promtool, "test", "rules", os.path.join(prom_dir, "dedit.rules.test.yml")])
    log("promtool check config / check rules / test rules: OK")

    # 2. Services on loopback.
    run([args.make_tiny_model_bin, "--out", os.path.join(TMP, "tiny")])
    tdir, ddir = os.path.join(TMP, "tiny/target"), os.path.join(TMP, "tiny/drafter")
    common = ["--host=127.0.0.1", "--port=0", "--metrics_port=0"]
    ready = {}
    p = start("drafter", [args.drafter_bin, f"--drafter_dir={ddir}", f"--target_dir={tdir}",
                          "--threads=1", "--drain_timeout_ms=1000", *common,
                          f"--ready_file={TMP}/drafter.ready"])
    ready["drafter"] = wait_ready_file("drafter", p, f"{TMP}/drafter.ready")
    p = start("target", [args.target_bin, f"--target_dir={tdir}", f"--drafter_dir={ddir}",
                         f"--drafter=127.0.0.1:{ready['drafter']['grpc_port']}",
                         "--threads=1", "--drain_timeout_ms=1000", *common,
                         f"--ready_file={TMP}/target.ready"])
    ready["target"] = wait_ready_file("target", p, f"{TMP}/target.ready")
    p = start("router", [args.router_bin, f"--target=127.0.0.1:{ready['target']['grpc_port']}",
                         f"--drafter=127.0.0.1:{ready['drafter']['grpc_port']}",
                         "--drain_timeout_ms=1000", *common, f"--ready_file={TMP}/router.ready"])
    ready["router"] = wait_ready_file("router", p, f"{TMP}/router.ready")
    # The OpenAI front: its /metrics is on its HTTP --port (the ready file's
    # metrics port).
    p = start("openai", [args.openai_bin, f"--router=127.0.0.1:{ready['router']['grpc_port']}",
                         "--host=127.0.0.1", "--port=0", "--drain_timeout_ms=1000",
                         f"--ready_file={TMP}/openai.ready"])
    ready["openai"] = wait_ready_file("openai", p, f"{TMP}/openai.ready")
    log("services ready: " + json.dumps(ready))

    # 3. Prometheus with our config, retargeted to loopback.
    cfg = yaml.safe_load(open(os.path.join(prom_dir, "prometheus.yml")))
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [os.path.join(prom_dir, f) if not os.path.isabs(f) else f
                         for f in cfg["rule_files"]]
    jobs = {sc["job_name"]: sc for sc in cfg["scrape_configs"]}
    for svc in ("router", "target", "drafter", "openai"):
        job = jobs.get("dedit-" + svc)
        if job is None:
            raise AssertionError(f"deploy/prometheus/prometheus.yml has no job dedit-{svc}")
        job["scrape_interval"] = "1s"
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ready[svc]['metrics_port']}"]}]
    cfg_path = os.path.join(TMP, "prometheus.yml")
    yaml.safe_dump(cfg, open(cfg_path, "w"))
    run([args.promtool, "check", "config", cfg_path])
    prom_port = free_port()
    prom_proc = start("prometheus", [args.prometheus, f"--config.file={cfg_path}",
                                     f"--storage.tsdb.path={TMP}/tsdb",
                                     f"--web.listen-address=127.0.0.1:{prom_port}",
                                     "--log.level=warn"])
    prom = Prom(f"http://127.0.0.1:{prom_port}")
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(prom.base + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if prom_proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("prometheus did not become ready")
        time.sleep(0.2)
    # All four targets up.
    deadline = time.time() + 30
    while True:
        res, _ = prom.query('up{job=~"dedit-.*"} == 1')
        if len(res) == 4:
            break
        if time.time() > deadline:
            raise RuntimeError(f"scrape targets not up: {prom.get('/api/v1/targets')}")
        time.sleep(0.5)
    log(f"prometheus ready on :{prom_port}, 4 targets up")

    # 4. Bounded load while Prometheus scrapes.
    stop = threading.Event()
    t_load = time.time()
    model, n, errors = load(args.stubs, f"127.0.0.1:{ready['router']['grpc_port']}",
                            args.requests, 2, stop)
    log(f"load: {n} streamed Generate calls on model {model!r} in {time.time()-t_load:.1f}s, "
        f"{len(errors)} errors")
    if errors:
        raise AssertionError("Generate failed: " + "; ".join(errors[:3]))

    # 5. Wait for enough scrapes of the loaded counters and rule evaluations.
    rules = yaml.safe_load(open(os.path.join(prom_dir, "dedit.rules.yml")))
    records = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    deadline = time.time() + 30
    while True:
        res, _ = prom.query("dedit_generation_tokens_total > 0")
        n_scraped = res and float(res[0]["value"][1]) >= 48 * n
        missing = [r for r in records if not prom.query(r)[0]]
        if n_scraped and not missing:
            break
        if time.time() > deadline:
            break  # check_all reports what is missing
        time.sleep(0.5)

    # 6. Every expression.
    dash = json.load(open(os.path.join(deploy, "grafana", "dedit.json")))
    exprs = dashboard_exprs(dash) + rule_exprs(rules)
    failures = check_all(prom, exprs)
    for where, expr, why in failures:
        print(f"FAIL {where}: {why}\n     {expr}", file=sys.stderr)
    log(f"evaluated {len(exprs)} expressions ({len(dashboard_exprs(dash))} dashboard, "
        f"{len(rule_exprs(rules))} rules): {len(failures)} failed")

    # Self-check: the same checker must flag a misspelled metric.
    headline = next(e for w, e in dashboard_exprs(dash) if "Mean acceptance length" in w)
    bad = headline.replace("dedit_spec_decode_num_accepted_tokens_total",
                           "dedit_spec_decode_num_acepted_tokens_total")
    assert bad != headline, "headline panel does not use dedit_spec_decode_num_accepted_tokens_total"
    self_check = check_all(prom, [("misspelled headline", bad),
                                  ("misspelled metric", "dedit_generaton_tokens_total")])
    if len(self_check) != 2:
        failures.append(("self-check", bad, "a misspelled metric returned data"))
        print("FAIL self-check: a misspelled metric returned data", file=sys.stderr)
    else:
        log("self-check: misspelled expressions return empty, as they must")

    # Headline sanity: a finite mean acceptance length >= 1.
    res, _ = prom.query(substitute(headline))
    if res:
        v = float(res[0]["value"][1])
        log(f"mean acceptance length (random tiny pair, expect ~1.0): {v:.3f}")
        if not (v >= 1.0 and v < 1e9):
            failures.append(("headline value", headline, f"mean acceptance length {v}"))

    if failures:
        dump_logs()
        log(f"FAILED ({len(failures)} failures) in {time.time()-t0:.1f}s")
        return 1
    log(f"PASSED in {time.time()-t0:.1f}s")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # noqa: BLE001 - report, dump logs, clean up
        print(f"ERROR: {e}", file=sys.stderr)
        dump_logs()
        rc = 1
    cleanup()
    sys.exit(rc)
