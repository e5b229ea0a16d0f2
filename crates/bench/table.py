#!/usr/bin/env python3
"""Side-by-side tables of the benchmark's programs: perf (Rust, through metrale-gpu-sys), the C twin (nccl.h
called directly) and, where run, NVIDIA's nccl-tests, from the log folder bench/run.sh fills, with the
targets checked against them, and run.sh's notes (notes.md) under the verdicts.

Log names: <phase>-<collective>-<mode>-r<round>-<program>.txt, program rust, c or nt (nccl-tests); phases
small, large, colls (full: older runs); modes default, graph, reg, sym, symgraph (normal: older runs); and
helpers-r<round>-<rust|c>.txt. All three print nccl-tests' columns:
size count type redop root | time algbw busbw #wrong (out of place) | time algbw busbw #wrong (in place).

Usage: table.py LOG_DIR   (prints the tables and writes LOG_DIR/summary.md; exit status 1 when a target
                           is missed or an output is missing)
"""
import os
import re
import statistics
import sys

NAME = re.compile(r"^([a-z]+)-([a-z_]+)-([a-z]+)-r(\d+)-(rust|linked|c|nt)\.txt$")
HELPERS = re.compile(r"^helpers-r(\d+)-(c|rust)\.txt$")
PROGRAMS = ("nt", "c", "linked", "rust")
LABEL = {"nt": "nccl-tests", "c": "C", "linked": "Rust (feature link)", "rust": "Rust"}
PHASES = ("small", "large", "colls", "full")
MODES = {  # name: how nccl-tests spells it
    "default": "default",
    "normal": "default",
    "graph": "-G 20",
    "reg": "-R 1",
    "sym": "-R 2",
    "symgraph": "-R 2 -G 20",
}
LARGE = 64 << 20  # the busbw targets apply from here up
SMALL = 64 << 10  # the Rust − C latency target applies up to here
BUSBW_RATIO = 0.99
LATENCY_US = 0.5
SUMMARY_SIZES = (8, 4 << 10, 256 << 10, 2 << 20, 16 << 20, 128 << 20, 1 << 30)


def parse_rows(path):
    """size -> (oop_us, oop_busbw, oop_wrong, ip_us, ip_busbw, ip_wrong); wrong is None for N/A."""
    rows = {}
    with open(path, errors="replace") as f:
        for line in f:
            p = line.split()
            if line.startswith("#") or len(p) != 13 or not p[0].isdigit():
                continue
            try:
                wrong = [None if p[i] == "N/A" else int(p[i]) for i in (8, 12)]
                rows[int(p[0])] = (float(p[5]), float(p[7]), wrong[0], float(p[9]), float(p[11]), wrong[1])
            except ValueError:
                continue
    return rows


def parse_helpers(path):
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            p = line.split()
            if len(p) >= 5 and p[0] == "helper":
                out[p[1]] = float(p[2])
    return out


def load(logs):
    """runs: (phase, coll, mode) -> program -> [rows of each round]; helpers: program -> [results]."""
    runs, helpers = {}, {"c": [], "rust": []}
    for name in sorted(os.listdir(logs)):
        m = NAME.match(name)
        if m and m.group(1) != "helpers":
            phase, coll, mode, _round, prog = m.groups()
            rows = parse_rows(os.path.join(logs, name))
            if rows:
                runs.setdefault((phase, coll, mode), {}).setdefault(prog, []).append(rows)
            continue
        m = HELPERS.match(name)
        if m:
            h = parse_helpers(os.path.join(logs, name))
            if h:
                helpers[m.group(2)].append(h)
    return runs, helpers


