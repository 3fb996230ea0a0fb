"""The scale-out files in docker/: compose.scale*.yaml, the HAProxy configurations
docker/proxy-config printed, and the StatefulSet and its companions in docker/k8s/, checked
on a machine without Docker or a cluster (test_deploy.py's parsers and server checks).

The manifests are validated against the Kubernetes API's JSON schemas (kubernetes-validate,
strict); the HAProxy configurations are regenerated with the command in their header and
compared, and `haproxy -c` checks them; replica names, DNS names, grace periods, volumes and
GPUs are cross-checked. As in test_deploy.py, the checks return lists of problems and the
`test_catches_*` tests feed them broken copies.

Run: ATTND_BIN=build/attnd build/venv/bin/python -m pytest -q tests/python/test_deploy_scale.py
"""

import copy
import os
import re
import shlex
import shutil
import subprocess

import pytest

from test_deploy import (DOCKER, ROOT, by_kind, compose, compose_env,
                         compose_interpolate, dockerfile, duration_s, effective_envs, k8s_docs,
                         k8s_kind, listen_port, read, resolve_port, runtime_stage)

PROXY_CONFIG = os.path.join(DOCKER, "proxy-config")
K8S_VERSION = "1.34.0"


# ---------------------------------------------------------------------------
# Scaling out: docker/compose.scale*.yaml, the proxy's configurations, the
# StatefulSet and its companions in docker/k8s/.
# ---------------------------------------------------------------------------
COMPOSE_PROXY_CFG = os.path.join(DOCKER, "haproxy.compose.cfg")


def proxy_command(text):
    """The argv of the `#   docker/proxy-config ...` line that docker/proxy-config writes
    second in its output."""
    lines = text.splitlines()
    starts = [ln for ln in lines if re.match(r"^#\s+docker/proxy-config\s", ln)]
    assert len(starts) == 1, "expected one `#   docker/proxy-config ...` line, found %d" % (
        len(starts))
    return shlex.split(starts[0].lstrip("#").strip())


def proxy_options(argv):
    """({option: value}, [(NAME, HOST, PORT)]) of a proxy-config command line."""
    opts, reps, i = {}, [], 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            opts[a[2:]] = argv[i + 1]
            i += 2
            continue
        name, _, hp = a.rpartition("=")
        host, _, port = hp.rpartition(":")
        reps.append((name, host, int(port)))
        i += 1
    return opts, reps


