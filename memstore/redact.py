"""Redaction: finding secrets in text and JSON values and replacing each with a marker that says
what kind of secret was there (``[REDACTED:github-token]``), never with nothing.

Every derived view (search chunks, the catalog, the memory view, the explorer, search snippets,
the CLI's output, exports) passes its text through a :class:`Redactor`. What it guarantees:

- **Detection.** Well-known key formats (cloud providers, code hosts, model providers, chat and
  payment services, JWTs, PEM private-key blocks), passwords in URLs, values assigned to
  secret-named keys (``password=``, ``"api_key":``, ``GITHUB_TOKEN=``, ``--token x``,
  ``Authorization: Bearer x``) in commands, env dumps, JSON and YAML, and high-entropy strings in
  assignment position; plus the patterns a store's ``config.toml`` adds (:func:`load_config`).
- **Never nothing.** A secret becomes ``[REDACTED:<kind>]``; the text around it is untouched.
- **Idempotent.** Redacting redacted text changes nothing: no rule matches a marker, and a
  finding that overlaps a marker is dropped.
- **Allowlists win.** A finding whose text is an allowed string, or fully matches an allowed
  pattern, is left as it is.
- **Cheap when there is nothing to find.** One compiled regular expression is searched over the
  text: every alternative starts with a character that is rare in ordinary text (``_ - = :`` and a
  few capital letters), so the regex engine skips from one such character to the next without
  entering the pattern, and each is rejected by a fixed-width look-behind or look-ahead. Only a
  position that passes that test (a known token prefix, a secret-named key before ``=`` or
  ``:``, a long mixed token after one) reaches Python code, which parses and validates it.

The built-in tables below are data; ``docs/redaction.md`` lists the kinds and explains why this is
a compiled regex set rather than detect-secrets' plugins (measured there).
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .errors import MemstoreError
from .fsio import read_no_follow
from .layout import CONFIG_FILE, config_path  # noqa: F401  (CONFIG_FILE: re-exported)

log = logging.getLogger(__name__)

MARKER_PREFIX = "[REDACTED:"
CONFIG_SECTION = "redact"
_KIND = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*\Z")
_MARKER = re.compile(r"\[REDACTED:[a-z0-9]+(?:-[a-z0-9]+)*\]")
_MAX_VALUE = 4096  # the longest assigned value (or token) one finding covers


def marker(kind: str) -> str:
    """The text that replaces a secret of ``kind``."""
    return f"{MARKER_PREFIX}{kind}]"


@dataclass(frozen=True, slots=True)
class Finding:
    """A secret of ``kind`` at ``text[start:end]``."""

    kind: str
    start: int
    end: int


# --------------------------------------------------------------------------------------------
# Configuration


class RedactConfigError(MemstoreError, ValueError):
    """A store's redaction configuration is malformed; ``path`` names the file."""

    def __init__(self, path: Union[os.PathLike, str, None], detail: str):
        self.path = os.fspath(path) if path is not None else None
        self.detail = detail
        where = self.path if self.path is not None else "redaction config"
        super().__init__(f"{where}: {detail}")


@dataclass(frozen=True)
class UserPattern:
    """A pattern a store adds: each match of ``regex`` (its group ``group``) is a ``kind`` secret."""

    kind: str
    regex: re.Pattern[str]
    group: Union[int, str] = 0


@dataclass(frozen=True)
class RedactConfig:
    """What a :class:`Redactor` does beyond the built-in rules.

    ``allow``: exact strings never redacted; ``allow_patterns``: regexes a finding's whole text
    must match (``fullmatch``) to be left alone; ``patterns``: extra secrets; ``disabled``:
    built-in kinds switched off; ``enabled=False`` turns redaction off entirely; ``at_write=True``
    redacts events before they are written to a session's log too (appends and imports), so a
    secret never reaches the disk. ``source`` is the file it was read from, if any.
    """

    enabled: bool = True
    at_write: bool = False
    allow: frozenset[str] = frozenset()
    allow_patterns: tuple[re.Pattern[str], ...] = ()
    patterns: tuple[UserPattern, ...] = ()
    disabled: frozenset[str] = frozenset()
    source: Optional[Path] = field(default=None, compare=False)


_CONFIG_KEYS = ("enabled", "at_write", "allow", "allow_patterns", "patterns", "disable")
_PATTERN_KEYS = ("kind", "regex", "group", "ignore_case")


def load_config(root: Union[os.PathLike, str]) -> RedactConfig:
    """The redaction settings of the store at ``root``: the ``[redact]`` table of
    ``<root>/config.toml``. A missing file, or a file without that table, gives the defaults; a
    malformed one raises :class:`RedactConfigError` naming the file, and an unreadable one
    :class:`~memstore.errors.StoreIOError`. Nothing is ever silently ignored: an unknown key is an
    error, so a misspelt ``alow`` cannot quietly disable an allowlist. The file is read as the
    store's other files are: never through a symlink, never blocking (a symlink, a FIFO or a
    directory there is an :class:`~memstore.errors.UnsafePathError` naming it)."""
    path = config_path(root)
    data = read_no_follow(path)
    if data is None:
        return RedactConfig()
    toml = _toml_module()
    if toml is None:
        raise RedactConfigError(path, "reading TOML needs Python 3.11 (tomllib) or the tomli package")
    try:
        document = toml.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RedactConfigError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except toml.TOMLDecodeError as exc:
        raise RedactConfigError(path, f"not valid TOML: {exc}") from None
    section = document.get(CONFIG_SECTION, {})
    if not isinstance(section, dict):
        raise RedactConfigError(path, f"[{CONFIG_SECTION}] must be a table, not {_type_name(section)}")
    config = parse_config(section, source=path)
    log.debug(
        "redaction config read from %s: %d allowed, %d allowed patterns, %d patterns, disabled %s",
        path,
        len(config.allow),
        len(config.allow_patterns),
        len(config.patterns),
        sorted(config.disabled),
    )
    return config


def _toml_module() -> Any:
    try:
        import tomllib

        return tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli  # type: ignore[import-not-found]

            return tomli
        except ImportError:
            return None


