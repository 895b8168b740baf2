"""Who holds the interpreter: a summary of a `py-spy record --gil --threads --format raw` profile.

Under load one Python process runs Stage 0 (vLLM's scheduler and our step hooks), Stage 1's decode loop,
every request's submit and the asyncio delivery, and they take turns on the GIL (BENCHMARKS.md, "What
bounds them now"). py-spy's `--gil` mode samples only the thread holding the GIL, so the samples of a
window say how busy the interpreter was and which thread, and which of its functions, kept it:

    py-spy record --pid PID --gil --threads --nonblocking --rate 250 --duration 20 --format raw -o gil.txt
    python -m tts_engine.tools.gil_profile gil.txt --rate 250 --duration 20 --markdown gil.md

`scripts/gpu_profile.sh` does both around a closed-loop bench level on the GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")
_NUMBERED = re.compile(r"_\d+$")          # asyncio_0, asyncio_1, ... (the executor's threads) -> asyncio_*
OURS = ("tts_engine/", "app.py")


@dataclass
class Sample:
    thread: str
    frames: list[str]      # outermost first
    count: int


def parse(lines) -> list[Sample]:
    """Lines of py-spy's raw (collapsed-stack) format: `thread (TID): NAME;frame;...;frame COUNT`."""
    samples = []
    for line in lines:
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        thread = "?"
        if match:
            thread = _NUMBERED.sub("_*", match.group(2) or f"thread {match.group(1)}")
            frames = frames[1:]
        samples.append(Sample(thread, frames, int(count)))
    return samples


def _function(frame: str) -> str:
    """`TalkerStage._run (tts_engine/stages/talker.py:141)` -> `TalkerStage._run (tts_engine/stages/talker.py)`."""
    return re.sub(r":\d+\)$", ")", frame)


def summarize(samples: list[Sample], top: int = 8, rate: float | None = None,
              duration: float | None = None) -> dict:
    """Samples per thread (share of all GIL samples), each thread's functions that held the GIL themselves
    (`self`, the innermost frame) and its innermost frames of our own code (`ours`: where in tts_engine the
    time was spent, whatever library it called). With the sampling rate and duration, `gil_busy` is the
    share of the window in which some thread held the GIL."""
    total = sum(s.count for s in samples)
    threads: dict[str, list[Sample]] = {}
    for s in samples:
        threads.setdefault(s.thread, []).append(s)
    rows = []
    for name, group in sorted(threads.items(), key=lambda kv: -sum(s.count for s in kv[1])):
        n = sum(s.count for s in group)
        own, ours = Counter(), Counter()
        for s in group:
            if s.frames:
                own[_function(s.frames[-1])] += s.count
            mine = [f for f in s.frames if any(o in f for o in OURS)]
            ours[_function(mine[-1]) if mine else "(not our code)"] += s.count
        rows.append({"thread": name, "samples": n, "share": round(n / total, 4) if total else 0.0,
                     "top_self": own.most_common(top), "top_ours": ours.most_common(top)})
    out: dict = {"samples": total, "threads": rows}
    if rate and duration:
        out["gil_busy"] = round(min(1.0, total / (rate * duration)), 4)
    return out


def markdown(summary: dict) -> str:
    lines = []
    if "gil_busy" in summary:
        lines.append(f"GIL held {100 * summary['gil_busy']:.0f}% of the window ({summary['samples']} samples).\n")
    lines += ["| thread | share of GIL samples | where in our code (innermost frame of tts_engine) |",
              "|---|---|---|"]
    for row in summary["threads"]:
        where = "; ".join(f"{f} {100 * n / row['samples']:.0f}%" for f, n in row["top_ours"][:4])
        lines.append(f"| {row['thread']} | {100 * row['share']:.1f}% | {where} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", help="py-spy record --gil --threads --format raw output")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--rate", type=float, help="py-spy's --rate (for the GIL-busy share)")
    ap.add_argument("--duration", type=float, help="py-spy's --duration in seconds (for the GIL-busy share)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    summary = summarize(parse(Path(args.profile).read_text().splitlines()), args.top, args.rate, args.duration)
    table = markdown(summary)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
