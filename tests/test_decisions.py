"""eval/decisions.py: the "decisions identical" proof a refactor commit shows."""

from __future__ import annotations

import json

from eval import decisions

EVENTS = [
    {"event": "forward", "round": 0, "duration_s": 0.01},
    {"event": "park", "round": 1, "rid": "A", "action": "native", "reason": "no_producer"},
    {"event": "parked", "round": 1, "rid": "B", "producer": "A", "depth": 342, "ready": 0},
    {"event": "round", "round": 1, "visited": 2, "blocked": 1, "t_start": 0.5, "t_end": 0.7},
]


def write(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_clock_fields_and_forwards_are_not_decisions(tmp_path, capsys):
    later = [dict(e) for e in EVENTS]
    later[0]["duration_s"], later[3]["t_start"] = 0.02, 9.0
    a, b = write(tmp_path / "a.jsonl", EVENTS), write(tmp_path / "b.jsonl", later)
    assert decisions.main([str(a), str(b)]) == 0
    assert "identical (3 decisions)" in capsys.readouterr().out


def test_a_field_one_event_lacks_differs_even_when_the_other_holds_none(tmp_path, capsys):
    later = [dict(e) for e in EVENTS]
    later[1]["producer"] = None  # NOTE: a new field; the loop's pass_s is a clock reading
    later[3]["pass_s"] = 0.004
    a, b = write(tmp_path / "a.jsonl", EVENTS), write(tmp_path / "b.jsonl", later)
    assert decisions.main([str(a), str(b)]) == 1
    assert "park of A in round 1): producer 'absent' vs None" in capsys.readouterr().out


def test_a_moved_decision_names_its_event_and_field(tmp_path, capsys):
    moved = [dict(e) for e in EVENTS]
    moved[2]["depth"] = 320
    a, b = write(tmp_path / "a.jsonl", EVENTS), write(tmp_path / "b.jsonl", moved)
    assert decisions.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "decision 2" in out and "parked of B in round 1" in out and "depth 342 vs 320" in out


def test_a_missing_decision_and_directories_compare_file_by_file(tmp_path, capsys):
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    write(tmp_path / "x" / "radixflow.jsonl", EVENTS)
    write(tmp_path / "y" / "radixflow.jsonl", EVENTS[:3])
    assert decisions.main([str(tmp_path / "x"), str(tmp_path / "y")]) == 1
    assert "has 3 decisions" in capsys.readouterr().out