def parse_config(section: dict, source: Union[os.PathLike, str, None] = None) -> RedactConfig:
    """A :class:`RedactConfig` from the contents of a ``[redact]`` table (as ``tomllib`` decodes
    it); :class:`RedactConfigError` naming ``source`` and the offending key otherwise."""
    where = Path(source) if source is not None else None

    def fail(detail: str) -> RedactConfigError:
        return RedactConfigError(where, detail)

    unknown = sorted(set(section) - set(_CONFIG_KEYS))
    if unknown:
        raise fail(f"unknown key {CONFIG_SECTION}.{unknown[0]} (known: {', '.join(_CONFIG_KEYS)})")
    enabled = section.get("enabled", True)
    if not isinstance(enabled, bool):
        raise fail(f"{CONFIG_SECTION}.enabled must be true or false, not {_type_name(enabled)}")
    at_write = section.get("at_write", False)
    if not isinstance(at_write, bool):
        raise fail(f"{CONFIG_SECTION}.at_write must be true or false, not {_type_name(at_write)}")
    if at_write and not enabled:
        raise fail(f"{CONFIG_SECTION}.at_write = true needs redaction enabled ({CONFIG_SECTION}.enabled = false)")
    allow = _string_list(section, "allow", fail)
    allow_patterns = tuple(
        _compile(text, f"{CONFIG_SECTION}.allow_patterns[{i}]", 0, fail)
        for i, text in enumerate(_string_list(section, "allow_patterns", fail))
    )
    disabled = _string_list(section, "disable", fail)
    for kind in disabled:
        if kind not in BUILTIN_KINDS:
            raise fail(
                f"{CONFIG_SECTION}.disable names {kind!r}, which is not a built-in kind "
                f"(built-in: {', '.join(sorted(BUILTIN_KINDS))})"
            )
    raw_patterns = section.get("patterns", [])
    if not isinstance(raw_patterns, list):
        raise fail(f"{CONFIG_SECTION}.patterns must be an array of tables ([[{CONFIG_SECTION}.patterns]])")
    patterns = tuple(_user_pattern(entry, i, fail) for i, entry in enumerate(raw_patterns))
    return RedactConfig(
        enabled=enabled,
        at_write=at_write,
        allow=frozenset(allow),
        allow_patterns=allow_patterns,
        patterns=patterns,
        disabled=frozenset(disabled),
        source=where,
    )


