"""Independent check of `opguard diff`'s first divergent operator, reading the
HDF5 step files with h5py only (docs/FORMAT.md), none of opguard's code.

usage: check_first_divergent.py REF SUSPECT EVENT_ID [RANK]

Both recordings must come from the same program (the event ids then line up).
Checks that the event has bitwise-equal inputs in both runs and different
outputs, and that every event the suspect ran before it has the same op and
bitwise-equal inputs and outputs in the reference. Exit 0 and one line when
all hold; exit 1 with the first violation otherwise.
"""
import glob
import os
import sys

import h5py


def parse_id(text):
    if "." in text:
        stream, seq = text.split(".")
        return (int(stream) << 48) | int(seq)
    return int(text)


def load(rec, rank):
    """Every event of the rank: id -> (step, t_start, op, inputs, outputs)."""
    events = {}
    for path in sorted(glob.glob(os.path.join(rec, f"rank{rank}", "step*.h5"))):
        with h5py.File(path, "r") as f:
            ev, val = f["events"], f["values"]
            blob, offsets = f["strings"][()].tobytes(), f["string_offsets"][()]

            def string(i):  # row i of the file's string table (docs/FORMAT.md)
                return blob[offsets[i]:offsets[i + 1]].decode()

            ids, steps, t0 = ev["id"][:], ev["step"][:], ev["t_start_ns"][:]
            ops = ev["op"][:]
            begin, n_in, n_out = ev["value_begin"][:], ev["n_inputs"][:], ev["n_outputs"][:]
            kind, flags, fp, text = val["kind"][:], val["flags"][:], val["fingerprint"][:], val["text"][:]

            def value(i):
                # tensors (1) and generator states (14) by flags and fingerprint; the rest by text
                if kind[i] in (1, 14):
                    # the bits' state only: uninitialised (1), not fingerprinted (8); not
                    # has-data/dropped (2, 4) nor what describes the tensor (16, 32, 64)
                    return ("t", int(flags[i]) & 0x9, int(fp[i]))
                return ("v", int(kind[i]), string(text[i]))

            for k in range(len(ids)):
                b = int(begin[k])
                ins = [value(i) for i in range(b, b + int(n_in[k]))]
                outs = [value(i) for i in range(b + int(n_in[k]), b + int(n_in[k]) + int(n_out[k]))]
                op = string(ops[k])
                events[int(ids[k])] = (int(steps[k]), int(t0[k]), op, ins, outs)
    return events


def main():
    ref_dir, sus_dir, target_text = sys.argv[1:4]
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ref, sus = load(ref_dir, rank), load(sus_dir, rank)
    target = parse_id(target_text)
    if target not in sus or target not in ref:
        print(f"event {target_text} is missing from a recording")
        return 1
    t_step, t_start, t_op, t_in, t_out = sus[target]
    r_step, _, r_op, r_in, r_out = ref[target]
    if (r_op, r_step) != (t_op, t_step):
        print(f"event {target_text} is {r_op} in the reference but {t_op} in the suspect")
        return 1
    if r_in != t_in:
        print(f"event {target_text} ({t_op}) has different inputs in the two runs")
        return 1
    if r_out == t_out:
        print(f"event {target_text} ({t_op}) has equal outputs in the two runs")
        return 1
    earlier = 0
    for eid, (step, start, op, ins, outs) in sus.items():
        if (step, start) >= (t_step, t_start):
            continue
        earlier += 1
        other = ref.get(eid)
        if other is None or other[2] != op or other[3] != ins or other[4] != outs:
            print(f"event {eid} ({op}, step {step}) ran before {target_text} and differs")
            return 1
    print(f"ok: {t_op} (event {target_text}) has equal inputs and different outputs; "
          f"{earlier} earlier events are bitwise equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
