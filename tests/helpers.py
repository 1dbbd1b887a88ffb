"""Small scenario builders shared by the tests."""

from __future__ import annotations

import copy


def unwrapped(out: str) -> list[str]:
    """The lines a command printed, each wrapped note or warning (and each verdict clause) back on one
    line: a line indented by four spaces continues the one before (:func:`sim.output.text.wrapped`)."""
    lines: list[str] = []
    for line in out.splitlines():
        if line.startswith("    ") and lines:
            lines[-1] += " " + line[4:]
        else:
            lines.append(line)
    return lines


def verdict_of(out: str) -> str:
    """The verdict a command printed (its head, then ``  - `` clauses, each wrapped with four-space
    continuation lines: :meth:`sim.output.text.VerdictText.block`), back on one line: the head
    and the clauses joined as :meth:`~sim.output.text.VerdictText.line` joins them (a sweep's
    bracketed tail comes back as a last clause).

    Raises:
        StopIteration: ``out`` has no verdict."""
    lines = unwrapped(out)
    at = next(i for i, line in enumerate(lines) if line.startswith("verdict"))
    clauses = []
    for line in lines[at + 1:]:
        if not line.startswith("  - "):
            break
        clauses.append(line[4:])
    return lines[at] + (": " + "; ".join(clauses) if clauses else "")


def constant_scenario(*, c: int = 4, output_len: int = 40, input_len: int = 64, cached_len: int = 0,
                      gpu: float = 0.004, prefill: float = 0.002, residue: float = 0.0,
                      recv: float = 1e-4, schedule: float = 2e-4, launch: float = 3e-4, process: float = 4e-4,
                      finish: str = "length", retraction: str = "v0.5.22", settings=("overlap", "normal"),
                      num_requests: int | None = None, warmup: int = 0, **extra) -> dict:
    """One batch of ``c`` equal requests with constant (size-independent) costs, no noise."""
    scenario = {
        "name": "constant",
        "seed": 0,
        "workload": {
            "arrival": "closed_loop", "concurrency": c, "num_requests": num_requests or c,
            "warmup_requests": warmup, "input_len": input_len, "cached_len": cached_len,
            "output_len": output_len, "finish": finish,
        },
        "server": {"device": "cuda", "settings": list(settings), "retraction": retraction},
        "costs": {
            "gpu": {"decode": {"base": gpu}, "prefill": {"base": prefill}, "overlap_residue": residue},
            "cpu": {"recv": {"base": recv}, "schedule": {"base": schedule}, "launch": {"base": launch},
                    "process": {"base": process}},
        },
    }
    for path, value in extra.items():
        node = scenario
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = copy.deepcopy(value)
    return scenario
