"""Oracle for Traceback.format() with source lines (see
tests/format_differential.rs): CPython 3.11's tracemalloc.Traceback.format
reading the files through the real linecache.

Request: {"tracebacks": [[[filename, lineno], ...] (most recent first)],
"limits": [null or int], "recent": [bool]}; answer: per traceback, per
limit, per most_recent_first, the lines.
"""

import json
import sys
import tracemalloc


def main():
    request = json.load(sys.stdin)
    out = []
    for frames in request["tracebacks"]:
        tb = tracemalloc.Traceback(tuple((f, l) for f, l in frames))
        out.append([[tb.format(limit, recent) for recent in (False, True)] for limit in request["limits"]])
    json.dump({"version": list(sys.version_info[:3]), "formats": out}, sys.stdout)


if __name__ == "__main__":
    main()
