"""Differential oracle for tracer's model: CPython's own tracemalloc.

Reads one JSON request on stdin, builds tracemalloc.Snapshot objects from
raw traces exactly as take_snapshot() does, and writes every output the Rust
model must reproduce (see tests/model_differential.rs) as JSON on stdout.

Raw trace tuples in 3.11: (domain, size, frames, total_nframe), frames a
tuple of (filename, lineno), most recent call first.
"""

import json
import linecache
import sys
import tracemalloc

# The Rust model shows no source lines; make sure Traceback.format() finds
# none for the generated file names either.
linecache.getline = lambda *args, **kwargs: ""

KEY_TYPES = ("filename", "lineno", "traceback")


def raw_traces(traces):
    return [
        (domain, size, tuple((f, l) for f, l in frames), total_nframe)
        for domain, size, frames, total_nframe in traces
    ]


def frames_most_recent_first(traceback):
    return [[frame.filename, frame.lineno] for frame in reversed(list(traceback))]


def traceback_obj(traceback):
    return {
        "frames": frames_most_recent_first(traceback),
        "total_nframe": traceback.total_nframe,
        "str": str(traceback),
        "format": traceback.format(),
        "format_most_recent_first": traceback.format(most_recent_first=True),
    }


def statistic_obj(stat):
    return {
        "traceback": traceback_obj(stat.traceback),
        "size": stat.size,
        "count": stat.count,
        "str": str(stat),
    }


def statistic_diff_obj(stat):
    return {
        "traceback": traceback_obj(stat.traceback),
        "size": stat.size,
        "size_diff": stat.size_diff,
        "count": stat.count,
        "count_diff": stat.count_diff,
        "str": str(stat),
    }


def run_case(case, limits, format_traces):
    new = tracemalloc.Snapshot(raw_traces(case["new"]), case["traceback_limit"])
    old = tracemalloc.Snapshot(raw_traces(case["old"]), case["traceback_limit"])
    out = {}
    for key_type in KEY_TYPES:
        for cumulative in (False, True):
            label = "%s cumulative=%s" % (key_type, cumulative)
            try:
                stats = new.statistics(key_type, cumulative)
                out["statistics " + label] = [statistic_obj(s) for s in stats]
            except ValueError as exc:
                out["statistics " + label] = {"error": str(exc)}
            try:
                diffs = new.compare_to(old, key_type, cumulative)
                out["compare_to " + label] = [statistic_diff_obj(s) for s in diffs]
            except ValueError as exc:
                out["compare_to " + label] = {"error": str(exc)}

    traces = list(new.traces)
    out["traces"] = [
        {
            "str": str(trace),
            "domain": trace.domain,
            "size": trace.size,
            "traceback": traceback_obj(trace.traceback),
            "formats": [
                trace.traceback.format(limit, most_recent_first)
                for limit in limits
                for most_recent_first in (False, True)
            ],
        }
        for trace in traces[:format_traces]
    ]
    # Stable sorts: equal keys keep their index order on both sides.
    out["traceback_order"] = sorted(
        range(len(traces)), key=lambda i: traces[i].traceback
    )
    frames = [frame for trace in traces for frame in trace.traceback]
    out["frame_order"] = sorted(range(len(frames)), key=lambda i: frames[i])
    return out


def main():
    request = json.load(sys.stdin)
    traceback = tracemalloc.Traceback((("a.c", 1),))
    response = {
        "version": list(sys.version_info[:3]),
        "cases": [
            run_case(case, request["limits"], request["format_traces"])
            for case in request["cases"]
        ],
        "sizes": [
            tracemalloc._format_size(size, sign) for size, sign in request["sizes"]
        ],
        "statistic_texts": [
            [
                str(tracemalloc.Statistic(traceback, size, count)),
                str(tracemalloc.StatisticDiff(traceback, size, size_diff, count, count_diff)),
            ]
            for size, count, size_diff, count_diff in request["statistic_texts"]
        ],
    }
    json.dump(response, sys.stdout)


if __name__ == "__main__":
    main()