def _type_name(value: Any) -> str:
    return {
        dict: "a table",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _string_list(section: dict, key: str, fail: Callable[[str], RedactConfigError]) -> list[str]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise fail(f"{CONFIG_SECTION}.{key} must be an array of strings")
    return value


def _compile(text: str, where: str, flags: int, fail: Callable[[str], RedactConfigError]) -> re.Pattern[str]:
    try:
        return re.compile(text, flags)
    except re.error as exc:
        raise fail(f"{where} is not a valid regular expression: {exc}") from None


def _user_pattern(entry: Any, index: int, fail: Callable[[str], RedactConfigError]) -> UserPattern:
    where = f"{CONFIG_SECTION}.patterns[{index}]"
    if not isinstance(entry, dict):
        raise fail(f"{where} must be a table with kind and regex")
    unknown = sorted(set(entry) - set(_PATTERN_KEYS))
    if unknown:
        raise fail(f"unknown key {where}.{unknown[0]} (known: {', '.join(_PATTERN_KEYS)})")
    kind, text = entry.get("kind"), entry.get("regex")
    if not isinstance(kind, str) or not _KIND.match(kind) or len(kind) > 40:
        raise fail(
            f"{where}.kind must be lowercase letters, digits and single dashes "
            f"(at most 40), like 'acme-token', not {kind!r}"
        )
    if not isinstance(text, str) or not text:
        raise fail(f"{where}.regex must be a non-empty string")
    ignore_case = entry.get("ignore_case", False)
    if not isinstance(ignore_case, bool):
        raise fail(f"{where}.ignore_case must be true or false")
    regex = _compile(text, f"{where}.regex", re.IGNORECASE if ignore_case else 0, fail)
    group = entry.get("group", 0)
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        raise fail(f"{where}.group must be a group number or name")
    if isinstance(group, int) and not 0 <= group <= regex.groups:
        raise fail(f"{where}.group is {group}, but the regex has {regex.groups} group(s)")
    if isinstance(group, str) and group not in regex.groupindex:
        raise fail(f"{where}.group names {group!r}, which the regex does not define")
    if regex.fullmatch(marker(kind)):
        raise fail(f"{where}.regex matches its own marker {marker(kind)!r}; redaction would not be idempotent")
    return UserPattern(kind=kind, regex=regex, group=group)


# --------------------------------------------------------------------------------------------
# The built-in rules: token formats with a recognizable prefix


@dataclass(frozen=True)
class _Format:
    """A token format: ``pattern`` matches the whole secret, which starts ``shift`` characters
    after where one of ``prefixes`` starts (0: the secret starts with the prefix; negative: the
    prefix is inside it; positive: the secret follows it)."""

    kind: str
    prefixes: tuple[str, ...]
    pattern: str
    validate: Optional[Callable[[str], bool]] = None
    shift: int = 0


def _has_classes(token: str, needed: int) -> bool:
    classes = any(c.isdigit() for c in token) + any(c.islower() for c in token) + any(c.isupper() for c in token)
    return classes >= needed


def _openai_like(token: str) -> bool:
    # sk- is also the start of ordinary words joined by dashes (sk-learn-...); a key's body is
    # random: digits and letters of both cases, or long lowercase hex.
    body = token[3:]
    return any(c.isdigit() for c in body) and (any(c.isupper() for c in body) or len(body) >= 32)


_NB = r"(?<![A-Za-z0-9_-])"  # no token character just before a prefix
_NA = r"(?![A-Za-z0-9_])"  # nor just after a fixed-length token

_FORMATS: tuple[_Format, ...] = (
    _Format(
        "aws-access-key",
        ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])",
    ),
    _Format("google-api-key", ("AIza",), _NB + r"AIza[0-9A-Za-z_-]{35}" + r"(?![A-Za-z0-9_-])"),
    _Format("google-oauth-client-secret", ("GOCSPX-",), _NB + r"GOCSPX-[A-Za-z0-9_-]{28,40}"),
    _Format("google-oauth-token", ("ya29.",), _NB + r"ya29\.[0-9A-Za-z_-]{30,2048}"),
    _Format("azure-storage-key", ("AccountKey=",), r"(?<=AccountKey=)[A-Za-z0-9+/]{86}==", shift=11),
    _Format("azure-storage-key", ("SharedAccessKey=",), r"(?<=SharedAccessKey=)[A-Za-z0-9+/]{42,43}=", shift=16),
    _Format(
        "azure-client-secret",
        ("Q~",),
        r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~-])",
        shift=-4,
    ),
    _Format("github-token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _NB + r"gh[pousr]_[A-Za-z0-9]{36,251}" + _NA),
    _Format("github-token", ("github_pat_",), _NB + r"github_pat_[A-Za-z0-9_]{70,251}" + _NA),
    _Format(
        "gitlab-token",
        tuple(
            f"{p}-" for p in ("glpat", "gldt", "glrt", "glptt", "glft", "glsoat", "glcbt", "glimt", "gloas", "glagent")
        ),
        _NB + r"gl(?:pat|dt|rt|ptt|ft|soat|cbt|imt|oas|agent)-[A-Za-z0-9_-]{20,1024}(?:\.[0-9a-z]{2}\.[0-9a-z]{7,9})?",
    ),
    _Format("anthropic-api-key", ("sk-ant-",), _NB + r"sk-ant-[a-z]{2,8}\d{2}-[A-Za-z0-9_-]{32,512}"),
    _Format("openrouter-api-key", ("sk-or-",), _NB + r"sk-or-v\d-[0-9a-f]{64}" + _NA),
    _Format("openai-api-key", ("sk-",), _NB + r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,512}", _openai_like),
    _Format("huggingface-token", ("hf_",), _NB + r"hf_[A-Za-z]{34,40}" + _NA, lambda t: _has_classes(t[3:], 2)),
    _Format("huggingface-token", ("api_org_",), _NB + r"api_org_[A-Za-z]{34}" + _NA, lambda t: _has_classes(t[8:], 2)),
    _Format("groq-api-key", ("gsk_",), _NB + r"gsk_[A-Za-z0-9]{48,56}" + _NA),
    _Format("xai-api-key", ("xai-",), _NB + r"xai-[A-Za-z0-9]{70,90}" + _NA),
    _Format("perplexity-api-key", ("pplx-",), _NB + r"pplx-[A-Za-z0-9]{40,56}" + _NA),
    _Format("replicate-token", ("r8_",), _NB + r"r8_[A-Za-z0-9]{37}" + _NA),
    _Format("langsmith-api-key", ("lsv2_pt_", "lsv2_sk_"), _NB + r"lsv2_(?:pt|sk)_[0-9a-f]{32}_[0-9a-f]{10}" + _NA),
    _Format("tavily-api-key", ("tvly-",), _NB + r"tvly-(?:dev-|prod-)?[A-Za-z0-9]{32}" + _NA),
    _Format(
        "slack-token",
        tuple(f"xox{c}-" for c in "abposre"),
        _NB + r"xox[abposre]-[0-9A-Za-z-]{10,250}",
        lambda t: any(c.isdigit() for c in t),
    ),
    _Format("slack-token", ("xapp-",), _NB + r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]{20,}"),
    _Format(
        "slack-webhook",
        ("https://hooks.slack.com/",),
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{20,200}",
    ),
    _Format(
        "discord-webhook",
        ("https://discord.com/api/webhooks/", "https://discordapp.com/api/webhooks/"),
        r"https://discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{60,}",
    ),
    _Format(
        "stripe-key",
        ("sk_live_", "sk_test_", "rk_live_", "rk_test_"),
        _NB + r"[rs]k_(?:live|test)_[0-9a-zA-Z]{24,247}" + _NA,
    ),
    _Format("stripe-webhook-secret", ("whsec_",), _NB + r"whsec_[A-Za-z0-9+/=]{32,}"),
    _Format("npm-token", ("npm_",), _NB + r"npm_[A-Za-z0-9]{36}" + _NA),
    _Format("pypi-token", ("pypi-AgE",), _NB + r"pypi-AgE[A-Za-z0-9_-]{50,}"),
    _Format("sendgrid-api-key", ("SG.",), _NB + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _NA),
    _Format("digitalocean-token", ("dop_v1_", "doo_v1_", "dor_v1_"), _NB + r"do[opr]_v1_[a-f0-9]{64}" + _NA),
    _Format(
        "shopify-token", ("shpat_", "shpca_", "shppa_", "shpss_"), _NB + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _NA
    ),
    _Format("jwt", ("eyJ",), _NB + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    _Format(
        "private-key",
        ("-----BEGIN",),
        # A whole PEM block, its newlines real or escaped (\n in JSON text); one cut short
        # (a truncated command output) up to where its base64 body ends.
        r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]{0,16384}?-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=:,. -]|\\+[nrt]|\s)*)",
    ),
    _Format("private-key", ("AGE-SECRET-KEY-1",), _NB + r"AGE-SECRET-KEY-1[0-9A-Z]{58}" + _NA),
)

# --------------------------------------------------------------------------------------------
# The built-in rules: secret-named keys, flags and URLs


