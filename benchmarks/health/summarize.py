"""Print benchmarks/health/results.jsonl (written by run.sh) as a Markdown table."""

import json
import sys
from pathlib import Path

rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
print("| fault | seconds | setup |")
print("|---|---:|---|")
for r in rows:
    setup = ", ".join(f"{k}={v}" for k, v in r.items() if k not in {"fault", "seconds"})
    print(f"| {r['fault']} | {r['seconds']} | {setup} |")
