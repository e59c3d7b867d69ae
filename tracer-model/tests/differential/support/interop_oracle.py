"""Interop oracle: CPython 3.11's tracemalloc reading and writing dump files
(see tests/interop.rs).

Request (JSON on stdin): {"dir": path, "cases": [{"raw": raw traces,
"limit": traceback_limit, "protocol": 2..5, "ours": file written by tracer
or null}, ...]}. For each case this script:
- builds tracemalloc.Snapshot(raw, limit) and writes it to
  dir/python-<i>.pickle with pickle.dump(snapshot, f, protocol) (what
  Snapshot.dump() does, with HIGHEST_PROTOCOL = 5);
- returns str() of every statistic of that snapshot, per key_type and
  cumulative, and of compare_to(an empty snapshot);
- if "ours" is set, loads it with tracemalloc.Snapshot.load() and returns
  the same statistics for it, whether its traces equal the raw ones, and its
  traceback_limit.
"""

import json
import os
import pickle
import sys
import tracemalloc

GROUPINGS = [("filename", False), ("filename", True), ("lineno", False),
             ("lineno", True), ("traceback", False)]


def raw_traces(traces):
    return [
        (domain, size, tuple((f, l) for f, l in frames), total_nframe)
        for domain, size, frames, total_nframe in traces
    ]


def stats(snapshot):
    out = {}
    for key_type, cumulative in GROUPINGS:
        label = "%s %s" % (key_type, cumulative)
        out["statistics " + label] = [str(s) for s in snapshot.statistics(key_type, cumulative)]
        empty = tracemalloc.Snapshot([], snapshot.traceback_limit)
        out["compare_to " + label] = [str(s) for s in snapshot.compare_to(empty, key_type, cumulative)]
    out["traceback format"] = [trace.traceback.format() for trace in snapshot.traces]
    return out


def main():
    request = json.load(sys.stdin)
    answers = []
    for i, case in enumerate(request["cases"]):
        raw = raw_traces(case["raw"])
        snapshot = tracemalloc.Snapshot(raw, case["limit"])
        path = os.path.join(request["dir"], "python-%d.pickle" % i)
        with open(path, "wb") as fp:
            pickle.dump(snapshot, fp, case["protocol"])
        answer = {"python": stats(snapshot)}
        if case.get("ours"):
            loaded = tracemalloc.Snapshot.load(case["ours"])
            answer["ours"] = stats(loaded)
            answer["ours_traces_equal"] = list(loaded.traces._traces) == raw
            answer["ours_limit"] = loaded.traceback_limit
            answer["ours_class"] = type(loaded).__module__ + "." + type(loaded).__name__
        answers.append(answer)
    json.dump({"version": list(sys.version_info[:3]), "cases": answers}, sys.stdout)


if __name__ == "__main__":
    main()
