"""Print benchmarks/health/results.jsonl (written by run.sh) as a Markdown table."""

import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| fault | seconds | setup |")
print("|---|---:|---|")
for r in rows:
    setup = ", ".join(f"{k}={v}" for k, v in r.items() if k not in {"fault", "seconds"})
    print(f"| {r['fault']} | {r['seconds']} | {setup} |")
