# A small program for tests/replay and the bisect test: causal attention with
# torch's scaled_dot_product_attention, which picks its kernel among the
# backends the program leaves enabled, on the CPU too (flash or math). With
# the argument "math" it runs under torch.nn.attention.sdpa_kernel(MATH), as a
# program does to compare against the reference kernel, and the outputs
# differ in their last bits; nothing in the environment or the arguments of
# the op shows it: opguard records the backends of every op.
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 32) for _ in range(3))
if len(sys.argv) > 1 and sys.argv[1] == "math":
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
else:
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
print(float(out.sum()))
