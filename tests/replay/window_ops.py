# A small program for the free-running window, alias and bisect-window tests
# (tests/replay/replay_test.cpp): a chain whose only config-dependent op is
# softmax (its bits depend on the CPU capability, default vs avx2/avx512,
# like knob_ops.py), followed by ops that read its result, one of them in
# place through a view; then an in-place op whose three arguments are one
# tensor (addmm_ gives other bits when they do not share memory).
import torch

torch.set_num_threads(2)
x = torch.arange(1 << 20, dtype=torch.float32) / (1 << 20) * 10.0 - 5.0
a = x.view(1024, -1)
s = torch.softmax(a, dim=1)
t = s * 3.0
w = t.clone()
w[:, 0].mul_(2.0)
r = w.sum(dim=1)
q = torch.arange(16, dtype=torch.float32).view(4, 4) / 7
q.addmm_(q, q)
