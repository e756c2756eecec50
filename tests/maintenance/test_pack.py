import hashlib
import os
import stat
import time
import tracemalloc

import orjson
import pytest
from support import write_session_files

import memstore.pack as pack_mod
from memstore import (
    AuditPackEntry,
    InvalidPack,
    SessionAuditPack,
    StoreIOError,
    create_audit_pack,
    read_audit_pack,
    verify_audit_pack,
    write_audit_pack,
)

EVENTS = (
    b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'
    b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":1}}}\n'
)


def make_session(root, session_id="s1", status="completed"):
    """A session as the event log leaves it: manifest.json, events.jsonl, derived/ and index/."""
    session_dir = write_session_files(root, session_id, status=status, events=EVENTS)
    (session_dir / "index").mkdir()
    (session_dir / "derived" / "memory.json").write_bytes(b'{"facts":[]}')
    (session_dir / "index" / "turns.json").write_bytes(b"[]")
    return session_dir


def entry(path, data=b""):
    return AuditPackEntry(path, len(data), hashlib.sha256(data).hexdigest())


# --------------------------------------------------------------------------------------------
# Reference scenarios


def test_round_trip_verifies_clean(tmp_path):
    make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.verified
    assert (result.mismatches, result.missing, result.unaccounted) == ([], [], [])


