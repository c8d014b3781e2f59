"""The usual hand-written alternative to opguard record, for the benchmark:
a TorchDispatchMode that torch.save()s every op's outputs.

    python dispatch_mode_baseline.py OUTDIR tiny_gpt.py [its args...]

runs the training script with the mode active (it must be importable and
have main(argv)), writing one file per op call into OUTDIR.
"""

import os
import runpy
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class SaveOutputs(TorchDispatchMode):
    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = out_dir
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t.detach() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        torch.save(tensors, os.path.join(self.out_dir, "%08d.pt" % self.count))
        self.count += 1
        return out


def main():
    out_dir, script, *argv = sys.argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    sys.argv = [script] + argv
    with SaveOutputs(out_dir):
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
