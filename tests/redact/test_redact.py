"""The redaction engine: every corpus secret becomes the marker of its kind wherever it appears
(event text, a JSON line, a JSON value), near misses stay exactly as they were, redaction is
idempotent, and a store's config.toml adds patterns and allowlists or fails naming the file."""

from __future__ import annotations

import copy
import json
import os

import orjson
import pytest
from redact_support import CORPUS, NEAR_MISSES, strings_in

from memstore import events, redact
from memstore.errors import MemstoreError, StoreIOError
from memstore.redact import Finding, RedactConfig, RedactConfigError, Redactor, load_config, marker, redact_value

GITHUB_TOKEN = next(s["value"] for e in CORPUS for s in e["secrets"] if s["kind"] == "github-token")


def event_texts(evs: list[dict]) -> list[str]:
    """The forms a derived view shows an event in: its search text, and its JSON line."""
    texts = []
    for event in evs:
        found = events.event_text(event)
        if found is not None:
            texts.append(found[1])
        texts.append(orjson.dumps(event).decode())
    return texts


# --------------------------------------------------------------------------------------------
# The corpus


def test_corpus_is_not_trivial():
    """The corpus covers the kinds the issue names, each entry holds at least one secret, and
    the near misses are there to keep false positives visible."""
    kinds = {s["kind"] for e in CORPUS for s in e["secrets"]}
    assert {
        "aws-access-key",
        "aws-secret-key",
        "google-api-key",
        "azure-storage-key",
        "azure-client-secret",
        "github-token",
        "gitlab-token",
        "openai-api-key",
        "anthropic-api-key",
        "huggingface-token",
        "groq-api-key",
        "slack-token",
        "slack-webhook",
        "stripe-key",
        "jwt",
        "private-key",
        "url-password",
        "password",
        "bearer-token",
        "high-entropy",
    } <= kinds
    assert all(e["secrets"] for e in CORPUS) and len(NEAR_MISSES) >= 8


def test_every_secret_in_the_text_forms_becomes_its_kind_marker(corpus_entry):
    """In an event's search text and in its JSON line, no corpus secret survives redaction, and
    the marker of its kind is there instead."""
    texts = event_texts(corpus_entry["events"])
    redacted = "\n".join(redact.redact_text(t) for t in texts)
    for secret in corpus_entry["secrets"]:
        value = secret["value"]
        assert value not in redacted, f"{secret['kind']} survived"
        assert orjson.dumps(value).decode()[1:-1] not in redacted, f"{secret['kind']} survived JSON-escaped"
        assert marker(secret["kind"]) in redacted


def test_every_secret_in_the_json_value_becomes_its_kind_marker(corpus_entry):
    """``redact_value`` of each event leaves no corpus secret in any of its strings, names each
    secret's kind, and never modifies the event it was given."""
    original = copy.deepcopy(corpus_entry["events"])
    redacted = [redact.redact_value(event) for event in corpus_entry["events"]]
    assert corpus_entry["events"] == original
    everything = "\n".join(strings_in(redacted))
    for secret in corpus_entry["secrets"]:
        assert secret["value"] not in everything, f"{secret['kind']} survived"
        assert marker(secret["kind"]) in everything
    assert [e["type"] for e in redacted] == [e["type"] for e in original]


def test_findings_cover_each_secret(corpus_entry):
    """``findings`` are sorted, do not overlap, and cover every character of every secret with
    a finding of its kind; ``contains_secret`` agrees."""
    for text in event_texts(corpus_entry["events"]):
        found = redact.findings(text)
        assert all(a.end <= b.start for a, b in zip(found, found[1:]))
        assert redact.contains_secret(text) == bool(found)
        for secret in corpus_entry["secrets"]:
            start = text.find(secret["value"])
            if start < 0:
                continue
            end = start + len(secret["value"])
            covering = [f for f in found if f.start <= start and f.end >= end]
            assert covering and covering[0].kind == secret["kind"], (secret, found)


def test_near_misses_are_left_exactly_as_they_are(near_miss):
    """Git SHAs, UUIDs, ids, lockfile hashes, base64 of ordinary data, long identifiers and
    references to secrets: no finding, the text is the same object, the value is unchanged."""
    for text in event_texts(near_miss["events"]):
        assert redact.findings(text) == [], text
        assert redact.redact_text(text) is text
        assert not redact.contains_secret(text)
    for event in near_miss["events"]:
        assert redact.redact_value(event) is event
    texts = "\n".join(event_texts(near_miss["events"]))
    assert all(keep in texts for keep in near_miss["keep"])


