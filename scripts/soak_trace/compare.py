"""What grew between a process's first and last snapshot of a traced soak (`scripts/soak.py --trace-every-minutes`).

    python scripts/soak_trace/compare.py [docs/results/.soak-trace] [--top 12]

Per process: traced Python memory and RSS at each snapshot (traced.jsonl), then the allocation sites whose live
memory grew most from the first snapshot to the last, with their call stacks.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=Path("docs/results/.soak-trace"))
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    rows = defaultdict(list)
    for line in (args.folder / "traced.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[(row["process"], row["pid"])].append(row)
    for (process, pid), taken in sorted(rows.items()):
        print(f"== {process} {pid}")
        for row in taken:
            print(f"   t {row['t_s']:>6} s  traced {row['traced_mib']:8.1f} MiB  RSS {row['rss_mib']:8.1f} MiB")
        snaps = sorted(args.folder.glob(f"{process}-{pid}-*.snap"))
        if len(snaps) < 2:
            continue
        first, last = (tracemalloc.Snapshot.load(str(p)) for p in (snaps[0], snaps[-1]))
        for stat in last.compare_to(first, "traceback")[: args.top]:
            if stat.size_diff <= 0:
                break
            print(f"   +{stat.size_diff / 2**20:.2f} MiB ({stat.count_diff:+d} blocks), "
                  f"now {stat.size / 2**20:.2f} MiB")
            for frame in stat.traceback.format(limit=6, most_recent_first=True):
                print(f"       {frame}")


if __name__ == "__main__":
    main()
