#!/usr/bin/python3
"""Offline validation of deploy/k8s: renders every overlay with kustomize
(kubectl's built-in `kubectl kustomize`, or a standalone `kustomize`) and
checks what a cluster would otherwise only tell us at rollout:

  * the stacks: Deployment dedit-stack, one pod = containers
    target and drafter, the target's --drafter on 127.0.0.1 (its own pod),
    at least 2 replicas (exactly 3 in the gpu overlay); a headless Service
    whose DNS the routers re-resolve (--stacks_dns host:target:drafter
    ports matching the containers); routers >= 2 with a PDB;
  * every container has cpu/memory requests and limits, native gRPC
    startup/liveness/readiness probes on its gRPC port (the target's and
    drafter's on their plaintext --health_port, since their gRPC port is
    mTLS), and a non-root securityContext with readOnlyRootFilesystem and
    no privilege escalation;
  * internal mTLS: target, drafter and router take --tls_cert,
    --tls_key and --tls_ca from a read-only mount of their Secret
    (dedit-stack-tls, dedit-router-tls) holding those files; the router
    checks the stacks' certificate for the headless Service's name
    (--tls_server_name);
  * NetworkPolicies: ingress is denied by default; the stacks' gRPC ports
    admit the router pods only, every /metrics port the monitoring
    namespace only, the router's public ports anyone;
  * every --flag in a container's args exists in that binary's main.cc
    or the flag libraries it links (ABSL_FLAG), --port/--metrics_port
    equal the binary's defaults, and the named containerPorts agree with
    them;
  * every $(VAR) in args is defined by the referenced ConfigMap;
  * Service selectors match exactly one Deployment, their targetPorts name
    real container ports with the same numbers (port names unique per pod);
    PDB and PodMonitor selectors match pods, and the PodMonitors give jobs
    dedit-router/target/drafter; every volumeMount has a volume and every
    PVC claim exists;
  * gpu overlay: target and drafter containers each request and limit
    nvidia.com/gpu: 1 (two per stack pod), the router none, DEDIT_DEVICE
    is cuda; cpu overlay: no GPU, device cpu;
  * deploy/k8s/examples/stack-hpa.yaml scales dedit-stack on KV usage or
    running requests.

A self-check mutates the rendered gpu overlay (drops a probe, a GPU, a
container, the headless Service, a securityContext field, ...) and asserts
each mutation is caught.

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

# Shared flags are defined once, in the libraries the binaries link.
SERVICE_FLAGS = ("common/serving/service_flags.cc",
                 "common/serving/internal_auth_flags.cc")
MODEL_SERVICE_FLAGS = SERVICE_FLAGS + (
    "common/serving/model_service_flags.cc",
    "common/model/cpu/cpu_flags.cc",
)
BINARIES = {  # container name -> its main.cc, then its flag libraries
    "target": ("target_service/main.cc",) + MODEL_SERVICE_FLAGS,
    "drafter": ("drafter_service/main.cc",) + MODEL_SERVICE_FLAGS,
    "router": ("router/main.cc", "common/engine/speculation_flags.cc")
    + SERVICE_FLAGS,
    "openai": ("gateway/main.cc", "common/serving/internal_auth_flags.cc"),
}


def render(kustomize_cmd, path):
    r = subprocess.run(kustomize_cmd + [path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(kustomize_cmd)} {path} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def binary_flags(src, rels):
    flags = {}
    for rel in rels:
        text = open(os.path.join(src, rel)).read()
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


STACK_CONTAINERS = ("target", "drafter")
PORT_NAMES = {  # container -> (gRPC port name, metrics port name)
    "router": ("grpc", "metrics"),
    "target": ("target-grpc", "target-metrics"),
    "drafter": ("drafter-grpc", "drafter-metrics"),
}
GPU_STACK_REPLICAS = 3
TLS_SECRETS = {"dedit-stack": "dedit-stack-tls", "dedit-router": "dedit-router-tls"}
TLS_FLAGS = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
MONITORING_NAMESPACE = "monitoring"


def check_tls(where, dep_name, binary, resolved, container, volumes, err):
    """--tls_* files come from a read-only mount of the deployment's Secret."""
    secret = TLS_SECRETS[dep_name]
    mounts = container.get("volumeMounts", [])
    for flag, key in TLS_FLAGS.items():
        path = resolved.get(flag)
        if not path:
            err(f"{where}: --{flag} missing: internal calls must be mTLS")
            continue
        mount = next((m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")),
                     None)
        vol = volumes.get(mount["name"], {}) if mount else {}
        if mount is None or "secret" not in vol:
            err(f"{where}: --{flag}={path} is not on a Secret volume mount")
            continue
        if vol["secret"].get("secretName") != secret:
            err(f"{where}: --{flag} comes from Secret {vol['secret'].get('secretName')}, "
                f"expected {secret}")
        if mount.get("readOnly") is not True:
            err(f"{where}: the TLS mount {mount['mountPath']} is not readOnly")
        name = path[len(mount["mountPath"].rstrip("/")) + 1:]
        items = vol["secret"].get("items")
        if items is not None and not any(
                i.get("path") == name and i.get("key") == key for i in items):
            err(f"{where}: --{flag}={path}: Secret {secret} does not project key {key} as {name}")
        mode = vol["secret"].get("defaultMode", 0o644)
        if mode & 0o007:
            err(f"{where}: Secret volume {mount['name']} is world-readable (defaultMode {mode:o})")


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
    if {d["metadata"]["name"] for d in deps} != {"dedit-stack", "dedit-router"}:
        err(f"expected Deployments dedit-stack/router, got {[d['metadata']['name'] for d in deps]}")
    svc_by_name = {s["metadata"]["name"]: s for s in services}
    pod_labels = {}
    container_ports = {}  # deployment -> {port name: number}, all containers
    port_owner = {}  # (deployment, port name) -> container name
    grpc_port = {}  # (deployment, container) -> resolved --port
    resolved_args = {}  # (deployment, container) -> resolved args
    device = {}
    for dep in deps:
        name = dep["metadata"]["name"]
        spec = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        pod_labels[name] = labels
        container_ports[name] = {}
        if not selector_matches(dep["spec"]["selector"].get("matchLabels", {}), labels):
            err(f"{name}: selector does not match its pod template labels")
        names = [c["name"] for c in spec.get("containers", [])]
        if name == "dedit-stack":
            # A stack is one pod: the target and the drafter it streams to.
            if sorted(names) != sorted(STACK_CONTAINERS):
                err(f"{name}: a stack pod must have containers target and drafter, got {names}")
            replicas = dep["spec"].get("replicas", 1)
            if overlay == "gpu" and replicas != GPU_STACK_REPLICAS:
                err(f"{name}: gpu overlay renders replicas: {replicas}, expected {GPU_STACK_REPLICAS}")
            if replicas < 2:
                err(f"{name}: replicas {replicas}: one stack does not scale out")
        elif name == "dedit-router":
            # The router and its OpenAI-compatible front (over localhost).
            if sorted(names) != ["openai", "router"]:
                err(f"{name}: containers {names}, expected router and openai")
            if dep["spec"].get("replicas", 1) < 2:
                err(f"{name}: routers are stateless; run at least 2")
        psc = spec.get("securityContext", {})
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for v in vols.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in pvcs:
                err(f"{name}: volume {v['name']} claims missing PVC {claim}")
        if not spec.get("containers"):
            err(f"{name}: no containers")
        pod_gpus = 0
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
                    err(f"{where}: --{f} is not a flag of dedit-{binary} ({', '.join(BINARIES[binary])})")
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
            resolved_args[(name, binary)] = resolved
            if binary == "openai":
                # HTTP, not gRPC: the API and /metrics on one --port; ready
                # when /health answers (the router is reachable).
                port = int(resolved.get("port", known.get("port", 0)))
                cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                for pname, num in cports.items():
                    if pname in container_ports[name]:
                        err(f"{where}: port name {pname} repeats in the pod")
                    container_ports[name][pname] = num
                    port_owner[(name, pname)] = binary
                if cports.get("http") != port:
                    err(f"{where}: containerPort http={cports.get('http')} but --port={port}")
                for probe in ("startupProbe", "readinessProbe"):
                    g = (c.get(probe) or {}).get("httpGet", {})
                    if g.get("path") != "/health" or g.get("port") not in ("http", port):
                        err(f"{where}: {probe} must GET /health on the http port")
                if not c.get("livenessProbe"):
                    err(f"{where}: livenessProbe missing")
                if res.get("requests", {}).get("nvidia.com/gpu") or res.get(
                        "limits", {}).get("nvidia.com/gpu"):
                    err(f"{where}: the HTTP front needs no GPU")
                continue
            device[binary] = resolved.get("device", known.get("device"))
            port = int(resolved.get("port", known.get("port", 0)))
            mport = int(resolved.get("metrics_port", known.get("metrics_port", 0)))
            grpc_port[(name, binary)] = port
            if port != int(known["port"]) or mport != int(known["metrics_port"]):
                err(f"{where}: ports {port}/{mport} differ from the binary's defaults "
                    f"{known['port']}/{known['metrics_port']}")
            cports = {}
            for p in c.get("ports", []):
                pname = p.get("name")
                cports[pname] = p["containerPort"]
                if pname in container_ports[name]:
                    err(f"{where}: port name {pname} repeats in the pod")
                container_ports[name][pname] = p["containerPort"]
                port_owner[(name, pname)] = binary
            gname, mname = PORT_NAMES[binary]
            if cports.get(gname) != port:
                err(f"{where}: containerPort {gname}={cports.get(gname)} but --port={port}")
            if cports.get(mname) != mport:
                err(f"{where}: containerPort {mname}={cports.get(mname)} but --metrics_port={mport}")
            check_tls(where, name, binary, resolved, c, vols, err)
            # The kubelet's gRPC probes speak no TLS: the model services,
            # whose --port is mTLS, are probed on their plaintext
            # --health_port; the router's public port is plaintext.
            probe_port = port
            if binary in STACK_CONTAINERS:
                hp = resolved.get("health_port")
                if hp is None or not hp.lstrip("-").isdigit() or int(hp) <= 0:
                    err(f"{where}: --health_port missing: probes cannot reach the mTLS port")
                else:
                    probe_port = int(hp)
                    if probe_port in (port, mport):
                        err(f"{where}: --health_port {probe_port} reuses another port")
                    if cports.get(f"{binary}-health") != probe_port:
                        err(f"{where}: containerPort {binary}-health={cports.get(f'{binary}-health')} "
                            f"but --health_port={probe_port}")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(probe)
                if not p:
                    err(f"{where}: {probe} missing")
                elif "grpc" not in p:
                    err(f"{where}: {probe} is not a native gRPC probe")
                else:
                    pp = p["grpc"].get("port")
                    if pp != probe_port:
                        err(f"{where}: {probe} gRPC port {pp} != {probe_port} (the plaintext "
                            f"{'--health_port' if probe_port != port else '--port'})")
            gpu_req = res.get("requests", {}).get("nvidia.com/gpu")
            gpu_lim = res.get("limits", {}).get("nvidia.com/gpu")
            if overlay == "gpu" and binary in STACK_CONTAINERS:
                if str(gpu_lim) != "1" or str(gpu_req) != "1":
                    err(f"{where}: gpu overlay must request and limit nvidia.com/gpu: 1 "
                        f"(requests {gpu_req}, limits {gpu_lim})")
                else:
                    pod_gpus += 1
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
        if overlay == "gpu" and name == "dedit-stack" and pod_gpus != 2:
            err(f"{name}: a gpu stack pod must hold two GPUs (one per container), has {pod_gpus}")
    # The target streams context to the drafter of its own pod.
    target_args = resolved_args.get(("dedit-stack", "target"), {})
    drafter_port = grpc_port.get(("dedit-stack", "drafter"))
    host, _, p = target_args.get("drafter", "").rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not p.isdigit() or int(p) != drafter_port:
        err(f"dedit-stack/target: --drafter={target_args.get('drafter')} is not its pod's "
            f"drafter (127.0.0.1:{drafter_port})")
    # The OpenAI front talks to the router of its own pod.
    front = resolved_args.get(("dedit-router", "openai"), {}).get("router", "")
    fhost, _, fport = front.rpartition(":")
    if fhost not in ("127.0.0.1", "localhost") or not fport.isdigit() or int(
            fport) != grpc_port.get(("dedit-router", "router")):
        err(f"dedit-router/openai: --router={front} is not its pod's router "
            f"(127.0.0.1:{grpc_port.get(('dedit-router', 'router'))})")
    # Routers find the stacks by DNS on a headless Service.
    router_args = resolved_args.get(("dedit-router", "router"), {})
    for f in ("target", "drafter", "stacks_file"):
        if router_args.get(f):
            err(f"dedit-router/router: --{f} bypasses stack discovery; use --stacks_dns")
    dns = router_args.get("stacks_dns", "")
    parts = dns.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        err(f"dedit-router/router: --stacks_dns={dns!r} is not host:target_port:drafter_port")
    else:
        svc = svc_by_name.get(parts[0])
        if svc is None:
            err(f"dedit-router/router: --stacks_dns names no Service ({parts[0]})")
        else:
            if svc["spec"].get("clusterIP") != "None":
                err(f"Service {parts[0]}: must be headless (clusterIP: None) so that DNS "
                    "lists every stack pod")
            sel = svc["spec"].get("selector", {})
            if not selector_matches(sel, pod_labels.get("dedit-stack", {"-": "-"})):
                err(f"Service {parts[0]}: does not select the stack pods")
            sports = {pp["port"] for pp in svc["spec"].get("ports", [])}
            for want, cname in ((int(parts[1]), "target"), (int(parts[2]), "drafter")):
                if want != grpc_port.get(("dedit-stack", cname)):
                    err(f"dedit-router/router: --stacks_dns port {want} is not the {cname}'s "
                        f"--port {grpc_port.get(('dedit-stack', cname))}")
                if want not in sports:
                    err(f"Service {parts[0]}: lacks port {want}")
    if len(parts) == 3 and router_args.get("tls_server_name") != parts[0]:
        err(f"dedit-router/router: --tls_server_name={router_args.get('tls_server_name')!r}; "
            f"stack pods are dialled by IP, their certificate names the Service {parts[0]!r}")
    errors += [f"[{overlay}] {e}" for e in validate_network_policies(
        by_kind.get("NetworkPolicy", []), pod_labels, container_ports, port_owner)]
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
    for svc in ("dedit-router", "dedit-stack"):
        if svc not in svc_by_name:
            err(f"Service {svc} missing")
    pdbs = by_kind.get("PodDisruptionBudget", [])
    for pdb in pdbs:
        sel = pdb["spec"]["selector"].get("matchLabels", {})
        if not any(selector_matches(sel, l) for l in pod_labels.values()):
            err(f"PDB {pdb['metadata']['name']} selects no pod")
    if not any(selector_matches(pdb["spec"]["selector"].get("matchLabels", {}),
                                pod_labels.get("dedit-router", {"-": "-"})) for pdb in pdbs):
        err("no PodDisruptionBudget keeps a router serving")
    pms = by_kind.get("PodMonitor", []) + by_kind.get("ServiceMonitor", [])
    if not pms:
        err("no PodMonitor/ServiceMonitor")
    jobs = {}  # job -> the container it scrapes
    for pm in by_kind.get("PodMonitor", []):
        sel = pm["spec"]["selector"].get("matchLabels", {})
        hit = [d for d, l in pod_labels.items() if selector_matches(sel, l)]
        if not hit:
            err(f"PodMonitor {pm['metadata']['name']} selects no pod")
        jl = pm["spec"].get("jobLabel")
        for ep in pm["spec"].get("podMetricsEndpoints", []):
            for d in hit:
                if ep.get("port") not in container_ports.get(d, {}):
                    err(f"PodMonitor port {ep.get('port')} missing on {d}")
                    continue
                job = pod_labels[d].get(jl) if jl else None
                for rl in ep.get("relabelings", []):
                    if rl.get("targetLabel") == "job":
                        job = rl.get("replacement")
                owner = port_owner.get((d, ep.get("port")))
                if job != f"dedit-{owner}":
                    err(f"PodMonitor {pm['metadata']['name']}: port {ep.get('port')} of {d} "
                        f"gets job {job}, but deploy/prometheus and the dashboard expect "
                        f"dedit-{owner}")
                jobs[job] = owner
    if sorted(jobs) != ["dedit-drafter", "dedit-openai", "dedit-router", "dedit-target"]:
        err(f"PodMonitors scrape jobs {sorted(jobs)}, not the three services and the "
            "HTTP front")
    return errors


def validate_network_policies(policies, pod_labels, container_ports, port_owner):
    """Who may open a connection to each named port of each pod.

    A port's sources are the peers of every ingress rule, of every policy
    selecting the pod, that lists the port (or no ports): "any" for a rule
    without `from`, else ("pods", matchLabels) for a podSelector of this
    namespace, ("ns", matchLabels) for a namespaceSelector, ("ip", cidr).
    """
    errors = []
    default_deny = [p for p in policies if not p["spec"].get("podSelector", {}).get("matchLabels")
                    and not p["spec"].get("podSelector", {}).get("matchExpressions")
                    and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                    and not p["spec"].get("ingress")]
    if not default_deny:
        errors.append("no default-deny ingress NetworkPolicy (podSelector: {}, no rules)")

    def sources(dep, pname):
        number = container_ports[dep][pname]
        found, selected = [], False
        for pol in policies:
            spec = pol["spec"]
            if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
                continue
            if not selector_matches(spec.get("podSelector", {}).get("matchLabels", {}),
                                    pod_labels[dep]):
                continue
            selected = True
            for rule in spec.get("ingress", []) or []:
                ports = rule.get("ports")
                if ports and not any(pp.get("port") in (pname, number) for pp in ports):
                    continue
                peers = rule.get("from")
                if not peers:
                    found.append(("any", None))
                    continue
                for peer in peers:
                    if "ipBlock" in peer:
                        found.append(("ip", peer["ipBlock"].get("cidr")))
                    elif "namespaceSelector" in peer:
                        found.append(("ns", peer["namespaceSelector"].get("matchLabels", {})))
                    elif "podSelector" in peer:
                        found.append(("pods", peer["podSelector"].get("matchLabels", {})))
        return selected, found

    monitoring = {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
    for dep, ports in container_ports.items():
        for pname in ports:
            selected, found = sources(dep, pname)
            where = f"NetworkPolicy: {dep} port {pname}"
            if not selected:
                errors.append(f"{where}: no policy selects the pod (open to all)")
                continue
            owner = port_owner.get((dep, pname))
            if pname.endswith("metrics") and owner != "openai":
                if not found:
                    errors.append(f"{where}: Prometheus cannot scrape it")
                for kind, sel in found:
                    if kind != "ns" or sel != monitoring:
                        errors.append(f"{where}: admits {kind} {sel}; /metrics is for the "
                                      f"{MONITORING_NAMESPACE} namespace only")
            elif dep == "dedit-stack" and pname.endswith("-grpc"):
                if not found:
                    errors.append(f"{where}: the routers cannot reach it")
                for kind, sel in found:
                    if (kind != "pods" or not selector_matches(sel, pod_labels["dedit-router"])
                            or selector_matches(sel, pod_labels["dedit-stack"])):
                        errors.append(f"{where}: admits {kind} {sel}; only router pods may call "
                                      "the stacks")
            elif dep == "dedit-router" and pname in ("grpc", "http"):
                if ("any", None) not in found:
                    errors.append(f"{where}: the public API must admit any client")
            elif pname.endswith("-health"):
                if found:
                    errors.append(f"{where}: admits {found}; only the kubelet probes it")
    return errors


def validate_hpa(src):
    """deploy/k8s/examples/stack-hpa.yaml scales the stack Deployment."""
    errors = []
    docs = [d for d in yaml.safe_load_all(open(os.path.join(
        src, "deploy/k8s/examples/stack-hpa.yaml"))) if d]
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    if len(hpas) != 1:
        return [f"[hpa] expected one HorizontalPodAutoscaler, got {len(hpas)}"]
    spec = hpas[0]["spec"]
    ref = spec.get("scaleTargetRef", {})
    if (ref.get("kind"), ref.get("name")) != ("Deployment", "dedit-stack"):
        errors.append(f"[hpa] scales {ref}, not Deployment dedit-stack")
    names = [m.get("pods", {}).get("metric", {}).get("name") for m in spec.get("metrics", [])]
    if not any(n in ("dedit_kv_cache_usage_ratio", "dedit_stack_requests_running") for n in names):
        errors.append(f"[hpa] scales on {names}, not KV usage or running requests")
    if spec.get("minReplicas", 1) < 1 or spec.get("maxReplicas", 0) <= spec.get("minReplicas", 1):
        errors.append("[hpa] replica bounds make no room to scale")
    return errors


def self_check(docs, flags_by_bin):
    """Each mutation of a valid rendering must be caught."""
    def dep(ds, name):
        return next(d for d in ds if d["kind"] == "Deployment" and d["metadata"]["name"] == name)

    def c(ds, name, container):
        return next(x for x in dep(ds, name)["spec"]["template"]["spec"]["containers"]
                    if x["name"] == container)

    def svc(ds, name):
        return next(d for d in ds if d["kind"] == "Service" and d["metadata"]["name"] == name)

    def netpol(ds, name):
        return next(d for d in ds
                    if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == name)
    mutations = {
        "drop readinessProbe": lambda ds: c(ds, "dedit-router", "router").pop("readinessProbe"),
        "drop drafter startupProbe": lambda ds: c(ds, "dedit-stack", "drafter").pop("startupProbe"),
        "http probe": lambda ds: c(ds, "dedit-stack", "target").__setitem__(
            "livenessProbe", {"httpGet": {"port": 9101, "path": "/metrics"}}),
        "drop GPU": lambda ds: c(ds, "dedit-stack", "drafter")["resources"]["limits"].pop(
            "nvidia.com/gpu"),
        "two GPUs in one container": lambda ds: [
            c(ds, "dedit-stack", "target")["resources"][k].__setitem__("nvidia.com/gpu", 2)
            for k in ("requests", "limits")],
        "one stack": lambda ds: dep(ds, "dedit-stack")["spec"].__setitem__("replicas", 1),
        "drafter in its own pod": lambda ds: dep(ds, "dedit-stack")["spec"]["template"]["spec"][
            "containers"].pop(),
        "remote drafter": lambda ds: c(ds, "dedit-stack", "target").__setitem__(
            "args", [a if not a.startswith("--drafter=") else "--drafter=dedit-drafter:50052"
                     for a in c(ds, "dedit-stack", "target")["args"]]),
        "ClusterIP stacks": lambda ds: svc(ds, "dedit-stack")["spec"].pop("clusterIP"),
        "router on a fixed target": lambda ds: c(ds, "dedit-router", "router")["args"].append(
            "--target=dedit-stack:50051"),
        "writable root": lambda ds: c(ds, "dedit-stack", "target")["securityContext"].__setitem__(
            "readOnlyRootFilesystem", False),
        "root user": lambda ds: [c(ds, "dedit-router", "router")["securityContext"].__setitem__(
                                     "runAsUser", 0),
                                 c(ds, "dedit-router", "router")["securityContext"].__setitem__(
                                     "runAsNonRoot", False)],
        "no limits": lambda ds: c(ds, "dedit-router", "router")["resources"].pop("limits"),
        "wrong port": lambda ds: c(ds, "dedit-stack", "drafter").__setitem__(
            "args", [a if not a.startswith("--port=") else "--port=50053"
                     for a in c(ds, "dedit-stack", "drafter")["args"]]),
        "unknown flag": lambda ds: c(ds, "dedit-router", "router")["args"].append("--no_such_flag=1"),
        "front on a remote router": lambda ds: c(ds, "dedit-router", "openai").__setitem__(
            "args", [a if not a.startswith("--router=") else "--router=dedit-router:50050"
                     for a in c(ds, "dedit-router", "openai")["args"]]),
        "front not ready-checked": lambda ds: c(ds, "dedit-router", "openai").pop(
            "readinessProbe"),
        "bad selector": lambda ds: svc(ds, "dedit-stack")["spec"].__setitem__(
            "selector", {"app.kubernetes.io/name": "dedit-stak"}),
        "probe on the mTLS port": lambda ds: c(ds, "dedit-stack", "drafter")[
            "readinessProbe"]["grpc"].__setitem__("port", 50052),
        "no health port": lambda ds: c(ds, "dedit-stack", "target").__setitem__(
            "args", [a for a in c(ds, "dedit-stack", "target")["args"]
                     if not a.startswith("--health_port=")]),
        "router without a client cert": lambda ds: c(ds, "dedit-router", "router").__setitem__(
            "args", [a for a in c(ds, "dedit-router", "router")["args"]
                     if not a.startswith("--tls_cert=")]),
        "TLS secret not mounted": lambda ds: c(ds, "dedit-stack", "drafter").__setitem__(
            "volumeMounts", [m for m in c(ds, "dedit-stack", "drafter")["volumeMounts"]
                             if m["name"] != "tls"]),
        "wrong TLS secret": lambda ds: next(
            v for v in dep(ds, "dedit-router")["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "tls")["secret"].__setitem__("secretName", "dedit-stack-tls"),
        "stack cert checked for an IP": lambda ds: c(ds, "dedit-router", "router").__setitem__(
            "args", [a for a in c(ds, "dedit-router", "router")["args"]
                     if not a.startswith("--tls_server_name=")]),
        "no default deny": lambda ds: ds.remove(netpol(ds, "dedit-default-deny-ingress")),
        "stacks open to all": lambda ds: netpol(ds, "dedit-stack-ingress")["spec"]["ingress"][0].pop(
            "from"),
        "stacks reachable from monitoring": lambda ds: netpol(
            ds, "dedit-stack-ingress")["spec"]["ingress"][0]["from"].append(
                {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": "monitoring"}}}),
        "metrics from anywhere": lambda ds: netpol(ds, "dedit-router-ingress")["spec"][
            "ingress"][1].pop("from"),
        "no stack policy": lambda ds: ds.remove(netpol(ds, "dedit-stack-ingress")),
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
    errors += validate_hpa(src)
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