def run_proxy_config(argv):
    assert argv[0] == "docker/proxy-config", argv
    r = subprocess.run([PROXY_CONFIG] + argv[1:], cwd=ROOT, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, (argv, r.stderr)
    return r.stdout


def check_generated(text, where):
    """A checked-in HAProxy configuration is exactly what the command in its header
    prints."""
    argv = proxy_command(text)
    if run_proxy_config(argv) != text:
        return ["%s is not the output of its command (regenerate it: %s)"
                % (where, " ".join(argv))]
    return []


def check_check_interval(opts, drain_delay, where):
    """attnd's drain delay outlasts the proxy's detection: 2 failed checks."""
    inter = float(opts.get("check-interval", "1000")) / 1000
    if not drain_delay > 2 * inter:
        return ["%s: ATTND_DRAIN_DELAY %g is not more than the proxy's 2 checks x %g s"
                % (where, drain_delay, inter)]
    return []


def in_network(addr, net):
    import ipaddress
    try:
        return ipaddress.ip_network(net, strict=False).subnet_of(
            ipaddress.ip_network(addr, strict=False))
    except (ValueError, TypeError):
        return False


def check_compose_scale(doc, gpu, cfg_text):
    """compose.scale.yaml (interpolated), its GPU override and the proxy's
    configuration agree."""
    p = []
    svcs = doc.get("services") or {}
    reps = sorted(n for n in svcs if re.match(r"^attnd-\d+$", n))
    if reps != ["attnd-0", "attnd-1", "attnd-2"]:
        return ["compose.scale: replicas %s, want attnd-0..attnd-2" % reps]
    proxy = svcs.get("proxy")
    if not proxy:
        return ["compose.scale: no proxy service"]
    argv = proxy_command(cfg_text)
    opts, listed = proxy_options(argv)
    if opts.get("resolvers") != "127.0.0.11:53":
        p.append("compose.scale: the proxy should resolve the replicas at run time through "
                 "Docker's DNS (--resolvers 127.0.0.11:53), has %r" % opts.get("resolvers"))
    nets = {n: [c.get("subnet") for c in ((d or {}).get("ipam") or {}).get("config") or []]
            for n, d in (doc.get("networks") or {}).items()}
    subnets = [s for v in nets.values() for s in v if s]
    vols = set(doc.get("volumes") or {})
    seen_vols, want = set(), []
    for name in reps:
        s = svcs[name]
        env = dict(runtime_stage("Dockerfile.cpu").env, **compose_env(s))
        _, port = listen_port(env)
        want.append((name, s.get("hostname"), port))
        if s.get("hostname") != name:
            p.append("compose.scale %s: hostname %r, want the stable name %s"
                     % (name, s.get("hostname"), name))
        b = s.get("build") or {}
        if os.path.normpath(os.path.join(DOCKER, b.get("context", "."))) != os.path.normpath(ROOT):
            p.append("compose.scale %s: build context is not the repository root" % name)
        if b.get("dockerfile") != "docker/Dockerfile.cpu":
            p.append("compose.scale %s: builds %s, want docker/Dockerfile.cpu"
                     % (name, b.get("dockerfile")))
        if s.get("ports"):
            p.append("compose.scale %s: publishes %s; only the proxy should" % (name, s["ports"]))
        hc = (s.get("healthcheck") or {}).get("test") or []
        if "/readyz" not in " ".join(hc):
            p.append("compose.scale %s: the healthcheck should probe /readyz" % name)
        trusted = [x.strip() for x in env.get("ATTND_TRUSTED_PROXY", "").split(",") if x.strip()]
        if not subnets or not any(in_network(sub, t) for sub in subnets for t in trusted):
            p.append("compose.scale %s: ATTND_TRUSTED_PROXY %s does not cover the network %s"
                     % (name, trusted, subnets))
        sd = env.get("ATTND_SESSION_DIR")
        mounts = [str(v).split(":") for v in s.get("volumes") or []]
        vol = [m[0] for m in mounts if len(m) >= 2 and m[1] == sd]
        if not sd or len(vol) != 1 or vol[0] not in vols:
            p.append("compose.scale %s: ATTND_SESSION_DIR %r is not a named volume (%s)"
                     % (name, sd, s.get("volumes")))
        elif vol[0] in seen_vols:
            p.append("compose.scale %s: shares the sessions volume %s" % (name, vol[0]))
        else:
            seen_vols.add(vol[0])
        delay = float(env.get("ATTND_DRAIN_DELAY", "0"))
        drain = float(env.get("ATTND_DRAIN_TIMEOUT", "30"))
        # a handover runs after the drain, before the exit
        hand = float(env.get("ATTND_HANDOVER_TIMEOUT", "30")) if env.get("ATTND_HANDOVER") else 0
        p += check_check_interval(opts, delay, "compose.scale %s" % name)
        try:
            grace = duration_s(s.get("stop_grace_period", "10s"))
        except ValueError as e:
            grace = 0
            p.append("compose.scale %s: %s" % (name, e))
        if not grace >= delay + drain + hand + 5:
            p.append("compose.scale %s: stop_grace_period %gs is less than ATTND_DRAIN_DELAY "
                     "%g + ATTND_DRAIN_TIMEOUT %g + ATTND_HANDOVER_TIMEOUT %g + 5 s"
                     % (name, grace, delay, drain, hand))
    if listed != want:
        p.append("compose.scale: haproxy.compose.cfg lists %s, the services are %s"
                 % (listed, want))
    if not str(proxy.get("image", "")).startswith("haproxy:2.6"):
        p.append("compose.scale: proxy image %s, want haproxy:2.6" % proxy.get("image"))
    lport = int(opts.get("listen", ":0").rpartition(":")[2])
    published = [str(x).rsplit(":", 1)[-1] for x in proxy.get("ports") or []]
    if published != [str(lport)] or lport != 8080:
        p.append("compose.scale: the proxy publishes %s, listens on %d (want 8080)"
                 % (proxy.get("ports"), lport))
    cfgs = [str(v).split(":") for v in proxy.get("volumes") or []]
    if not any(os.path.normpath(os.path.join(DOCKER, c[0])) == COMPOSE_PROXY_CFG and
               c[1] == "/usr/local/etc/haproxy/haproxy.cfg" for c in cfgs if len(c) >= 2):
        p.append("compose.scale: the proxy does not mount haproxy.compose.cfg as "
                 "/usr/local/etc/haproxy/haproxy.cfg")
    # The GPU override: the CUDA image, one distinct GPU per replica.
    gs = gpu.get("services") or {}
    if sorted(gs) != reps:
        p.append("compose.scale.gpu: overrides %s, want %s" % (sorted(gs), reps))
    ids = []
    for name in sorted(gs):
        s = gs[name]
        if (s.get("build") or {}).get("dockerfile") != "docker/Dockerfile":
            p.append("compose.scale.gpu %s: should build docker/Dockerfile" % name)
        if compose_env(s).get("ATTND_BACKEND") != "cuda":
            p.append("compose.scale.gpu %s: ATTND_BACKEND should be cuda" % name)
        devs = ((((s.get("deploy") or {}).get("resources") or {}).get("reservations") or {})
                .get("devices") or [])
        d = [d for d in devs if d.get("driver") == "nvidia" and
             "gpu" in (d.get("capabilities") or [])]
        if len(d) != 1 or len(d[0].get("device_ids") or []) != 1 or "count" in d[0]:
            p.append("compose.scale.gpu %s: reserve one GPU by device_ids, has %s" % (name, devs))
        else:
            ids.append(str(d[0]["device_ids"][0]))
    if len(ids) != len(set(ids)):
        p.append("compose.scale.gpu: replicas share GPUs %s" % ids)
    return p


def check_k8s_scaling(docs, env, cm_text):
    """The StatefulSet, its headless Service, the PDB, the proxy and its
    configuration, the HPA's bound agree."""
    p = []
    k = by_kind(docs)
    sts = k["StatefulSet"]
    labels = sts["spec"]["template"]["metadata"].get("labels") or {}
    hl = k.get("Service/%s" % sts["spec"].get("serviceName"))
    if not hl:
        return ["the StatefulSet's serviceName %r is no Service" % sts["spec"].get("serviceName")]
    if hl["spec"].get("clusterIP") != "None":
        p.append("Service %s: clusterIP should be None (headless)" % hl["metadata"]["name"])
    sel = hl["spec"].get("selector") or {}
    if not sel or any(labels.get(a) != b for a, b in sel.items()):
        p.append("the headless Service does not select the attnd pods")
    pdb = k.get("PodDisruptionBudget")
    if not pdb or pdb["spec"].get("maxUnavailable") != 1 or any(
            labels.get(a) != b for a, b in (pdb["spec"].get("selector") or {})
            .get("matchLabels", {"": None}).items()):
        p.append("the PodDisruptionBudget should select the attnd pods with maxUnavailable 1")
    hpa = k["HorizontalPodAutoscaler"]
    if not any(m.get("type") == "Pods" and m["pods"]["metric"]["name"] == "attnd_queue_depth"
               for m in hpa["spec"].get("metrics") or []):
        p.append("the HPA should scale on the pods metric attnd_queue_depth")
    # The proxy: its ConfigMap, Deployment and Service.
    cm = k.get("ConfigMap/haproxy-config")
    dep = k.get("Deployment/haproxy")
    if not cm or not dep:
        return p + ["no ConfigMap haproxy-config or Deployment haproxy"]
    argv = proxy_command(cm_text)
    opts, listed = proxy_options(argv)
    if opts.get("resolvers") != "resolv.conf":
        p.append("the proxy's command should have --resolvers resolv.conf")
    ns = "default"
    _, port = listen_port(env)
    want = [("%s-%d" % (sts["metadata"]["name"], i), "%s-%d.%s.%s.svc.cluster.local"
             % (sts["metadata"]["name"], i, hl["metadata"]["name"], ns), port)
            for i in range(hpa["spec"]["maxReplicas"])]
    if listed != want:
        p.append("the proxy lists %s, want the pods 0..maxReplicas-1 by their DNS names %s"
                 % ([x[0] for x in listed], [w[1] for w in want]))
    p += check_check_interval(opts, float(env.get("ATTND_DRAIN_DELAY", "0")), "k8s")
    if dep["spec"].get("replicas") != 2:
        p.append("the proxy Deployment should run 2 replicas, has %r" % dep["spec"].get("replicas"))
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    mounted = [m for m in c.get("volumeMounts") or [] if m["mountPath"] == "/usr/local/etc/haproxy"
               and ((vols.get(m["name"]) or {}).get("configMap") or {}).get("name")
               == "haproxy-config"]
    if not mounted:
        p.append("the proxy does not mount haproxy-config at /usr/local/etc/haproxy")
    lport = int(opts.get("listen", ":0").rpartition(":")[2])
    if [cp.get("containerPort") for cp in c.get("ports") or []] != [lport]:
        p.append("the proxy's containerPort is not its --listen port %d" % lport)
    plabels = dep["spec"]["template"]["metadata"].get("labels") or {}
    entry = [d for _, d in docs if d.get("kind") == "Service" and d is not hl]
    if len(entry) != 1 or any(plabels.get(a) != b for a, b in
                              (entry[0]["spec"].get("selector") or {"": None}).items()):
        p.append("one Service should select the proxy pods")
    else:
        for sp in entry[0]["spec"].get("ports") or []:
            if resolve_port(c, sp.get("targetPort", sp.get("port"))) != lport:
                p.append("the proxy's Service targets %r, not %d" % (sp.get("targetPort"), lport))
    if pod.get("terminationGracePeriodSeconds", 30) <= int(opts.get("timeout", "60")) + 30:
        p.append("the proxy's grace period does not cover its server timeout")
    return p


def haproxy_cm_text():
    """The proxy's configuration in its ConfigMap (docker/k8s/haproxy.yaml)."""
    return k8s_kind(k8s_docs(), "ConfigMap", "haproxy-config")["data"]["haproxy.cfg"]


def test_compose_scale():
    scale = compose_interpolate(compose("compose.scale.yaml"), {})
    gpu = compose_interpolate(compose("compose.scale.gpu.yaml"), {})
    assert check_compose_scale(scale, gpu, read(COMPOSE_PROXY_CFG)) == []


def test_kubernetes_scaling():
    assert check_k8s_scaling(k8s_docs(), effective_envs()["k8s"], haproxy_cm_text()) == []


def test_proxy_configs_are_generated():
    """Each checked-in HAProxy configuration is the output of the docker/proxy-config
    command in its header, byte for byte."""
    assert check_generated(read(COMPOSE_PROXY_CFG), COMPOSE_PROXY_CFG) == []
    assert check_generated(haproxy_cm_text(), "k8s/haproxy.yaml") == []


def haproxy_check(cfg_text, tmp_path):
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy"
                                          if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if not haproxy:
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy): "
                    "the configurations are not checked with haproxy -c")
    f = tmp_path / "haproxy.cfg"
    f.write_text(cfg_text)
    return subprocess.run([haproxy, "-c", "-f", str(f)], capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_haproxy_accepts_the_configs(which, tmp_path):
    """haproxy -c on each configuration: with `resolvers ... init-addr none`
    names that do not resolve here (attnd-0, the cluster's) are no error."""
    if which == "compose":
        text = read(COMPOSE_PROXY_CFG)
    else:
        text = k8s_kind(k8s_docs(), "ConfigMap", "haproxy-config")["data"]["haproxy.cfg"]
    r = haproxy_check(text, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def schema_problems(docs):
    try:
        import kubernetes_validate
    except ImportError:
        pytest.skip("kubernetes-validate is not installed: run with build/venv/bin/python "
                    "(make test installs tests/python/requirements-test.txt there)")
    p = []
    for f, d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            p.append("%s %s/%s: %s at %s" % (f, d.get("kind"), (d.get("metadata") or {})
                                              .get("name"), e.message, list(e.path)))
    return p


def test_manifests_match_kubernetes_schemas():
    """Every document of docker/k8s/ against the API's JSON schemas for
    K8S_VERSION, strict: a field the API does not have is an error."""
    docs = k8s_docs()
    assert len(docs) >= 9
    assert schema_problems(docs) == []


def test_catches_a_misspelt_manifest_field():
    docs = k8s_docs()
    for mutate in (
            lambda k: k["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
            .__setitem__("readinesProbe", {}),
            lambda k: k["HorizontalPodAutoscaler"]["spec"].__setitem__("maxReplica", 8),
            lambda k: k["PodDisruptionBudget"]["spec"].__setitem__("maxUnavailabel", 1),
            lambda k: k["Deployment/haproxy"]["spec"]["template"]["spec"]
            .__setitem__("terminationGracePeriod", 10)):
        d = copy.deepcopy(docs)
        mutate(by_kind(d))
        assert schema_problems(d), "not caught"


def test_catches_scaling_mistakes():
    scale = compose_interpolate(compose("compose.scale.yaml"), {})
    gpu = compose_interpolate(compose("compose.scale.gpu.yaml"), {})
    cfg = read(COMPOSE_PROXY_CFG)

    def broken(fn, text=cfg):
        s, g = copy.deepcopy(scale), copy.deepcopy(gpu)
        fn(s["services"], g["services"])
        return check_compose_scale(s, g, text)

    env = lambda s: s["attnd-1"]["environment"]  # noqa: E731
    assert broken(lambda s, g: s["attnd-1"].__setitem__("hostname", "attnd-x"))
    assert broken(lambda s, g: env(s).__setitem__("ATTND_DRAIN_DELAY", "2"))
    assert broken(lambda s, g: env(s).__setitem__("ATTND_DRAIN_TIMEOUT", "40"))
    assert broken(lambda s, g: env(s).__setitem__("ATTND_HANDOVER_TIMEOUT", "40"))
    assert broken(lambda s, g: env(s).__setitem__("ATTND_TRUSTED_PROXY", "10.0.0.0/8"))
    assert broken(lambda s, g: s["attnd-2"].__setitem__("volumes", ["sessions-1:/var/lib/attnd/sessions"]))
    assert broken(lambda s, g: s["attnd-0"].__setitem__("ports", ["8081:8080"]))
    assert broken(lambda s, g: s.pop("attnd-2"))
    assert broken(lambda s, g: g["attnd-2"]["deploy"]["resources"]["reservations"]["devices"][0]
                  .__setitem__("device_ids", ["1"]))
    assert broken(lambda s, g: None, cfg.replace("attnd-2=attnd-2:8080", "attnd-2=attnd-3:8080"))
    assert broken(lambda s, g: None, cfg.replace("127.0.0.11:53", "resolv.conf"))
    # A hand edit, or a command that no longer prints this file.
    assert check_generated(cfg.replace("balance leastconn", "balance roundrobin"), "x")
    assert check_generated(cfg.replace("--check-interval 1000", "--check-interval 500"), "x")

    docs, text = k8s_docs(), haproxy_cm_text()
    envk = effective_envs()["k8s"]

    def kbroken(fn, t=text, e=envk):
        d = copy.deepcopy(docs)
        fn(by_kind(d))
        return check_k8s_scaling(d, e, t)

    assert kbroken(lambda k: k["StatefulSet"]["spec"].__setitem__("serviceName", "attnd"))
    assert kbroken(lambda k: k["Service/attnd-headless"]["spec"].pop("clusterIP"))
    assert kbroken(lambda k: k["PodDisruptionBudget"]["spec"].__setitem__("maxUnavailable", 2))
    assert kbroken(lambda k: k["HorizontalPodAutoscaler"]["spec"].__setitem__("maxReplicas", 9))
    assert kbroken(lambda k: k["Deployment/haproxy"]["spec"].__setitem__("replicas", 1))
    assert kbroken(lambda k: k["Service/attnd"]["spec"]["selector"]
                   .__setitem__("app.kubernetes.io/name", "attnd"))
    assert kbroken(lambda k: None, e=dict(envk, ATTND_DRAIN_DELAY="1"))
    assert kbroken(lambda k: None, t=text.replace(".default.svc", ".attnd.svc"))
    assert check_generated(text.replace("fall 2", "fall 3"), "x")
    assert check_generated(text.replace("--timeout 60", "--timeout 30"), "x")


def test_catches_a_broken_haproxy_config(tmp_path):
    r = haproxy_check(read(COMPOSE_PROXY_CFG).replace("balance leastconn", "balance fewest"),
                      tmp_path)
    assert r.returncode != 0, r.stdout
