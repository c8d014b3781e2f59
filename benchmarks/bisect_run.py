"""Wall time of `opguard bisect run` from two recordings to a checked bundle on
the C++ example, split by stage (diff, re-record, replay, bisect config,
shrink, bundle), and the number of replay trials against the number of
knobs that differ. The recordings themselves are not timed.

    .venv/bin/python benchmarks/bisect_run.py --build build [--knob threads|cpu_capability|mkldnn|tp|all]

Each case records tiny_gpt twice (reference and suspect differing in the
knob), runs `bisect run --json --check-with <this python>`, and prints one
line per stage. Also: `bisect config` on the re-recorded event with three
knobs changed (one of which matters), to show trials against knobs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# knob: (reference flags, suspect flags, reference env, suspect env, suspect's opguard record flags)
CASES = {
    "threads": (["--threads", "2"], ["--threads", "1"], {}, {}, []),
    "cpu_capability": (["--threads", "1"], ["--threads", "1"], {"ATEN_CPU_CAPABILITY": "avx2"},
                       {"ATEN_CPU_CAPABILITY": "default"}, []),
    "mkldnn": ([], ["--mkldnn", "off"], {}, {}, []),
    # A 2-way row-parallel down-projection the program applies and declares.
    "tp": (["--width", "96"], ["--width", "96", "--tp", "2"], {}, {}, ["--declare", "tp=2"]),
}
# Three knobs changed over the recorded config, one of which matters.
THREE_KNOBS = {"threads": "threads=1,mkldnn=off,deterministic=on",
               "cpu_capability": "cpu_capability=default,mkldnn=off,threads=2",
               "mkldnn": "mkldnn=off,threads=1,deterministic=on",
               "tp": "tp=2,mkldnn=off,deterministic=on"}


def run(cmd, env=None, ok=(0,)):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    if r.returncode not in ok:
        sys.exit("failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-3000:]))
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--knob", choices=list(CASES) + ["all"], default="all")
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    opguard = os.path.join(a.build, "bin", "opguard")
    tiny = os.path.join(a.build, "bin", "tiny_gpt")
    knobs = list(CASES) if a.knob == "all" else [a.knob]
    for knob in knobs:
        ref_flags, sus_flags, ref_env, sus_env, sus_record = CASES[knob]
        with tempfile.TemporaryDirectory(prefix="opguard_bisect_bench_") as tmp:
            ref, sus, out = (os.path.join(tmp, n) for n in ("ref", "sus", "out"))
            prog = [tiny, "--steps", str(a.steps)]
            run([opguard, "record", "--out", ref, "--"] + prog + ref_flags, ref_env)
            run([opguard, "record", "--out", sus] + sus_record + ["--"] + prog + sus_flags, sus_env)
            r = run([opguard, "bisect", "run", ref, sus, "-o", out, "--json", "--check-with", sys.executable])
            j = json.loads(r.stdout)
            print("== %s: %s" % (knob, j["message"]))
            for s in j["stages"]:
                print("  %-14s %7.2f s" % (s["stage"], s["seconds"]))
            print("  %-14s %7.2f s" % ("total", j["seconds"]))
            c = j["config"]
            print("  knobs differing %d, found %s, replay trials %d" %
                  (len(c["differences"]), ",".join(m["knob"] for m in c["minimal"]), c["trial_count"]))
            sh = j["shrink"]
            print("  shrink: %d -> %d bytes in %d candidates (%d kept)" %
                  (sh["original_bytes"], sh["final_bytes"], sh["trials"], sh["accepted"]))
            print("  bundle: %s" % (j["bundle_note"] or j["bundle"]))
            # Trials against knobs: three knobs changed, one matters.
            r = run([opguard, "bisect", "config", j["recording"], "--event", j["event"], "--bad", THREE_KNOBS[knob],
                     "--json"],
                    ok=(0, 4))
            c3 = json.loads(r.stdout)
            print("  bisect config over %d knobs: found %s in %d replay trials (%.2f s)" %
                  (len(c3["differences"]), ",".join(m["knob"] for m in c3["minimal"]) or "-", c3["trial_count"],
                   c3["seconds"]))


if __name__ == "__main__":
    main()
