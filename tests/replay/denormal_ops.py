# A small program for tests/replay: with the argument "flush" it calls
# torch.set_flush_denormal(True) first, and the product of two float32 numbers
# of 1e-20 (1e-40, below float32's smallest normal 1.2e-38) is flushed to zero
# instead of the denormal it is otherwise. The recording's manifest says so
# (flush_denormal), and replay runs the op with denormals flushed again.
import sys

import torch

if len(sys.argv) > 1 and sys.argv[1] == "flush":
    if not torch.set_flush_denormal(True):
        sys.exit("this CPU cannot flush denormals")
x = torch.full((64,), 1e-20)
y = torch.full((64,), 1e-20)
z = x * y
print(int((z == 0).sum()))
