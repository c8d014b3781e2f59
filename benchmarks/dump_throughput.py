"""Full-dump throughput: bytes per second the recorder writes with full tensors
of every event (`opguard record --dump-all`), against a plain HDF5 contiguous
write of the same tensors (same dtypes and shapes, one file per step),
measured in the same run. Target: ratio >= 0.8.

    .venv/bin/python benchmarks/dump_throughput.py --build build [--repeats 3]

Two figures:
  end to end   bytes_written (manifest) / (wall time of the C++ example under
               `opguard record --dump-all` - wall time under `opguard record`
               with fingerprints only): what full dumps cost the run, per byte.
               The writer thread overlaps the training thread, so this can beat
               a write that nothing overlaps.
  StepWriter   formats::StepWriter writing the same tensors and events as the
               recorder's writer thread does, timed alone (opguard_dump_throughput).
The baseline for both is opguard_dump_throughput's plain HDF5 write of the
tensors of the same recording, on the same disk, in the same run.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit("benchmark run failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-2000:]))
    return elapsed, r.stdout


def bytes_written(recording):
    with h5py.File(os.path.join(recording, "rank0", "manifest.h5"), "r") as f:
        return int(f["info"].attrs["bytes_written"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    # Small enough that a run's dumps (about 220 MiB) fit in the page cache:
    # larger runs measure the disk's writeback, whoever comes second paying.
    # One intra-op thread leaves a core to the writer thread: with as many
    # threads as cores, OpenMP's spin-waiting workers take it (56% of the
    # samples of a --threads 2 run on 2 cores were in libgomp; dumps then cost
    # 3.5 s instead of 0.5 s).
    p.add_argument("--size", default="--width 64 --depth 2 --seq 32 --batch 8 --threads 1")
    p.add_argument("--scratch", default=tempfile.gettempdir(), help="where recordings are written (same disk for all)")
    a = p.parse_args()
    opguard = os.path.join(a.build, "bin", "opguard")
    bench = os.path.join(a.build, "bin", "opguard_dump_throughput")
    program = [os.path.join(a.build, "bin", "tiny_gpt")] + a.size.split() + ["--steps", str(a.steps), "--print-every", "0"]
    tmp = tempfile.mkdtemp(prefix="opguard-dump-bench-", dir=a.scratch)
    fingerprints, dumps, sizes = [], [], []
    plain, ours = [], []
    for i in range(a.repeats):
        fp_dir, dump_dir = os.path.join(tmp, "fp%d" % i), os.path.join(tmp, "dump%d" % i)
        os.sync()  # neither run pays for the other's writeback
        fingerprints.append(timed([opguard, "record", "--out", fp_dir, "--"] + program)[0])
        os.sync()
        dumps.append(timed([opguard, "record", "--dump-all", "--out", dump_dir, "--"] + program)[0])
        sizes.append(bytes_written(dump_dir))
        _, out = timed([bench, "--recording", dump_dir, "--repeats", "3", "--out", tmp])
        plain.append(float(re.search(r"plain HDF5 contiguous \(baseline\)\s+([0-9.]+)", out).group(1)))
        ours.append(float(re.search(r"formats::StepWriter\s+([0-9.]+)", out).group(1)))
        shutil.rmtree(fp_dir, ignore_errors=True)
        shutil.rmtree(dump_dir, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    mib = statistics.median(sizes) / (1 << 20)
    extra = statistics.median(d - f for d, f in zip(dumps, fingerprints))
    base = statistics.median(plain)
    e2e = mib / extra if extra > 0 else float("inf")
    print("program: tiny_gpt %s, %d steps; %.1f MiB of full tensors per run; median of %d interleaved repeats"
          % (a.size, a.steps, mib, a.repeats))
    print("wall time: fingerprints only %.2f s, --dump-all %.2f s (extra %.2f s)"
          % (statistics.median(fingerprints), statistics.median(dumps), extra))
    print("  each run (s): fingerprints %s, --dump-all %s" % (" ".join("%.2f" % x for x in fingerprints),
                                                            " ".join("%.2f" % x for x in dumps)))
    print("%-40s %10s %8s" % ("writer", "MiB/s", "ratio"))
    print("%-40s %10.1f %8.3f" % ("plain HDF5 contiguous (baseline)", base, 1.0))
    print("%-40s %10.1f %8.3f" % ("formats::StepWriter (same tensors)", statistics.median(ours), statistics.median(ours) / base))
    print("%-40s %10.1f %8.3f" % ("opguard record --dump-all (end to end)", e2e, e2e / base))


if __name__ == "__main__":
    main()