# Key names whose value is a secret: the name must end with one (``DB_PASSWORD``, ``apiKey``,
# ``x-api-key``, ``aws_secret_access_key``); ``max_tokens`` or ``token_count`` do not.
_KEY_WORDS = ("password", "passwd", "passphrase", "pass", "pwd", "secret", "token", "authorization")
_KEY_COMPOUNDS = (
    "api key",
    "secret key",
    "access key",
    "private key",
    "auth key",
    "signing key",
    "encryption key",
    "master key",
    "client key",
    "account key",
    "session key",
)
# What may stand between a key and its ``=`` or ``:``: a closing quote (plain or JSON-escaped),
# a closing bracket, a space.
_CLOSERS = ("", '"', "'", '\\"', " ", '"]')
# A key ending like this is a digest or an identifier, not a secret, whatever its value looks like.
_NOT_SECRET_KEYS = (
    "integrity",
    "hash",
    "checksum",
    "digest",
    "sha",
    "sha1",
    "sha256",
    "sha512",
    "md5",
    "etag",
    "signature",
    "encrypted_content",
    "id",
    "uuid",
    "guid",
    "commit",
    "rev",
    "revision",
    "version",
    "cursor",
    "nonce",
    "salt",
    "fingerprint",
    "thumbprint",
    "path",
    "file",
    "url",
    "uri",
    "name",
    "model",
    "ref",
    "branch",
    "tag",
    "image",
    "type",
    "kind",
    "mode",
    "format",
)
# Prefixes of identifiers that agent logs are full of (tool calls, messages, requests).
_ID_PREFIXES = (
    "call_",
    "toolu_",
    "msg_",
    "req_",
    "resp_",
    "run_",
    "thread_",
    "file-",
    "file_",
    "chatcmpl-",
    "asst_",
    "batch_",
    "evt_",
    "ch_",
    "cus_",
    "pi_",
    "sub_",
    "in_",
    "prod_",
    "price_",
    "srvtoolu_",
    "rs_",
    "fc_",
)


def _key_variants() -> list[str]:
    words = list(_KEY_WORDS)
    for compound in _KEY_COMPOUNDS:
        first, second = compound.split()
        words += [first + second, f"{first}_{second}", f"{first}-{second}"]
    return words


_KEYS = tuple(_key_variants())
_KEY_TAILS = tuple(sorted({k.replace("-", "_").replace(".", "_") for k in _KEYS}, key=len, reverse=True))
_SHORT_KEYS = ("pass", "pwd")  # only as a whole word: not bypass, not cwd

_VALUE = re.compile(
    r"[ \t]{0,8}(?:"
    r"(?P<esc>\\{1,3})?(?:\"(?P<dq>(?:[^\"\\\n]|\\[^\"\nnrt]){1,%d})|'(?P<sq>[^'\\\n]{1,%d})|`(?P<bq>[^`\\\n]{1,%d}))"
    r"|(?P<uv>[^\s\"'`\\,;&|<>(){}\[\]]{1,%d}))" % (_MAX_VALUE, _MAX_VALUE, _MAX_VALUE, _MAX_VALUE)
)
_AUTH_SCHEME = re.compile(r"(?i:(bearer|basic|token|digest|apikey))[ \t]+(?=\S)")
_PLACEHOLDER_WORDS = frozenset(
    "none null nil true false undefined str string int number bool boolean bytes any optional required secret "
    "password passwd pass token redacted hidden masked env environ changeme xxx example test dummy placeholder "
    "secretstr os self config settings getpass input prompt empty unset default value".split()
)
_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEX_OR_UUID = re.compile(r"[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*")
_HASH_PREFIX = re.compile(r"(?i:sha1|sha224|sha256|sha384|sha512|md5|blake2b?|xxh\d*)[-:]")
_ENTROPY_TOKEN = re.compile(r"[A-Za-z0-9+/=_~.-]{20,%d}" % _MAX_VALUE)
_IDENT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_URL_USERINFO = re.compile(r"//(?P<user>[^\s/@:?#\"'<>]{0,256}):(?P<password>[^\s/?#\"'<>]{1,256})@(?=[A-Za-z0-9\[])")
_URL_SCHEME_END = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}\Z")
_FLAG = re.compile(r"--?(?P<name>(?:[A-Za-z0-9]+-)*(?:[A-Za-z0-9]+))(?:=|[ \t]+)")
_CURL_USER = re.compile(r"-(?:u|-user)(?:[ \t]+|=)(?P<q>[\"']?)[^\s:\"'@]{1,128}:(?P<password>[^\s\"']{1,256})")

# Which kind names a secret that several rules found: the most specific.
_PRIORITY_FORMAT, _PRIORITY_URL, _PRIORITY_USER, _PRIORITY_ASSIGNED, _PRIORITY_ENTROPY = 0, 1, 2, 3, 4


def _key_kind(key: str) -> Optional[str]:
    """The kind of secret a key named ``key`` holds, or ``None`` if its name says it holds none."""
    norm = key.lower().replace("-", "_").replace(".", "_")
    tail = next((t for t in _KEY_TAILS if norm.endswith(t)), None)
    if tail is None:
        return None
    before = key[: len(key) - len(tail)]
    if tail in _SHORT_KEYS and before and before[-1].isalpha() and before[-1].isupper() == key[len(before)].isupper():
        return None  # bypass, COMPASS, OLDPWD (but dbPass, DB_PASS, db-pwd)
    squashed = norm.replace("_", "")
    if "secretaccesskey" in squashed or (squashed.startswith("aws") and "secret" in squashed):
        return "aws-secret-key"
    if tail in ("password", "passwd", "passphrase", "pass", "pwd"):
        return "password"
    if tail == "token":
        return "token"
    if tail == "authorization":
        return "bearer-token"
    if tail in ("api_key", "apikey"):
        return "api-key"
    if tail in ("private_key", "privatekey"):
        return "private-key"
    return "secret"


def _is_placeholder(value: str) -> bool:
    """Whether an assigned value is a reference or a stand-in rather than a secret: a variable
    (``$X``, ``${X}``, ``{{ x }}``, ``%(x)s``), a type or keyword, a mask, a marker."""
    if value.startswith(("$", "{{", "{%", "%(", "%s", "<", MARKER_PREFIX, "***", "...", "•")):
        return True
    if value.lower() in _PLACEHOLDER_WORDS:
        return True
    return len(set(value)) == 1  # xxxxxxxx, ********


def _is_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~/", "file:")) or (
        len(value) > 2 and value[1] == ":" and value[2] in "\\/"
    )


