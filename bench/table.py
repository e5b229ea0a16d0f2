#!/usr/bin/env python3
"""Side-by-side tables of the C twin (benches/c/perf_twin.c) and the Rust example (examples/perf.rs), from the
log directory ci/bench-run.sh fills, and the issue's targets checked against them.

Log names: <phase>-<collective>-<mode>-r<round>-<lang>.txt (phase: full or small; mode: normal or graph;
lang: c or rust) and helpers-r<round>-<lang>.txt. Both programs print nccl-tests' columns:
size count type redop root | time algbw busbw #wrong (out of place) | time algbw busbw #wrong (in place).

Usage: bench_table.py LOG_DIR   (prints the tables and writes LOG_DIR/summary.md)
"""
import os
import re
import statistics
import sys

NAME = re.compile(r"^(full|small)-([a-z_]+)-(normal|graph)-r(\d+)-(c|rust)\.txt$")
HELPERS = re.compile(r"^helpers-r(\d+)-(c|rust)\.txt$")
LARGE = 64 << 20  # the busbw target applies from here up
SMALL = 64 << 10  # the latency target applies up to here
ANCHOR_AR_2G_BUSBW = 341.0  # nccl-tests 2.19.6 on the same kind of machine (GPU-MACHINE.md)
ANCHOR_AR_8B_US = 18.3


