"""Shares of a worker's CPU by stage, from `perf script` output of a
`perf record --call-graph dwarf` (see scripts/profile_worker.sh): a
sample counts for a stage when the stage's function is on its stack, so
nested stages overlap (composing includes the MIME writer)."""
import collections
import re
import sys

STAGES = [
    ("compose (all)", "mailsplit::compose::build_for"),
    ("  MIME writer", "mailsplit::compose::mime::mime"),
    ("  render", "mailsplit::compose::render"),
    ("  Message-ID token", "mailsplit::compose::envelope::message_id_of"),
    ("SMTP session", "mailsplit::mail::session"),
    ("ledger: claim", "mailsplit::store::deliveries::claim"),
    ("ledger: record", "mailsplit::store::deliveries::record"),
    ("SQLite (all statements)", "sqlite3_step"),
    ("allocator", "mi_"),
]


def samples(path):
    stack = []
    for line in open(path, errors="replace"):
        if not line.strip():
            if stack:
                yield stack
            stack = []
        elif line[0] in " \t":
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                stack.append(re.sub(r"\+0x[0-9a-f]+.*$", "", parts[1]))
    if stack:
        yield stack


def main():
    counts = collections.Counter()
    total = 0
    for stack in samples(sys.argv[1]):
        total += 1
        for name, marker in STAGES:
            if any(marker in frame for frame in (stack[:1] if marker == "mi_" else stack)):
                counts[name] += 1
    print(f"{total} samples")
    for name, _ in STAGES:
        print(f"  {name:26} {counts[name] / max(total, 1) * 100:5.1f} %")


if __name__ == "__main__":
    main()
