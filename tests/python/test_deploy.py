"""The deployment files in docker/, checked on a machine without Docker.

Nothing here builds or runs an image. The Dockerfiles are parsed by a small
parser (instructions, line continuations, stages); the compose file and the
Kubernetes manifests by PyYAML. Every ATTND_* variable and --flag they use is
checked against what the real server accepts (`$ATTND_BIN --help`), and the
values by starting $ATTND_BIN with each file's environment. Ports, probe paths,
grace periods, the packages of each stage and the user are cross-checked (the
scale-out files in test_deploy_scale.py). The checks are functions returning a list of problems, and the `test_catches_*`
tests feed them broken copies to show that each one fails when it should.

Run: ATTND_BIN=build/attnd /usr/bin/python3 -m pytest -q tests/python
(attn is taken from ATTN_BIN, else next to ATTND_BIN.)
"""

import copy
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

try:
    import yaml
except ImportError as e:  # pragma: no cover
    raise ImportError("test_deploy.py needs PyYAML: apt-get install python3-yaml") from e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKER = os.path.join(ROOT, "docker")
K8S = os.path.join(DOCKER, "k8s")
DOCKERFILES = ["Dockerfile", "Dockerfile.cpu"]
COMPOSE_FILES = ["compose.yaml", "compose.secure.yaml", "compose.scale.yaml",
                 "compose.scale.gpu.yaml"]
# The Kubernetes version whose API schemas the manifests must satisfy.

# ---------------------------------------------------------------------------
# Packages of the Makefile's DEPS that the images' build stages leave out on
# purpose: `make build/attnd build/attn` does not use them (checked below by
# a dry run of those targets). Everything else in DEPS must be installed.
# ---------------------------------------------------------------------------
DEPS_NOT_IN_IMAGE = {
    "libcriterion-dev": "Criterion: the unit and integration tests only",
    "clang": "the libFuzzer targets (make fuzz) only; attnd and attn build with gcc",
    "libclang-rt-dev": "libFuzzer's runtime for make fuzz only",
    "wrk": "make bench-server only",
    "clang-format": "make test's format check only",
    "curl": "the tests only (the runtime stages install curl for HEALTHCHECK)",
    "libb64-0d": "perf_analyzer (tritonclient's wheel) in the /v2 tests and make bench-v2 only",
    "openssl": "the HTTPS tests' throwaway certificates only",
    "chromium": "the web console's browser test (tests/python/test_console.py) only",
    "chromium-driver": "the web console's browser test (tests/python/test_console.py) only",
    "haproxy": "the scale-out tests (tests/scale) and make bench-scale only; the proxy has "
               "its own image",
}


def dep_excluded(pkg):
    """Why a DEPS package is not in the build stage, or None if it must be."""
    if pkg in DEPS_NOT_IN_IMAGE:
        return DEPS_NOT_IN_IMAGE[pkg]
    if pkg == "python3" or pkg.startswith("python3-"):
        return "the pytest suite (tests/python) only"
    return None


# Runtime packages every base image already has (debian:bookworm-slim,
# nvidia/cuda runtime on ubuntu24.04).
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6"}
# Runtime library packages: Debian 12 name -> Ubuntu 24.04 name (64-bit time_t).
UBUNTU_NOBLE_NAME = {
    "libmicrohttpd12": "libmicrohttpd12t64",
    "libuv1": "libuv1t64",
    "libcurl4": "libcurl4t64",
    "libcjson1": "libcjson1",
    "libgnutls30": "libgnutls30t64",
    "zlib1g": "zlib1g",
}
# Runtime packages not linked by the binaries, with the reason.
RUNTIME_EXTRAS = {"curl": "the HEALTHCHECK command"}

DOCKERFILE_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY",
    "ENTRYPOINT", "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL",
    "HEALTHCHECK", "SHELL"}


# ---------------------------------------------------------------------------
# A Dockerfile parser: enough of the reference syntax for these files.
# ---------------------------------------------------------------------------
class DockerfileError(ValueError):
    pass


class Instr:
    def __init__(self, keyword, args, line):
        self.keyword, self.args, self.line = keyword, args, line

    def __repr__(self):
        return "%s@%d(%r)" % (self.keyword, self.line, self.args[:60])

    def json_args(self):
        """The exec (JSON array) form's list, or None for the shell form."""
        if self.args.startswith("["):
            try:
                v = json.loads(self.args)
            except ValueError:
                return None
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                return v
        return None


def parse_dockerfile(text):
    """Instructions in order. Continuation lines ending in a backslash are
    joined as Docker joins them (backslash and newline removed); comment lines
    and blank lines inside a continuation are skipped."""
    instrs, buf, start = [], None, 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if buf is None:
            if not stripped or stripped.startswith("#"):
                continue
            buf, start = "", n
        elif not stripped or stripped.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1]
            continue
        buf += line
        m = re.match(r"\s*([A-Za-z]+)(?:\s+(.*))?$", buf, re.S)
        if not m:
            raise DockerfileError("line %d: not an instruction: %r" % (start, buf))
        instrs.append(Instr(m.group(1).upper(), (m.group(2) or "").strip(), start))
        if m.group(1) != m.group(1).upper():
            raise DockerfileError("line %d: write instructions in capitals: %s"
                                  % (start, m.group(1)))
        buf = None
    if buf is not None:
        raise DockerfileError("line %d: the last instruction ends in a backslash" % start)
    return instrs


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(s, variables):
    """Docker's ${VAR}, $VAR and ${VAR:-default} in FROM, COPY, ENV, ..."""
    def repl(m):
        name = m.group(1) or m.group(3)
        if variables.get(name):
            return variables[name]
        return m.group(2) or ""
    return _VAR.sub(repl, s)


def parse_assignments(args):
    """ENV and ARG bodies: `K=V K2="V 2"` or the legacy `K V`."""
    toks = shlex.split(args)
    if not toks:
        raise DockerfileError("empty assignment")
    if "=" not in toks[0]:
        return {toks[0]: " ".join(toks[1:])}
    out = {}
    for t in toks:
        k, eq, v = t.partition("=")
        if not eq or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise DockerfileError("bad assignment %r" % t)
        out[k] = v
    return out


class Stage:
    def __init__(self, image, name, line):
        self.image, self.name, self.line = image, name, line
        self.instrs, self.args, self.env = [], {}, {}

    def all(self, keyword):
        return [i for i in self.instrs if i.keyword == keyword]

    def last(self, keyword):
        found = self.all(keyword)
        return found[-1] if found else None


def stages_of(instrs, build_args=None):
    """(global ARG defaults, [Stage]) with FROM images resolved."""
    build_args = build_args or {}
    global_args, stages = {}, []
    for ins in instrs:
        if ins.keyword not in DOCKERFILE_INSTRUCTIONS:
            raise DockerfileError("line %d: unknown instruction %s" % (ins.line, ins.keyword))
        if ins.keyword == "FROM":
            toks = [t for t in ins.args.split() if not t.startswith("--platform")]
            if len(toks) == 3 and toks[1].upper() == "AS":
                image, name = toks[0], toks[2]
            elif len(toks) == 1:
                image, name = toks[0], None
            else:
                raise DockerfileError("line %d: FROM image [AS name]: %r" % (ins.line, ins.args))
            stages.append(Stage(substitute(image, global_args), name, ins.line))
            continue
        if ins.keyword == "ARG":
            arg = parse_assignments(ins.args)
            for k, v in arg.items():
                v = build_args.get(k, v)
                if stages:
                    stages[-1].args[k] = v
                else:
                    global_args[k] = v
            if not stages:
                continue
        if not stages:
            raise DockerfileError("line %d: %s before the first FROM" % (ins.line, ins.keyword))
        st = stages[-1]
        if ins.keyword == "ENV":
            for k, v in parse_assignments(ins.args).items():
                st.env[k] = substitute(v, dict(st.args, **st.env))
        st.instrs.append(ins)
    return global_args, stages


