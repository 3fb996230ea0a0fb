"""The Python client against a server started with --api-key: the key from the argument or
from ATTND_API_KEY (the variable the server reads too), and the 401 without it; and against
one whose --api-key-file holds a key per tenant: each works, a string that is none is 401."""
import numpy as np
import pytest

import attnd
from attn_ref import reference, rel_err
from conftest import _serve, attnd_error

KEY = "k3y-for-the-tests_0123456789"
KEY_ALICE, KEY_UNNAMED = "sk-alice_0123456789", "sk-unnamed_9876543210"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    yield from _serve(["--api-key", KEY], tmp_path_factory)


@pytest.fixture(scope="module")
def tenants_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text("# one key per tenant\nalice:%s\n\n%s\n" % (KEY_ALICE, KEY_UNNAMED))
    yield from _serve(["--api-key-file", str(path)], tmp_path_factory)


def _problem():
    rng = np.random.default_rng(5)
    return [rng.standard_normal((2, 9, 16)).astype(np.float32) for _ in range(3)]


def test_key_argument(keyed_server, monkeypatch):
    monkeypatch.delenv("ATTND_API_KEY", raising=False)
    q, k, v = _problem()
    o = keyed_server.client(api_key=KEY).attention(q, k, v, causal=True)
    assert rel_err(o, reference(q, k, v, causal=True)[0]) <= 1e-5


def test_key_from_the_environment(keyed_server, monkeypatch):
    monkeypatch.setenv("ATTND_API_KEY", KEY)
    q, k, v = _problem()
    o = keyed_server.client().attention(q, k, v)
    assert rel_err(o, reference(q, k, v)[0]) <= 1e-5


def test_no_key_or_a_wrong_one_is_401(keyed_server, monkeypatch):
    monkeypatch.delenv("ATTND_API_KEY", raising=False)
    q, k, v = _problem()
    for c in (keyed_server.client(), keyed_server.client(api_key=KEY[:-1] + "X")):
        e = attnd_error(c.attention, q, k, v)
        assert (e.status, e.code) == (401, "unauthorized"), e
    assert keyed_server.client().health()          # the probes stay open


def test_a_key_a_header_cannot_carry_is_refused():
    with pytest.raises(ValueError):
        attnd.Client("http://127.0.0.1:1", api_key="two words")


def test_each_key_of_a_key_file(tenants_server, monkeypatch):
    monkeypatch.delenv("ATTND_API_KEY", raising=False)
    q, k, v = _problem()
    for key in (KEY_ALICE, KEY_UNNAMED):
        o = tenants_server.client(api_key=key).attention(q, k, v)
        assert rel_err(o, reference(q, k, v)[0]) <= 1e-5, key
    e = attnd_error(tenants_server.client(api_key="sk-neither_0123456789").attention, q, k, v)
    assert (e.status, e.code) == (401, "unauthorized"), e
