"""examples/hf_sessions.py against a real attnd: a transformers Llama whose attention runs on
attnd sessions generates the same greedy tokens, with the same logits (F32), as the model with
transformers' own "sdpa" attention.

It needs torch and transformers, which the test venv does not have (torch is a few GB): the
example runs in the first interpreter that imports both, $ATTND_PEERS_PYTHON, this one, or
the peers venv's (build/peers-venv/bin/python, made by make bench-peers); where none does,
the test prints "skipped: torch/transformers not installed" and skips.
"""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

EXAMPLE = os.path.join(ROOT, "examples", "hf_sessions.py")


def _has_torch_and_transformers(python):
    if not python or not os.access(python, os.X_OK):
        return False
    probe = subprocess.run([python, "-c", "import torch, transformers"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    return probe.returncode == 0


def _python():
    for p in (os.environ.get("ATTND_PEERS_PYTHON"), sys.executable,
              os.path.join(ROOT, "build", "peers-venv", "bin", "python")):
        if _has_torch_and_transformers(p):
            return p
    return None


def test_hf_generation_on_sessions(server):
    python = _python()
    if python is None:
        print("skipped: torch/transformers not installed")
        pytest.skip("torch/transformers not installed")
    run = subprocess.run([python, EXAMPLE, "--url", server.url, "--prompt", "12", "--new", "16"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    lines = {ln.split(None, 1)[0]: ln for ln in run.stdout.splitlines() if ln.strip()}
    assert "tokens    same" in run.stdout, out
    assert lines["logits"].endswith(": ok"), out
    # the wire: the prompt once, then one token a step, and the server held 12 + 15 tokens
    assert "prefill 12 tokens at pos 0, then 15 steps of 1 token" in run.stdout, out
    assert "[27, 27]: ok" in run.stdout, out
    assert run.stdout.rstrip().endswith("hf_sessions: PASS"), out