def test_one_byte_tamper_is_a_mismatch(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    data = bytearray((session_dir / "events.jsonl").read_bytes())
    data[10] ^= 0x01  # same size, different content
    (session_dir / "events.jsonl").write_bytes(bytes(data))
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert not result.verified
    assert result.mismatches == ["events.jsonl"]
    assert result.missing == []


def test_size_change_is_a_mismatch(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    with open(session_dir / "events.jsonl", "ab") as fh:
        fh.write(b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n')
    assert verify_audit_pack(tmp_path, "s1", pack).mismatches == ["events.jsonl"]


def test_file_added_after_packing_is_unaccounted_but_verifies(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    (session_dir / "derived" / "eviction-summary-0001.json").write_bytes(b"{}")
    (session_dir / "new.txt").write_bytes(b"x")
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.verified
    assert result.unaccounted == ["derived/eviction-summary-0001.json", "new.txt"]


def test_deleted_file_is_missing_only(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    (session_dir / "derived" / "memory.json").unlink()
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert not result.verified
    assert result.missing == ["derived/memory.json"]
    assert result.mismatches == []


@pytest.mark.parametrize(
    "bad_path",
    [
        "../outside.json",
        "/etc/passwd",
        "derived/../../escape",
        "",
        "./events.jsonl",
        "derived\\..\\..\\escape",
        "..\\outside.json",
        "C:",
        "C:/Windows/win.ini",
        "c:events.jsonl",
        "derived//memory.json",
        "derived/",
        "nul\x00byte",
    ],
)
def test_unsafe_entry_paths_are_invalid_pack(tmp_path, bad_path):
    make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    pack.entries.append(entry(bad_path))
    with pytest.raises(InvalidPack):
        verify_audit_pack(tmp_path, "s1", pack)


def test_paths_are_validated_before_any_file_is_opened(tmp_path, monkeypatch):
    make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    pack.entries.append(entry("../outside.json"))  # last, after valid entries
    opened = []
    real_open = pack_mod._open_beneath
    monkeypatch.setattr(pack_mod, "_open_beneath", lambda *a: opened.append(a) or real_open(*a))
    with pytest.raises(InvalidPack, match="outside"):
        verify_audit_pack(tmp_path, "s1", pack)
    assert opened == []


def test_duplicate_entry_is_invalid_pack(tmp_path):
    make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    pack.entries.append(pack.entries[0])
    with pytest.raises(InvalidPack, match="twice"):
        verify_audit_pack(tmp_path, "s1", pack)


def test_missing_session_is_an_io_error_naming_the_path(tmp_path):
    with pytest.raises(StoreIOError) as info:
        create_audit_pack(tmp_path, "nope")
    assert info.value.path == str(tmp_path / "sessions" / "nope")
    pack = SessionAuditPack("nope", "t", "completed", 0, 0, [])
    with pytest.raises(StoreIOError) as info:
        verify_audit_pack(tmp_path, "nope", pack)
    assert str(tmp_path / "sessions" / "nope") in str(info.value)


def test_inventory_is_deterministic_and_sorted(tmp_path):
    session_dir = make_session(tmp_path)
    for name in ("b.txt", "a.txt", "Z.txt", "derived/zz.json", "derived/aa.json", "a/b/c.txt"):
        (session_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (session_dir / name).write_bytes(name.encode())
    first = create_audit_pack(tmp_path, "s1")
    second = create_audit_pack(tmp_path, "s1")
    paths = [e.path for e in first.entries]
    assert paths == sorted(paths)
    assert first.entries == second.entries
    assert paths == [
        "Z.txt",
        "a.txt",
        "a/b/c.txt",
        "b.txt",
        "derived/aa.json",
        "derived/memory.json",
        "derived/zz.json",
        "events.jsonl",
        "index/turns.json",
        "manifest.json",
    ]
    by_path = {e.path: e for e in first.entries}
    assert by_path["events.jsonl"].bytes == len(EVENTS)
    assert by_path["events.jsonl"].sha256 == hashlib.sha256(EVENTS).hexdigest()


def test_default_location_write_read_round_trip_excludes_itself(tmp_path):
    session_dir = make_session(tmp_path)
    pack, path = write_audit_pack(tmp_path, "s1")
    assert path == session_dir / "derived" / "audit-pack.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = read_audit_pack(path)
    assert loaded == pack
    assert "derived/audit-pack.json" not in [e.path for e in loaded.entries]
    # The written pack is in the session now; a second pack still does not list it, and
    # verification does not report it as unaccounted.
    again, _ = write_audit_pack(tmp_path, "s1")
    assert [e.path for e in again.entries] == [e.path for e in pack.entries]
    assert verify_audit_pack(tmp_path, "s1", loaded).unaccounted == []


def test_audit_pack_json_is_excluded_at_any_depth(tmp_path):
    session_dir = make_session(tmp_path)
    (session_dir / "audit-pack.json").write_bytes(b"{}")
    (session_dir / "index" / "audit-pack.json").write_bytes(b"{}")
    paths = [e.path for e in create_audit_pack(tmp_path, "s1").entries]
    assert not [p for p in paths if p.endswith("audit-pack.json")]


def test_schema_version_99_is_refused_at_read_time(tmp_path):
    make_session(tmp_path)
    _, path = write_audit_pack(tmp_path, "s1")
    data = orjson.loads(path.read_bytes())
    data["schema_version"] = 99
    path.write_bytes(orjson.dumps(data))
    with pytest.raises(InvalidPack, match="unsupported schema_version 99 \\(expected 1\\)"):
        read_audit_pack(path)


# --------------------------------------------------------------------------------------------
# Format, reading and writing


def test_pack_copies_manifest_summary_and_is_pretty_json(tmp_path):
    make_session(tmp_path, status="active")
    pack, path = write_audit_pack(tmp_path, "s1")
    assert (pack.session_id, pack.status, pack.turn_count, pack.event_count) == ("s1", "active", 1, 2)
    text = path.read_text()
    assert text.startswith('{\n  "schema_version": 1,\n  "session_id": "s1",\n  "generated_at": ')
    data = orjson.loads(text)
    assert list(data) == [
        "schema_version",
        "session_id",
        "generated_at",
        "status",
        "turn_count",
        "event_count",
        "entries",
    ]
    assert list(data["entries"][0]) == ["path", "bytes", "sha256"]


def test_write_to_custom_output(tmp_path):
    make_session(tmp_path)
    out = tmp_path / "packs" / "s1.json"
    with pytest.raises(StoreIOError):
        write_audit_pack(tmp_path, "s1", out)  # the directory must exist
    out.parent.mkdir()
    pack, path = write_audit_pack(tmp_path, "s1", out)
    assert path == out and read_audit_pack(out) == pack
    assert not (tmp_path / "sessions" / "s1" / "derived" / "audit-pack.json").exists()


@pytest.mark.parametrize("manifest", [None, b'{"broken"', b'{"session_id":"s1"}'])
def test_missing_or_malformed_manifest_is_an_error_naming_it(tmp_path, manifest):
    session_dir = make_session(tmp_path)
    if manifest is None:
        (session_dir / "manifest.json").unlink()
    else:
        (session_dir / "manifest.json").write_bytes(manifest)
    with pytest.raises(StoreIOError) as info:
        create_audit_pack(tmp_path, "s1")
    assert info.value.path == str(session_dir / "manifest.json")


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"schema_version":"1","session_id":"s","generated_at":"t","status":"s","turn_count":0,"event_count":0,"entries":[]}',
        b'{"schema_version":true,"session_id":"s","generated_at":"t","status":"s","turn_count":0,"event_count":0,"entries":[]}',
        b'{"schema_version":1,"session_id":"s","generated_at":"t","status":"s","turn_count":-1,"event_count":0,"entries":[]}',
        b'{"schema_version":1,"session_id":"s","generated_at":"t","status":"s","turn_count":0,"event_count":0}',
        b'{"schema_version":1,"session_id":"s","generated_at":"t","status":"s","turn_count":0,"event_count":0,'
        b'"entries":[{"path":"a","bytes":1,"sha256":"XYZ"}]}',
        b'{"schema_version":1,"session_id":"s","generated_at":"t","status":"s","turn_count":0,"event_count":0,'
        b'"entries":[{"path":3,"bytes":1,"sha256":"' + b"0" * 64 + b'"}]}',
    ],
)
def test_malformed_pack_files_are_invalid_pack(tmp_path, content):
    path = tmp_path / "pack.json"
    path.write_bytes(content)
    with pytest.raises(InvalidPack) as info:
        read_audit_pack(path)
    assert str(path) in str(info.value)


def test_reading_a_missing_pack_is_an_io_error(tmp_path):
    with pytest.raises(StoreIOError) as info:
        read_audit_pack(tmp_path / "absent.json")
    assert info.value.path == str(tmp_path / "absent.json")


def test_unknown_schema_version_object_is_refused_by_verify(tmp_path):
    make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    pack.schema_version = 2
    with pytest.raises(InvalidPack, match="schema_version 2"):
        verify_audit_pack(tmp_path, "s1", pack)


# --------------------------------------------------------------------------------------------
# Symlinks and special files


def test_symlinks_are_never_followed_while_packing(tmp_path):
    session_dir = make_session(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    (session_dir / "link.txt").symlink_to(outside / "secret.txt")
    (session_dir / "linkdir").symlink_to(outside)
    paths = [e.path for e in create_audit_pack(tmp_path, "s1").entries]
    assert not [p for p in paths if p.startswith("link")]


def test_a_packed_file_replaced_by_a_symlink_is_a_mismatch(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(EVENTS)  # identical content, but reached through a symlink
    (session_dir / "events.jsonl").unlink()
    (session_dir / "events.jsonl").symlink_to(copy)
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.mismatches == ["events.jsonl"] and not result.verified


def test_a_packed_directory_replaced_by_a_symlink_is_not_followed(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    elsewhere = tmp_path / "elsewhere"
    (session_dir / "derived").rename(elsewhere)
    (session_dir / "derived").symlink_to(elsewhere)
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.mismatches == ["derived/memory.json"] and not result.verified


def test_a_symlinked_session_directory_is_refused(tmp_path):
    real = make_session(tmp_path, "real")
    (tmp_path / "sessions" / "alias").symlink_to(real)
    with pytest.raises(StoreIOError, match="symlink"):
        create_audit_pack(tmp_path, "alias")


def test_fifos_and_temp_files_are_not_inventoried_but_hidden_files_are(tmp_path):
    session_dir = make_session(tmp_path)
    os.mkfifo(session_dir / "pipe")
    (session_dir / ".manifest.json.tmp-1-abc").write_bytes(b"partial")  # an atomic write's temp
    (session_dir / ".notes").write_bytes(b"hidden, but a file like any other")
    pack = create_audit_pack(tmp_path, "s1")  # must not block on the FIFO
    paths = [e.path for e in pack.entries]
    assert "pipe" not in paths and ".manifest.json.tmp-1-abc" not in paths
    assert ".notes" in paths
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.verified and result.unaccounted == []


def test_a_packed_file_replaced_by_a_fifo_is_a_mismatch_without_blocking(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    (session_dir / "derived" / "memory.json").unlink()
    os.mkfifo(session_dir / "derived" / "memory.json")
    assert verify_audit_pack(tmp_path, "s1", pack).mismatches == ["derived/memory.json"]


# --------------------------------------------------------------------------------------------
# Large sessions


def test_a_100mb_session_verifies_with_flat_memory(tmp_path):
    session_dir = make_session(tmp_path)
    size = 100 * 1024 * 1024
    with open(session_dir / "events.jsonl", "r+b") as fh:
        fh.truncate(size)  # sparse: quick to create, still 100 MB to read and hash
        fh.seek(size - 4)
        fh.write(b"end\n")
    started = time.perf_counter()
    tracemalloc.start()
    try:
        pack = create_audit_pack(tmp_path, "s1")
        result = verify_audit_pack(tmp_path, "s1", pack)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - started
    assert result.verified
    assert {e.path: e.bytes for e in pack.entries}["events.jsonl"] == size
    assert peak < 4 * 1024 * 1024, f"peak traced memory {peak} bytes"
    assert elapsed < 10


def test_a_packed_directory_replaced_by_a_file_means_its_files_are_missing(tmp_path):
    session_dir = make_session(tmp_path)
    pack = create_audit_pack(tmp_path, "s1")
    (session_dir / "index" / "turns.json").unlink()
    (session_dir / "index").rmdir()
    (session_dir / "index").write_bytes(b"not a directory")
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert result.missing == ["index/turns.json"] and result.mismatches == []
    assert result.unaccounted == ["index"]
