#!/usr/bin/env bash
# docker/test-image.sh — builds docker/Dockerfile.cpu's image without a Docker
# engine, then runs attnd from it.
#
#   sudo docker/test-image.sh [WORKDIR]          (default WORKDIR: build/test-image)
#
# How: debootstrap --variant=minbase bookworm stands in for debian:bookworm-slim
# (cached in WORKDIR/base; FRESH=1 makes a new one). Each stage of the
# Dockerfile gets a copy of it, and its instructions run in order, parsed by
# the same parser as tests/python/test_deploy.py: ARG and ENV set the
# environment, WORKDIR the directory, COPY copies from the repository (the
# build context) or an earlier stage, RUN runs `/bin/sh -c` in a chroot with
# /proc and /sys mounted in a private mount namespace. Then the runtime stage's
# ENTRYPOINT starts as its USER with its ENV (ATTND_LISTEN moved to a free
# loopback port), and the script checks /healthz, /readyz, /metrics, the
# HEALTHCHECK command run inside the image, `attn infer --check` from the
# image, and exit status 0 on SIGTERM.
#
# Not covered: the differences between a minbase debootstrap and the
# debian:bookworm-slim image (the latter also lists bookworm-updates and
# bookworm-security, and drops documentation), Docker's isolation (network,
# PID and user namespaces, cgroups), and the CUDA Dockerfile.
#
# Needs root, debootstrap, util-linux (unshare, mount) and deb.debian.org (or
# DEBIAN_MIRROR). KEEP=1 keeps the stage filesystems. Exit status: 0 passed,
# 1 failed, 2 could not run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${1:-$ROOT/build/test-image}

if [ "$(id -u)" != 0 ]; then
  echo "test-image: run as root (debootstrap and chroot)" >&2; exit 2
fi
for tool in debootstrap unshare chroot mount; do
  if ! command -v "$tool" >/dev/null; then
    echo "test-image: $tool not found (apt-get install -y debootstrap)" >&2; exit 2
  fi
done

mkdir -p "$WORK"
exec /usr/bin/python3 - "$ROOT" "$(cd "$WORK" && pwd)" <<'PY'
import json, os, re, shlex, shutil, signal, socket, subprocess, sys, time
import urllib.error, urllib.request

ROOT, WORK = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from test_deploy import parse_dockerfile, parse_assignments, parse_healthcheck, substitute  # noqa

MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
T0 = time.monotonic()


def say(msg):
    print("test-image [%6.1f s] %s" % (time.monotonic() - T0, msg), flush=True)


def fail(msg):
    say("FAIL: " + msg)
    sys.exit(1)


def mounted_under(path):
    path = os.path.realpath(path) + "/"
    with open("/proc/mounts") as f:
        return [l.split()[1] for l in f if (l.split()[1] + "/").startswith(path)]


def remove_tree(path):
    if not os.path.exists(path):
        return
    if mounted_under(path):
        fail("refusing to remove %s: mounts under it: %s" % (path, mounted_under(path)))
    subprocess.run(["rm", "-rf", "--one-file-system", path], check=True)


def chroot_cmd(rootfs, argv, user=None):
    """argv run in rootfs, with /proc and /sys mounted in a private mount
    namespace (they vanish with the process); exec keeps the PID."""
    spec = ["--userspec=" + user] if user else []
    script = ('mount -t proc proc "$0/proc" && mount -t sysfs -o ro sys "$0/sys" && '
              'exec chroot "$@"')
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script,
            rootfs] + spec + [rootfs] + argv


def run_env(env):
    e = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    e.update(env)
    return e


# ---- the base: debootstrap minbase bookworm -----------------------------------
base = os.path.join(WORK, "base")
if os.environ.get("FRESH") == "1":
    remove_tree(base)
if not os.path.exists(os.path.join(base, ".complete")):
    remove_tree(base)
    say("debootstrap --variant=minbase bookworm %s" % MIRROR)
    r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", base, MIRROR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:])
        fail("debootstrap failed")
    open(os.path.join(base, ".complete"), "w").close()
    say("base done")
