"""API keys without Ray (serve_app/auth.py): the key sources and their checks, the comparison,
the reload of a changed key file, and the middleware in front of the FastAPI app."""

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from ranker_contract.config import AppConfig, AuthConfig
from serve_app import auth
from serve_app.auth import KeyStore, load_keys, parse_keys, require_keys
from serve_app.ingress import app

KEY_A, KEY_B = "a" * 15 + "-secret-A", "b" * 15 + "-secret-B"


def _bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


def _keys_file(tmp_path, text: str):
    path = tmp_path / "keys"
    path.write_text(text)
    return AuthConfig(api_keys_file=str(path))


def test_entries_are_id_colon_key_or_id_space_key_with_comments():
    text = f"# the teams\n\nsearch:{KEY_A}\n  ads   {KEY_B}  \n"
    assert list(parse_keys(text, "src")) == ["search", "ads"]


def test_environment_entries_may_be_comma_separated(monkeypatch):
    monkeypatch.setenv("KEYS", f"search:{KEY_A}, ads:{KEY_B}")
    store = KeyStore(AuthConfig(api_keys_env="KEYS"))
    assert store.ids == ("search", "ads")
    assert store.key_id(_bearer(KEY_B)) == "ads"


@pytest.mark.parametrize("text, problem", [
    ("", "no keys"),
    ("# only a comment\n", "no keys"),
    ("search:short-key\n", "shorter than 16"),
    (f"search:{KEY_A}\nsearch:{KEY_B}\n", "repeats"),
    (f"search:{KEY_A}\nads:{KEY_A}\n", "repeats"),
    (f"{KEY_A}\n", "not `id:key`"),
    (f"team/1:{KEY_A}\n", "not `id:key`"),
])
def test_bad_key_files_fail_naming_the_setting_never_the_key(tmp_path, text, problem):
    with pytest.raises(ValueError) as error:
        load_keys(_keys_file(tmp_path, text))
    assert "auth.api_keys_file" in str(error.value) and problem in str(error.value)
    for secret in (KEY_A, KEY_B, "short-key"):
        assert secret not in str(error.value)


def test_missing_sources_fail_naming_the_setting(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="auth.api_keys_file .*cannot be read"):
        load_keys(AuthConfig(api_keys_file=str(tmp_path / "absent")))
    monkeypatch.delenv("NO_SUCH_KEYS", raising=False)
    with pytest.raises(ValueError, match=r"auth.api_keys_env \(NO_SUCH_KEYS\).*not set"):
        load_keys(AuthConfig(api_keys_env="NO_SUCH_KEYS"))


def test_auth_is_off_by_default_and_takes_one_source():
    assert not AppConfig().auth.enabled
    with pytest.raises(ValidationError, match="not both"):
        AuthConfig(api_keys_file="keys", api_keys_env="KEYS")
    with pytest.raises(ValidationError, match="auth"):
        AppConfig.model_validate({"auth": {"api_keys": ["inline"]}})  # never in the YAML


@pytest.mark.parametrize("header", [None, b"", b"Bearer", b"Bearer ", b"Basic " + KEY_A.encode(),
                                    KEY_A.encode(), b"Bearer " + KEY_A[:-1].encode(),
                                    b"Bearer " + KEY_A.encode() + b"x", b"Bearer \xff\xfe"])
def test_only_the_exact_key_after_bearer_is_accepted(tmp_path, header):
    store = KeyStore(_keys_file(tmp_path, f"search:{KEY_A}\n"))
    assert store.key_id(header) is None
    assert store.key_id(_bearer(KEY_A)) == "search"
    assert store.key_id(b"bearer  " + KEY_A.encode()) == "search"  # scheme: any case


def test_a_changed_file_is_read_again_and_a_removed_key_is_revoked(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", 0.0)  # look at the file on every request
    config = _keys_file(tmp_path, f"search:{KEY_A}\nads:{KEY_B}\n")
    store, reloaded = KeyStore(config), []
    store.on_reload = reloaded.append
    assert store.key_id(_bearer(KEY_B)) == "ads"
    (tmp_path / "keys").write_text(f"search:{KEY_A}\n")
    assert store.key_id(_bearer(KEY_B)) is None
    assert store.key_id(_bearer(KEY_A)) == "search"
    assert reloaded == [("search",)]


def test_a_broken_file_locks_everyone_out_until_fixed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", 0.0)
    store = KeyStore(_keys_file(tmp_path, f"search:{KEY_A}\n"))
    (tmp_path / "keys").write_text("search:short\n")
    assert store.key_id(_bearer(KEY_A)) is None
    assert "every request is refused" in caplog.text and KEY_A not in caplog.text
    (tmp_path / "keys").write_text(f"search:{KEY_A}\n# fixed\n")
    assert store.key_id(_bearer(KEY_A)) == "search"


def test_the_file_is_not_looked_at_again_within_the_reload_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", float("inf"))
    store = KeyStore(_keys_file(tmp_path, f"search:{KEY_A}\n"))
    (tmp_path / "keys").unlink()
    assert store.key_id(_bearer(KEY_A)) == "search"


@pytest.fixture
def guarded_app(tmp_path):
    refused: list[str] = []
    require_keys(KeyStore(_keys_file(tmp_path, f"search:{KEY_A}\n")), refused.append)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client, refused
    finally:
        require_keys(None, refused.append)


@pytest.mark.parametrize("method, path", [("POST", "/v1/score"), ("POST", "/v2/rerank"),
                                          ("GET", "/v1/models"), ("GET", "/docs"),
                                          ("GET", "/openapi.json"), ("GET", "/no/such/route")])
def test_middleware_answers_401_with_the_envelope_before_any_route(guarded_app, method, path):
    client, refused = guarded_app
    for headers in ({}, {"Authorization": "Bearer wrong-key-of-some-length"}):
        r = client.request(method, path, content=b"{not json", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json() == {"error": {"message": r.json()["error"]["message"],
                                      "type": "AuthenticationError", "param": None, "code": 401}}
        assert "wrong-key" not in r.text
    assert refused == [path, path]


def test_middleware_lets_a_valid_key_through(guarded_app):
    client, refused = guarded_app
    headers = {"Authorization": f"Bearer {KEY_A}"}
    assert client.get("/openapi.json", headers=headers).status_code == 200
    assert client.get("/docs", headers=headers).status_code == 200
    assert client.get("/no/such/route", headers=headers).status_code == 404
    assert refused == []


def test_cache_owners_are_the_key_or_its_shared_cache_group():
    auth = AuthConfig(api_keys_env="KEYS", shared_cache={"feed": ["feed-1", "feed-2"]})
    assert auth.cache_owner("feed-1") == auth.cache_owner("feed-2") == "group feed"
    assert auth.cache_owner("ads") == "key ads"
    assert auth.cache_owner("feed") != auth.cache_owner("feed-1")  # a key named as a group
    assert AuthConfig().cache_owner("none") == ""  # auth off: one tenant, as before
    with pytest.raises(ValueError, match="'feed-1' is in both 'feed' and 'other'"):
        AuthConfig(api_keys_env="KEYS", shared_cache={"feed": ["feed-1"], "other": ["feed-1"]})
    with pytest.raises(ValueError, match="no API keys are configured"):
        AuthConfig(shared_cache={"feed": ["feed-1"]})
