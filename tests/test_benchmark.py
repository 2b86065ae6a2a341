"""The benchmark script runs and reports every figure (its targets are checked by running it)."""

import json

import benchmark


def test_scripted_session_reports_each_configuration(capsys):
    assert benchmark.main(["--turns", "3", "--window", "30000"]) == 0
    out = capsys.readouterr().out
    assert "full pipeline" in out and "caching off" in out and "cheap layers off" in out
    for row in ("billed input tokens", "cache-read share", "peak context", "prompt-too-long errors",
                "pipeline ms median", "compact_history", "1,000 messages"):
        assert row in out


def test_the_scripted_session_is_long_enough():
    session = benchmark.scripted_session(seed=7)
    assert session.model_calls >= 200
    texts = json.dumps([r for _, replies in session.turns for r in replies], ensure_ascii=False)
    assert "笔记" in texts and texts.count('"tool_use"') > session.model_calls / 2


def test_a_transcript_can_be_replayed(tmp_path, capsys, s08):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "read a.py"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file",
                                           "input": {"path": "a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x = 1\n" * 500}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It sets x."}]},
    ]
    path = s08.save_transcript(tmp_path, history, "compact")
    session = benchmark.replayed_session(path, s08)
    assert session.turns[0][0] == "read a.py" and len(session.turns[0][1]) == 2
    assert benchmark.main(["--replay", str(path), "--window", "30000"]) == 0
    out = capsys.readouterr().out
    assert "1 user turns, 2 scripted model calls" in out and "Targets" not in out
