# A small program for tests/replay: knobs changed between ops. A full sum
# over 2 intra-op threads, then over 1 (torch.set_num_threads(1) mid-run: the
# manifest's end value is 1); a conv2d inside
# torch.backends.mkldnn.flags(enabled=False), then one with oneDNN on again
# (the manifest says on at both ends). Each pair gets other bits from the
# same inputs; opguard records the knobs per op, and replay runs each op
# under its own. Last, the CUDA knobs changed through PyTorch 2.9's
# per-backend API (torch.backends.cuda.matmul.fp32_precision: libtorch's
# float32MatmulPrecision() throws from then on) and an mm: no effect on the
# CPU, but opguard records them per op and exits cleanly.
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
torch.backends.cuda.matmul.fp32_precision = "tf32"
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
square = torch.mm(weight.flatten(1), weight.flatten(1).t())
print(bool(torch.equal(two, one)), bool(torch.equal(plain, onednn)), square.shape)