def parse_healthcheck(ins):
    """(options dict, command as a shell string) of a HEALTHCHECK."""
    toks = ins.args.split(None)
    opts, i = {}, 0
    while i < len(toks) and toks[i].startswith("--"):
        k, _, v = toks[i][2:].partition("=")
        opts[k] = v
        i += 1
    rest = ins.args.split(None, i)[i] if i < len(toks) else ""
    word, _, cmd = rest.partition(" ")
    if word != "CMD":
        raise DockerfileError("HEALTHCHECK [options] CMD command: %r" % ins.args)
    cmd = cmd.strip()
    if cmd.startswith("["):
        return opts, " ".join(shlex.quote(a) for a in json.loads(cmd))
    return opts, cmd


def apt_packages(run):
    """Packages named by `apt-get install` in a RUN command."""
    toks = shlex.split(run, posix=True)
    pkgs, i = [], 0
    while i < len(toks):
        if os.path.basename(toks[i]) in ("apt-get", "apt") and "install" in toks[i + 1:i + 6]:
            j = toks.index("install", i) + 1
            while j < len(toks) and toks[j] not in ("&&", "||", ";", "|"):
                if not toks[j].startswith("-"):
                    pkgs.append(toks[j].rstrip(";").split("=")[0])
                if toks[j].endswith(";"):
                    break
                j += 1
            i = j
        i += 1
    return pkgs


def duration_s(s):
    """Docker / compose durations: 10s, 1m30s, 500ms, 2h."""
    if isinstance(s, (int, float)):
        return float(s)
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", s):
        if m.start() != pos:
            raise ValueError("bad duration %r" % s)
        pos = m.end()
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3,
                                      "us": 1e-6, "ns": 1e-9}[m.group(2)]
    if pos != len(s) or not s:
        raise ValueError("bad duration %r" % s)
    return total