else:
    say("reusing %s (FRESH=1 to rebuild)" % base)

# ---- the stages ---------------------------------------------------------------
dockerfile = os.path.join(ROOT, "docker", "Dockerfile.cpu")
with open(dockerfile) as f:
    instrs = parse_dockerfile(f.read())

global_args, stages, st = {}, {}, None
for ins in instrs:
    kw = ins.keyword
    if kw == "FROM":
        toks = ins.args.split()
        image = substitute(toks[0], global_args)
        name = toks[2] if len(toks) == 3 else "stage%d" % len(stages)
        rootfs = os.path.join(WORK, name)
        remove_tree(rootfs)
        if image in stages:
            src = stages[image]["rootfs"]
        elif image == "debian:bookworm-slim":
            src = base
        else:
            fail("line %d: FROM %s: only debian:bookworm-slim or an earlier stage" % (ins.line, image))
        say("FROM %s AS %s: copying %s" % (image, name, os.path.basename(src)))
        subprocess.run(["cp", "-a", src, rootfs], check=True)
        st = stages[name] = {"rootfs": rootfs, "vars": {}, "env": {}, "cwd": "/", "user": None,
                             "entrypoint": None, "cmd": [], "healthcheck": None, "expose": []}
        continue
    if st is None:
        if kw == "ARG":
            global_args.update(parse_assignments(ins.args))
            continue
        fail("line %d: %s before FROM" % (ins.line, kw))
    variables = dict(st["vars"], **st["env"])
    if kw == "ARG":
        for k, v in parse_assignments(ins.args).items():
            st["vars"][k] = os.environ.get("BUILD_ARG_" + k, v or global_args.get(k, ""))
    elif kw == "ENV":
        for k, v in parse_assignments(ins.args).items():
            st["env"][k] = substitute(v, variables)
    elif kw == "WORKDIR":
        st["cwd"] = os.path.join(st["cwd"], substitute(ins.args, variables))
        os.makedirs(st["rootfs"] + st["cwd"], exist_ok=True)
    elif kw == "COPY":
        toks = [substitute(t, variables) for t in shlex.split(ins.args)]
        opts = {t.split("=", 1)[0]: t.split("=", 1)[1] for t in toks if t.startswith("--")}
        paths = [t for t in toks if not t.startswith("--")]
        srcs, dest = paths[:-1], os.path.join(st["cwd"], paths[-1])
        frm = opts.get("--from")
        origin = stages[frm]["rootfs"] if frm else ROOT
        into_dir = dest.endswith("/") or len(srcs) > 1
        for s in srcs:
            sp = os.path.join(origin, s.lstrip("/") if frm else s)
            target = st["rootfs"] + dest
            if os.path.isdir(sp):
                shutil.copytree(sp, target, symlinks=True, dirs_exist_ok=True)
            else:
                if into_dir:
                    os.makedirs(target, exist_ok=True)
                    target = os.path.join(target, os.path.basename(s))
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(sp, target)
        say("COPY %s" % ins.args)
    elif kw == "RUN":
        cmd = "cd %s || exit 1\n%s" % (shlex.quote(st["cwd"]), ins.args)
        env = run_env(dict(st["vars"], **st["env"]))
        t = time.monotonic()
        say("RUN (line %d) %s" % (ins.line, re.sub(r"\s+", " ", ins.args)[:90]))
        log = os.path.join(WORK, "%s-line%d.log" % (os.path.basename(st["rootfs"]), ins.line))
        with open(log, "w") as out:
            r = subprocess.run(chroot_cmd(st["rootfs"], ["/bin/sh", "-c", cmd]), env=env,
                               stdout=out, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            with open(log) as f:
                print(f.read()[-4000:])
            fail("RUN at line %d exited %d (log: %s)" % (ins.line, r.returncode, log))
        say("  done in %.1f s (log: %s)" % (time.monotonic() - t, os.path.relpath(log, ROOT)))
    elif kw == "USER":
        st["user"] = substitute(ins.args, variables)
    elif kw == "ENTRYPOINT":
        st["entrypoint"] = json.loads(ins.args)
    elif kw == "CMD":
        st["cmd"] = json.loads(ins.args)
    elif kw == "HEALTHCHECK":
        st["healthcheck"] = parse_healthcheck(ins)[1]
    elif kw == "EXPOSE":
        st["expose"] = ins.args.split()
    elif kw in ("LABEL", "STOPSIGNAL"):
        pass
    else:
        fail("line %d: %s is not supported by this script" % (ins.line, kw))

img = st
rootfs = img["rootfs"]
size = subprocess.run(["du", "-sm", rootfs], capture_output=True, text=True).stdout.split()[0]
say("image filesystem: %s MiB (%s)" % (size, os.path.relpath(rootfs, ROOT)))
for tool in ("gcc", "make", "cc"):
    r = subprocess.run(chroot_cmd(rootfs, ["/bin/sh", "-c", "command -v " + tool]),
                       capture_output=True, env=run_env({}))
    if r.returncode == 0:
        fail("the runtime image contains %s" % tool)

# ---- run it ---------------------------------------------------------------------
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = run_env(dict(img["env"], ATTND_LISTEN="127.0.0.1:%d" % port))
url = "http://127.0.0.1:%d" % port
log_path = os.path.join(WORK, "attnd.log")
say("starting %s as %s with %s" % (img["entrypoint"] + img["cmd"], img["user"],
                                   {k: v for k, v in env.items() if k.startswith("ATTND_")}))
logf = open(log_path, "wb")
proc = subprocess.Popen(chroot_cmd(rootfs, img["entrypoint"] + img["cmd"], img["user"]),
                        env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def get(path, data=None, headers=None):
    req = urllib.request.Request(url + path, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def log():
    with open(log_path, "rb") as f:
        return f.read().decode("utf-8", "replace")


try:
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            fail("attnd exited %d:\n%s" % (proc.returncode, log()))
        try:
            if get("/healthz")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            fail("no 200 from /healthz within 20 s:\n" + log())
        time.sleep(0.05)
    say("/healthz 200: " + log().strip().splitlines()[0])
    for path in ("/readyz", "/metrics", "/v1/info"):
        status, body = get(path)
        if status != 200:
            fail("%s answered %d" % (path, status))
    info = json.loads(get("/v1/info")[1])
    say("/readyz, /metrics, /v1/info 200; info: %s" % json.dumps(info)[:200])
    body = json.dumps({"q": [[1, 0], [0, 1]], "k": [[1, 0], [0, 1], [1, 1]],
                       "v": [[1, 2], [3, 4], [5, 6]]}).encode()
    status, reply = get("/attention", body, {"Content-Type": "application/json"})
    if status != 200:
        fail("POST /attention answered %d: %s" % (status, reply[:300]))
    say("POST /attention 200: %s" % reply[:120].decode())
    hc = img["healthcheck"]
    r = subprocess.run(chroot_cmd(rootfs, ["/bin/sh", "-c", hc], img["user"]), env=env,
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail("HEALTHCHECK %r exited %d: %s" % (hc, r.returncode, r.stderr))
    say("HEALTHCHECK inside the image: exit 0")
    r = subprocess.run(chroot_cmd(rootfs, ["/usr/local/bin/attn", "infer", url, "--shape",
                                           "1,4,128,64", "--dtype", "BF16", "--causal",
                                           "--check"], img["user"]),
                       env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or "PASS" not in r.stdout:
        fail("attn infer --check from the image exited %d:\n%s%s" % (r.returncode, r.stdout,
                                                                     r.stderr))
    say("attn infer --check from the image: " + [l for l in r.stdout.splitlines()
                                                 if "PASS" in l][0].strip()[:110])
finally:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    logf.close()
if proc.returncode != 0:
    fail("attnd exited %d on SIGTERM:\n%s" % (proc.returncode, log()))
say("SIGTERM: attnd exited 0 (%s)" % log().strip().splitlines()[-1])
if os.environ.get("KEEP") != "1":
    for s in stages.values():
        remove_tree(s["rootfs"])
say("PASS")
PY
