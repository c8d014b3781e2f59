# A small program for tests/replay: knobs changed between ops. A full sum
# over 2 intra-op threads, then over 1 (torch.set_num_threads(1) mid-run: the
# manifest's end value is 1); a conv2d inside
# torch.backends.mkldnn.flags(enabled=False), then one with oneDNN on again
# (the manifest says on at both ends). Each pair gets other bits from the
# same inputs; opguard records the knobs per op, and replay runs each op
# under its own.
import warnings

import torch

warnings.filterwarnings("ignore")
torch.manual_seed(0)
x = torch.randn(1 << 20)
torch.set_num_threads(2)
two = x.sum()
torch.set_num_threads(1)
one = x.sum()
image = torch.randn(16, 3, 16, 16)
weight = torch.randn(8, 3, 3, 3)
with torch.backends.mkldnn.flags(enabled=False):
    plain = torch.nn.functional.conv2d(image, weight)
onednn = torch.nn.functional.conv2d(image, weight)
print(bool(torch.equal(two, one)), bool(torch.equal(plain, onednn)))
