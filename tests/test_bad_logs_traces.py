"""`overlap-sim log` and `overlap-sim gaps` refuse values a real SGLang log or Chrome trace cannot hold:
exit 2, one line on stderr naming the file and the field (and the line), nothing written."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.jsonio import loads_top_level as _loads_top

GOOD = ("[2026-10-16 14:07:18 TP0] Decode batch, #running-req: 8, #token: 4480, token usage: 0.50, cuda graph: True, "
        "gen throughput (token/s): 2010.5, #queue-req: 2, ")
KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7}


def _decode(ts: str = "2026-10-16 14:07:16", ranks: str = " TP0", **values) -> str:
    fields = {"#running-req": "8", "#token": "4160", "token usage": "0.01", "cuda graph": "True",
              "gen throughput (token/s)": "2000.5", "#queue-req": "0", **values}
    return f"[{ts}{ranks}] Decode batch, " + ", ".join(f"{k}: {v}" for k, v in fields.items()) + ", "


def _refused(capsys, argv, *words) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.mark.parametrize("label, text", [
    ("#running-req", "-8"), ("token usage", "-0.01"), ("gen throughput (token/s)", "-2000.5"),
    ("token usage", "5.0"), ("#queue-req", "-1"), ("swa token usage", "1.5"), ("cache hit rate", "150.00%"),
    ("accept rate", "1.2"),
])
def test_log_value_sglang_cannot_write_exits_2(tmp_path, capsys, label, text):
    log = tmp_path / "server.log"
    log.write_text("some startup line\n" + _decode(**{label: text}) + "\n" + GOOD + "\n")
    out = tmp_path / "out"
    _refused(capsys, ["log", str(log), "--out", str(out)], str(log), f"line 2: {label}:", text)
    assert not out.exists()


def test_log_fuzzer_case_is_refused_on_its_first_bad_field(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text(_decode(**{"#running-req": "-8", "token usage": "-0.01", "gen throughput (token/s)": "-2000.5"})
                   + "\n" + _decode(ts="2026-10-16 14:07:18", **{"token usage": "5.0",
                                                                 "gen throughput (token/s)": "2010.5"}) + "\n")
    _refused(capsys, ["log", str(log), "--out", str(tmp_path / "o")], str(log), "line 1: #running-req", "negative")
    assert not (tmp_path / "o").exists()


def test_log_rounded_minus_zero_and_full_pool_are_fine(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text(_decode(**{"token usage": "-0.00"}) + "\n" + _decode(**{"token usage": "1.00"}) + "\n")
    assert main(["log", str(log), "--json", "--out", str(tmp_path / "o")]) == 0
    assert [r["token_usage"] for r in json.loads(capsys.readouterr().out)["records"]] == [0.0, 1.0]


def test_log_timestamp_going_back_exits_2(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text(_decode(ts="2026-10-16 14:07:18") + "\n\n" + _decode(ts="2026-10-16 14:07:16") + "\n")
    out = tmp_path / "out"
    _refused(capsys, ["log", str(log), "--out", str(out)], str(log), "line 3: timestamp", "back in time", "line 1")
    assert not out.exists()


def test_log_equal_timestamps_and_ranks_interleaving_are_fine(tmp_path, capsys):
    lines = [_decode(ts="2026-10-16 14:07:16", ranks=" TP0"), _decode(ts="2026-10-16 14:07:16", ranks=" TP0"),
             _decode(ts="2026-10-16 14:07:17", ranks=" TP1"), _decode(ts="2026-10-16 14:07:16", ranks=" TP0"),
             _decode(ts="2026-10-16 14:07:18", ranks=" TP1")]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["log", str(log), "--json", "--out", str(tmp_path / "o")]) == 0
    assert len(json.loads(capsys.readouterr().out)["records"]) == 5


def _trace(tmp_path, events=None, raw: str | None = None):
    path = tmp_path / "trace.json"
    path.write_text(raw if raw is not None else json.dumps({"traceEvents": events}))
    return str(path)


@pytest.mark.parametrize("bad, field", [
    ({"ts": 1e300}, "traceEvents[1].ts"), ({"ts": -1e17}, "traceEvents[1].ts"), ({"ts": "abc"}, "traceEvents[1].ts"),
    ({"ts": "0x10"}, "traceEvents[1].ts"), ({"ts": True}, "traceEvents[1].ts"), ({"ts": None}, "traceEvents[1].ts"),
    ({"dur": 1e300}, "traceEvents[1].dur"), ({"dur": "5 us"}, "traceEvents[1].dur"),
    ({"dur": 8 * 24 * 3600 * 1e6}, "traceEvents[1].dur"),
])
def test_gaps_span_time_not_a_sane_number_exits_2(tmp_path, capsys, bad, field):
    path = _trace(tmp_path, [{**KERNEL, "ts": 0, "dur": 5}, {**KERNEL, "ts": 100, "dur": 5, **bad},
                             {**KERNEL, "ts": 200, "dur": 5}])
    plot = tmp_path / "g.png"
    _refused(capsys, ["gaps", path, "--plot", str(plot)], path, field, "7 days")
    assert not plot.exists()


@pytest.mark.parametrize("far, field", [(1e15, "traceEvents[2].ts"), (-1e15, "traceEvents[0].ts")])
def test_gaps_one_devices_spans_weeks_apart_exit_2(tmp_path, capsys, far, field):
    events = [{**KERNEL, "ts": 0, "dur": 5}, {**KERNEL, "ts": 100, "dur": 5}, {**KERNEL, "ts": 200, "dur": 5}]
    events[0 if far < 0 else 2]["ts"] = far
    path = _trace(tmp_path, events)
    _refused(capsys, ["gaps", path], path, field, "pid 0", "7 days")


def test_gaps_numeric_strings_and_epoch_clocks_on_other_pids_are_read(tmp_path, capsys):
    # a numeric string ts is what some exporters write (Perfetto reads it); a CPU pid on an epoch clock
    path = _trace(tmp_path, [{**KERNEL, "ts": "0", "dur": "5"}, {**KERNEL, "ts": 100, "dur": 5},
                             {**KERNEL, "pid": 9, "cat": "cpu_op", "ts": 1.7e15, "dur": 5}])
    assert main(["gaps", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_steps"] == 2


@pytest.mark.parametrize("key2", ["traceEvents", "trace\\u0045vents"])
@pytest.mark.parametrize("command", [["gaps"], ["calibrate", "--from-trace"]])
def test_gaps_trace_events_given_twice_exits_2(tmp_path, capsys, key2, command):
    one, two = json.dumps([{**KERNEL, "ts": 0, "dur": 5}]), json.dumps([{**KERNEL, "ts": 100, "dur": 5}])
    path = _trace(tmp_path, raw=f'{{"traceEvents": {one}, "displayTimeUnit": "ms", "{key2}": {two}}}')
    extra = ["--out", str(tmp_path / "p.json")] if command[0] == "calibrate" else []
    _refused(capsys, [*command, path, *extra], path, "traceEvents", "2 times")
    assert not (tmp_path / "p.json").exists()


def test_gaps_repeated_keys_below_the_top_level_are_not_refused(tmp_path, capsys):
    events = json.dumps([{**KERNEL, "ts": 0, "dur": 5}, {**KERNEL, "ts": 100, "dur": 5}])
    path = _trace(tmp_path, raw=f'{{"traceEvents": {events}, "meta": {{"traceEvents": 1, "traceEvents": 2}}}}')
    assert main(["gaps", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_steps"] == 2


@pytest.mark.parametrize("text", ['{"traceEvents": [1, {"a": [2]}], "x": null}', ' { } ', '[{"ts": 1}]', '3',
                                  '\ufeff{"a": 1}', '{"a": NaN, "b": -Infinity}', '{"a":1,"a":2}'])
def test_loads_top_is_json_loads(text):
    data, _dups = _loads_top(text.encode("utf-8"))
    want = json.loads(text.encode("utf-8"))
    assert json.dumps(data) == json.dumps(want)


@pytest.mark.parametrize("text", ['{"traceEvents": [', '{"a": 1} x', '{"a" 1}', '{"a": 1,}', '', '{1: 2}'])
def test_loads_top_fails_as_json_loads_does(text):
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(text.encode("utf-8"))
    with pytest.raises(json.JSONDecodeError) as got:
        _loads_top(text.encode("utf-8"))
    assert (got.value.lineno, got.value.colno, got.value.msg) == (want.value.lineno, want.value.colno, want.value.msg)
