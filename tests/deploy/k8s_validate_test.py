#!/usr/bin/python3
"""Offline validation of deploy/k8s: renders every overlay with kustomize
(kubectl's built-in `kubectl kustomize`, or a standalone `kustomize`) and
checks what a cluster would otherwise only tell us at rollout:

  * every container has cpu/memory requests and limits, native gRPC
    startup/liveness/readiness probes on its gRPC port, and a non-root
    securityContext with readOnlyRootFilesystem and no privilege escalation;
  * every --flag in a container's args exists in that binary's main.cc
    (ABSL_FLAG), --port/--metrics_port equal the binary's defaults, and the
    named containerPorts agree with them;
  * every $(VAR) in args is defined by the referenced ConfigMap;
  * Service selectors match exactly one Deployment, their targetPorts name
    real container ports with the same numbers; --target/--drafter addresses
    name an existing Service port; PDB and PodMonitor selectors match pods;
    every volumeMount has a volume and every PVC claim exists;
  * gpu overlay: target and drafter request and limit nvidia.com/gpu: 1,
    the router none, DEDIT_DEVICE is cuda; cpu overlay: no GPU, device cpu.

A self-check mutates the rendered gpu overlay (drops a probe, a GPU, a
securityContext field, a Service port) and asserts each mutation is caught.

  k8s_validate_test.py --source-dir /path/to/dedit
"""
import argparse
import copy
import os
import re
import shutil
import subprocess
import sys

import yaml

BINARIES = {  # container name -> main.cc
    "target": "target_service/main.cc",
    "drafter": "drafter_service/main.cc",
    "router": "router/main.cc",
}