def parse_rows(path):
    """size -> (oop_us, oop_busbw, oop_wrong, ip_us, ip_busbw, ip_wrong); wrong is None for N/A."""
    rows = {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                continue
            p = line.split()
            if len(p) != 13 or not p[0].isdigit():
                continue
            wrong = lambda s: None if s == "N/A" else int(s)
            try:
                rows[int(p[0])] = (float(p[5]), float(p[7]), wrong(p[8]), float(p[9]), float(p[11]), wrong(p[12]))
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


def fmt_size(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    logs = sys.argv[1]
    runs = {}  # (phase, coll, mode) -> lang -> [rows per round]
    helpers = {"c": [], "rust": []}
    for name in sorted(os.listdir(logs)):
        m = NAME.match(name)
        if m:
            phase, coll, mode, _round, lang = m.groups()
            rows = parse_rows(os.path.join(logs, name))
            if rows:
                runs.setdefault((phase, coll, mode), {}).setdefault(lang, []).append(rows)
            continue
        m = HELPERS.match(name)
        if m:
            h = parse_helpers(os.path.join(logs, name))
            if h:
                helpers[m.group(2)].append(h)

    out = []
    say = out.append
    verdicts = []
    wrong_total = {"c": 0, "rust": 0}
    wrong_checked = {"c": 0, "rust": 0}

    for (phase, coll, mode), by_lang in sorted(runs.items(), key=lambda kv: (kv[0][0] != "full", kv[0][2], kv[0][1])):
        for lang, rounds in by_lang.items():
            for rows in rounds:
                for r in rows.values():
                    for w in (r[2], r[5]):
                        if w is not None:
                            wrong_total[lang] += w
                            wrong_checked[lang] += 1
        c_runs, r_runs = by_lang.get("c", []), by_lang.get("rust", [])
        if not c_runs or not r_runs:
            say(f"\n## {phase} {coll} {mode}: missing output ({'C' if not c_runs else 'Rust'}); see the logs\n")
            verdicts.append((f"{coll} {mode} ({phase})", "MISSING", "no output from one side"))
            continue
        sizes = sorted(set.intersection(*(set(r) for r in c_runs + r_runs)))
        say(f"\n## {coll}, {mode} ({phase} sweep, {len(c_runs)} C / {len(r_runs)} Rust runs; medians over runs)\n")
        say("| size | C µs | Rust µs | Rust/C | Rust−C µs | C busbw | Rust busbw | in-place Rust/C | #wrong C/Rust |")
        say("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        small_diffs, large_ratios = [], []
        for s in sizes:
            col = lambda runs_, i: median([r[s][i] for r in runs_])
            c_us, r_us = col(c_runs, 0), col(r_runs, 0)
            c_bw, r_bw = col(c_runs, 1), col(r_runs, 1)
            c_ip, r_ip = col(c_runs, 3), col(r_runs, 3)
            c_ipbw, r_ipbw = col(c_runs, 4), col(r_runs, 4)
            wrongs = lambda runs_: sum((r[s][2] or 0) + (r[s][5] or 0) for r in runs_)
            ratio = r_us / c_us if c_us > 0 else float("nan")
            ip_ratio = r_ip / c_ip if c_ip > 0 else float("nan")
            say(f"| {fmt_size(s)} | {c_us:.2f} | {r_us:.2f} | {ratio:.3f} | {r_us - c_us:+.2f} | {c_bw:.2f} | "
                f"{r_bw:.2f} | {ip_ratio:.3f} | {wrongs(c_runs)}/{wrongs(r_runs)} |")
            if 0 < s <= SMALL:
                small_diffs += [r_us - c_us, r_ip - c_ip]
            if s >= LARGE:
                if c_bw > 0:
                    large_ratios.append(r_bw / c_bw)
                if c_ipbw > 0:
                    large_ratios.append(r_ipbw / c_ipbw)
            if phase == "full" and mode == "normal" and coll == "all_reduce":
                if s == 2 << 30:
                    say(f"|  | (nccl-tests anchor at 2G: busbw {ANCHOR_AR_2G_BUSBW}) | | | | | | | |")
                if s == 8:
                    say(f"|  | (nccl-tests anchor at 8B: {ANCHOR_AR_8B_US} µs) | | | | | | | |")
        if small_diffs and phase == "small":
            worst = max(small_diffs)
            med = median(small_diffs)
            ok = med <= 0.5
            verdicts.append((f"{coll} {mode}: sizes ≤ 64K, Rust − C time", "PASS" if ok else "FAIL",
                             f"median {med:+.2f} µs, worst {worst:+.2f} µs (target: median ≤ +0.5 µs)"))
        if large_ratios and phase == "full":
            worst = min(large_ratios)
            ok = worst >= 0.99
            verdicts.append((f"{coll} {mode}: sizes ≥ 64M, Rust/C busbw", "PASS" if ok else "FAIL",
                             f"worst {worst:.3f}, median {median(large_ratios):.3f} (target ≥ 0.99)"))

    if helpers["c"] and helpers["rust"]:
        say(f"\n## Helpers: ns per call ({len(helpers['c'])} C / {len(helpers['rust'])} Rust runs; median of each run's"
            " median)\n")
        say("| helper | C (direct call) ns | Rust (crate helper) ns | Rust/C | Rust−C ns | verdict |")
        say("| --- | ---: | ---: | ---: | ---: | --- |")
        names = [n for n in helpers["rust"][0] if n in helpers["c"][0]]
        for n in names:
            c = median([h[n] for h in helpers["c"] if n in h])
            r = median([h[n] for h in helpers["rust"] if n in h])
            ok = r <= 1.05 * c or r - c <= 20.0
            say(f"| {n} | {c:.2f} | {r:.2f} | {r / c if c > 0 else float('nan'):.3f} | {r - c:+.2f} | "
                f"{'PASS' if ok else 'FAIL'} |")
            verdicts.append((f"helper {n}", "PASS" if ok else "FAIL",
                             f"C {c:.2f} ns, Rust {r:.2f} ns (target ≤ 1.05× or ≤ +20 ns)"))
        raw = [n for n in helpers["rust"][0] if n.startswith("raw_")]
        if raw:
            say("\nRust, the driver call through the crate's table without the helper: " + ", ".join(
                f"{n[4:]} {median([h[n] for h in helpers['rust'] if n in h]):.2f} ns" for n in raw))
    else:
        verdicts.append(("helpers", "MISSING", "no --helpers output from one side"))

    for lang in ("c", "rust"):
        ok = wrong_total[lang] == 0 and wrong_checked[lang] > 0
        verdicts.append((f"#wrong, {'C' if lang == 'c' else 'Rust'}", "PASS" if ok else "FAIL",
                         f"{wrong_total[lang]} wrong elements over {wrong_checked[lang]} checked measurements"))

    say("\n## Verdicts\n")
    say("| target | verdict | numbers |")
    say("| --- | --- | --- |")
    for what, v, detail in verdicts:
        say(f"| {what} | {v} | {detail} |")

    text = "\n".join(out) + "\n"
    with open(os.path.join(logs, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(v == "PASS" for _, v, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