def _assigned_value_is_secret(value: str, kind: str, *, quoted: bool, spaced: bool, colon: bool, follower: str) -> bool:
    """Whether ``value``, assigned to a key whose name says ``kind``, is a literal secret."""
    if not value or _is_placeholder(value) or _is_path(value):
        return False
    if quoted and value[0] in ",;)]}":
        return False  # the quote closed a string that ended with the key ('Password: ', stream)
    if not quoted:
        if follower and follower in "([":
            return False  # password=get_password(), token = tokens[0]
        if _DOTTED_NAME.fullmatch(value):
            return False  # self.token, os.environ, settings.SECRET_KEY
        if _NAME.fullmatch(value):
            has_digit = any(c.isdigit() for c in value)
            if spaced and not has_digit:
                return False  # password = user_password (a variable, in code)
            if colon and not has_digit and (value.islower() or value.istitle()):
                return False  # "Password: required", "token: invalid" (prose)
            if not has_digit and _key_kind(value) is not None:
                return False  # token=access_token, api_key=API_KEY
    if kind == "password":
        return len(value) >= 3
    if any(c.isspace() for c in value):
        return False  # a sentence, not a token ("token": "custom file before token error")
    if value.isdigit() and len(value) < 16:
        return False  # max_token=4096
    if len(value) < 8:
        return False
    return quoted or not value.isalpha() or not value.islower()


def _shannon(token: str) -> float:
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in Counter(token).values())


def _decodes_to_text(token: str) -> bool:
    """Whether ``token`` is base64 (plain or URL-safe) of ordinary text: data, not a key."""
    if len(token) % 4 == 1 or any(c in token for c in "~."):
        return False
    padded = token + "=" * (-len(token) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) < 12:
        return False
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    printable = sum(c.isprintable() or c in "\n\r\t" for c in decoded)
    return printable >= 0.95 * len(decoded)


_JOINERS = re.compile(r"[/._~-]+")
_CAMEL_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _wordish(part: str) -> bool:
    return part.isdigit() or (part.isalpha() and (part.islower() or part.isupper() or part.istitle()))


def looks_random(token: str) -> bool:
    """Whether ``token`` looks machine-generated (a key) rather than written (a word, an
    identifier, a path, a version, a digest): at least 20 characters, a digit and a letter,
    both letter cases or at least 32 characters, no hex-only digest or UUID, and a character
    entropy close to that of random text of its length."""
    n = len(token)
    if n < 20 or _HEX_OR_UUID.fullmatch(token) or _HASH_PREFIX.match(token):
        return False
    if not any(c.isdigit() for c in token) or not any(c.isalpha() for c in token):
        return False
    if not (any(c.isupper() for c in token) and any(c.islower() for c in token)) and n < 32:
        return False
    if token.startswith(_ID_PREFIXES):
        return False
    words = _CAMEL_WORDS.findall(token)
    if sum(map(len, words)) == len(token) and len(token) >= 4 * len(words):
        return False  # an identifier: stringEndArchive64Locator, AWSLambdaBasicExecutionRole2
    parts = [p for p in _JOINERS.split(token) if p]
    if len(parts) > 1 and sum(len(p) for p in parts if _wordish(p)) >= 0.75 * sum(len(p) for p in parts):
        return False  # words and numbers joined: a slug, a version, a host name, a path
    if _shannon(token) < 0.82 * math.log2(min(n, 64)):
        return False
    if sum(ord(b) - ord(a) == 1 for a, b in zip(token, token[1:])) * 4 >= n:
        return False  # an alphabet or a counting sequence: abcdef...0123456789
    return not _decodes_to_text(token)


# --------------------------------------------------------------------------------------------
# The trigger: one regex that finds every place a rule could start


# Where a prefix's trigger anchors, best first: the characters the assignment and flag rules
# anchor on anyway (a prefix anchored there adds no new stop to the scan), then characters rare
# in agent text. Each character of this string is a place the scan stops at.
_ANCHOR_PREFERENCE = "~_-=:JGA9"


def _anchor(literal: str) -> int:
    """Where in ``literal`` its trigger anchors (see ``_ANCHOR_PREFERENCE``)."""
    for c in _ANCHOR_PREFERENCE:
        if c in literal:
            return literal.index(c)
    raise ValueError(f"prefix {literal!r} has no character to anchor on (add one to _ANCHOR_PREFERENCE)")


def _fold(text: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in text)


def _behind(entries: Sequence[tuple[str, str]], *, fold: bool = False, skip: int = 0) -> str:
    """A regex true where the text ``skip`` characters before the position ends with the
    string of one of ``entries`` ``(string, then)``, followed by that entry's ``then`` regex.

    Built as a reversed trie of fixed-width look-behinds, one character per level, each level
    led by a single character-class test: a position that ends with none of the strings fails
    after one or two tests, however many strings there are. Where one string ends another
    (``sk`` in ``ask``), the longer is tried first; entries of one string keep their order."""
    trie: dict = {}
    for string, then in entries:
        node = trie
        for c in reversed(string):
            node = node.setdefault(c.lower() if fold else c, {})
        node.setdefault("", []).append(then)

    def test(chars: Sequence[str], depth: int) -> str:
        if len(chars) == 1:
            body = _fold(chars[0]) if fold else re.escape(chars[0])
        else:
            body = "[" + "".join((c.lower() + c.upper()) if fold and c.isalpha() else re.escape(c) for c in chars) + "]"
        return f"(?<={body}{'.' * depth})"

    def emit(node: dict, depth: int) -> str:
        ends = node.get("", [])
        if "" in ends:
            return ""  # this string matches with nothing after it: longer ones add nothing
        children = sorted(c for c in node if c)
        alternatives = [test([c], depth) + emit(node[c], depth + 1) for c in children]
        if len(children) > 1:
            alternatives = [test(children, depth) + "(?:" + "|".join(alternatives) + ")"]
        alternatives += ends
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

    return emit(trie, skip)


def _window(strings: Sequence[str], *, fold: bool = False, skip: int = 0) -> str:
    """One look-behind true where each of the last characters before the position (``skip``
    characters back) is one the strings have there: a single cheap test that most positions
    fail, put before :func:`_behind`'s exact trie."""
    width = min(len(s) for s in strings)
    classes = []
    for i in range(width, 0, -1):
        chars = sorted({c for s in strings for c in ((s[-i].lower(), s[-i].upper()) if fold else (s[-i],))})
        classes.append("[" + "".join(re.escape(c) for c in chars) + "]")
    return f"(?<={''.join(classes)}{'.' * skip})"


