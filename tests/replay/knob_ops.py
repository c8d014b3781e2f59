# A small program for tests/replay: ops whose bits depend on a knob of
# PLATFORM.md's table, measured with torch 2.11 here (softmax: the CPU
# capability, default vs avx2/avx512; a full sum of 16M floats: the thread
# count, 1 vs 2), and ops those knobs leave alone (mm: MKL's kernels, not
# ATen's; a row sum; exp). Inputs come from arange and exact arithmetic, so
# they are the same bits under every CPU capability (randn is not).
import torch

torch.set_num_threads(2)
n = 1 << 24
x = torch.arange(n, dtype=torch.float32) / n * 10.0 - 5.0
small = x[: 1 << 20].contiguous()
e = torch.exp(small)
s = torch.softmax(small.view(1024, -1), dim=1)
a = small.view(1024, -1)[:, :256].contiguous()
m = torch.mm(a, a.t())
total = x.sum()
rows = small.view(1024, -1).sum(dim=1)
# Random ops replay from the recorded default-generator state.
torch.manual_seed(1234)
noise = torch.randn(4096)
dropped = torch.nn.functional.dropout(small[:4096], 0.5, training=True)
