# A small program for the parallelism knobs (tests/replay/parallel_test.cpp):
# matmul-like ops whose reduction dimension tp=P splits, a backward pass whose
# weight gradient (an mm of a transposed matrix) and bias gradient (a sum over
# dim 0) microbatches=M splits, and ops neither knob applies to (relu, an
# fp16 mm). Random inputs are fine: replay reads the recorded bits.
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
a = torch.randn(32, 256)
b = torch.randn(256, 48)
bias = torch.randn(48)
m = torch.mm(a, b)
am = torch.addmm(bias, a, b)
mt = torch.matmul(torch.randn(4, 8, 256), b)
bm = torch.bmm(torch.randn(4, 16, 128), torch.randn(4, 128, 8))
r = torch.relu(a)
h = torch.mm(a[:, :64].half(), b[:64].half())
lin = torch.nn.Linear(256, 48)
x = torch.randn(64, 256)
loss = (lin(x) * torch.randn(64, 48)).sum()
loss.backward()