def test_redaction_is_idempotent(corpus_entry):
    """Redacting redacted text or values changes nothing: markers never match a rule."""
    for text in event_texts(corpus_entry["events"]):
        once = redact.redact_text(text)
        assert redact.redact_text(once) == once
        assert redact.findings(once) == []
    for event in corpus_entry["events"]:
        once = redact.redact_value(event)
        assert redact.redact_value(once) == once


def test_markers_never_match_and_are_never_empty():
    """A marker of every built-in kind is left alone, alone or in an assignment; a secret is
    never replaced by nothing."""
    for kind in sorted(redact.BUILTIN_KINDS):
        m = marker(kind)
        for text in (m, f"password={m}", f'"api_key": "{m}"', f"postgres://u:{m}@db/app", f"--token {m}"):
            assert redact.findings(text) == [], text
    assert redact.redact_text("token=ghp_") == "token=ghp_"
    out = redact.redact_text("GITHUB_TOKEN=" + GITHUB_TOKEN)
    assert out.startswith("GITHUB_TOKEN=[REDACTED:") and out.endswith("]")


# --------------------------------------------------------------------------------------------
# Assignments and values


@pytest.mark.parametrize(
    "text, secret, kind",
    [
        ("export DB_PASSWORD=hunter2!x", "hunter2!x", "password"),
        ('{"password":"correct horse battery"}', "correct horse battery", "password"),
        ("password: 'Tr0ub4dor&3'", "Tr0ub4dor&3", "password"),
        ('client_secret = "d8e8fca2dc0f896fd7cb4cb0031ba249"', "d8e8fca2dc0f896fd7cb4cb0031ba249", "secret"),
        ("apiKey: Zk29sLq0pW8mXn3vB7cT", "Zk29sLq0pW8mXn3vB7cT", "api-key"),
        (
            "curl -H 'X-Api-Key: 9f86d081884c7d659a2feaa0c55ad015' https://x",
            "9f86d081884c7d659a2feaa0c55ad015",
            "api-key",
        ),
        ("Authorization: Basic dXNlcjpwYXNzd29yZDE=", "dXNlcjpwYXNzd29yZDE=", "basic-auth"),
        ("tool --api-key=Qm9vbGVhbjEyMzQ1Njc4OQ run", "Qm9vbGVhbjEyMzQ1Njc4OQ", "api-key"),
        ('{\\"token\\":\\"Rk3mQ9vZx2LpW8nT5bYc\\"}', "Rk3mQ9vZx2LpW8nT5bYc", "token"),
        ("redis://:Sup3rS3cret@cache:6379/0", "Sup3rS3cret", "url-password"),
    ],
)
def test_assigned_secrets(text, secret, kind):
    """A value assigned to a secret-named key, flag, header or URL password is redacted as
    the key's kind, in shell, JSON (also JSON-escaped), YAML and code."""
    found = redact.findings(text)
    assert [(f.kind, text[f.start : f.end]) for f in found] == [(kind, secret)]
    assert redact.redact_text(text) == text.replace(secret, marker(kind))


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=4096",
        "token_count: 12",
        "tokens: 1234",
        "bypass=true",
        "PWD=/home/dev/app",
        "password = get_password()",
        "password = self.password",
        "api_key: ${OPENAI_API_KEY}",
        "token: {{ vault_token }}",
        '"password": null',
        "secret_name: app-secrets",
        "Password: required",
        'api_key = os.environ["API_KEY"]',
        "--token-file ~/.config/tok",
        "--private-key ~/.ssh/id_ed25519",
        "password: string",
        "if token == other:",
        "compass: north",
        "https://user@example.com/x",
    ],
)
def test_references_and_placeholders_are_not_secrets(text):
    """Variables, calls, paths, templates, types and counts under secret-sounding names stay."""
    assert redact.findings(text) == []


