"""The audit chain: written, verified, and broken in every way the issue names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.observability.audit import AuditTrail, chain_files, verify


def write(path: Path, n: int, **kw) -> None:
    trail = AuditTrail(path, **kw)
    for i in range(n):
        trail.record("request", request_id=f"r{i}", key_id="k1", status=200, models=["m"], prompt_tokens=i)
    trail.close()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_an_untouched_trail_verifies_and_restart_continues_the_chain(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 5)
    write(path, 3)  # a restart: seq and prev carry on from the file
    recs = [json.loads(x) for x in lines(path)]
    assert [r["seq"] for r in recs] == list(range(8))
    assert all(b["prev"] == a["hash"] for a, b in zip(recs, recs[1:]))
    v = verify(path)
    assert v.ok and v.records == 8, v.problems


def test_an_edited_record_is_found_with_its_line(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 6)
    ls = lines(path)
    rec = json.loads(ls[3])
    rec["prompt_tokens"] = 999
    ls[3] = json.dumps(rec)
    path.write_text("\n".join(ls) + "\n")
    v = verify(path)
    assert not v.ok
    assert any(f"{path}:4:" in p and "edited" in p for p in v.problems), v.problems


def test_an_edit_that_recomputes_the_hash_still_breaks_the_next_link(tmp_path):
    from appliance.observability.audit import canonical, record_hash

    path = tmp_path / "audit.log"
    write(path, 4)
    ls = lines(path)
    rec = json.loads(ls[1])
    rec["key_id"] = "someone-else"
    rec["hash"] = record_hash(rec)
    ls[1] = canonical(rec).decode()
    path.write_text("\n".join(ls) + "\n")
    v = verify(path)
    assert any(f"{path}:3:" in p and "does not chain" in p for p in v.problems), v.problems


def test_a_removed_record_is_found(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 6)
    ls = lines(path)
    del ls[2]
    path.write_text("\n".join(ls) + "\n")
    v = verify(path)
    assert any(f"{path}:3:" in p and "removed" in p for p in v.problems), v.problems


def test_reordered_records_are_found(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 6)
    ls = lines(path)
    ls[2], ls[3] = ls[3], ls[2]
    path.write_text("\n".join(ls) + "\n")
    v = verify(path)
    assert not v.ok
    assert any(f"{path}:4:" in p and "reordered" in p for p in v.problems), v.problems


def test_rotation_keeps_the_chain_across_files(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 40, max_bytes=2000, keep=100)
    files = chain_files(path)
    assert len(files) > 2
    recs = [json.loads(x) for f in files for x in lines(f)]
    assert [r["seq"] for r in recs] == list(range(40))
    v = verify(path)
    assert v.ok and v.records == 40, v.problems
    # a record removed from a rotated file is found in that file
    ls = lines(files[0])
    del ls[1]
    files[0].write_text("\n".join(ls) + "\n")
    v = verify(path)
    assert any(str(files[0]) in p and "removed" in p for p in v.problems), v.problems


def test_rotation_drops_the_oldest_beyond_keep_and_notes_where_the_chain_starts(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 60, max_bytes=1500, keep=2)
    assert len(chain_files(path)) == 3
    v = verify(path)
    assert v.ok, v.problems
    assert any("starts at seq" in n for n in v.notes)


def test_a_torn_last_line_is_trimmed_on_open(tmp_path):
    path = tmp_path / "audit.log"
    write(path, 3)
    with open(path, "ab") as f:
        f.write(b'{"seq": 3, "ts"')  # power cut mid-write
    assert any("torn" in n for n in verify(path).notes)
    write(path, 2)
    v = verify(path)
    assert v.ok and v.records == 5, v.problems


def test_cli_verify_exit_codes(tmp_path, capsys):
    path = tmp_path / "audit.log"
    write(path, 3)
    assert main(["audit", "verify", str(path)]) == 0
    assert "ok: 3 records" in capsys.readouterr().out
    ls = lines(path)
    path.write_text("\n".join([ls[0], ls[2]]) + "\n")
    assert main(["audit", "verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and f"{path}:2" in out


@pytest.mark.parametrize("line", ['{"seq": 9014, "hash": null}', '{"seq": 5, "hash": 7}', "[1]",
                                  '{"seq": "x", "hash": "a"}', "{}"])
def test_a_last_line_that_is_no_record_neither_stops_the_start_nor_the_writer(tmp_path, line):
    # one appended line of JSON that is no record kept the server from starting (a traceback),
    # killed the writer thread for the run (every later record lost, no error counted) or
    # restarted the chain at seq 0 mid-file
    path = tmp_path / "audit.log"
    write(path, 3)
    with open(path, "a") as f:
        f.write(line + "\n")
    trail = AuditTrail(path)
    trail.record("request", request_id="after")
    trail.close()
    assert trail.errors == 0
    recs = [json.loads(x) for x in lines(path)]
    assert recs[-1]["request_id"] == "after" and recs[-1]["seq"] == 3 and recs[-1]["prev"] == recs[2]["hash"]
    v = verify(path)  # the line is reported where it is, the chain around it holds
    assert v.problems == [f"{path}:4: not a valid audit record"], v.problems


@pytest.mark.parametrize(("field", "value"), [("seq", "2"), ("seq", None), ("prev", 12345), ("prev", "é" * 64),
                                              ("hash", True)])
def test_verify_reports_a_field_edited_to_another_type(tmp_path, field, value):
    path = tmp_path / "audit.log"
    write(path, 4)
    ls = lines(path)
    rec = json.loads(ls[2])
    rec[field] = value
    ls[2] = json.dumps(rec)
    path.write_text("\n".join(ls) + "\n")
    v = verify(path)  # (a traceback before)
    assert f"{path}:3: not a valid audit record" in v.problems, v.problems
    assert not verify(tmp_path).ok and "a directory" in verify(tmp_path).problems[0]
