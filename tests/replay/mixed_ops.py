# A small program for tests/replay: ops whose replay needs more than their
# tensor inputs. Under torch.autocast (bf16 on the CPU) a linear or matmul
# receives float32 tensors and casts them inside the op, so replay must run it
# under the same autocast; a Python number passed where the schema takes a
# tensor is a wrapped 0-dim tensor that type promotion treats as a scalar
# (0-dim float32 + 1e-6 stays float32; an int tensor * 0.5 is float32, not
# float64; x * 0.1 multiplies by the double 0.1 under dtype=fp64);
# scaled_dot_product_attention with dropout draws from the default generator
# although it has no generator argument. tests/cli/repro_e2e_test.cpp bundles
# the linear (tp=2) and x * 0.1 (dtype=fp64).
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(4, 8, 64)
w = torch.randn(96, 64)
q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = torch.nn.functional.linear(x, w)
    z = torch.matmul(y, y.transpose(1, 2))
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True)
    # Autocast runs cross_entropy in float32: a float32 loss from bfloat16 logits.
    p = torch.nn.functional.cross_entropy(y.reshape(-1, 96), torch.arange(32) % 96)
tenth = x * 0.1  # bundled with dtype=fp64: 0.1 stays a double, x is cast
norm = z.float().norm()
scaled = norm + 1e-6
ints = torch.arange(10)
half = ints * 0.5
print(y.dtype, z.dtype, a.dtype, p.dtype, scaled.dtype, half.dtype)

# Training: kernels that choose their path by requires_grad. matmul folds a
# 3-d operand into one mm when the other operand requires grad (whatever the
# grad mode) and otherwise runs this non-contiguous one as a bmm, whose
# small-matrix kernel (ATen's own loop) sums in another order than MKL's mm
# (a matrix-vector product here: it differs on Intel and AMD CPUs, with or
# without MKL_CBWR; a 4 x 5 weight differed on Intel only); an op writes a computed tensor in
# place under grad mode (replay must not rebuild it as a leaf, which cannot
# be written so, nor as a view, which detach_ refuses); an update writes a
# parameter under no_grad.
w3 = torch.randn(8, 1, requires_grad=True)
x3 = torch.randn(17, 8, 8, requires_grad=True).tanh().transpose(0, 1)  # computed, not a leaf
h3 = torch.matmul(x3, w3)
h3 = h3 * 2
h3.relu_()
cut = torch.tanh(h3)
cut.detach_()
left = torch.matmul(w3.t(), torch.randn(8, 8, 17))
h3.sum().backward()
left.sum().backward()
with torch.no_grad():
    frozen = torch.matmul(x3, w3)
    w3.add_(w3.grad, alpha=-0.1)
print(h3.dtype, frozen.dtype)

# Under torch.set_default_dtype(torch.float64) factory ops without a dtype
# and an int tensor * 0.25 give float64: replay must run them under it.
# tests/cli/repro_e2e_test.cpp bundles the linspace (cpu_capability=default:
# its vectorised kernel rounds otherwise).
torch.set_default_dtype(torch.float64)
r64 = torch.randn(8)
z64 = torch.zeros(3)
q64 = torch.arange(6) * 0.25
l64 = torch.linspace(0.1, 7.3, 10007)
torch.set_default_dtype(torch.float32)
print(r64.dtype, z64.dtype, q64.dtype)

# Optimizer ops: foreach ops take a Scalar[] (per-parameter step sizes, ints
# kept as ints), and fused AdamW without amsgrad writes an empty Tensor[]
# (max_exp_avg_sqs) that replay must return as a tensor list. Last: the
# optimizer step ends step 0, which tests/cli/repro_e2e_test.cpp reads.
params = [torch.randn(5, 3), torch.randn(7)]
torch._foreach_addcdiv_(params, [torch.randn(5, 3), torch.randn(7)], [torch.rand(5, 3) + 1, torch.rand(7) + 1],
                        [0.1, 0.25])
torch._foreach_mul_(params, [2, 3])
wp = torch.nn.Parameter(torch.randn(6, 4))
wp.grad = torch.randn(6, 4)
torch.optim.AdamW([wp], lr=0.01, fused=True).step()