@dataclass(frozen=True)
class _Trigger:
    """Where a handler may find a secret: at ``anchor`` (one character), when the text before
    it ends with ``before`` and ``then`` (a zero-width regex) holds just after it."""

    anchor: str
    before: str
    then: str
    handler: Callable[[str, int], Iterator[tuple[int, int, str, int]]]


def _format_handler(
    formats: tuple[_Format, ...], offset: int
) -> Callable[[str, int], Iterator[tuple[int, int, str, int]]]:
    compiled = [(f, re.compile(f.pattern)) for f in formats]

    def handle(text: str, at: int) -> Iterator[tuple[int, int, str, int]]:
        for fmt, pattern in compiled:
            start = at - offset + fmt.shift
            if start < 0:
                continue
            m = pattern.match(text, start)
            if m is not None and (fmt.validate is None or fmt.validate(m.group())):
                yield (m.start(), m.end(), fmt.kind, _PRIORITY_FORMAT)
                return

    return handle


def _format_triggers() -> list[_Trigger]:
    by_literal: dict[str, list[_Format]] = {}
    for fmt in _FORMATS:
        for prefix in fmt.prefixes:
            by_literal.setdefault(prefix, []).append(fmt)
    triggers = []
    # Longer literals first: with one anchor and one text before it, sk-ant- before sk-.
    for literal in sorted(by_literal, key=len, reverse=True):
        i = _anchor(literal)
        after = literal[i + 1 :]
        triggers.append(
            _Trigger(
                literal[i],
                literal[:i],
                f"(?={re.escape(after)})" if after else "",
                _format_handler(tuple(by_literal[literal]), i),
            )
        )
    return triggers


def _value_span(m: re.Match[str]) -> tuple[bool, int, int]:
    """Whether a :data:`_VALUE` match is quoted, and where its value is. An unquoted value
    ends before a trailing ``:`` or ``.`` (``if token == other:``, the end of a sentence)."""
    for group in ("dq", "sq", "bq"):
        if m.group(group) is not None:
            return True, m.start(group), m.end(group)
    start, end = m.span("uv")
    while end > start and m.string[end - 1] in ":.":
        end -= 1
    return False, start, end


def _separator_handler(text: str, at: int) -> Iterator[tuple[int, int, str, int]]:
    """At a ``=`` or ``:``: the value of a secret-named key, else a random-looking value."""
    end_key = at
    while end_key > 0 and at - end_key < 4 and text[end_key - 1] in "\"'\\] ":
        end_key -= 1
    start_key = end_key
    while start_key > 0 and end_key - start_key < 128 and text[start_key - 1] in _IDENT_CHARS:
        start_key -= 1
    key = text[start_key:end_key]
    after = at + 1
    if after < len(text) and text[after] in "=>" and text[at] in ":=":
        after += 1  # :=, =>, ==
    m = _VALUE.match(text, after)
    if m is None:
        return
    quoted, vstart, vend = _value_span(m)
    value = text[vstart:vend]
    kind = _key_kind(key) if key else None
    if kind is not None:
        if kind == "bearer-token":
            scheme = _AUTH_SCHEME.match(text, vstart)
            if scheme is None:
                return
            if scheme.group(1).lower() == "basic":
                kind = "basic-auth"
            vstart = scheme.end()
            value = text[vstart:vend]
            if not quoted:  # Authorization: Bearer abc (the scheme ended the unquoted value)
                tail = _VALUE.match(text, vstart)
                if tail is None or tail.group("uv") is None:
                    return
                vend = tail.end("uv")
                value = tail.group("uv")
        spaced = text[at - 1 : at] == " " and text[after : after + 1] == " "
        follower = text[vend : vend + 1]
        if _assigned_value_is_secret(
            value, kind, quoted=quoted, spaced=spaced, colon=text[at] == ":", follower=follower
        ):
            yield (vstart, vend, kind, _PRIORITY_ASSIGNED)
            return
    if key and key.lower().replace("-", "_").endswith(_NOT_SECRET_KEYS):
        return
    if text[at - 1 : at] in ("!", "<", ">"):
        return  # a comparison, not an assignment
    if not quoted and (text[vend : vend + 1] in ("(", "[") or _DOTTED_NAME.fullmatch(value.lstrip("~!-+"))):
        return  # code: a call, an index, an attribute (retriever = BM25HF.load_from_hub(...))
    token = _ENTROPY_TOKEN.match(text, vstart, vend)
    if token is not None and token.end() == vend and looks_random(token.group()):
        yield (vstart, vend, "high-entropy", _PRIORITY_ENTROPY)


def _flag_handler(text: str, at: int) -> Iterator[tuple[int, int, str, int]]:
    """At a ``-``: ``--password x``/``--token=x``, or curl's ``-u user:password``."""
    curl = _CURL_USER.match(text, at)
    if curl is not None:
        password = curl.group("password")
        if not _is_placeholder(password) and len(password) >= 3:
            yield (curl.start("password"), curl.end("password"), "password", _PRIORITY_ASSIGNED)
        return
    m = _FLAG.match(text, at)
    if m is None:
        return
    kind = _key_kind(m.group("name"))
    if kind is None:
        return
    value = _VALUE.match(text, m.end())
    if value is None:
        return
    quoted, vstart, vend = _value_span(value)
    if _assigned_value_is_secret(
        text[vstart:vend], kind, quoted=quoted, spaced=False, colon=False, follower=text[vend : vend + 1]
    ):
        yield (vstart, vend, kind, _PRIORITY_ASSIGNED)


def _url_handler(text: str, at: int) -> Iterator[tuple[int, int, str, int]]:
    """At the ``:`` of ``scheme://user:password@host``: the password."""
    if _URL_SCHEME_END.search(text, max(0, at - 31), at) is None:
        return
    m = _URL_USERINFO.match(text, at + 1)
    if m is None:
        return
    password = m.group("password")
    if _is_placeholder(password) or password.lower() in ("password", "pass", "secret"):
        return
    yield (m.start("password"), m.end("password"), "url-password", _PRIORITY_URL)


