#!/usr/bin/python3
"""The services under abuse, measured on loopback against real processes.

Starts dedit-drafter, dedit-target and dedit-router over a model folder
(the bundled pair by default) with the limits under test, then measures:

  leases     sequences left on the target and the drafter, second by
             second, after `kill -9` of the router with N streams running
             (goal: 0 within --sequence_lease_seconds);
  burst      N concurrent requests with max_tokens 4096: how many are
             admitted (get a first token) and how many refused (goal: all
             admitted);
  huge       one 64 MB text prompt: time until the router refuses it and
             the router's RSS growth (goal: under 100 ms and 50 MB);
  scrapes    /metrics scrapes of all three services while 5 slow clients
             each hold a connection open, sending a byte every 1.5 s
             (goal: every scrape succeeds).

Prints one JSON object. Run with nothing else using the cores.

  bench/services/abuse_figures.py --build build --model-dir checkpoints/tiny
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, binary, args, run_dir, name):
        self.ready = os.path.join(run_dir, name + ".ready")
        self.log = open(os.path.join(run_dir, name + ".log"), "w")
        self.p = subprocess.Popen([binary] + args + ["--ready_file", self.ready],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not os.path.exists(self.ready):
            if self.p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{name} did not start; see {self.log.name}")
            time.sleep(0.05)
        info = json.load(open(self.ready))
        self.port, self.metrics_port = info["grpc_port"], info["metrics_port"]

    def rss_kb(self):
        for line in open(f"/proc/{self.p.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model-dir", default="checkpoints/tiny")
    ap.add_argument("--lease-seconds", type=float, default=5)
    ap.add_argument("--lease-streams", type=int, default=24)
    ap.add_argument("--burst", type=int, default=70)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    stubs = os.path.join(a.build, "proto/python")
    sys.path.insert(0, stubs)
    import grpc
    from dedit.v1 import (drafter_pb2, generation_pb2, services_pb2_grpc,
                          target_pb2)

    run_dir = tempfile.mkdtemp(prefix="dedit-abuse-")
    target_dir = os.path.join(a.model_dir, "target")
    drafter_dir = os.path.join(a.model_dir, "drafter")
    vocab = json.load(open(os.path.join(target_dir, "config.json")))["vocab_size"]
    drafter = Proc(os.path.join(a.build, "drafter_service/dedit-drafter"),
                   ["--drafter_dir", drafter_dir, "--target_dir", target_dir,
                    "--threads", str(a.threads), "--host", "127.0.0.1",
                    "--port", "0", "--metrics_port", "0"], run_dir, "drafter")
    target = Proc(os.path.join(a.build, "target_service/dedit-target"),
                  ["--target_dir", target_dir, "--drafter_dir", drafter_dir,
                   "--drafter", f"127.0.0.1:{drafter.port}",
                   "--threads", str(a.threads), "--host", "127.0.0.1",
                   "--port", "0", "--metrics_port", "0",
                   f"--sequence_lease_seconds={a.lease_seconds}"],
                  run_dir, "target")
    router_args = ["--target", f"127.0.0.1:{target.port}",
                   "--drafter", f"127.0.0.1:{drafter.port}",
                   "--tokenizer", os.path.join(target_dir, "tokenizer.json"),
                   "--host", "127.0.0.1", "--port", "0",
                   "--metrics_port", "0"]

    def start_router(name):
        r = Proc(os.path.join(a.build, "router/dedit-router"), router_args,
                 run_dir, name)
        ch = grpc.insecure_channel(f"127.0.0.1:{r.port}",
                                   options=[("grpc.max_send_message_length",
                                             128 << 20)])
        stub = services_pb2_grpc.GenerationStub(ch)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                info = stub.Info(generation_pb2.RouterInfoRequest(), timeout=2)
                if info.drafter_healthy:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        return r, stub

    tstub = services_pb2_grpc.TargetStub(
        grpc.insecure_channel(f"127.0.0.1:{target.port}"))
    dstub = services_pb2_grpc.DrafterStub(
        grpc.insecure_channel(f"127.0.0.1:{drafter.port}"))
    rng = random.Random(1)

    def request(max_tokens):
        req = generation_pb2.GenerateRequest(max_tokens=max_tokens,
                                             ignore_eos=True, window=8,
                                             passes=1)
        req.token_ids.ids.extend(rng.randrange(vocab) for _ in range(16))
        return req

    def counts():
        t = tstub.Info(target_pb2.TargetInfoRequest(), timeout=5)
        d = dstub.Info(drafter_pb2.DrafterInfoRequest(), timeout=5)
        return t.num_sequences, d.num_sequences, t.reserved_tokens

    out = {"model_dir": a.model_dir, "lease_seconds": a.lease_seconds}
    router, stub = start_router("router")

    # --- leases: kill -9 the router with streams running ----------------
    started = threading.Semaphore(0)

    def stream_until_error(req):
        try:
            for i, _ in enumerate(stub.Generate(req, timeout=120)):
                if i == 0:
                    started.release()
        except grpc.RpcError:
            pass

    threads = [threading.Thread(target=stream_until_error,
                                args=(request(4096),), daemon=True)
               for _ in range(a.lease_streams)]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire(timeout=60)
    before = counts()
    router.kill()
    killed = time.time()
    timeline, gone_at = [], None
    while time.time() - killed < a.lease_seconds * 3 + 5:
        t_seq, d_seq, reserved = counts()
        elapsed = time.time() - killed
        timeline.append([round(elapsed, 2), t_seq, d_seq])
        if t_seq == 0 and d_seq == 0 and reserved == 0:
            gone_at = elapsed
            break
        time.sleep(0.1)
    expired = tstub.Info(target_pb2.TargetInfoRequest()).expired_sequences
    out["leases"] = {
        "streams": a.lease_streams,
        "at_kill": {"target": before[0], "drafter": before[1],
                    "reserved_tokens": before[2]},
        "seconds_until_both_empty": round(gone_at, 2) if gone_at else None,
        "expired_total": expired,
        "timeline_s_target_drafter": timeline[::max(1, len(timeline) // 12)],
    }

    # --- burst: N concurrent max_tokens 4096 ----------------------------
    router, stub = start_router("router2")
    results = []
    lock = threading.Lock()

    def first_token(req):
        code = "OK"
        try:
            call = stub.Generate(req, timeout=120)
            next(iter(call))
            call.cancel()
        except grpc.RpcError as e:
            code = e.code().name
        except StopIteration:
            code = "NO_TOKEN"
        with lock:
            results.append(code)

    burst = [threading.Thread(target=first_token, args=(request(4096),))
             for _ in range(a.burst)]
    for t in burst:
        t.start()
    for t in burst:
        t.join()
    out["burst"] = {"requests": a.burst, "max_tokens": 4096,
                    "admitted": results.count("OK"),
                    "refused": {c: results.count(c) for c in set(results)
                                if c != "OK"}}
    time.sleep(0.5)

    # --- huge: a 64 MB text prompt ---------------------------------------
    rss0 = router.rss_kb()
    peak = [rss0]
    sampling = threading.Event()

    def sample_rss():  # the peak while the request is sent and refused
        while not sampling.is_set():
            peak[0] = max(peak[0], router.rss_kb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    huge = generation_pb2.GenerateRequest(text="a" * (64 << 20), max_tokens=8)
    t0 = time.time()
    code = "OK"
    try:
        for _ in stub.Generate(huge, timeout=60):
            pass
    except grpc.RpcError as e:
        code = e.code().name
    refuse_ms = (time.time() - t0) * 1000
    time.sleep(0.2)
    sampling.set()
    sampler.join()
    out["huge_prompt"] = {"bytes": 64 << 20, "status": code,
                          "client_seconds_to_refusal_ms": round(refuse_ms, 1),
                          "router_peak_rss_growth_mb": round(
                              (peak[0] - rss0) / 1024, 1),
                          "router_rss_growth_after_mb": round(
                              (router.rss_kb() - rss0) / 1024, 1)}

    # --- scrapes under 5 slow clients ------------------------------------
    ports = {"router": router.metrics_port, "target": target.metrics_port,
             "drafter": drafter.metrics_port}
    slow = []
    stop = threading.Event()

    def slow_client(port):
        s = socket.create_connection(("127.0.0.1", port))
        slow.append(s)
        for ch in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":
            if stop.wait(1.5):
                break
            try:
                s.send(bytes([ch]))
            except OSError:
                break

    for port in ports.values():
        for _ in range(5):
            threading.Thread(target=slow_client, args=(port,),
                             daemon=True).start()
    time.sleep(1)
    ok, total = 0, 0
    for _ in range(5):
        for port in ports.values():
            total += 1
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                    ok += r.status == 200 and b"# TYPE" in r.read()
            except OSError:
                pass
        time.sleep(0.5)
    stop.set()
    out["scrapes"] = {"slow_clients_per_port": 5, "scrapes": total,
                      "succeeded": ok}
    for s in slow:
        s.close()
    for p in (router, target, drafter):
        p.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