def size_bytes(s):
    """attnd's sizes: 1048576, 512K, 64M, 1G."""
    m = re.match(r"^(\d+)([KkMmGg]?)$", s)
    if not m:
        raise ValueError("bad size %r" % s)
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def quantity_bytes(q):
    """Kubernetes memory quantities: 16Gi, 512Mi, 1G, 1000000."""
    m = re.match(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$", str(q))
    if not m:
        raise ValueError("bad quantity %r" % q)
    mul = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return float(m.group(1)) * mul


# ---------------------------------------------------------------------------
# What the server and the client accept, from their --help.
# ---------------------------------------------------------------------------
def parse_help(text):
    """{flag: env var or None} from a usage text: one entry per option line
    (`  --name ARG  text [ATTND_X]`), continuation lines indented deeper."""
    flags, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^\s{1,4}--([a-z][a-z0-9-]*)", line)
        if m:
            cur = m.group(1)
            flags[cur] = line
            for extra in re.findall(r",\s*--([a-z][a-z0-9-]*)", line):
                flags[extra] = ""
        elif cur and re.match(r"^\s{6,}\S", line):
            flags[cur] += " " + line.strip()
        else:
            cur = None
    out = {}
    for flag, desc in flags.items():
        env = re.search(r"\[(ATTND_[A-Z0-9_]+)\]", desc)
        out[flag] = env.group(1) if env else None
    return out


def help_routes(text):
    """The paths attnd --help names (`GET /attention/plan, /healthz, ...`)."""
    return set(re.findall(r"(?<![\w/])(/[a-z0-9_/]*[a-z0-9_])", text.split("\noptions")[0]))


def _binary(var, default):
    path = os.environ.get(var, default)
    if not os.path.isabs(path):
        path = os.path.join(ROOT, path)
    return path


def attnd_bin():
    return _binary("ATTND_BIN", os.path.join("build", "attnd"))


def attn_bin():
    return _binary("ATTN_BIN", os.path.join(os.path.dirname(attnd_bin()), "attn"))


@pytest.fixture(scope="module")
def server_help():
    b = attnd_bin()
    if not os.access(b, os.X_OK):
        pytest.fail("no attnd binary at %s (make build/attnd, or set ATTND_BIN)" % b)
    out = subprocess.run([b, "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    flags = parse_help(out.stdout)
    assert "listen" in flags and flags["listen"] == "ATTND_LISTEN", out.stdout
    return {"flags": flags, "envs": {e for e in flags.values() if e},
            "routes": help_routes(out.stdout), "text": out.stdout}


@pytest.fixture(scope="module")
def served_gauges(tmp_path_factory):
    """The gauges a running attnd's /metrics declares (# TYPE name gauge)."""
    srv = start_attnd({"ATTND_BACKEND": "cpu", "ATTND_THREADS": "1"},
                      tmp_path_factory.mktemp("gauges"))
    try:
        metrics = http_get(srv.url + "/metrics")[1]
    finally:
        srv.stop(timeout=35)
    gauges = set(re.findall(r"^# TYPE (attnd_[a-z_]+) gauge$", metrics, re.M))
    assert "attnd_queue_depth" in gauges, metrics
    return gauges


@pytest.fixture(scope="module")
def load_help():
    b = attn_bin()
    if not os.access(b, os.X_OK):
        pytest.fail("no attn binary at %s (make build/attn, or set ATTN_BIN)" % b)
    out = subprocess.run([b, "load", "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    return set(re.findall(r"--([a-z][a-z0-9-]*)", text))


# ---------------------------------------------------------------------------
# The files.
# ---------------------------------------------------------------------------
def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def dockerfile(name, build_args=None):
    return stages_of(parse_dockerfile(read(os.path.join(DOCKER, name))), build_args)


def runtime_stage(name):
    return dockerfile(name)[1][-1]


def compose(name="compose.yaml"):
    return yaml.safe_load(read(os.path.join(DOCKER, name)))


def k8s_docs():
    docs = []
    for f in sorted(os.listdir(K8S)):
        if f.endswith((".yaml", ".yml")):
            for d in yaml.safe_load_all(read(os.path.join(K8S, f))):
                if d is not None:
                    docs.append((f, d))
    return docs


def k8s_kind(docs, kind, name=None):
    found = [d for _, d in docs if d.get("kind") == kind and
             (name is None or (d.get("metadata") or {}).get("name") == name)]
    assert len(found) == 1, "expected one %s%s in docker/k8s/, found %d" % (
        kind, "" if name is None else " " + name, len(found))
    return found[0]


def by_kind(docs):
    """{kind: document} of attnd's own manifests (label app.kubernetes.io/name:
    attnd), and {"Kind/name": document} of every one."""
    out = {}
    for _, d in docs:
        meta = d.get("metadata") or {}
        out["%s/%s" % (d.get("kind"), meta.get("name"))] = d
        if (meta.get("labels") or {}).get("app.kubernetes.io/name") == "attnd":
            assert d["kind"] not in out, "two attnd %ss" % d["kind"]
            out[d["kind"]] = d
    return out


def k8s_container(docs):
    pod = k8s_kind(docs, "StatefulSet")["spec"]["template"]["spec"]
    c = [c for c in pod["containers"] if c["name"] == "attnd"]
    assert len(c) == 1, "the StatefulSet needs one container named attnd"
    return pod, c[0]


_COMPOSE_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*)|(\$))")


def compose_interpolate(value, env):
    """Compose's interpolation: ${V}, ${V:-default}, ${V-default}, $V, $$."""
    if isinstance(value, str):
        def repl(m):
            if m.group(5):
                return "$"
            name = m.group(1) or m.group(4)
            if name in env and (env[name] or m.group(2) != ":"):
                return env[name]
            return m.group(3) or ""
        return _COMPOSE_VAR.sub(repl, value)
    if isinstance(value, list):
        return [compose_interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: compose_interpolate(v, env) for k, v in value.items()}
    return value


def compose_env(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def effective_envs():
    """{name: environment attnd starts with} for each way of deploying it."""
    cuda_env = runtime_stage("Dockerfile").env
    docs = k8s_docs()
    _, c = k8s_container(docs)
    cm = k8s_kind(docs, "ConfigMap", "attnd-config")
    k8s = dict(cuda_env, **{k: str(v) for k, v in (cm.get("data") or {}).items()})
    k8s.update({e["name"]: str(e.get("value", "")) for e in c.get("env") or []})
    comp = compose_interpolate(compose(), {})
    scale = compose_interpolate(compose("compose.scale.yaml"), {})
    cpu_env = runtime_stage("Dockerfile.cpu").env
    return {
        "Dockerfile": dict(cuda_env),
        "Dockerfile.cpu": dict(cpu_env),
        "compose": dict(cuda_env, **compose_env(comp["services"]["attnd"])),
        "compose.scale": dict(cpu_env, **compose_env(scale["services"]["attnd-0"])),
        "k8s": k8s,
    }


def listen_port(env):
    host, _, port = env.get("ATTND_LISTEN", "127.0.0.1:8080").rpartition(":")
    return host, int(port)


# ---------------------------------------------------------------------------
# Checks: each returns a list of problems (empty when all is well).
# ---------------------------------------------------------------------------
def check_env_names(names, known, where):
    return ["%s: %s is not a variable attnd reads (attnd --help lists %s)"
            % (where, n, ", ".join(sorted(known))) for n in sorted(set(names) - set(known))]


def check_flags(args, known, where):
    out = []
    for a in args:
        m = re.match(r"^--([a-z][a-z0-9-]*)", str(a))
        if m and m.group(1) not in known:
            out.append("%s: --%s is not a flag it accepts" % (where, m.group(1)))
    return out


def tokens_in(text, pattern=r"\bATTND_[A-Z0-9_]+\b"):
    return set(re.findall(pattern, text))


def check_dockerfile(name, stages, global_args):
    """Shape of one Dockerfile: stages, images, ARG, USER, EXPOSE, HEALTHCHECK,
    ENTRYPOINT, what the runtime stage receives."""
    p = []
    if len(stages) != 2 or not all(s.name for s in stages):
        return ["%s: expected two named stages (build, runtime), got %s"
                % (name, [(s.image, s.name) for s in stages])]
    build, run = stages
    cuda = name == "Dockerfile"
    if cuda:
        mb = re.match(r"^nvidia/cuda:(13\.\d+\.\d+)-devel-ubuntu24\.04$", build.image)
        mr = re.match(r"^nvidia/cuda:(13\.\d+\.\d+)-runtime-ubuntu24\.04$", run.image)
        if not mb:
            p.append("%s: build stage FROM %s is not nvidia/cuda:13.x-devel-ubuntu24.04"
                     % (name, build.image))
        if not mr:
            p.append("%s: runtime stage FROM %s is not nvidia/cuda:13.x-runtime-ubuntu24.04"
                     % (name, run.image))
        if mb and mr and mb.group(1) != mr.group(1):
            p.append("%s: devel %s and runtime %s differ" % (name, mb.group(1), mr.group(1)))
        arch = build.args.get("CUDA_ARCHS")
        if arch != "80;89;90":
            p.append("%s: ARG CUDA_ARCHS in the build stage should default to 80;89;90, got %r"
                     % (name, arch))
    else:
        for s in stages:
            if s.image != "debian:bookworm-slim":
                p.append("%s: stage %s FROM %s, expected debian:bookworm-slim"
                         % (name, s.name, s.image))
    for s in stages:
        for ins in s.all("RUN"):
            if "native" in ins.args:
                p.append("%s line %d: no GPU at build time, never -arch=native"
                         % (name, ins.line))
            if "apt-get install" in ins.args:
                for need in ("apt-get update", "--no-install-recommends",
                             "rm -rf /var/lib/apt/lists/*"):
                    if need not in ins.args:
                        p.append("%s line %d: apt-get install without %r in the same RUN"
                                 % (name, ins.line, need))
    if len([i for s in stages for i in s.instrs if "apt-get install" in i.args and
            i.keyword == "RUN"]) != 2:
        p.append("%s: expected one apt-get install RUN per stage" % name)
    # The runtime stage gets build/attnd and build/attn from the build stage, nothing else.
    copies = run.all("COPY")
    sources = []
    for c in copies:
        toks = c.args.split()
        if not any(t == "--from=" + build.name for t in toks):
            p.append("%s line %d: the runtime stage copies only from the build stage"
                     % (name, c.line))
        wd = build.last("WORKDIR").args if build.last("WORKDIR") else "/"
        sources += [os.path.relpath(t, wd) for t in toks[:-1] if not t.startswith("--")]
    if sorted(sources) != ["build/attn", "build/attnd"]:
        p.append("%s: the runtime stage should copy build/attnd and build/attn, copies %s"
                 % (name, sources))
    dest = copies[-1].args.split()[-1] if copies else ""
    ep = run.last("ENTRYPOINT")
    epj = ep.json_args() if ep else None
    if not epj or os.path.basename(epj[0]) != "attnd":
        p.append("%s: ENTRYPOINT should be the exec form [\".../attnd\"]" % name)
    elif epj[0] != os.path.join(dest, "attnd"):
        p.append("%s: ENTRYPOINT %s is not where COPY put attnd (%s)" % (name, epj[0], dest))
    user = run.last("USER")
    uid = user.args.split(":")[0] if user else "0"
    if not uid.isdigit() or int(uid) == 0:
        p.append("%s: the runtime stage needs a numeric non-root USER (got %r)"
                 % (name, user.args if user else None))
    elif not any("--uid %s" % uid in i.args for i in run.all("RUN")):
        p.append("%s: no RUN creates the user with uid %s" % (name, uid))
    if user and ep and user.line > ep.line:
        p.append("%s: USER comes after ENTRYPOINT" % name)
    host, port = listen_port(run.env)
    if "ATTND_LISTEN" not in run.env or host not in ("0.0.0.0", "[::]", "::"):
        p.append("%s: ENV ATTND_LISTEN must listen on all interfaces (0.0.0.0:8080), got %r"
                 % (name, run.env.get("ATTND_LISTEN")))
    exposed = [t.split("/")[0] for e in run.all("EXPOSE") for t in e.args.split()]
    if exposed != [str(port)] or port != 8080:
        p.append("%s: EXPOSE %s but ATTND_LISTEN's port is %d (want 8080)"
                 % (name, exposed, port))
    hc = run.last("HEALTHCHECK")
    if not hc:
        p.append("%s: no HEALTHCHECK" % name)
    else:
        opts, cmd = parse_healthcheck(hc)
        for k, v in opts.items():
            if k not in ("interval", "timeout", "start-period", "start-interval", "retries"):
                p.append("%s: HEALTHCHECK --%s is not an option" % (name, k))
            elif k == "retries":
                if not v.isdigit():
                    p.append("%s: HEALTHCHECK --retries=%s" % (name, v))
            else:
                try:
                    duration_s(v)
                except ValueError:
                    p.append("%s: HEALTHCHECK --%s=%s is not a duration" % (name, k, v))
        if not re.search(r"/readyz\b", cmd):
            p.append("%s: HEALTHCHECK should probe /readyz: %s" % (name, cmd))
    return p


def check_build_packages(name, pkgs, deps):
    """The build stage installs DEPS less the documented exclusions, and
    nothing else."""
    want = {d for d in deps if not dep_excluded(d)}
    p = []
    for d in sorted(want - set(pkgs)):
        p.append("%s: the build stage does not install %s (in the Makefile's DEPS); install "
                 "it, or add it to DEPS_NOT_IN_IMAGE with the reason" % (name, d))
    for d in sorted(set(pkgs) - want):
        why = dep_excluded(d)
        p.append("%s: the build stage installs %s, %s" % (
            name, d, "which is documented as not needed (%s)" % why if why
            else "which is not in the Makefile's DEPS"))
    return p


def check_runtime_packages(name, pkgs, needed_debian):
    """The runtime stage installs the packages of the libraries the binaries
    link (Debian names, mapped for Ubuntu), the documented extras, nothing else."""
    cuda = name == "Dockerfile"
    want, p = set(), []
    for d in sorted(set(needed_debian) - BASE_PACKAGES):
        if cuda:
            if d not in UBUNTU_NOBLE_NAME:
                p.append("%s: the binaries need %s; add its Ubuntu 24.04 name to "
                         "UBUNTU_NOBLE_NAME" % (name, d))
                continue
            d = UBUNTU_NOBLE_NAME[d]
        want.add(d)
    want |= set(RUNTIME_EXTRAS)
    for d in sorted(want - set(pkgs)):
        p.append("%s: the runtime stage does not install %s" % (name, d))
    for d in sorted(set(pkgs) - want):
        p.append("%s: the runtime stage installs %s, which the binaries do not need" % (name, d))
    return p


def check_grace(deployment, drain_timeout, drain_delay=0.0, handover=0.0):
    """The pod's grace period covers the preStop sleep, attnd's drain delay
    (SIGTERM to the drain's start), its drain timeout and, when it hands its
    sessions over (ATTND_HANDOVER), the handover's timeout."""
    pod = deployment["spec"]["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    p, sleep = [], 0.0
    for c in pod["containers"]:
        pre = ((c.get("lifecycle") or {}).get("preStop") or {})
        if "sleep" in pre:
            sleep = max(sleep, float(pre["sleep"]["seconds"]))
        elif "exec" in pre:
            cmd = pre["exec"]["command"]
            if os.path.basename(cmd[0]) != "sleep" or len(cmd) != 2:
                p.append("preStop should be `sleep N`, is %s" % cmd)
            else:
                sleep = max(sleep, float(cmd[1]))
        else:
            p.append("container %s has no preStop sleep" % c["name"])
    if sleep <= 0:
        p.append("the preStop sleep must be positive")
    if not grace > drain_timeout + drain_delay + handover + sleep:
        p.append("terminationGracePeriodSeconds %s is not more than ATTND_DRAIN_TIMEOUT %g + "
                 "ATTND_DRAIN_DELAY %g + ATTND_HANDOVER_TIMEOUT %g + preStop %g"
                 % (grace, drain_timeout, drain_delay, handover, sleep))
    return p


def resolve_port(container, port):
    if isinstance(port, int):
        return port
    for cp in container.get("ports") or []:
        if cp.get("name") == port:
            return cp["containerPort"]
    return None


def check_k8s(docs, image_uid, routes, gauges=None):
    """Cross-references between the manifests, and with the server."""
    p = []
    for f, d in docs:
        for k in ("apiVersion", "kind"):
            if k not in d:
                p.append("%s: a document without %s" % (f, k))
        if not (d.get("metadata") or {}).get("name"):
            p.append("%s: a %s without metadata.name" % (f, d.get("kind")))
    dep = k8s_kind(docs, "StatefulSet")
    svc = k8s_kind(docs, "Service", dep["spec"].get("serviceName"))
    hpa = k8s_kind(docs, "HorizontalPodAutoscaler")
    cm = k8s_kind(docs, "ConfigMap", "attnd-config")
    pod, c = k8s_container(docs)
    tmpl = dep["spec"]["template"]
    labels = tmpl["metadata"].get("labels") or {}
    env = dict(runtime_stage("Dockerfile").env, **(cm.get("data") or {}))
    host, port = listen_port(env)
    if host not in ("0.0.0.0", "[::]", "::"):
        p.append("ATTND_LISTEN %s: probes and the Service cannot reach it" % env["ATTND_LISTEN"])

    for k, v in (cm.get("data") or {}).items():
        if not isinstance(v, str):
            p.append("ConfigMap %s: %r must be a string (quote it)" % (k, v))
    refs = [e["configMapRef"]["name"] for e in c.get("envFrom") or [] if "configMapRef" in e]
    if cm["metadata"]["name"] not in refs:
        p.append("the attnd container does not envFrom the ConfigMap %s" % cm["metadata"]["name"])

    sel = dep["spec"]["selector"].get("matchLabels") or {}
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        p.append("the StatefulSet's selector %s does not match its pod labels %s" % (sel, labels))
    if "replicas" in dep["spec"]:
        p.append("the HPA owns the replica count: leave spec.replicas out of the StatefulSet")

    lim = (c.get("resources") or {}).get("limits") or {}
    req = (c.get("resources") or {}).get("requests") or {}
    if str(lim.get("nvidia.com/gpu")) != "1":
        p.append("the container should limit nvidia.com/gpu to 1, has %r" % lim.get("nvidia.com/gpu"))
    budget = int(env.get("ATTND_MAX_QUEUE", "64")) * size_bytes(env.get("ATTND_MAX_BODY", "1G"))
    if "memory" not in lim or budget > 0.75 * quantity_bytes(lim["memory"]):
        p.append("ATTND_MAX_QUEUE x ATTND_MAX_BODY = %d bytes of request bodies does not fit in "
                 "3/4 of the memory limit %s" % (budget, lim.get("memory")))

    ports = [cp.get("containerPort") for cp in c.get("ports") or []]
    if ports != [port]:
        p.append("containerPort %s, but attnd listens on %d" % (ports, port))
    probes = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": None}
    for probe, want in probes.items():
        pr = c.get(probe)
        if pr is None:
            if want:
                p.append("no %s" % probe)
            continue
        g = pr.get("httpGet") or {}
        if want and g.get("path") != want:
            p.append("%s path %r, want %s" % (probe, g.get("path"), want))
        if g.get("path") not in routes:
            p.append("%s path %r is not a route of attnd (%s)" % (probe, g.get("path"),
                                                                  sorted(routes)))
        if resolve_port(c, g.get("port")) != port:
            p.append("%s port %r is not %d" % (probe, g.get("port"), port))

    ann = tmpl["metadata"].get("annotations") or {}
    want_ann = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics"}
    for k, v in want_ann.items():
        if ann.get(k) != v:
            p.append("pod annotation %s is %r, want %r (a string)" % (k, ann.get(k), v))
    for k, v in ann.items():
        if not isinstance(v, str):
            p.append("annotation %s: %r must be a string" % (k, v))
    if "/metrics" not in routes:
        p.append("attnd serves no /metrics")

    sc = dict(pod.get("securityContext") or {}, **(c.get("securityContext") or {}))
    if not sc.get("runAsNonRoot"):
        p.append("set runAsNonRoot")
    if sc.get("runAsUser") not in (None, image_uid):
        p.append("runAsUser %s differs from the image's USER %s" % (sc.get("runAsUser"), image_uid))

    ssel = svc["spec"].get("selector") or {}
    if not ssel or any(labels.get(k) != v for k, v in ssel.items()):
        p.append("the Service selector %s does not select the pods %s" % (ssel, labels))
    for sp in svc["spec"].get("ports") or []:
        if resolve_port(c, sp.get("targetPort", sp.get("port"))) != port:
            p.append("Service port %s targets %r, not attnd's %d" % (sp.get("port"),
                                                                    sp.get("targetPort"), port))

    ref = hpa["spec"]["scaleTargetRef"]
    if (ref.get("kind"), ref.get("name"), ref.get("apiVersion")) != (
            "StatefulSet", dep["metadata"]["name"], dep["apiVersion"]):
        p.append("the HPA targets %s, not the StatefulSet" % ref)
    lo, hi = hpa["spec"].get("minReplicas", 1), hpa["spec"]["maxReplicas"]
    if not 1 <= lo <= hi:
        p.append("HPA replicas %s..%s" % (lo, hi))
    for m in hpa["spec"].get("metrics") or []:
        if m.get("type") == "Resource" and m["resource"]["name"] not in req:
            p.append("the HPA scales on %s utilization but the container requests no %s"
                     % (m["resource"]["name"], m["resource"]["name"]))
        if m.get("type") == "Pods" and gauges is not None and \
                m["pods"]["metric"]["name"] not in gauges:
            p.append("the HPA scales on %s, which is no gauge attnd serves (%s)"
                     % (m["pods"]["metric"]["name"], sorted(gauges)))
    return p


def check_compose(doc, load_flags, drain_timeout, routes):
    p = []
    svcs = doc.get("services") or {}
    a = svcs.get("attnd")
    if not a:
        return ["compose: no attnd service"]
    b = a.get("build") or {}
    ctx = os.path.normpath(os.path.join(DOCKER, b.get("context", ".")))
    if ctx != os.path.normpath(ROOT):
        p.append("compose: build context %s is not the repository root" % ctx)
    if not os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))):
        p.append("compose: dockerfile %s not found in the context" % b.get("dockerfile"))
    arch = str((b.get("args") or {}).get("CUDA_ARCHS", "80;89;90"))
    if not re.match(r"^\d+(;\d+)*$", arch):
        p.append("compose: CUDA_ARCHS %r is not a ;-separated list" % arch)
    devs = ((((a.get("deploy") or {}).get("resources") or {}).get("reservations") or {})
            .get("devices") or [])
    if not any(d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])
               for d in devs):
        p.append("compose: attnd reserves no GPU (deploy.resources.reservations.devices)")
    env = dict(runtime_stage("Dockerfile").env, **compose_env(a))
    _, port = listen_port(env)
    published = [str(x).rsplit(":", 1)[-1].split("/")[0] for x in a.get("ports") or []]
    if published != [str(port)]:
        p.append("compose: ports %s do not publish attnd's %d" % (a.get("ports"), port))
    hc = (a.get("healthcheck") or {}).get("test") or []
    if not hc or hc[0] not in ("CMD", "CMD-SHELL") or "/readyz" not in " ".join(hc):
        p.append("compose: the healthcheck should probe /readyz: %s" % hc)
    try:
        grace = duration_s(a.get("stop_grace_period", "10s"))
    except ValueError as e:
        grace = 0
        p.append("compose: %s" % e)
    if not grace > drain_timeout:
        p.append("compose: stop_grace_period %gs is not more than ATTND_DRAIN_TIMEOUT %g"
                 % (grace, drain_timeout))
    ld = svcs.get("load")
    if not ld:
        return p + ["compose: no load service"]
    if "load" not in (ld.get("profiles") or []):
        p.append("compose: the load service should be in the profile \"load\"")
    if ld.get("image") != a.get("image"):
        p.append("compose: load runs image %s, attnd builds %s" % (ld.get("image"), a.get("image")))
    ep = ld.get("entrypoint") or []
    cmd = ld.get("command") or []
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if not ep or os.path.basename(ep[0]) != "attn" or not cmd or cmd[0] != "load":
        p.append("compose: the load service should run attn load, runs %s %s" % (ep, cmd))
    p += check_flags(cmd[1:], load_flags, "compose load (attn load)")
    urls = [x for x in cmd if str(x).startswith("http")]
    m = re.match(r"^http://([^:/]+):(\d+)", urls[0]) if urls else None
    if not m or m.group(1) != "attnd" or int(m.group(2)) != port:
        p.append("compose: attn load should target http://attnd:%d, targets %s" % (port, urls))
    dep = (ld.get("depends_on") or {})
    if not isinstance(dep, dict) or (dep.get("attnd") or {}).get("condition") != "service_healthy":
        p.append("compose: load should wait for attnd with condition service_healthy")
    return p