def fmt_size(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def column(rounds, size, i):
    """The median over rounds of column i at size, or None when no round has it."""
    vals = [r[size][i] for r in rounds if size in r]
    return median(vals) if vals else None


def num(x, fmt):
    return "–" if x is None else format(x, fmt)


def sort_key(key):
    phase, coll, mode = key
    order = list(MODES)
    return (PHASES.index(phase) if phase in PHASES else 9, coll != "all_reduce", coll,
            order.index(mode) if mode in order else 9)


def table(say, key, by_prog, present):
    """One phase, collective and mode: a column group per program seen anywhere in the logs (`present`)."""
    phase, coll, mode = key
    progs = [p for p in PROGRAMS if p in present]
    refs = [p for p in progs if p != "rust"] if "rust" in progs else []
    counts = ", ".join(f"{len(by_prog.get(p, []))} {LABEL[p]}" for p in progs)
    say(f"\n## {coll}, {MODES.get(mode, mode)} ({phase}: {counts} runs; medians over runs; out of place)\n")
    heads = ([f"{LABEL[p]} µs" for p in progs] + [f"Rust − {LABEL[r]} µs" for r in refs]
             + [f"{LABEL[p]} busbw" for p in progs] + [f"Rust/{LABEL[r]} busbw" for r in refs]
             + ["#wrong " + "/".join(LABEL[p] for p in progs)])
    say("| size | " + " | ".join(heads) + " |")
    say("| ---: |" + " ---: |" * len(heads))
    sizes = sorted(set().union(*(set(r) for rounds in by_prog.values() for r in rounds)))
    for s in sizes:
        us = {p: column(by_prog.get(p, []), s, 0) for p in progs}
        bw = {p: column(by_prog.get(p, []), s, 1) for p in progs}
        diff = lambda r: None if us["rust"] is None or us[r] is None else us["rust"] - us[r]
        ratio = lambda r: None if not bw[r] or bw["rust"] is None else bw["rust"] / bw[r]
        wrong = "/".join(
            str(sum((r[s][2] or 0) + (r[s][5] or 0) for r in by_prog.get(p, []) if s in r))
            if by_prog.get(p) else "–" for p in progs)
        cells = ([num(us[p], ".2f") for p in progs] + [num(diff(r), "+.2f") for r in refs]
                 + [num(bw[p], ".2f") for p in progs] + [num(ratio(r), ".3f") for r in refs] + [wrong])
        say(f"| {fmt_size(s)} | " + " | ".join(cells) + " |")


def both_placements(by_prog, prog, size, us_or_bw):
    """The medians of (out of place, in place) time (0) or busbw (1) of one program at one size."""
    rounds = by_prog.get(prog, [])
    return [column(rounds, size, i) for i in ((0, 3) if us_or_bw == 0 else (1, 4))]


def verdicts_for(key, by_prog, present):
    """(target, verdict, numbers) rows of one table; `present`: the programs seen anywhere in the logs."""
    phase, coll, mode = key
    name = f"{coll} {MODES.get(mode, mode)} ({phase})"
    out = []
    missing = [LABEL[p] for p in PROGRAMS if p in present and not by_prog.get(p)]
    if missing:
        out.append((name, "MISSING", f"no output from {', '.join(missing)}: see the logs"))
    sizes = sorted(set().union(*(set(r) for rounds in by_prog.values() for r in rounds)))
    for ref in ("nt", "c"):
        if not by_prog.get(ref) or not by_prog.get("rust"):
            continue
        ratios = []
        for s in (s for s in sizes if s >= LARGE):
            for r, c in zip(both_placements(by_prog, "rust", s, 1), both_placements(by_prog, ref, s, 1)):
                if r is not None and c:
                    ratios.append(r / c)
        if ratios:
            worst = min(ratios)
            out.append((f"{name}: ≥ 64M, Rust/{LABEL[ref]} busbw", "PASS" if worst >= BUSBW_RATIO else "FAIL",
                        f"worst {worst:.3f}, median {median(ratios):.3f} (target ≥ {BUSBW_RATIO})"))
    if by_prog.get("c") and by_prog.get("rust"):
        diffs = []
        for s in (s for s in sizes if 0 < s <= SMALL):
            for r, c in zip(both_placements(by_prog, "rust", s, 0), both_placements(by_prog, "c", s, 0)):
                if r is not None and c is not None:
                    diffs.append(r - c)
        if diffs and phase == "small":
            med = median(diffs)
            out.append((f"{name}: ≤ 64K, Rust − C time", "PASS" if med <= LATENCY_US else "FAIL",
                        f"median {med:+.2f} µs, worst {max(diffs):+.2f} µs (target: median ≤ +{LATENCY_US} µs)"))
    if (coll, mode, phase) == ("all_reduce", "symgraph", "small") and by_prog.get("nt") and by_prog.get("rust"):
        r, n = column(by_prog["rust"], 8, 0), column(by_prog["nt"], 8, 0)
        if r is not None and n is not None:
            out.append((f"{name}: 8 B, Rust − nccl-tests time", "PASS" if r - n <= LATENCY_US else "FAIL",
                        f"Rust {r:.2f} µs, nccl-tests {n:.2f} µs: {r - n:+.2f} µs (target ≤ +{LATENCY_US} µs)"))
    return out


def modes_summary(say, runs):
    """all_reduce by mode and size (small and large phases together), for one program per table."""
    merged = {}  # mode -> prog -> [rows]
    for (phase, coll, mode), by_prog in runs.items():
        if coll == "all_reduce" and phase in ("small", "large"):
            for prog, rounds in by_prog.items():
                merged.setdefault(mode, {}).setdefault(prog, []).extend(rounds)
    modes = [m for m in MODES if m in merged]
    if not modes:
        return
    for prog in ("rust", "nt"):
        sizes = [s for s in SUMMARY_SIZES if any(column(merged[m].get(prog, []), s, 0) for m in modes)]
        if not sizes:
            continue
        say(f"\n## all_reduce by mode, {LABEL[prog]} (µs, and busbw GB/s from 2M; medians; fastest in bold)\n")
        say("| mode | " + " | ".join(fmt_size(s) for s in sizes) + " |")
        say("| --- |" + " ---: |" * len(sizes))
        best = {s: min((column(merged[m].get(prog, []), s, 0) or float("inf"), m) for m in modes)[1]
                for s in sizes}
        for m in modes:
            cells = []
            for s in sizes:
                us = column(merged[m].get(prog, []), s, 0)
                bw = column(merged[m].get(prog, []), s, 1)
                cell = "–" if us is None else f"{us:.1f}" + (f" / {bw:.0f}" if s >= 2 << 20 else "")
                cells.append(f"**{cell}**" if best[s] == m and us is not None else cell)
            say(f"| {MODES[m]} | " + " | ".join(cells) + " |")


def helper_tables(say, helpers):
    rows = []
    if not (helpers["c"] and helpers["rust"]):
        lacking = [LABEL[p] for p in ("c", "rust") if not helpers[p]]
        return [] if len(lacking) == 2 else [("helpers", "MISSING", f"no --helpers output from {lacking[0]}")]
    say(f"\n## Helpers: ns per call ({len(helpers['c'])} C / {len(helpers['rust'])} Rust runs, pinned to one core;"
        " median of each run's median)\n")
    say("| helper | C (direct call) ns | Rust (crate helper) ns | Rust/C | Rust−C ns | verdict |")
    say("| --- | ---: | ---: | ---: | ---: | --- |")
    for n in (n for n in helpers["rust"][0] if n in helpers["c"][0]):
        c = median([h[n] for h in helpers["c"] if n in h])
        r = median([h[n] for h in helpers["rust"] if n in h])
        ok = r <= 1.05 * c or r - c <= 20.0
        ratio = r / c if c > 0 else float("nan")
        say(f"| {n} | {c:.2f} | {r:.2f} | {ratio:.3f} | {r - c:+.2f} | {'PASS' if ok else 'FAIL'} |")
        rows.append((f"helper {n}", "PASS" if ok else "FAIL",
                     f"C {c:.2f} ns, Rust {r:.2f} ns (target ≤ 1.05× or ≤ +20 ns)"))
    raw = [n for n in helpers["rust"][0] if n.startswith("raw_")]
    if raw:
        say("\nRust, the driver call through the crate's table without the helper: " + ", ".join(
            f"{n[4:]} {median([h[n] for h in helpers['rust'] if n in h]):.2f} ns" for n in raw))
    return rows


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    logs = sys.argv[1]
    runs, helpers = load(logs)
    body, verdicts = [], []
    say = body.append
    modes_summary(say, runs)
    present = {prog for by_prog in runs.values() for prog in by_prog}
    for key in sorted(runs, key=sort_key):
        table(say, key, runs[key], present)
        verdicts += verdicts_for(key, runs[key], present)
    verdicts += helper_tables(say, helpers)
    for prog in PROGRAMS:
        measured = [w for by_prog in runs.values() for rows in by_prog.get(prog, [])
                    for r in rows.values() for w in (r[2], r[5]) if w is not None]
        if measured:
            wrong = sum(measured)
            verdicts.append((f"#wrong, {LABEL[prog]}", "PASS" if wrong == 0 else "FAIL",
                             f"{wrong} wrong elements over {len(measured)} checked measurements"))

    if not verdicts:
        verdicts.append(("measurements", "MISSING", f"no program output in {logs}"))
    head = ["## Verdicts\n", "| target | verdict | numbers |", "| --- | --- | --- |"]
    head += [f"| {what} | {v} | {detail} |" for what, v, detail in verdicts]
    notes = os.path.join(logs, "notes.md")  # what run.sh says about this run (e.g. nccl-tests not given)
    if os.path.exists(notes):
        with open(notes, encoding="utf-8") as f:
            lines = [line.rstrip() for line in f if line.strip()]
        if lines:
            head += ["", "Notes:", ""] + lines
    text = "\n".join(head + body) + "\n"
    with open(os.path.join(logs, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0 if all(v == "PASS" for _, v, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