def test_redact_value_redacts_strings_under_secret_named_keys():
    """Under a secret-named key a whole literal value becomes one marker (even a plain word
    no text rule would flag); other values are redacted as text; keys, numbers, booleans and
    nulls are kept; containers with nothing to redact are returned as they are."""
    untouched = {"name": "api", "count": 3, "ok": True, "none": None}
    value = {
        "db": {"user": "app", "password": "hunter22", "port": 5432},
        "headers": [{"Authorization": "Bearer abcdef123456"}, {"Accept": "text/html"}],
        "note": "deploy with GITHUB_TOKEN=" + GITHUB_TOKEN,
        "token": "ghp_short",  # too short for a GitHub token: still a literal under 'token'
        "untouched": untouched,
        "api_key": "",
    }
    out = redact.redact_value(value)
    assert out["db"] == {"user": "app", "password": "[REDACTED:password]", "port": 5432}
    assert out["headers"][0] == {"Authorization": "[REDACTED:bearer-token]"}
    assert out["headers"][1] is value["headers"][1]
    assert out["note"] == "deploy with GITHUB_TOKEN=[REDACTED:github-token]"
    assert out["token"] == "[REDACTED:token]"
    assert out["untouched"] is untouched and out["api_key"] == ""
    assert list(out) == list(value)
    assert value["db"]["password"] == "hunter22"


def test_redact_value_walks_deep_nesting():
    """A value nested far deeper than Python's recursion limit is walked (foreign logs do that)."""
    leaf: object = {"password": "hunter22"}
    for _ in range(5000):
        leaf = [leaf]
    out = redact.redact_value(leaf)
    for _ in range(5000):
        out = out[0]
    assert out == {"password": "[REDACTED:password]"}


def test_non_string_values_pass_through():
    """Numbers, booleans, None and empty containers come back as they are."""
    for value in (0, 1.5, True, None, [], {}, ""):
        assert redact.redact_value(value) is value


# --------------------------------------------------------------------------------------------
# Configuration


def write_config(root, text: str) -> None:
    (root / "config.toml").write_text(text, encoding="utf-8")


def test_missing_config_gives_the_defaults(tmp_path):
    """No config.toml, or one without a [redact] table: the built-in rules, nothing else."""
    assert load_config(tmp_path) == RedactConfig()
    write_config(tmp_path, "[retention]\ndays = 30\n")
    assert load_config(tmp_path) == RedactConfig()


def test_allowlists_and_patterns_from_the_store_config(tmp_path):
    """Allowed strings and patterns are never redacted; user patterns redact with their kind
    (a chosen group only); disabled built-in kinds are not reported; enabled=false turns
    redaction off."""
    key = GITHUB_TOKEN
    write_config(
        tmp_path,
        f'''
[redact]
allow = ["{key}"]
allow_patterns = ['AKIA[A-Z2-7]{{12}}TEST']
disable = ["jwt"]

[[redact.patterns]]
kind = "acme-token"
regex = 'acme_[0-9a-f]{{32}}'

[[redact.patterns]]
kind = "employee-id"
regex = 'employee=(\\d{{6}})'
group = 1
''',
    )
    r = redact.redactor_for(tmp_path)
    jwt = next(s["value"] for e in CORPUS for s in e["secrets"] if s["kind"] == "jwt")
    text = (
        f"token {key} and AKIAABCDEFGHIJKLTEST stay; acme_0123456789abcdef0123456789abcdef goes; "
        f"employee=123456 too; jwt {jwt} stays"
    )
    assert r.redact_text(text) == (
        f"token {key} and AKIAABCDEFGHIJKLTEST stay; [REDACTED:acme-token] goes; "
        f"employee=[REDACTED:employee-id] too; jwt {jwt} stays"
    )
    assert redact.redact_text(text) != text  # the defaults redact what the store allows
    assert r.redact_text(r.redact_text(text)) == r.redact_text(text)
    write_config(tmp_path, "[redact]\nenabled = false\n")
    off = redact.redactor_for(tmp_path)
    assert off.redact_text(text) is text and off.findings(text) == [] and not off.contains_secret(text)
    assert off.redact_value({"password": "hunter22"}) == {"password": "hunter22"}