def _keyword_condition() -> str:
    """True after a separator that follows a secret-named key and a closer. Only the key's last
    six characters are tested (the handler checks the whole name): the trie stays small enough
    to compile in milliseconds."""
    strings = [tail + closer for tail in {key[-6:] for key in _KEYS} for closer in _CLOSERS]
    return _window(strings, fold=True, skip=1) + _behind([(s, "") for s in strings], fold=True, skip=1)


# A run of at least 20 token characters (not a path), with a digit in it, after optional space
# and an opening quote: all a random-looking value needs, tested before Python sees it.
_ENTROPY_AHEAD = (
    r"(?=[ \t]?(?:\\{0,3}[\"'`])?(?=[A-Za-z0-9+=_~.-][A-Za-z0-9+/=_~.-]{19})"
    r"[A-Za-z+/=_~.-]{0,%d}\d)" % _MAX_VALUE
)
_FLAG_KEYS = "|".join(
    _fold(k) for k in sorted({k.replace("_", "-").replace(".", "-") for k in _KEYS}, key=len, reverse=True)
)


def _all_triggers() -> list[_Trigger]:
    triggers = _format_triggers()
    keyword = _keyword_condition()
    for sep in "=:":
        triggers.append(_Trigger(sep, "", f"(?:{keyword}|{_ENTROPY_AHEAD})", _separator_handler))
    triggers.append(_Trigger(":", "", r"(?=//[^\s/@]{1,512}@)", _url_handler))
    triggers.append(_Trigger("-", "", r"(?=-(?:[A-Za-z0-9]+-)*(?:" + _FLAG_KEYS + r")(?:=|[ \t]))", _flag_handler))
    triggers.append(
        _Trigger("-", "", r"(?<=[\s'\"]-)(?=(?:u|-user)(?:[ \t]+|=)[\"']?[^\s:\"'@]{1,128}:)", _flag_handler)
    )
    return triggers


@dataclass(frozen=True)
class _Scanner:
    regex: re.Pattern[str]
    handlers: dict[str, Callable[[str, int], Iterator[tuple[int, int, str, int]]]]


@functools.lru_cache(maxsize=1)
def _scanner() -> _Scanner:
    """The compiled trigger. Every top-level alternative starts with its anchor character, so the
    regex engine skips from one anchor character to the next without entering the pattern; at
    an anchor, the triggers' look-behinds form one trie (:func:`_behind`). Each trigger ends in
    an empty named group: the match's ``lastgroup`` names its handler."""
    by_anchor: dict[str, list[tuple[str, str]]] = {}
    handlers: dict[str, Callable[[str, int], Iterator[tuple[int, int, str, int]]]] = {}
    for i, trigger in enumerate(_all_triggers()):
        name = f"t{i}"
        handlers[name] = trigger.handler
        by_anchor.setdefault(trigger.anchor, []).append((trigger.before, f"{trigger.then}(?P<{name}>)"))
    # The look-behinds are tested after the anchor was consumed: skip it.
    branches = [re.escape(anchor) + "(?:" + _behind(entries, skip=1) + ")" for anchor, entries in by_anchor.items()]
    return _Scanner(re.compile("|".join(branches), re.DOTALL), handlers)


BUILTIN_KINDS = frozenset(
    [f.kind for f in _FORMATS]
    + [
        "url-password",
        "password",
        "secret",
        "token",
        "api-key",
        "aws-secret-key",
        "private-key",
        "bearer-token",
        "basic-auth",
        "high-entropy",
    ]
)


# --------------------------------------------------------------------------------------------
# The redactor


