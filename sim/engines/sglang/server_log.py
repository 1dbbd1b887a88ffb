"""SGLang scheduler log lines ("Prefill batch ...", "Decode batch ...") into a table over time.

The scheduler logs one line per prefill batch and one every ``decode_log_interval`` decode
batches (``log_prefill_stats`` / ``log_decode_stats``; ``scheduler_metrics_mixin.py`` since
2025, ``scheduler.py`` before). The logger's prefix is ``[%Y-%m-%d %H:%M:%S`` plus the ranks
of multi-GPU runs (`` DP0 TP1``, `` PP0 TP0``, `` TP0 EP0``) and ``]``. Variants handled:

- 2024: ``Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 0.00%,
  token usage: 0.00, #running-req: 0, #queue-req: 0``; older prefills carry
  ``Prefill batch(mixed #running-req: 3).``; ``Decode batch. #running-req: 1, #token: 40,
  token usage: 0.00, gen throughput (token/s): 5.20, #queue-req: 0``.
- 2025-2026: a comma after ``batch``, an optional ``[forward_ct]`` (``SGLANG_LOG_FORWARD_ITERS``),
  ``cuda graph: True`` / ``cpu graph: ...``, ``#pending-token``, ``input throughput (token/s)``,
  hybrid pools (``#full token``, ``full token usage``, ``swa token usage``, ``mamba usage``),
  speculative decoding (``accept len``, ``accept rate``), PD disaggregation (``#prealloc-req``,
  ``#inflight-req``, ``#transfer-req``, ``#retracted-req``, ``pre-allocated usage``), and a
  trailing ``, ``.

Field names become snake_case columns (``#running-req`` -> ``running_req``, ``gen throughput
(token/s)`` -> ``gen_throughput_tok_s``, ``cuda graph`` -> ``cuda_graph``); ``x%`` becomes the
fraction x/100; ``True``/``False`` booleans. Unknown fields are kept the same way, so new
releases' fields appear without a code change. A line that is not a batch line, or a batch
line with no ``key: value`` field or with a number that is not finite (``nan``, ``inf``: a
garbled line), is skipped and counted, never fatal.

A batch line whose values SGLang cannot have written refuses the whole log (:class:`UserInputError`
naming the file, the line number and the field, as logged): a negative number (every numeric field
SGLang logs is a count, a throughput, a length or a fraction; ``-0.00``, a rounded tiny negative,
is 0), or a fraction above 1 (``token usage`` and the other ``... usage`` fields are the used share
of the KV pool, ``num_used / max_total_num_tokens``; ``cache hit rate`` and ``accept rate`` are
shares too). So is a timestamp earlier than the previous line of the same ranks (one process
writes those in order; the logger's second resolution makes equal timestamps common, and those are
fine). Lines of different ranks are written by different processes and may interleave slightly
out of order, so they are not compared with each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from sim.errors import UserInputError

_LINE = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<ranks>(?:\s+[A-Za-z]+\d+)*)\]\s*)?"
    r"(?P<kind>Prefill|Decode) batch"
    r"(?:\s*\[(?P<iter>\d+)\])?"
    r"(?:\s*\(mixed #running-req: (?P<mixed>\d+)\))?"
    r"\s*[.,:]?\s*(?P<rest>.*)$")
_RANK = re.compile(r"([A-Za-z]+)(\d+)")
_FIELD = re.compile(r"\s*([^:,][^:]*?):\s*([^,]*?)\s*(?:,|$)")
# canonical names where the snake_case of the label is not clear enough
_RENAME = {"token": "kv_tokens", "full_token": "full_kv_tokens", "swa_token": "swa_kv_tokens"}


def _column(label: str) -> str:
    label = label.strip().replace("(token/s)", "tok_s")
    name = re.sub(r"[^0-9a-zA-Z]+", "_", label.lstrip("#")).strip("_").lower()
    return _RENAME.get(name, name)


def _value(text: str):
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    pct = text.endswith("%")
    try:
        num = float(text[:-1] if pct else text)
    except ValueError:
        return text
    if pct:
        return num / 100.0
    return int(num) if re.fullmatch(r"[-+]?\d+", text) else num


def parse_line(line: str) -> Optional[dict]:
    """One log line as a record dict, or None if it is not a scheduler batch line.

    Keys: ``time`` (datetime or None), ``kind`` ('prefill'|'decode'), ``forward_ct`` (if logged),
    one ``<rank>_rank`` per prefix rank (``tp_rank``, ``dp_rank``...), then the line's fields."""
    parsed = _parse_line(line)
    return None if parsed is None else parsed[0]