def render(kustomize_cmd, path):
    r = subprocess.run(kustomize_cmd + [path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(kustomize_cmd)} {path} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def binary_flags(src, rel):
    text = open(os.path.join(src, rel)).read()
    flags = {}
    for m in re.finditer(r'ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)\s*,\s*("?[^,"]*"?)', text):
        flags[m.group(1)] = m.group(2).strip('"')
    return flags


def parse_args(args):
    out = {}
    for a in args:
        m = re.fullmatch(r"--(\w+)(?:=(.*))?", a)
        if not m:
            raise ValueError(f"unparsed arg {a!r} (use --flag=value)")
        out[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return out


def selector_matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def validate(docs, overlay, flags_by_bin):
    errors = []

    def err(msg):
        errors.append(f"[{overlay}] {msg}")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deps = by_kind.get("Deployment", [])
    services = by_kind.get("Service", [])
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in by_kind.get("ConfigMap", [])}
    pvcs = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
    if {d["metadata"]["name"] for d in deps} != {"dedit-target", "dedit-drafter", "dedit-router"}:
        err(f"expected Deployments dedit-target/drafter/router, got {[d['metadata']['name'] for d in deps]}")
    svc_ports = {}  # service name -> {port: (targetPort)}
    for s in services:
        svc_ports[s["metadata"]["name"]] = {p["port"]: p.get("targetPort", p["port"])
                                            for p in s["spec"].get("ports", [])}
    pod_labels = {}
    container_ports = {}  # deployment -> {name: number}
    device = {}
    for dep in deps:
        name = dep["metadata"]["name"]
        spec = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        pod_labels[name] = labels
        if not selector_matches(dep["spec"]["selector"].get("matchLabels", {}), labels):
            err(f"{name}: selector does not match its pod template labels")
        psc = spec.get("securityContext", {})
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for v in vols.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in pvcs:
                err(f"{name}: volume {v['name']} claims missing PVC {claim}")
        if not spec.get("containers"):
            err(f"{name}: no containers")
        for c in spec.get("containers", []):
            where = f"{name}/{c['name']}"
            csc = c.get("securityContext", {})
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(kind, {}):
                        err(f"{where}: resources.{kind}.{r} missing")
            non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            uid = csc.get("runAsUser", psc.get("runAsUser"))
            if non_root is not True:
                err(f"{where}: runAsNonRoot is not true")
            if uid is None or uid == 0:
                err(f"{where}: runAsUser must be a non-zero uid")
            if csc.get("readOnlyRootFilesystem") is not True:
                err(f"{where}: readOnlyRootFilesystem is not true")
            if csc.get("allowPrivilegeEscalation") is not False:
                err(f"{where}: allowPrivilegeEscalation is not false")
            if "ALL" not in csc.get("capabilities", {}).get("drop", []):
                err(f"{where}: capabilities.drop lacks ALL")
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    err(f"{where}: volumeMount {m['name']} has no volume")
            binary = c["name"]
            if binary not in flags_by_bin:
                err(f"{where}: unknown container name (expected target/drafter/router)")
                continue
            known = flags_by_bin[binary]
            try:
                args = parse_args(c.get("args", []))
            except ValueError as e:
                err(f"{where}: {e}")
                continue
            for f in args:
                if f not in known:
                    err(f"{where}: --{f} is not a flag of dedit-{binary} ({BINARIES[binary]})")
            env = {}
            for ef in c.get("envFrom", []):
                ref = ef.get("configMapRef", {}).get("name")
                if ref is not None:
                    if ref not in cms:
                        err(f"{where}: envFrom ConfigMap {ref} not rendered")
                    env.update(cms.get(ref, {}))
            for e in c.get("env", []):
                env[e["name"]] = e.get("value", "")
            resolved = {}
            for f, v in args.items():
                for var in re.findall(r"\$\((\w+)\)", v):
                    if var not in env:
                        err(f"{where}: --{f} uses $({var}), not defined by its ConfigMap/env")
                resolved[f] = re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1), "")), v)
            device[binary] = resolved.get("device", known.get("device"))
            port = int(resolved.get("port", known.get("port", 0)))
            mport = int(resolved.get("metrics_port", known.get("metrics_port", 0)))
            if port != int(known["port"]) or mport != int(known["metrics_port"]):
                err(f"{where}: ports {port}/{mport} differ from the binary's defaults "
                    f"{known['port']}/{known['metrics_port']}")
            cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            container_ports[name] = cports
            if cports.get("grpc") != port:
                err(f"{where}: containerPort grpc={cports.get('grpc')} but --port={port}")
            if cports.get("metrics") != mport:
                err(f"{where}: containerPort metrics={cports.get('metrics')} but --metrics_port={mport}")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(probe)
                if not p:
                    err(f"{where}: {probe} missing")
                elif "grpc" not in p:
                    err(f"{where}: {probe} is not a native gRPC probe")
                else:
                    pp = p["grpc"].get("port")
                    if pp != port:
                        err(f"{where}: {probe} gRPC port {pp} != --port {port}")
            # Addresses of the other services.
            for f in ("target", "drafter"):
                if f in resolved and resolved[f]:
                    host, _, p = resolved[f].rpartition(":")
                    if host not in svc_ports or int(p) not in svc_ports[host]:
                        err(f"{where}: --{f}={resolved[f]} is not a Service port")
            gpu_req = res.get("requests", {}).get("nvidia.com/gpu")
            gpu_lim = res.get("limits", {}).get("nvidia.com/gpu")
            if overlay == "gpu" and binary in ("target", "drafter"):
                if str(gpu_lim) != "1" or str(gpu_req) != "1":
                    err(f"{where}: gpu overlay must request and limit nvidia.com/gpu: 1 "
                        f"(requests {gpu_req}, limits {gpu_lim})")
                if not str(device[binary]).startswith("cuda"):
                    err(f"{where}: gpu overlay runs on --device={device[binary]}")
            elif gpu_req or gpu_lim:
                err(f"{where}: unexpected nvidia.com/gpu in the {overlay} overlay")
            if binary == "router":
                # The router runs no model and links no libtorch.
                if "device" in resolved:
                    err(f"{where}: the router takes no --device")
            elif overlay == "cpu" and device.get(binary) != "cpu":
                err(f"{where}: cpu overlay runs on --device={device.get(binary)}")
    # Services: selector -> exactly one Deployment; targetPorts exist.
    for s in services:
        sname = s["metadata"]["name"]
        sel = s["spec"].get("selector", {})
        matched = [d for d, l in pod_labels.items() if sel and selector_matches(sel, l)]
        if len(matched) != 1:
            err(f"Service {sname}: selector {sel} matches {matched}")
            continue
        cports = container_ports.get(matched[0], {})
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort", p["port"])
            num = cports.get(tp) if isinstance(tp, str) else tp
            if num is None or num not in cports.values():
                err(f"Service {sname}: targetPort {tp} is no container port of {matched[0]}")
            elif num != p["port"]:
                err(f"Service {sname}: port {p['port']} forwards to {num}; keep them equal")
    for svc in ("dedit-router", "dedit-target", "dedit-drafter"):
        if svc not in svc_ports:
            err(f"Service {svc} missing")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        sel = pdb["spec"]["selector"].get("matchLabels", {})
        if not any(selector_matches(sel, l) for l in pod_labels.values()):
            err(f"PDB {pdb['metadata']['name']} selects no pod")
    if not by_kind.get("PodDisruptionBudget"):
        err("no PodDisruptionBudget")
    pms = by_kind.get("PodMonitor", []) + by_kind.get("ServiceMonitor", [])
    if not pms:
        err("no PodMonitor/ServiceMonitor")
    for pm in by_kind.get("PodMonitor", []):
        sel = pm["spec"]["selector"].get("matchLabels", {})
        hit = [d for d, l in pod_labels.items() if selector_matches(sel, l)]
        if sorted(hit) != ["dedit-drafter", "dedit-router", "dedit-target"]:
            err(f"PodMonitor {pm['metadata']['name']} selects {hit}, not all three services")
        for ep in pm["spec"].get("podMetricsEndpoints", []):
            for d in hit:
                if ep.get("port") not in container_ports.get(d, {}):
                    err(f"PodMonitor port {ep.get('port')} missing on {d}")
        jl = pm["spec"].get("jobLabel")
        for d in hit:
            if jl and pod_labels[d].get(jl) != d:
                err(f"PodMonitor jobLabel {jl} gives job {pod_labels[d].get(jl)} for {d}, "
                    f"but deploy/prometheus and the dashboard expect job {d}")
    return errors


