# A small program for tests/replay: with the argument "flush" it calls
# torch.set_flush_denormal(True) first, and the product of two float32 numbers
# of 1e-20 (1e-40, below float32's smallest normal 1.2e-38) is flushed to zero
# instead of the denormal it is otherwise. The recording's manifest says so
# (flush_denormal), and replay runs the op with denormals flushed again.
# With "big" the tensors have 2**20 elements and torch two intra-op threads:
# the product is computed in two chunks, one on a worker thread (whose MXCSR
# is its own).
# With "late" (and "flush") the program starts the intra-op worker by a
# parallel op before it sets the flag: the worker keeps flushing nothing, and
# only the main thread's chunk of the product is flushed (flush_denormal=main).
# With "cleared" it sets the flag, starts the worker, then clears the flag:
# only the worker's chunk is flushed (flush_denormal=workers).
import sys

import torch

args = sys.argv[1:]
big = "big" in args


def start_workers():
    torch.ones(1 << 20).sum()  # parallel: the intra-op workers start with this thread's MXCSR


def flush_denormals():
    if not torch.set_flush_denormal(True):
        sys.exit("this CPU cannot flush denormals")


if big:
    torch.set_num_threads(2)
if "late" in args:
    start_workers()
if "flush" in args or "cleared" in args:
    flush_denormals()
if "cleared" in args:
    start_workers()
    torch.set_flush_denormal(False)
n = 1 << 20 if big else 64
x = torch.full((n,), 1e-20)
y = torch.full((n,), 1e-20)
z = x * y
print(int((z == 0).sum()))
