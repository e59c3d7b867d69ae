"""Differential oracle for tracer's filters: CPython 3.11's own fnmatch and
tracemalloc.Snapshot.filter_traces (see tests/filter_differential.rs).

Reads one JSON request on stdin and writes the answers as JSON on stdout:
- "fnmatch": [[name, pattern], ...] -> fnmatch.fnmatch(name, pattern), or
  the exception's text when Python raises;
- "filter_cases": [{"traces": raw traces, "filters": [...]}, ...] -> the
  indices of the traces filter_traces keeps (each trace's size is its index).
"""

import fnmatch
import json
import sys
import tracemalloc


def make_filter(spec):
    if spec["kind"] == "domain":
        return tracemalloc.DomainFilter(spec["inclusive"], spec["domain"])
    return tracemalloc.Filter(
        spec["inclusive"],
        spec["pattern"],
        lineno=spec["lineno"],
        all_frames=spec["all_frames"],
        domain=spec["domain"],
    )


def raw_traces(traces):
    return [
        (domain, size, tuple((f, l) for f, l in frames), total_nframe)
        for domain, size, frames, total_nframe in traces
    ]


def main():
    request = json.load(sys.stdin)
    matches = []
    for name, pattern in request["fnmatch"]:
        try:
            matches.append(fnmatch.fnmatch(name, pattern))
        except Exception as exc:  # re.error for patterns re refuses
            matches.append("error: %s" % exc)
    cases = []
    for case in request["filter_cases"]:
        snapshot = tracemalloc.Snapshot(raw_traces(case["traces"]), 8)
        filters = [make_filter(spec) for spec in case["filters"]]
        kept = snapshot.filter_traces(filters)
        cases.append({
            "kept": [trace.size for trace in kept.traces],
            "patterns": [f.filename_pattern for f in filters if isinstance(f, tracemalloc.Filter)],
        })
    json.dump({"version": list(sys.version_info[:3]), "fnmatch": matches, "filter_cases": cases}, sys.stdout)


if __name__ == "__main__":
    main()