def test_an_allowed_value_under_a_secret_key_stays(tmp_path):
    """The allowlist also protects whole values under secret-named keys in JSON values."""
    write_config(tmp_path, '[redact]\nallow = ["demo-password-1"]\n')
    r = redact.redactor_for(tmp_path)
    assert r.redact_value({"password": "demo-password-1"}) == {"password": "demo-password-1"}
    assert r.redact_value({"password": "other-password-2"}) == {"password": "[REDACTED:password]"}


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("[redact\nallow = 1", "not valid TOML"),
        ("redact = 3", "[redact] must be a table"),
        ("[redact]\nalow = ['x']", "unknown key redact.alow"),
        ("[redact]\nallow = 'x'", "redact.allow must be an array of strings"),
        ("[redact]\nenabled = 'yes'", "redact.enabled must be true or false"),
        ("[redact]\nallow_patterns = ['(unclosed']", "redact.allow_patterns[0] is not a valid regular expression"),
        ("[redact]\ndisable = ['no-such-kind']", "not a built-in kind"),
        ("[[redact.patterns]]\nkind = 'Bad Kind'\nregex = 'x'", "redact.patterns[0].kind must be"),
        ("[[redact.patterns]]\nkind = 'k'\nregex = ''", "redact.patterns[0].regex must be a non-empty string"),
        (
            "[[redact.patterns]]\nkind = 'k'\nregex = 'a(b'",
            "redact.patterns[0].regex is not a valid regular expression",
        ),
        ("[[redact.patterns]]\nkind = 'k'\nregex = 'ab'\ngroup = 2", "redact.patterns[0].group is 2"),
        ("[[redact.patterns]]\nkind = 'k'\nregex = 'ab'\ncolour = 1", "unknown key redact.patterns[0].colour"),
        ("[[redact.patterns]]\nkind = 'k'\nregex = '.*'", "matches its own marker"),
        ("[redact]\npatterns = 'x'", "redact.patterns must be an array of tables"),
    ],
)
def test_malformed_config_is_a_clear_error_naming_the_file(tmp_path, text, complaint):
    """Every malformed setting raises RedactConfigError (a MemstoreError and ValueError) whose
    message names the file and what is wrong."""
    write_config(tmp_path, text)
    with pytest.raises(RedactConfigError) as caught:
        load_config(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "config.toml") in message and complaint in message
    assert isinstance(caught.value, MemstoreError) and isinstance(caught.value, ValueError)
    assert caught.value.path == str(tmp_path / "config.toml")


def test_non_utf8_config_is_a_clear_error(tmp_path):
    """A config.toml that is not UTF-8 is named, with the byte where decoding failed."""
    (tmp_path / "config.toml").write_bytes(b"[redact]\nallow = ['\xff']\n")
    with pytest.raises(RedactConfigError, match="not UTF-8"):
        load_config(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_config_is_a_store_io_error(tmp_path):
    """A config.toml that cannot be read raises StoreIOError naming it (not the defaults)."""
    write_config(tmp_path, "[redact]\n")
    (tmp_path / "config.toml").chmod(0)
    with pytest.raises(StoreIOError):
        load_config(tmp_path)


def test_config_that_is_a_directory_is_a_store_io_error(tmp_path):
    """A directory where config.toml should be is an error naming it, not silently the defaults."""
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(StoreIOError) as caught:
        load_config(tmp_path)
    assert caught.value.path == str(tmp_path / "config.toml")


def test_module_functions_use_the_built_in_rules():
    """The module-level functions are the default redactor's."""
    text = "\n".join(event_texts(CORPUS[0]["events"]))
    assert redact.default_redactor() is redact.default_redactor()
    assert redact.findings(text) == Redactor().findings(text)
    assert redact.redact_text(text) == Redactor(RedactConfig()).redact_text(text)
    assert all(isinstance(f, Finding) for f in redact.findings(text))


def test_secrets_in_structured_tool_arguments_are_named_by_their_neighbours():
    """An environment list's {"name", "value"} pairs, a header pair and an argv's flag name the
    string beside them: the secret is redacted, ordinary values beside it are kept."""
    value = {
        "env": [
            {"name": "STRIPE_API_KEY", "value": "9f8e7d6c5b4a39281706f5e4d3c2b1a0"},
            {"name": "DB_PASSWORD", "value": "Winter2026!x"},
            {"name": "HOME", "value": "/root"},
        ],
        "headers": [["Authorization", "Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1aQ"], ["Accept", "application/json"]],
        "argv": ["mysql", "--password", "Winter2026!x", "-h", "db.internal"],
        "message": ["git", "commit", "-m", "fix the password reset flow"],
        "tags": [{"Key": "Name", "Value": "web-1"}],
    }
    out = redact_value(value)
    text = json.dumps(out)
    assert "Winter2026" not in text and "9f8e7d6c5b4a" not in text
    assert out["env"][2] == {"name": "HOME", "value": "/root"}
    assert out["headers"][1] == ["Accept", "application/json"]
    assert out["argv"][3:] == ["-h", "db.internal"]
    assert out["message"] == value["message"] and out["tags"] == value["tags"]
