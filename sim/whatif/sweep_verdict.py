"""The verdict line of ``sweep``: each grid point's verdict (:mod:`sim.whatif.verdict`'s rule
over the point's repeats, grounded as a run's by :func:`sim.whatif.verdict.grounded`), the points
grouped by answer, and what the answers stand on over all points.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

from sim.output.text import VerdictText
from sim.whatif.verdict import (KEEP, OFF, PLACEHOLDER_CLAUSE, UNSEEN, UNSURE, Verdict, grounded, not_simulated,
                                resolve_run_cv, threshold_ratio, verdict)


def _point_summaries(rows) -> dict[str, dict]:
    """One setting -> summary per setting over a sweep point's repeats: throughput the geometric mean
    (so the ratio of two is the geometric mean of the paired ratios), TPOT the mean, served only if
    every repeat served."""
    import numpy as np

    from sim.whatif.variance import served_runs

    out = {}
    for setting, g in rows.groupby("setting", sort=False):
        thr = g["output_throughput"].astype(float).to_numpy()
        all_served = all(served_runs(g))
        out[setting] = {"outcome": "ok" if all_served else "failed", "completed": int(all_served),
                        "output_throughput": float(np.exp(np.log(thr).mean())) if all_served and (thr > 0).all() else 0.0,
                        "median_tpot_ms": float(g["median_tpot_ms"].astype(float).mean())}
        for key in ("ttft_growth", "median_ttft_ms", "in_server_mid", "in_server_last", "duration_s",
                    "mean_decode_batch_size"):  # the repeats' mean (queue_growth, attention_share)
            if key in g:
                out[setting][key] = float(g[key].astype(float).mean())
        # the repeats' steps together, for the share priced beyond the profile's data (grounded)
        for key in ("run_steps", "num_steps", "extrapolated_steps", "far_steps", "bounded_steps"):
            if key in g:
                out[setting][key] = int(np.nansum(g[key].astype(float).to_numpy()))
        if "max_extrapolation" in g:  # the farthest repeat's distance, and where it lay
            far = g["max_extrapolation"].astype(float).fillna(1.0).to_numpy()
            out[setting]["max_extrapolation"] = float(far.max(initial=1.0))
            if "max_extrapolation_at" in g and len(far):
                at = g["max_extrapolation_at"].iloc[int(far.argmax())]
                out[setting]["max_extrapolation_at"] = at if isinstance(at, str) else ""
        if "max_bounded_share" in g:  # the widest bound of a repeat, and where it lay
            wide = g["max_bounded_share"].astype(float).fillna(0.0).to_numpy()
            out[setting]["max_bounded_share"] = float(wide.max(initial=0.0))
            if "max_bounded_at" in g and len(wide):
                at = g["max_bounded_at"].iloc[int(wide.argmax())]
                out[setting]["max_bounded_at"] = at if isinstance(at, str) else ""
    return out


SWEEP_NO_RANGE = "a sweep runs no corners: `overlap-sim run` of a point gives its range"


def sweep_verdict_text(table, noise, run_cv_flag: Optional[float] = None, device: str = "cuda",
                       grounds: Optional[dict] = None) -> Optional[VerdictText]:
    """The verdict of a sweep table (:func:`sim.whatif.sweeps.sweep`), said: points grouped by
    answer, each with its throughput ratio (geometric mean over repeats). ``noise``: the scenario's
    ``costs.noise``; a grid over ``costs.noise.run_gpu_cv``/``run_cpu_cv`` sets each point's CV.
    ``grounds``: grid point index -> (its server section, its profile's metadata or None, whether
    its costs are placeholders, what its profile's stated uncertainties are, whether its load is an
    open loop, its scenario or None): each point's verdict
    is then grounded as a run's (:func:`grounded`: placeholders, caveats, steps beyond the
    profile's data, another model's costs, a decode forward mostly the profile's plain attention:
    :mod:`sim.whatif.harness`), its stated range said not simulated. None when the
    settings hold no pair of :data:`PAIRS`."""
    from dataclasses import replace

    from sim.whatif.harness import (attention_caveat, attention_share, attention_sweep_clause, launch_floor_clause,
                                    mostly_harness, prefill_launch_floor, prefill_launch_part,
                                    prefill_launch_sweep_clause)
    from sim.whatif.variance import grid_keys

    keys = grid_keys(table)
    one_point = table["point"].nunique() == 1  # (its attention caveat as a run says it)
    found, points = [], []  # each point's (grid values, verdict), and the point's index, in order
    attention = []  # each grounded point's (share of its decode forward that grows with context, its values)
    launches = []  # each grounded point's (device part of a prefill's launch ms, the launch ms, its values)
    for point, rows in table.groupby("point", sort=True):
        values = {k: rows[k].iloc[0] for k in keys}
        point_noise = SimpleNamespace(**{f: float(values.get(f"costs.noise.{f}", getattr(noise, f)))
                                         for f in ("run_gpu_cv", "run_cpu_cv")})
        cv, source = resolve_run_cv(run_cv_flag, point_noise, device)
        summaries = _point_summaries(rows)
        v = verdict(summaries, cv, source)
        if v is None:
            return None
        if grounds is not None and not v.failed:
            server, meta, placeholder, stated, open_loop, *rest = grounds[int(point)]
            scenario = rest[0] if rest else None  # (grounds from before the point's scenario was kept)
            pair = {s: summaries[s] for s in v.pair[:2]}
            v = grounded(v, server, meta, placeholder, list(pair.values()), open_loop)
            if stated:
                v = replace(v, range_skipped=tuple(stated), range_skipped_by=SWEEP_NO_RANGE)
            if scenario is not None:
                if one_point:
                    if caveat := attention_caveat(scenario, meta, pair):
                        v = replace(v, caveats=v.caveats + (caveat,))
                    floor = prefill_launch_floor(scenario, meta, v.pair, simulate_it=False)
                    if floor is not None and mostly_harness(floor.device_ms, floor.launch_ms):
                        v = replace(v, caveats=v.caveats + (launch_floor_clause(floor, v, pair, SWEEP_NO_RANGE),))
                else:
                    where = " ".join(f"{k}={values[k]}" for k in keys)
                    if share := attention_share(scenario, meta, pair):
                        attention.append((share[0], where))
                    if (part := prefill_launch_part(scenario, v.pair[0])) is not None:
                        launches.append((part[1] * 1e3, part[2] * 1e3, where))
        found.append((values, v))
        points.append(int(point))
    if len(found) == 1:
        said = found[0][1].text()
        more = [c for c in (_frontend_in_clause(table), _interval_clause(table, zip(points, found), keys)) if c]
        return VerdictText(said.head, (*said.clauses, *more), said.tail)
    parts = []
    for answer in (KEEP, OFF, UNSEEN, UNSURE):
        mine = [(values, v) for values, v in found if v.answer == answer]
        if not mine:
            continue
        head = mine[0][1].head()
        where = ", ".join(
            " ".join(f"{k}={values[k]}" for k in keys) + (f" ({v.throughput_ratio:.3f}x)" if not v.failed
                                                          else f" ({v.failed} failed)")
            for values, v in mine[:8])
        more = len(mine) - 8
        parts.append(f"{head} at {where}" + (f" and {more} more point{'s' if more > 1 else ''}" if more > 0 else ""))
    cvs = sorted({round(v.run_cv, 6) for _values, v in found})
    sources = sorted({v.cv_source for _values, v in found})
    cv_text = (f"run-to-run CV assumed {cvs[0]:.1%} ({sources[0]}): one A/B run shows a ratio beyond "
               f"{threshold_ratio(cvs[0]):.3f}x" if len(cvs) == 1 else
               f"run-to-run CV per point ({', '.join(sources)})")
    num, den = found[0][1].pair[:2]
    answered = sum(1 for _, v in found if not v.failed)
    more = (attention_sweep_clause(attention, answered), prefill_launch_sweep_clause(launches, answered),
            _frontend_in_clause(table), _interval_clause(table, zip(points, found), keys))
    return VerdictText(f"verdict ({num}/{den} output throughput)",
                       (*parts, *_sweep_standing([v for _, v in found]), *(c for c in more if c)), cv_text)


def _interval_clause(table, found, keys: list[str]) -> str:
    """Where a point's answer is definite (keep or off) but the 95% interval of its ratio over
    its repeats (``ratio_ci.csv``, :func:`sim.whatif.variance.ratio_ci`) includes 1: the two rules
    say so together (the answer weighs the ratio against the assumed run-to-run CV; the interval
    is the repeats' own spread, wide with few of them); '' without repeats or such points.
    ``found``: (point index, (its grid values, its verdict)) for each point."""
    if table.groupby("point")["repeat"].nunique().max() < 2:
        return ""
    from sim.whatif.variance import ratio_ci

    found = list(found)
    num, den = found[0][1][1].pair[:2]
    ci = ratio_ci(table, num=num, den=den).set_index("point")
    crossing = []
    for point, (values, v) in found:
        if v.failed or v.answer not in (KEEP, OFF) or point not in ci.index:
            continue
        lo, hi, n = (float(ci.at[point, "ci_low"]), float(ci.at[point, "ci_high"]), int(ci.at[point, "n"]))
        if lo <= 1.0 <= hi:
            crossing.append(" ".join(f"{k}={values[k]}" for k in keys) + f" ({lo:.3f}-{hi:.3f} over {n} repeats)")
    if not crossing:
        return ""
    return (f"the 95% interval of the ratio over the repeats includes 1 at {', '.join(crossing[:8])}"
            + (f" and {len(crossing) - 8} more" if len(crossing) > 8 else "")
            + ": those answers rest on the assumed run-to-run CV, the repeats alone do not settle them "
              "(more --repeats narrow the interval; ratio_ci.csv)")


def _frontend_in_clause(table) -> str:
    """At how many points requests entered vLLM's API server in a pool larger than the largest
    burst ``vllm.frontend_in`` was measured at (the summaries' ``frontend_in_beyond``, which a
    run warns of: :mod:`sim.engines.vllm.frontend`); '' at none."""
    if "frontend_in_beyond" not in table:
        return ""
    beyond = table[table["frontend_in_beyond"].fillna(0) > 0]
    if beyond.empty:
        return ""
    return (f"at {beyond['point'].nunique()} of {table['point'].nunique()} points requests entered vLLM's API server "
            f"in a pool beyond the bursts vllm.frontend_in was measured at (to {int(beyond['frontend_in_measured_to'].min())}; "
            f"up to {int(beyond['frontend_in_pool'].max())} at once): their way in extends the curve's line")


def _sweep_standing(found: list[Verdict]) -> list[str]:
    """What a sweep's answers stand on, over its points, a clause each (:meth:`Verdict._standing_clauses`
    of one run, gathered): placeholder costs, the engines' caveats, the stated uncertainties a sweep
    does not simulate, and at how many points steps were priced beyond the profile's data."""
    from sim.model.reach import FAR, bounded_words, reach_words

    served = [v for v in found if not v.failed]
    out = [PLACEHOLDER_CLAUSE] if any(v.placeholder for v in served) else []
    out += dict.fromkeys(c for v in served for c in v.caveats)
    if skipped := list(dict.fromkeys(w for v in served for w in v.range_skipped)):
        out.append(not_simulated(skipped, SWEEP_NO_RANGE, "answers'"))
    if grew := sum(1 for v in served if v.queue_growth):
        out.append(f"at {grew} of {len(served)} points the queue grew through the run (an open loop near or above "
                   "capacity: those answers are for this run's length, not a steady state)")
    beyond = [v for v in served if v.extrapolated_share > 0]
    if beyond:
        far = sum(1 for v in beyond if v.far_share > 0)
        farthest = max(beyond, key=lambda v: v.max_extrapolation)
        out.append(f"at {len(beyond)} of {len(served)} points steps priced beyond the profile's measured data ("
                   + reach_words(farthest.max_extrapolation, farthest.max_extrapolation_at)
                   + (f"; at {far} of them, steps beyond x{FAR:g}, where no measurement stands behind the price"
                      if far else "")
                   + ")")
    if bounded := [v for v in served if v.bounded_share > 0]:
        widest = max(bounded, key=lambda v: v.max_bounded_share)
        out.append(f"at {len(bounded)} of {len(served)} points steps priced below the profile's measured contexts "
                   f"{bounded_words(widest.max_bounded_share, widest.max_bounded_at)}, counted apart from the steps "
                   "beyond the data")
    return out