def _parse_line(line: str) -> Optional[tuple[dict, dict, tuple]]:
    """:func:`parse_line`'s record, each field's (label, text) as logged by column, and the
    prefix ranks (the writing process); None if not a batch line."""
    m = _LINE.search(line)
    if m is None:
        return None
    fields = {}
    raw = {}
    end = 0
    for fm in _FIELD.finditer(m.group("rest")):
        col = _column(fm.group(1))
        fields[col] = _value(fm.group(2))
        raw[col] = (fm.group(1).strip(), fm.group(2).strip())
        end = fm.end()
    if m.group("rest")[end:].strip():
        return None  # a line cut short (a label without its value): skipped and counted as cut
    if not fields or any(isinstance(v, float) and not math.isfinite(v) for v in fields.values()):
        return None  # no field, or a garbled number (nan, inf): the line is skipped and counted
    rec: dict = {"time": None, "kind": m.group("kind").lower()}
    if m.group("ts"):
        try:
            rec["time"] = datetime.fromisoformat(m.group("ts").replace(",", ".").replace("T", " "))
        except ValueError:
            return None
    for name, num in _RANK.findall(m.group("ranks") or ""):
        rec[f"{name.lower()}_rank"] = int(num)
    if m.group("iter"):
        rec["forward_ct"] = int(m.group("iter"))
    if m.group("mixed"):
        rec["mixed_running_req"] = int(m.group("mixed"))
    rec.update(fields)
    return rec, raw, tuple(_RANK.findall(m.group("ranks") or ""))


def _is_fraction(label: str) -> bool:
    label = label.lower()
    return label.endswith("usage") or label.endswith("rate")


def _check_values(rec: dict, raw: dict, source: str, lineno: int) -> None:
    """Refuse a batch line holding a value SGLang cannot log (see the module docstring)."""
    for col, (label, text) in raw.items():
        v = rec.get(col)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if v < 0:
            raise UserInputError(source, f"line {lineno}: {label}", f"must not be negative (got {text}): SGLang "
                                 "logs counts, throughputs and fractions; the log is corrupt or not SGLang's")
        if _is_fraction(label) and v > 1:
            raise UserInputError(source, f"line {lineno}: {label}", f"expected a fraction in [0, 1] (got {text}): "
                                 "SGLang logs usages and rates as shares (0.00 to 1.00, or up to 100%); the log is "
                                 "corrupt")


@dataclass
class ParsedLog:
    """``records``: one dict per batch line in file order; ``skipped_lines``: non-empty lines that
    are not batch lines (other log output, tracebacks, cut or garbled lines)."""

    source: str
    records: list[dict] = field(default_factory=list)
    skipped_lines: int = 0
    cut_lines: int = 0  # of the skipped: batch lines cut short (a label without its value)

    def frame(self) -> pd.DataFrame:
        """The records as a DataFrame, with ``t_s``: seconds since the first timestamped record."""
        df = pd.DataFrame(self.records)
        if "time" in df and df["time"].notna().any():
            t = pd.to_datetime(df["time"])
            df["t_s"] = (t - t.min()).dt.total_seconds()
        else:
            df["t_s"] = range(len(df))  # no timestamps: line order
            df.attrs["t_is_line_order"] = True  # said by the command and on the plot's axis
        return df


def parse_lines(lines: Iterable[str], source: str = "<lines>") -> ParsedLog:
    """Parse log lines (see :func:`parse_line`); blank lines are ignored, others counted if skipped.

    Raises:
        UserInputError: a batch line with a negative number, a usage or rate above 1, or a timestamp
            earlier than the previous line of the same ranks (names ``source`` and the line number)."""
    out = ParsedLog(source)
    last: dict = {}  # prefix ranks -> (time, line number) of the last timestamped line they wrote
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parsed = _parse_line(line)
        if parsed is None:
            out.skipped_lines += 1
            if _LINE.search(line):
                out.cut_lines += 1
            continue
        rec, raw, ranks = parsed
        _check_values(rec, raw, source, lineno)
        if rec["time"] is not None:
            prev = last.get(ranks)
            if prev is not None and rec["time"] < prev[0]:
                who = " of ranks " + " ".join(f"{n}{i}" for n, i in ranks) if ranks else ""
                raise UserInputError(source, f"line {lineno}: timestamp", f"goes back in time ({rec['time']} after "
                                     f"{prev[0]} on line {prev[1]}{who}): one process writes its lines in order; "
                                     "logs joined out of order or corrupt")
            last[ranks] = (rec["time"], lineno)
        out.records.append(rec)
    return out


def parse_log(path: Path) -> ParsedLog:
    """Parse a server log file (undecodable bytes are replaced, not fatal).

    Raises:
        UserInputError: the file cannot be read, is empty, holds no batch line at all, or has a
            value SGLang cannot log (:func:`parse_lines`)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            parsed = parse_lines(fh, str(path))
    except OSError as err:
        raise UserInputError(str(path), "", f"cannot read the log ({err.strerror or err})") from None
    if not parsed.records:
        what = "the log is empty" if parsed.skipped_lines == 0 else f"none of its {parsed.skipped_lines} lines"
        raise UserInputError(str(path), "", f"{what}: expected SGLang scheduler lines with 'Prefill batch' or "
                                            "'Decode batch' (run the server with --log-level info)")
    return parsed
