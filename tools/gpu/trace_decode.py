#!/usr/bin/env python3
"""Where a decode step's time goes, from an Nsight Systems kernel trace.

Input: the CSV of `nsys stats -r cuda_gpu_trace -f csv` of a run traced
with `--cuda-graph-trace=node` (bench/gpu/gpu_decode with
GLM53_BENCH_DECODE_ONLY=1; tools/gpu/run_device.sh shows the commands).
Steps are cut at each embedding kernel (embed_k starts every forward);
the last complete step is analysed, or the median step by length with
--all.

Per kernel name it prints the calls, the summed duration and the summed
*critical-path increment*: how much later the step's frontier (the
latest end of any kernel so far) is after the kernel than before it. With
programmatic dependent launch a kernel starts while its predecessor runs,
so durations overlap and add up to more than the step; the increments add
up to the step exactly and say which kernels the step waits on.

Usage: trace_decode.py TRACE.csv[.gz] [--top N]"""
import csv
import gzip
import re
import sys


def rows(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", newline="") as f:
        lines = [l for l in f if l.strip()]
    head = next(i for i, l in enumerate(lines) if "Start" in l and "Name" in l)
    for r in csv.DictReader(lines[head:]):
        start = r.get("Start (ns)") or r.get("Start")
        dur = r.get("Duration (ns)") or r.get("Duration")
        name = r.get("Name", "")
        if start is None or dur is None:
            continue
        try:
            yield int(float(start)), int(float(dur)), name
        except ValueError:
            continue


def short(name):
    """the kernel's function name without template arguments and parameters"""
    n = re.sub(r"\(.*$", "", name)
    n = re.sub(r"^void ", "", n)
    depth, out = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name[:60]


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    top = 40
    if "--top" in args:
        top = int(args[args.index("--top") + 1])
    ks = sorted((s, d, short(n), n) for s, d, n in rows(args[0]) if not n.startswith("[CUDA mem"))
    if not ks:
        print("no kernels in", args[0])
        return 1
    cut = [i for i, k in enumerate(ks) if k[2] == "embed_k"]
    if len(cut) < 2:
        print("fewer than two forwards (embed_k) in the trace: analysing all %d kernels" % len(ks))
        steps = [ks]
    else:
        steps = [ks[a:b] for a, b in zip(cut, cut[1:])]
    # the decode steps are the short ones at the end; take the last complete
    step = steps[-1]
    t0 = step[0][0]
    front = t0
    agg = {}
    for s, d, n, full in step:
        e = s + d
        inc = max(0, e - front)
        front = max(front, e)
        a = agg.setdefault(n, [0, 0, 0])
        a[0] += 1
        a[1] += d
        a[2] += inc
    span = front - t0
    busy = sum(d for _, d, _, _ in step)
    print("step: %d kernels, %.3f ms from the first start to the last end; durations sum to %.3f ms" %
          (len(step), span / 1e6, busy / 1e6))
    print("%-44s %6s %10s %10s %8s %6s" % ("kernel", "calls", "dur ms", "path ms", "path us", "path%"))
    for n, (c, d, p) in sorted(agg.items(), key=lambda kv: -kv[1][2])[:top]:
        print("%-44s %6d %10.3f %10.3f %8.2f %5.1f%%" % (n[:44], c, d / 1e6, p / 1e6, p / 1e3 / c, 100.0 * p / span))
    # the gaps: time on the path in which no kernel of the step ran
    idle, last = 0, t0
    for s, d, _, _ in step:
        if s > last:
            idle += s - last
        last = max(last, s + d)
    print("no kernel running: %.3f ms of the step" % (idle / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
