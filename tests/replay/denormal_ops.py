# A small program for tests/replay: with the argument "flush" it calls
# torch.set_flush_denormal(True) first, and the product of two float32 numbers
# of 1e-20 (1e-40, below float32's smallest normal 1.2e-38) is flushed to zero
# instead of the denormal it is otherwise. The recording's manifest says so
# (flush_denormal), and replay runs the op with denormals flushed again.
# With "big" the tensors have 2**20 elements and torch two intra-op threads:
# the product is computed in two chunks, one on a worker thread (whose MXCSR
# is its own).
import sys

import torch

big = "big" in sys.argv[1:]
if big:
    torch.set_num_threads(2)
if "flush" in sys.argv[1:]:
    if not torch.set_flush_denormal(True):
        sys.exit("this CPU cannot flush denormals")
n = 1 << 20 if big else 64
x = torch.full((n,), 1e-20)
y = torch.full((n,), 1e-20)
z = x * y
print(int((z == 0).sum()))
