#!/usr/bin/env python3
"""Who the ranks of a synchronous job waited for, and in which phase it lost the time, from the
timeline a run writes with trainer.timeline_steps (output_dir/timeline.json).

In each step every rank waits in the gradient average until the last rank has finished backward.
For each step this takes the rank whose backward ended last ("the last rank"), how far behind the
first rank it arrived ("spread"), and where it lost that time against the other ranks: a late
start (it left the previous step's average later: woken late), or a longer data, forward or
backward phase than the other ranks' median. Over the steps: the medians and means of those, and
which ranks were last how often. One rank last again and again is a straggler (its core, its
data); the last rank changing from step to step with the excess spread over the phases is noise
that hits every rank (a shared host's other guests, the clock).

Usage: bench/timeline.py OUTPUT_DIR/timeline.json
"""
import collections, json, statistics, sys

PHASES = ("data", "forward", "backward")


def steps_of(path):
    """{step: {rank: {phase: (start_us, end_us)}}} of the complete events."""
    steps = collections.defaultdict(lambda: collections.defaultdict(dict))
    with open(path) as f:
        for e in json.load(f)["traceEvents"]:
            if e.get("ph") == "X":
                steps[e["args"]["step"]][e["tid"]][e["name"]] = (e["ts"], e["ts"] + e["dur"])
    return steps


def summary(path):
    """The figures above, for the steps in which every rank recorded a backward."""
    spreads, lengths, excess, last = [], [], {p: [] for p in ("start",) + PHASES}, collections.Counter()
    for step, ranks in sorted(steps_of(path).items()):
        if len(ranks) < 2 or any("backward" not in r or "step" not in r for r in ranks.values()):
            continue
        arrival = {r: phases["backward"][1] for r, phases in ranks.items()}
        slow = max(arrival, key=arrival.get)
        others = [r for r in ranks if r != slow]
        last[slow] += 1
        spreads.append((arrival[slow] - min(arrival.values())) / 1000)
        lengths.append(statistics.median(p["step"][1] - p["step"][0] for p in ranks.values()) / 1000)
        mine = ranks[slow]
        excess["start"].append((mine["step"][0] - statistics.median(ranks[r]["step"][0] for r in others)) / 1000)
        for phase in PHASES:
            took = lambda p: p[phase][1] - p[phase][0] if phase in p else 0
            excess[phase].append((took(mine) - statistics.median(took(ranks[r]) for r in others)) / 1000)
    if not spreads:
        return None
    return {"steps": len(spreads), "spread_median_ms": statistics.median(spreads),
            "spread_mean_ms": statistics.mean(spreads), "step_ms": statistics.median(lengths),
            "excess_mean_ms": {p: statistics.mean(v) for p, v in excess.items()},
            "last": last.most_common()}


def describe(s):
    """One line of a summary() for a person."""
    if s is None:
        return "no steps with every rank's backward in the timeline"
    ex = s["excess_mean_ms"]
    lasts = ", ".join(f"rank {r} in {n}" for r, n in s["last"][:3])
    return (f"{s['steps']} steps of {s['step_ms']:.2f} ms (median): the last rank reached the gradient "
            f"average {s['spread_median_ms']:.2f} ms after the first (median; mean "
            f"{s['spread_mean_ms']:.2f} ms); against the other ranks it started {ex['start']:+.2f} ms "
            f"late and took data {ex['data']:+.2f}, forward {ex['forward']:+.2f}, backward "
            f"{ex['backward']:+.2f} ms (means); last: {lasts} ({len(s['last'])} of the ranks were last in some step)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(describe(summary(sys.argv[1])))
