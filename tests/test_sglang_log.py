"""`overlap-sim log`: SGLang scheduler log lines of 2024-2026 releases into a table and a plot."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from sim.cli import main
from sim.engines.sglang.server_log import parse_line, parse_lines

SEED_DOC_LINE = ("[2026-10-16 14:07:15] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 511, "
                 "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
                 "input throughput (token/s): 0.39")

LOG = """\
[2026-10-16 14:07:10] server_args=ServerArgs(model_path='x', disable_overlap_schedule=True)
[2026-10-16 14:07:12 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.21 GB
[2026-10-16 14:07:15 TP0] Prefill batch, #new-seq: 8, #new-token: 8, #cached-token: 4088, token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 12.50
[2026-10-16 14:07:16 TP0] Decode batch, #running-req: 8, #token: 4160, token usage: 0.01, cuda graph: True, gen throughput (token/s): 1502.33, #queue-req: 0, 
[2026-10-16 14:07:18 TP0] Decode batch, #running-req: 8, #token: 4480, token usage: 0.02, cuda graph: True, gen throughput (token/s): 1620.10, #queue-req: 2, 
INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK
[2026-10-16 14:07:19 TP0] Decode batch, #running-re
\xff\xfe garbage \x00
[2026-10-16 14:07:20 TP0] Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, token usage: 0.03, #running-req: 6, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 800.00

"""


@pytest.mark.parametrize("line, expected", [
    (SEED_DOC_LINE,
     {"time": datetime(2026, 10, 16, 14, 7, 15), "kind": "prefill", "new_seq": 1, "new_token": 1, "cached_token": 511,
      "token_usage": 0.0, "running_req": 0, "queue_req": 0, "pending_token": 0, "cuda_graph": False,
      "input_throughput_tok_s": 0.39}),
    # 2024: a period after 'batch', cache hit rate in percent, TP prefix
    ("[2024-10-16 14:07:15 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 12.50%, "
     "token usage: 0.00, #running-req: 0, #queue-req: 0",
     {"time": datetime(2024, 10, 16, 14, 7, 15), "kind": "prefill", "tp_rank": 0, "new_seq": 1, "new_token": 7,
      "cached_token": 0, "cache_hit_rate": 0.125, "token_usage": 0.0, "running_req": 0, "queue_req": 0}),
    ("[2024-10-16 14:07:15 TP1] Decode batch. #running-req: 1, #token: 40, token usage: 0.00, "
     "gen throughput (token/s): 5.20, #queue-req: 0",
     {"time": datetime(2024, 10, 16, 14, 7, 15), "kind": "decode", "tp_rank": 1, "running_req": 1, "kv_tokens": 40,
      "token_usage": 0.0, "gen_throughput_tok_s": 5.2, "queue_req": 0}),
    # 2024 mixed chunked prefill
    ("[2024-08-01 10:00:00 TP0] Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 7, #cached-token: 0, "
     "cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0",
     {"time": datetime(2024, 8, 1, 10), "kind": "prefill", "tp_rank": 0, "mixed_running_req": 3, "new_seq": 1,
      "new_token": 7, "cached_token": 0, "cache_hit_rate": 0.0, "token_usage": 0.0, "running_req": 0, "queue_req": 0}),
    # 2025: DP attention prefix, forward counter, speculative decoding, trailing comma
    ("[2025-06-01 10:00:00 DP1 TP3] Decode batch [1234], #running-req: 8, #token: 4160, token usage: 0.01, "
     "accept len: 2.50, accept rate: 0.62, cuda graph: True, gen throughput (token/s): 1502.33, #queue-req: 0, ",
     {"time": datetime(2025, 6, 1, 10), "kind": "decode", "dp_rank": 1, "tp_rank": 3, "forward_ct": 1234,
      "running_req": 8, "kv_tokens": 4160, "token_usage": 0.01, "accept_len": 2.5, "accept_rate": 0.62,
      "cuda_graph": True, "gen_throughput_tok_s": 1502.33, "queue_req": 0}),
    # hybrid SWA pool, PD-disaggregation decode server, CPU graph, milliseconds in the timestamp
    ("[2025-11-02 08:30:01.250 PP0 TP0] Decode batch, #running-req: 4, #full token: 900, full token usage: 0.10, "
     "#swa token: 300, swa token usage: 0.05, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 1, "
     "#retracted-req: 0, cpu graph: False, gen throughput (token/s): 88.00, #queue-req: 0, ",
     {"time": datetime(2025, 11, 2, 8, 30, 1, 250000), "kind": "decode", "pp_rank": 0, "tp_rank": 0,
      "running_req": 4, "full_kv_tokens": 900, "full_token_usage": 0.1, "swa_kv_tokens": 300, "swa_token_usage": 0.05,
      "pre_allocated_usage": 0.0, "prealloc_req": 0, "transfer_req": 1, "retracted_req": 0, "cpu_graph": False,
      "gen_throughput_tok_s": 88.0, "queue_req": 0}),
    # a line captured without the logger prefix, behind a container name
    ("sglang-1  | Decode batch, #running-req: 2, #token: 64, token usage: 0.00, cuda graph: True, "
     "gen throughput (token/s): 10.00, #queue-req: 0",
     {"time": None, "kind": "decode", "running_req": 2, "kv_tokens": 64, "token_usage": 0.0, "cuda_graph": True,
      "gen_throughput_tok_s": 10.0, "queue_req": 0}),
])
def test_parse_line_variants(line, expected):
    assert parse_line(line) == expected


@pytest.mark.parametrize("line", ["[2026-10-16 14:07:19 TP0] Decode batch, #running-re", "Prefill batch",
                                  "[2026-10-16 14:07:16] Scheduler hit an exception: Traceback", ""])
def test_non_batch_lines_are_not_records(line):
    assert parse_line(line) is None


def test_parse_lines_counts_skipped():
    parsed = parse_lines(LOG.splitlines())
    assert len(parsed.records) == 4
    assert parsed.skipped_lines == 5  # server args, load weight, http access, cut line, garbage
    df = parsed.frame()
    assert list(df["t_s"]) == [0.0, 1.0, 3.0, 5.0]
    assert list(df["kind"]) == ["prefill", "decode", "decode", "prefill"]


def test_cli_json_and_files(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_bytes(LOG.encode("latin-1"))
    out = tmp_path / "out"
    assert main(["log", str(log), "--json", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert set(data) == {"records", "skipped_lines"}
    assert data["skipped_lines"] == 5 and len(data["records"]) == 4
    assert data["records"][1]["gen_throughput_tok_s"] == 1502.33
    assert data["records"][0]["time"] == "2026-10-16 14:07:15"
    assert "skipped 5" in captured.err
    assert (out / "log.png").read_bytes()[:4] == b"\x89PNG"
    assert "queue_req" in (out / "log.csv").read_text().splitlines()[0]
    assert main(["log", str(log), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "max running requests" in table and "1561.2" in table  # mean of the two decode throughputs


def test_a_log_without_timestamps_says_its_times_are_line_numbers(tmp_path, capsys):
    import re

    log = tmp_path / "server.log"
    log.write_text(re.sub(r"^\[[^]]*\] ", "", LOG, flags=re.M))  # the prefix a log shipper strips
    assert main(["log", str(log), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "no batch line has a timestamp" in captured.err and "line numbers" in captured.err
    assert "time span" not in captured.out


@pytest.mark.parametrize("content", ["", "\n\n", "just some output\nno batches here\n"])
def test_log_without_batch_lines_exits_2(tmp_path, capsys, content):
    log = tmp_path / "server.log"
    log.write_text(content)
    assert main(["log", str(log), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(log) in err and "Prefill batch" in err and len(err.strip().splitlines()) == 1


def test_missing_log_exits_2(tmp_path, capsys):
    assert main(["log", str(tmp_path / "nope.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
