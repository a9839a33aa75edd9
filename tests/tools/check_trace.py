"""Checks GS_TRACE files and gstrace's merge of them (tests/tools/test_trace.sh).

    check_trace.py file FILE [--expect CAT:NAME:BYTES:MIN ...] [--spans NAME,...]
    check_trace.py merged FILE --ranks N
    check_trace.py png FILE WIDTH HEIGHT

file:   valid JSON with the "gradsync" header; complete events with ts and dur >= 0; on
        every track (pid, tid) the events nest (two either do not overlap or one holds the
        other); at least MIN events of CAT/NAME with args.bytes == BYTES (BYTES "-": any);
        every --spans name present (the application's own spans).
merged: every rank's events, ts moved by its offset; a collective call (communicator,
        sequence number) seen on several ranks overlaps in time on all of them, within the
        stated clock bound: no rank finishes call k before another started it.
png:    a PNG of that size (its IHDR).
Exit status 0 when every check holds, else 1 with what failed.
"""
import collections
import json
import struct
import sys


def fail(msg):
    print("check_trace: FAILED: " + msg)
    sys.exit(1)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail("%s is not valid JSON: %s" % (path, e))


def complete_events(doc, path):
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        fail("%s has no traceEvents list" % path)
    out = []
    for e in events:
        if e.get("ph") == "M":
            continue
        if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)) or e.get("dur", -1) < 0:
            fail("%s: malformed event %r" % (path, e))
        out.append(e)
    return out


def check_nesting(events, path):
    tracks = collections.defaultdict(list)
    for e in events:
        tracks[(e["pid"], e["tid"])].append(e)
    slack = 0.002  # us: ts and dur are printed to 1 ns
    for key, evs in tracks.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + slack:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + slack:
                fail("%s: track %s: %s at %.3f (%.3f us) overlaps %s at %.3f (%.3f us) without nesting"
                     % (path, key, e["name"], e["ts"], e["dur"], stack[-1]["name"], stack[-1]["ts"],
                        stack[-1]["dur"]))
            stack.append(e)
    return len(tracks)


def cmd_file(path, args):
    doc = load(path)
    head = doc.get("gradsync")
    if not isinstance(head, dict) or "rank" not in head or "clock_offset_ns" not in head:
        fail("%s: no gradsync header with rank and clock offset" % path)
    if head["clock_bound_ns"] < 0 or abs(head["clock_offset_ns"]) > 10**15:
        fail("%s: implausible clock %r" % (path, head))
    events = complete_events(doc, path)
    ntracks = check_nesting(events, path)
    i = 0
    while i < len(args):
        if args[i] == "--expect":
            cat, name, nbytes, least = args[i + 1].split(":")
            got = [e for e in events if e["cat"] == cat and e["name"] == name and
                   (nbytes == "-" or e["args"].get("bytes") == int(nbytes))]
            if len(got) < int(least):
                fail("%s: %d %s/%s events of %s bytes, expected at least %s"
                     % (path, len(got), cat, name, nbytes, least))
            bad = [e for e in got if e["args"].get("status", "GS_OK") != "GS_OK"]
            if bad:
                fail("%s: %s/%s events with errors: %r" % (path, cat, name, bad[:2]))
        elif args[i] == "--spans":
            for name in args[i + 1].split(","):
                if not any(e["cat"] == "app" and e["name"] == name for e in events):
                    fail("%s: no application span %r" % (path, name))
        else:
            fail("unknown argument " + args[i])
        i += 2
    print("check_trace: %s: rank %d, %d events on %d tracks, well nested; clock %s (offset %d ns, bound %d ns)"
          % (path, head["rank"], len(events), ntracks, head["clock_source"], head["clock_offset_ns"],
             head["clock_bound_ns"]))


def cmd_merged(path, args):
    doc = load(path)
    ranks = int(args[args.index("--ranks") + 1])
    info = doc.get("gradsync", {})
    merged = info.get("merged", [])
    if len(merged) != ranks or not all(m["complete"] for m in merged):
        fail("%s: merged %r, expected %d complete ranks" % (path, merged, ranks))
    events = complete_events(doc, path)
    if sorted({e["pid"] for e in events}) != list(range(ranks)):
        fail("%s: events of ranks %r" % (path, sorted({e["pid"] for e in events})))
    check_nesting(events, path)
    bound_us = info["clock_bound_ns"] / 1e3 + 0.002
    calls = collections.defaultdict(list)
    for e in events:
        if e["cat"] == "coll":
            calls[(e["args"]["comm"], e["args"]["seq"])].append(e)
    checked = 0
    for key, evs in calls.items():
        if len(evs) < 2:
            continue
        last_start = max(e["ts"] for e in evs)
        first_end = min(e["ts"] + e["dur"] for e in evs)
        if last_start > first_end + bound_us:
            late = max(evs, key=lambda e: e["ts"])
            early = min(evs, key=lambda e: e["ts"] + e["dur"])
            fail("%s: call %s: rank %d started it %.3f us after rank %d had finished it (bound %.3f us)"
                 % (path, key, late["pid"], last_start - first_end, early["pid"], bound_us))
        checked += 1
    if checked == 0:
        fail("%s: no collective call seen on more than one rank" % path)
    print("check_trace: %s: %d ranks, %d events; %d collective calls overlap on every rank within %.3f us"
          % (path, ranks, len(events), checked, bound_us))


def cmd_png(path, width, height):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        fail("%s is not a PNG" % path)
    w, h = struct.unpack(">II", head[16:24])
    if (w, h) != (int(width), int(height)):
        fail("%s is %dx%d, expected %sx%s" % (path, w, h, width, height))
    print("check_trace: %s: PNG %dx%d" % (path, w, h))


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    what, path, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "file":
        cmd_file(path, rest)
    elif what == "merged":
        cmd_merged(path, rest)
    elif what == "png":
        cmd_png(path, *rest)
    else:
        fail("unknown check " + what)


if __name__ == "__main__":
    main()