# ---------------------------------------------------------------------------
# Helpers that run things.
# ---------------------------------------------------------------------------
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2, headers=None):
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}
    env.update(extra)
    return env


class Running:
    """attnd started with an environment (no flags), on 127.0.0.1:<free port>."""

    def __init__(self, env, tmp_path):
        self.log_path = os.path.join(str(tmp_path), "attnd-%d.log" % id(self))
        self.port = free_port()
        self.env = dict(env, ATTND_LISTEN="127.0.0.1:%d" % self.port)
        self.url = "http://127.0.0.1:%d" % self.port
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([attnd_bin()], env=clean_env(self.env),
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return
            try:
                if http_get(self.url + "/healthz", 1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


def local_session_dir(env, tmp_path):
    """The deployment's ATTND_SESSION_DIR (a volume there) made here, an
    empty directory of our own: attnd exits 2 without it."""
    if not env.get("ATTND_SESSION_DIR"):
        return env
    d = os.path.join(str(tmp_path), "sessions")
    os.makedirs(d, exist_ok=True)
    return dict(env, ATTND_SESSION_DIR=d)


def start_attnd(env, tmp_path):
    """Starts attnd with `env`. A CUDA backend on a machine without a GPU
    exits 2 with "no CUDA device": then ATTND_BACKEND is checked to be one
    --help lists and the server is started again with auto."""
    srv = Running(env, tmp_path)
    if srv.proc.poll() is not None and env.get("ATTND_BACKEND") == "cuda" \
            and "no CUDA device" in srv.log():
        srv = Running(dict(env, ATTND_BACKEND="auto"), tmp_path)
        srv.fell_back = True
    else:
        srv.fell_back = False
    return srv


def shell_with(cmd, env, timeout=15):
    return subprocess.run(["/bin/sh", "-c", cmd], env=clean_env(env), capture_output=True,
                          text=True, timeout=timeout)


def make_deps():
    """The Makefile's DEPS: a multi-line variable with backslash continuations."""
    text = read(os.path.join(ROOT, "Makefile"))
    m = re.search(r"^DEPS\s*[:?]?=((?:.*\\\n)*.*)$", text, re.M)
    assert m, "no DEPS = ... in the Makefile"
    value = re.sub(r"\\\n", " ", m.group(1)).split("#")[0]
    return value.split()


def needed_packages(binaries):
    """Debian packages of the libraries the binaries link directly (DT_NEEDED),
    through ldconfig's cache and dpkg -S. Libraries no package owns (a CUDA
    toolkit from a tarball) come from the CUDA base image: skipped."""
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    paths = {}
    for line in cache.splitlines():
        m = re.match(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if m and ("x86-64" in m.group(2) or "64bit" in m.group(2) or "AArch64" in m.group(2)):
            paths.setdefault(m.group(1), m.group(3))
    pkgs = {}
    for b in binaries:
        dyn = subprocess.run(["readelf", "-d", b], capture_output=True, text=True, check=True)
        for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn.stdout):
            if lib.startswith(("libcuda", "libcudart", "libcublas", "libnvidia")):
                continue
            # A SAN=1 build links the sanitizer runtimes; images never do.
            if lib.startswith(("libasan", "libubsan", "liblsan", "libtsan")):
                continue
            path = paths.get(lib)
            assert path, "%s links %s, which ldconfig does not know" % (b, lib)
            real = os.path.realpath(path)
            owner = None
            for cand in (path, real, re.sub(r"^/usr/lib/", "/lib/", real),
                         re.sub(r"^/lib/", "/usr/lib/", real)):
                r = subprocess.run(["dpkg", "-S", cand], capture_output=True, text=True)
                if r.returncode == 0:
                    owner = r.stdout.split(":")[0].strip()
                    break
            assert owner, "no Debian package owns %s (%s)" % (lib, path)
            pkgs[lib] = owner
    return pkgs


# ---------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------
def test_yaml_files_parse():
    files = [os.path.join(DOCKER, f) for f in COMPOSE_FILES] + \
        [os.path.join(K8S, f) for f in sorted(os.listdir(K8S)) if f.endswith((".yaml", ".yml"))]
    assert len(files) >= 5
    for f in files:
        docs = [d for d in yaml.safe_load_all(read(f)) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), f
    kinds = sorted(d["kind"] for _, d in k8s_docs())
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget", "Secret", "Service", "Service",
                     "StatefulSet"], kinds


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_parses_and_is_sane(name):
    global_args, stages = dockerfile(name)
    assert check_dockerfile(name, stages, global_args) == []


def test_dockerfile_parser():
    text = ("# c\nARG V=1.0\nFROM img:${V} AS b\nRUN a \\\n  # inside\n  && b\n"
            "ENV A=1 \\\n    B=\"x y\"\nFROM scratch AS r\nENTRYPOINT [\"/x\"]\n")
    g, st = stages_of(parse_dockerfile(text))
    assert g == {"V": "1.0"} and [(s.image, s.name) for s in st] == [("img:1.0", "b"),
                                                                      ("scratch", "r")]
    assert st[0].instrs[0].args == "a   && b" and st[0].env == {"A": "1", "B": "x y"}
    assert st[1].last("ENTRYPOINT").json_args() == ["/x"]
    for bad in ("FROM a\nRUN x \\\n", "FROM a\nEXPOSES 80\n", "RUN x\n", "FROM a b c d\n"):
        with pytest.raises(DockerfileError):
            stages_of(parse_dockerfile(bad))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_stage_runs_the_makefile_targets(name, tmp_path):
    """The RUN that builds, executed by /bin/sh with a fake make that records
    its arguments: the targets, CUDA=1/0, and CUDA_ARCHS turned from "80;89;90"
    (or a --build-arg) into the Makefile's "80 89 90"."""
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "argv.json"
    (fake / "make").write_text("#!/usr/bin/python3\nimport json, sys\n"
                               "open(%r, 'w').write(json.dumps(sys.argv[1:]))\n" % str(record))
    (fake / "make").chmod(0o755)
    cuda = name == "Dockerfile"
    for build_args, want_archs in ((None, "80 89 90"), ({"CUDA_ARCHS": "75;86"}, "75 86")):
        _, stages = dockerfile(name, build_args)
        build = stages[0]
        runs = [i for i in build.all("RUN") if "build/attnd" in i.args]
        assert len(runs) == 1, "one RUN that makes build/attnd in the build stage"
        env = dict(build.args, PATH="%s:/usr/bin:/bin" % fake)
        r = shell_with(runs[0].args, env)
        assert r.returncode == 0, r.stderr
        argv = json.loads(record.read_text())
        assert argv[-2:] == ["build/attnd", "build/attn"], argv
        assert ("CUDA=1" if cuda else "CUDA=0") in argv, argv
        if cuda:
            assert "CUDA_ARCHS=" + want_archs in argv, argv
        assert not any("native" in a for a in argv)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_stage_copies_what_make_needs(name, tmp_path):
    """The build stage's COPY instructions, replayed into an empty folder:
    `make -n` must find every source of build/attnd and build/attn there, and
    its commands use none of the packages left out of the image."""
    _, stages = dockerfile(name)
    build = stages[0]
    workdir = build.last("WORKDIR").args
    ctx = tmp_path / "src"
    ctx.mkdir()
    for c in build.all("COPY"):
        toks = c.args.split()
        assert not any(t.startswith("--from") for t in toks)
        dest = os.path.join(workdir, toks[-1])
        target = os.path.join(str(ctx), os.path.relpath(dest, workdir))
        for src in toks[:-1]:
            s = os.path.join(ROOT, src)
            assert os.path.exists(s), "COPY %s: not in the repository" % src
            if os.path.isdir(s):
                shutil.copytree(s, target, dirs_exist_ok=True)
            else:
                if toks[-1].endswith("/"):
                    os.makedirs(target, exist_ok=True)
                shutil.copy(s, target)
    # Under `make test BUILD=... SAN=1` those variables reach this make through
    # MAKEFLAGS and the environment; the image's build sees none of them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BUILD", "SAN", "WERROR", "CUDA",
                        "CUDA_ARCHS")}
    r = subprocess.run(["make", "-n", "-B", "CUDA=0", "build/attnd", "build/attn"],
                       cwd=str(ctx), capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    links = [l for l in r.stdout.splitlines() if re.search(r"-o build/attnd? ", l)]
    assert len(links) == 2, r.stdout[-2000:]
    for word in ("criterion", "clang", "wrk", "python3"):
        assert word not in r.stdout, "make build/attnd build/attn uses %s" % word


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_stage_installs_the_makefile_deps(name):
    deps = make_deps()
    assert "libmicrohttpd-dev" in deps and "gcc" in deps, deps
    build = dockerfile(name)[1][0]
    pkgs = [p for i in build.all("RUN") for p in apt_packages(i.args)]
    assert check_build_packages(name, pkgs, deps) == []


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runtime_stage_installs_the_libraries_the_binaries_link(name):
    if not shutil.which("dpkg") or not shutil.which("readelf"):
        pytest.skip("needs dpkg and readelf (a Debian host)")
    needed = needed_packages([attnd_bin(), attn_bin()])
    assert "libmicrohttpd12" in needed.values(), needed
    run = runtime_stage(name)
    pkgs = [p for i in run.all("RUN") for p in apt_packages(i.args)]
    assert check_runtime_packages(name, pkgs, set(needed.values())) == []


def test_env_and_flags_are_the_servers(server_help, load_help):
    """Every ATTND_* name anywhere in the Dockerfiles, compose file, manifests
    and docker/README.md, and every --flag given to attnd, is one attnd --help
    lists; the load service's flags are attn load's."""
    envs, flags = server_help["envs"], set(server_help["flags"])
    p = []
    for f in DOCKERFILES + COMPOSE_FILES + ["README.md"]:
        p += check_env_names(tokens_in(read(os.path.join(DOCKER, f))), envs, f)
    for f in os.listdir(K8S):
        p += check_env_names(tokens_in(read(os.path.join(K8S, f))), envs, "k8s/" + f)
    for name in DOCKERFILES:
        for s in dockerfile(name)[1]:
            p += check_env_names([k for k in s.env if k.startswith("ATTND")], envs, name)
            for i in s.all("CMD") + s.all("ENTRYPOINT"):
                p += check_flags(i.json_args() or shlex.split(i.args), flags, name)
    comp = compose_interpolate(compose(), {})
    a = comp["services"]["attnd"]
    p += check_env_names(compose_env(a), envs, "compose attnd")
    cmd = a.get("command") or []
    p += check_flags(shlex.split(cmd) if isinstance(cmd, str) else cmd, flags, "compose attnd")
    docs = k8s_docs()
    _, c = k8s_container(docs)
    p += check_env_names((k8s_kind(docs, "ConfigMap", "attnd-config").get("data") or {}).keys(),
                         envs, "ConfigMap")
    p += check_env_names([e["name"] for e in c.get("env") or []], envs, "StatefulSet env")
    p += check_flags((c.get("command") or [])[1:] + (c.get("args") or []), flags, "StatefulSet")
    ld = comp["services"]["load"]
    p += check_flags(ld["command"][1:], load_help, "compose load (attn load)")
    for f in COMPOSE_FILES[1:]:
        for name, s in (compose_interpolate(compose(f), {}).get("services") or {}).items():
            if name.startswith("attnd"):
                p += check_env_names(compose_env(s), envs, "%s %s" % (f, name))
                cmd = s.get("command") or []
                p += check_flags(shlex.split(cmd) if isinstance(cmd, str) else cmd, flags,
                                 "%s %s" % (f, name))
    assert p == []


def test_compose(server_help, load_help):
    comp = compose_interpolate(compose(), {})
    drain = float(effective_envs()["compose"].get("ATTND_DRAIN_TIMEOUT", "30"))
    assert check_compose(comp, load_help, drain, server_help["routes"]) == []


def test_kubernetes_manifests(server_help, served_gauges):
    uid = int(runtime_stage("Dockerfile").last("USER").args.split(":")[0])
    assert check_k8s(k8s_docs(), uid, server_help["routes"], served_gauges) == []


def test_grace_period_covers_drain_and_prestop():
    env = effective_envs()["k8s"]
    drain = float(env.get("ATTND_DRAIN_TIMEOUT", "30"))
    delay = float(env.get("ATTND_DRAIN_DELAY", "0"))
    handover = float(env.get("ATTND_HANDOVER_TIMEOUT", "30")) if env.get("ATTND_HANDOVER") else 0
    assert check_grace(k8s_kind(k8s_docs(), "StatefulSet"), drain, delay, handover) == []


def test_every_port_is_the_listen_port():
    for name, env in effective_envs().items():
        host, port = listen_port(env)
        assert (host, port) == ("0.0.0.0", 8080), (name, env.get("ATTND_LISTEN"))


@pytest.mark.parametrize("which", ["Dockerfile", "Dockerfile.cpu", "compose", "compose.scale",
                                   "k8s"])
def test_server_accepts_the_configuration(which, server_help, tmp_path):
    """attnd started with exactly the environment of this deployment (the
    listen address moved to a free loopback port) comes up, serves the probe
    paths, passes its health check, and exits 0 on SIGTERM within the drain
    timeout."""
    env = effective_envs()[which]
    auth = {}
    if env.get("ATTND_API_KEY_FILE"):
        # the Secret the manifest mounts, made here at a path of our own
        key = os.path.join(str(tmp_path), "api-key")
        with open(key, "w") as f:
            f.write("test-key-0123\n")
        env = dict(env, ATTND_API_KEY_FILE=key)
        auth = {"Authorization": "Bearer test-key-0123"}
    env = local_session_dir(env, tmp_path)
    srv = start_attnd(env, tmp_path)
    try:
        assert srv.proc.poll() is None, "attnd exited %s with %s:\n%s" % (
            srv.proc.returncode, {k: v for k, v in env.items() if k.startswith("ATTND")},
            srv.log())
        if srv.fell_back:
            assert re.search(r"--backend .*\bcuda\b", server_help["text"]), \
                "cuda is not a backend attnd --help lists"
        for path in ("/healthz", "/readyz"):
            status, body = http_get(srv.url + path)
            assert status == 200, (path, status, body)
        assert "attnd_requests_total" in http_get(srv.url + "/metrics", headers=auth)[1]
        if auth:
            assert http_get(srv.url + "/metrics")[0] == 401, "the key is not required"
        assert http_get(srv.url + "/no-such-route", headers=auth)[0] == 404
        checks = []
        if which.startswith("Dockerfile"):
            checks.append(parse_healthcheck(runtime_stage(which).last("HEALTHCHECK"))[1])
        elif which == "compose":
            checks.append(compose_interpolate(compose(), {})["services"]["attnd"]
                          ["healthcheck"]["test"][1])
        for cmd in checks:
            r = shell_with(cmd, srv.env)
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
            dead = dict(srv.env, ATTND_LISTEN="127.0.0.1:%d" % free_port())
            assert shell_with(cmd, dead).returncode != 0, "the health check passes with no server"
    finally:
        status = srv.stop(timeout=float(env.get("ATTND_DRAIN_TIMEOUT", "30")) +
                          float(env.get("ATTND_DRAIN_DELAY", "0")) + 5)
    assert status == 0, "attnd exited %s on SIGTERM\n%s" % (status, srv.log())


def test_compose_load_command_runs(server_help, tmp_path):
    """The load service's command (interpolated with LOAD_DURATION=1), aimed
    at a local attnd instead of http://attnd:8080: it must run and get 2xx."""
    srv = start_attnd(dict(effective_envs()["compose"], ATTND_BACKEND="auto"), tmp_path)
    try:
        assert srv.proc.poll() is None, srv.log()
        ld = compose_interpolate(compose(), {"LOAD_DURATION": "1", "LOAD_CONCURRENCY": "2",
                                             "LOAD_SHAPE": "1,2,64,32"})["services"]["load"]
        cmd = [attn_bin()] + [srv.url if str(a).startswith("http://attnd") else str(a)
                              for a in ld["command"]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        m = re.search(r"successful \(2xx\) (\d+)", r.stdout)
        assert m and int(m.group(1)) > 0, r.stdout
    finally:
        assert srv.stop(timeout=35) == 0, srv.log()


def test_readme_commands_and_metrics(server_help, tmp_path):
    text = read(os.path.join(DOCKER, "README.md"))
    for s in ("docker build -f docker/Dockerfile ", "docker build -f docker/Dockerfile.cpu ",
              "docker run --gpus all -p 8080:8080", "docker compose -f docker/compose.yaml up",
              "--profile load", "kubectl apply -f docker/k8s/", "What was verified where",
              "docker compose -f docker/compose.scale.yaml up",
              "-f docker/compose.scale.gpu.yaml", "server-template", "maxReplicas"):
        assert s in text, "docker/README.md lacks %r" % s
    # The adapter rule: the same in the README and in hpa.yaml's comment, and
    # it exposes the metric the HPA asks for.
    rule_md = re.search(r"```yaml\n(rules:\n.*?)```", text, re.S)
    assert rule_md, "docker/README.md lacks the prometheus-adapter rules: snippet"
    hpa_text = read(os.path.join(K8S, "hpa.yaml"))
    m = re.search(r"^#   rules:\n(?:#  .*\n)+", hpa_text, re.M)
    assert m, "hpa.yaml's comment lacks the adapter rule"
    rule_hpa = "".join(ln[4:] + "\n" for ln in m.group(0).splitlines())
    assert yaml.safe_load(rule_md.group(1)) == yaml.safe_load(rule_hpa)
    rule = yaml.safe_load(rule_hpa)["rules"][0]
    hpa = k8s_kind(k8s_docs(), "HorizontalPodAutoscaler")
    wanted = [x["pods"]["metric"]["name"] for x in hpa["spec"]["metrics"] if x["type"] == "Pods"]
    assert wanted == [rule["name"]["as"]], (wanted, rule["name"])
    assert re.match(rule["name"]["matches"], "attnd_queue_depth")
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(DOCKER, link)), "broken link %s" % link
    names = tokens_in(text, r"\battnd_[a-z_]+\b")
    srv = start_attnd({"ATTND_BACKEND": "cpu", "ATTND_THREADS": "1"}, tmp_path)
    try:
        metrics = http_get(srv.url + "/metrics")[1]
    finally:
        srv.stop(timeout=35)
    served = set(re.findall(r"^# TYPE (attnd_[a-z_]+) ", metrics, re.M))
    assert names <= served, "README names metrics attnd does not serve: %s" % (names - served)


# ---------------------------------------------------------------------------
# Each check fails when what it checks breaks.
# ---------------------------------------------------------------------------
def test_catches_a_misspelt_variable_or_flag(server_help, load_help):
    docs = k8s_docs()
    cm = k8s_kind(docs, "ConfigMap", "attnd-config")
    data = dict(cm["data"])
    data["ATTND_MAX_QEUE"] = data.pop("ATTND_MAX_QUEUE")
    assert check_env_names(data, server_help["envs"], "ConfigMap")
    assert check_flags(["--max-queue", "8", "--drain-timout", "3"], set(server_help["flags"]), "x")
    comp = compose_interpolate(compose(), {})
    comp["services"]["load"]["command"] = [
        "--concurency" if c == "--concurrency" else c for c in comp["services"]["load"]["command"]]
    assert any("--concurency" in x for x in check_compose(comp, load_help, 30,
                                                          server_help["routes"]))


def test_catches_a_bad_value(tmp_path):
    env = dict(effective_envs()["k8s"], ATTND_MAX_BODY="256MB", ATTND_BACKEND="auto")
    srv = start_attnd(local_session_dir(env, tmp_path), tmp_path)
    srv.stop(timeout=5)
    assert srv.proc.returncode == 2 and "ATTND_MAX_BODY" in srv.log(), srv.log()


def test_catches_dockerfile_mistakes():
    text = read(os.path.join(DOCKER, "Dockerfile"))
    cases = {
        "EXPOSE 8080": "EXPOSE 8081",
        "USER 10001:10001": "USER root",
        '/readyz" ||': '/ready" ||',
        "ATTND_LISTEN=0.0.0.0:8080": "ATTND_LISTEN=127.0.0.1:8080",
        'CUDA_ARCHS="80;89;90"': 'CUDA_ARCHS="native"',
        "-runtime-ubuntu24.04": "-runtime-ubuntu22.04",
        "/src/build/attnd /src/build/attn": "/src/build /src/build/attn",
        " \\\n && rm -rf /var/lib/apt/lists/*\n\nWORKDIR": "\n\nWORKDIR",
    }
    for old, new in cases.items():
        assert old in text, old
        g, st = stages_of(parse_dockerfile(text.replace(old, new, 1)))
        assert check_dockerfile("Dockerfile", st, g), "not caught: %s -> %s" % (old, new)


def test_catches_package_drift():
    deps = make_deps()
    build = dockerfile("Dockerfile.cpu")[1][0]
    pkgs = [p for i in build.all("RUN") for p in apt_packages(i.args)]
    assert check_build_packages("x", pkgs, deps + ["libnuma-dev"])
    assert check_build_packages("x", [p for p in pkgs if p != "libuv1-dev"], deps)
    assert check_build_packages("x", pkgs + ["libcriterion-dev"], deps)
    needed = {"libc6", "libmicrohttpd12", "libuv1", "libcjson1", "libcurl4", "libgnutls30",
              "zlib1g"}
    run = [p for i in runtime_stage("Dockerfile").all("RUN") for p in apt_packages(i.args)]
    assert check_runtime_packages("Dockerfile", run, needed) == []
    assert check_runtime_packages("Dockerfile", [p for p in run if p != "libuv1t64"], needed)
    assert check_runtime_packages("Dockerfile", run + ["libuv1"], needed)
    assert check_runtime_packages("Dockerfile", run, needed | {"libnuma1"})


def test_catches_manifest_mistakes(server_help, served_gauges):
    docs = k8s_docs()
    uid = int(runtime_stage("Dockerfile").last("USER").args.split(":")[0])
    routes = server_help["routes"]

    def mutated(fn):
        d = copy.deepcopy(docs)
        fn(by_kind(d))
        return check_k8s(d, uid, routes, served_gauges)

    def pod(k):
        return k["StatefulSet"]["spec"]["template"]

    def ctr(k):
        return pod(k)["spec"]["containers"][0]

    breaks = [
        lambda k: ctr(k)["readinessProbe"]["httpGet"].__setitem__("path", "/ready"),
        lambda k: ctr(k)["livenessProbe"]["httpGet"].__setitem__("port", 8081),
        lambda k: ctr(k)["ports"][0].__setitem__("containerPort", 80),
        lambda k: k["Service"]["spec"]["ports"][0].__setitem__("targetPort", "web"),
        lambda k: k["Service"]["spec"]["selector"].__setitem__("app.kubernetes.io/name", "x"),
        lambda k: pod(k)["metadata"]["annotations"].__setitem__("prometheus.io/port", 8080),
        lambda k: pod(k)["metadata"]["annotations"].__setitem__("prometheus.io/path", "/m"),
        lambda k: ctr(k)["resources"]["limits"].pop("nvidia.com/gpu"),
        lambda k: k["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]
        .__setitem__("name", "attnd_queue_dept"),
        lambda k: ctr(k)["envFrom"][0]["configMapRef"].__setitem__("name", "other"),
        lambda k: k["ConfigMap"]["data"].__setitem__("ATTND_MAX_QUEUE", 32),
        lambda k: k["ConfigMap"]["data"].__setitem__("ATTND_MAX_BODY", "1G"),
        lambda k: k["ConfigMap"]["data"].__setitem__("ATTND_LISTEN", "127.0.0.1:8080"),
        lambda k: k["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"].__setitem__("name", "y"),
        lambda k: k["StatefulSet"]["spec"].__setitem__("replicas", 3),
        lambda k: pod(k)["spec"]["securityContext"].__setitem__("runAsUser", 0),
    ]
    for i, fn in enumerate(breaks):
        assert mutated(fn), "mutation %d not caught" % i
    dep = copy.deepcopy(k8s_kind(docs, "StatefulSet"))
    assert check_grace(dep, 30, 5, 30) == []
    assert check_grace(dep, 30, 15, 30)
    dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 36
    assert check_grace(dep, 30, 5)
    dep["spec"]["template"]["spec"]["containers"][0].pop("lifecycle")
    assert check_grace(dep, 30)


def test_catches_compose_mistakes(server_help, load_help):
    base = compose_interpolate(compose(), {})

    def broken(fn):
        d = copy.deepcopy(base)
        fn(d["services"])
        return check_compose(d, load_help, 30, server_help["routes"])

    assert broken(lambda s: s["attnd"].__setitem__("stop_grace_period", "30s"))
    assert broken(lambda s: s["attnd"]["deploy"]["resources"]["reservations"]
                  ["devices"][0].__setitem__("driver", "amd"))
    assert broken(lambda s: s["attnd"].__setitem__("ports", ["8080:80"]))
    assert broken(lambda s: s["attnd"]["build"].__setitem__("context", "."))
    assert broken(lambda s: s["load"]["command"].__setitem__(1, "http://attnd:80"))
    assert broken(lambda s: s["load"].pop("depends_on"))
    assert broken(lambda s: s["attnd"]["environment"].__setitem__("ATTND_LISTEN", "0.0.0.0:9000"))