class Redactor:
    """Finds and replaces secrets as ``config`` says (the built-in rules, plus a store's). Cheap
    to create: the built-in rules are compiled once per process and shared."""

    def __init__(self, config: Optional[RedactConfig] = None):
        self.config = config if config is not None else RedactConfig()
        self._scan = _scanner()
        self._check_allowed = bool(self.config.allow or self.config.allow_patterns)

    def _raw(self, text: str) -> Iterator[tuple[int, int, str, int]]:
        """Every candidate finding, unfiltered and possibly overlapping, in no particular order."""
        search, handlers = self._scan.regex.search, self._scan.handlers
        m = search(text)
        while m is not None:  # most texts: not once
            at = m.start()
            yield from handlers[m.lastgroup](text, at)  # type: ignore[index]
            m = search(text, at + 1)
        for pattern in self.config.patterns:
            for found in pattern.regex.finditer(text):
                start, end = found.span(pattern.group)
                if end > start:
                    yield (start, end, pattern.kind, _PRIORITY_USER)

    def _accepted(self, text: str) -> Iterator[tuple[int, int, str, int]]:
        config = self.config
        markers = [m.span() for m in _MARKER.finditer(text)] if MARKER_PREFIX in text else []
        for start, end, kind, priority in self._raw(text):
            if kind in config.disabled and priority != _PRIORITY_USER:
                continue
            if markers and any(start < m_end and m_start < end for m_start, m_end in markers):
                continue
            if self._check_allowed and self._allowed(text[start:end]):
                continue
            yield (start, end, kind, priority)

    def _allowed(self, secret: str) -> bool:
        return secret in self.config.allow or any(p.fullmatch(secret) for p in self.config.allow_patterns)

    def findings(self, text: str) -> list[Finding]:
        """The secrets in ``text``, in order and not overlapping (overlapping candidates are
        merged, keeping the kind of the most specific rule: a known format over a user pattern
        over a secret-named key over mere entropy). Empty when redaction is disabled."""
        if not self.config.enabled or not text:
            return []
        if not self.config.patterns and self._scan.regex.search(text) is None:
            return []  # the common case, at the cost of one regex search
        raw = sorted(self._accepted(text), key=lambda f: (f[0], -f[1]))
        merged: list[list] = []
        for start, end, kind, priority in raw:
            if merged and start < merged[-1][1]:
                last = merged[-1]
                if priority < last[3] or (priority == last[3] and end - start > last[1] - last[0]):
                    last[2], last[3] = kind, priority
                last[1] = max(last[1], end)
            else:
                merged.append([start, end, kind, priority])
        return [Finding(kind, start, end) for start, end, kind, _ in merged]

    def contains_secret(self, text: str) -> bool:
        """Whether :meth:`findings` would find anything (stops at the first secret)."""
        if not self.config.enabled or not text:
            return False
        if not self.config.patterns and self._scan.regex.search(text) is None:
            return False
        return next(self._accepted(text), None) is not None

    def redact_text(self, text: str) -> str:
        """``text`` with each secret replaced by its marker; the very same object when there is
        none. Idempotent: ``redact_text(redact_text(t)) == redact_text(t)``."""
        return _apply(text, self.findings(text))

    def redact_value(self, value: Any) -> Any:
        """A JSON value (dicts, lists, strings, numbers, booleans, ``None``, nested to any depth)
        with every string redacted; dict keys are kept. A string under a secret-named key
        (``password``, ``api_key``, ``token``, ``secret``, ...) that is a literal secret is
        replaced whole by one marker, even when nothing in the string alone looks like a secret.
        The input is never modified; containers with nothing to redact are returned as they
        are (the same objects), changed ones as copies."""
        if isinstance(value, str):
            return self.redact_text(value)
        if not isinstance(value, (dict, list)) or not self.config.enabled:
            return value
        root = _Frame(value, None, None)
        stack = [root]
        while stack:
            frame = stack[-1]
            for key, child in frame.items:
                if isinstance(child, str):
                    new = self._redact_entry(frame.name_for(key), child)
                    if new is not child:
                        frame.set(key, new)
                    if not frame.is_dict:
                        frame.previous = child
                elif isinstance(child, (dict, list)) and child:
                    stack.append(_Frame(child, frame, key))
                    break
            else:
                stack.pop()
                if frame.copy is not None and frame.parent is not None:
                    frame.parent.set(frame.key, frame.copy)
        return root.copy if root.copy is not None else value

    def _redact_entry(self, key: Any, text: str) -> str:
        """A string found under ``key`` in a dict (``key`` is ``None`` in a list)."""
        found = self.findings(text)
        kind = _key_kind(key) if isinstance(key, str) and key else None
        if kind is None or not text or MARKER_PREFIX in text:
            return _apply(text, found)
        value = text
        if kind == "bearer-token":
            scheme = _AUTH_SCHEME.match(text)
            if scheme is not None:
                kind = "basic-auth" if scheme.group(1).lower() == "basic" else kind
                value = text[scheme.end() :]
        if kind in self.config.disabled or not _assigned_value_is_secret(
            value, kind, quoted=True, spaced=False, colon=False, follower=""
        ):
            return _apply(text, found)
        if self._check_allowed and (self._allowed(text) or self._allowed(value)):
            return _apply(text, found)
        # The whole value is the secret; a recognized format names it better than the key does.
        specific = next((f.kind for f in found if f.kind != "high-entropy"), kind)
        return marker(specific)


def _apply(text: str, found: list[Finding]) -> str:
    if not found:
        return text
    pieces, last = [], 0
    for f in found:
        pieces.append(text[last : f.start])
        pieces.append(marker(f.kind))
        last = f.end
    pieces.append(text[last:])
    return "".join(pieces)


# A dict naming its value beside it: {"name": "API_KEY", "value": "..."} (Kubernetes, ECS, tags).
_PAIR_NAME_KEYS = ("name", "Name", "key", "Key")
_PAIR_VALUE_KEYS = frozenset(("value", "Value"))


class _Frame:
    """One container being walked by :meth:`Redactor.redact_value`, copied on first change.

    A string's *name* is what names it: its key in a dict, or the sibling ``name``/``key`` of a
    ``value`` (``{"name": "DB_PASSWORD", "value": "..."}``, as environment lists and tags are
    written), or in a list the string before it (``["--password", "..."]`` in an argv,
    ``["Authorization", "Bearer ..."]`` in a header pair), its leading dashes dropped."""

    __slots__ = ("source", "items", "copy", "parent", "key", "is_dict", "pair_name", "previous")

    def __init__(self, source: Union[dict, list], parent: Optional[_Frame], key: Any):
        self.source = source
        self.is_dict = isinstance(source, dict)
        self.pair_name: Optional[str] = None
        if isinstance(source, dict):
            for field_name in _PAIR_NAME_KEYS:
                named = source.get(field_name)
                if isinstance(named, str) and named:
                    self.pair_name = named
                    break
        self.previous: Optional[str] = None
        self.items: Iterator[tuple[Any, Any]] = iter(source.items()) if isinstance(source, dict) else enumerate(source)
        self.copy: Union[dict, list, None] = None
        self.parent = parent
        self.key = key

    def name_for(self, key: Any) -> Optional[str]:
        """The name of the string at ``key`` (see the class docstring), or ``None``."""
        if self.is_dict:
            if key in _PAIR_VALUE_KEYS and self.pair_name is not None:
                return self.pair_name
            return key if isinstance(key, str) else None
        return self.previous.lstrip("-") or None if self.previous is not None else None

    def set(self, key: Any, value: Any) -> None:
        if self.copy is None:
            self.copy = dict(self.source) if isinstance(self.source, dict) else list(self.source)
        self.copy[key] = value


@functools.lru_cache(maxsize=1)
def default_redactor() -> Redactor:
    """The redactor with the built-in rules only (no store config)."""
    return Redactor()


def redact_text(text: str) -> str:
    """:meth:`Redactor.redact_text` with the built-in rules."""
    return default_redactor().redact_text(text)


def redact_value(value: Any) -> Any:
    """:meth:`Redactor.redact_value` with the built-in rules."""
    return default_redactor().redact_value(value)


def contains_secret(text: str) -> bool:
    """:meth:`Redactor.contains_secret` with the built-in rules."""
    return default_redactor().contains_secret(text)


def findings(text: str) -> list[Finding]:
    """:meth:`Redactor.findings` with the built-in rules."""
    return default_redactor().findings(text)


def redactor_for(root: Union[os.PathLike, str]) -> Redactor:
    """The redactor of the store at ``root`` (its ``config.toml``, read now)."""
    return Redactor(load_config(root))