def self_check(docs, flags_by_bin):
    """Each mutation of a valid rendering must be caught."""
    def dep(ds, name):
        return next(d for d in ds if d["kind"] == "Deployment" and d["metadata"]["name"] == name)

    def c0(ds, name):
        return dep(ds, name)["spec"]["template"]["spec"]["containers"][0]
    mutations = {
        "drop readinessProbe": lambda ds: c0(ds, "dedit-router").pop("readinessProbe"),
        "http probe": lambda ds: c0(ds, "dedit-target").__setitem__(
            "livenessProbe", {"httpGet": {"port": 9101, "path": "/metrics"}}),
        "drop GPU": lambda ds: c0(ds, "dedit-drafter")["resources"]["limits"].pop("nvidia.com/gpu"),
        "writable root": lambda ds: c0(ds, "dedit-target")["securityContext"].__setitem__(
            "readOnlyRootFilesystem", False),
        "root user": lambda ds: [c0(ds, "dedit-router")["securityContext"].__setitem__("runAsUser", 0),
                                 c0(ds, "dedit-router")["securityContext"].__setitem__("runAsNonRoot", False)],
        "no limits": lambda ds: c0(ds, "dedit-router")["resources"].pop("limits"),
        "wrong port": lambda ds: c0(ds, "dedit-drafter").__setitem__(
            "args", [a if not a.startswith("--port=") else "--port=50053"
                     for a in c0(ds, "dedit-drafter")["args"]]),
        "unknown flag": lambda ds: c0(ds, "dedit-router")["args"].append("--no_such_flag=1"),
        "bad selector": lambda ds: next(d for d in ds if d["kind"] == "Service" and
                                        d["metadata"]["name"] == "dedit-target")["spec"]
                                   .__setitem__("selector", {"app.kubernetes.io/name": "dedit-targt"}),
    }
    failures = []
    for what, mutate in mutations.items():
        ds = copy.deepcopy(docs)
        mutate(ds)
        if not validate(ds, "gpu", flags_by_bin):
            failures.append(what)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", default=os.path.join(os.path.dirname(__file__), "../.."))
    args = ap.parse_args()
    src = os.path.abspath(args.source_dir)
    kustomize = None
    if shutil.which("kustomize"):
        kustomize = ["kustomize", "build"]
    if shutil.which("kubectl"):
        v = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True)
        # kubectl >= 1.21 embeds kustomize v4+ and says so; Debian 12's
        # kubernetes-client (1.20, kustomize v2) lacks `labels`/`patches`.
        if re.search(r"Kustomize Version: v[4-9]", v.stdout):
            kustomize = ["kubectl", "kustomize"]
    if kustomize is None:
        print("SKIP: no kustomize v4+ (kubectl >= 1.21 or a standalone kustomize)")
        return 77
    flags_by_bin = {b: binary_flags(src, rel) for b, rel in BINARIES.items()}
    errors = []
    rendered = {}
    for overlay in ("cpu", "gpu"):
        docs = render(kustomize, os.path.join(src, "deploy/k8s/overlays", overlay))
        rendered[overlay] = docs
        errs = validate(docs, overlay, flags_by_bin)
        errors += errs
        kinds = sorted({d["kind"] for d in docs})
        print(f"{overlay}: {len(docs)} objects ({', '.join(kinds)}), {len(errs)} problems")
    missed = self_check(rendered["gpu"], flags_by_bin)
    if missed:
        errors.append(f"self-check: mutations not caught: {missed}")
    else:
        print("self-check: every mutation caught")
    for e in errors:
        print("FAIL " + e, file=sys.stderr)
    print("PASSED" if not errors else f"FAILED ({len(errors)})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
