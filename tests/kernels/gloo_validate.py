#!/usr/bin/env python3
"""A real distributed run to validate kernels/decompose against (docs/KERNELS.md).

WORLD processes on this machine (torch.multiprocessing, c10d with the Gloo
backend over a FileStore) each compute
  - a tensor-parallel partial matmul: A[:, shard] @ B[shard, :], the reduction
    dimension K cut like torch.tensor_split (kernels::shard_of),
  - a data-parallel weight gradient over its micro-batch of rows:
    dY[rows]^T @ X[rows],
  - raw partials of several sizes and dtypes (float32, float64, bfloat16),
then all_reduce(SUM) each; and, in one process, a weight gradient accumulated
over WORLD micro-batches by autograd (the reference for reduce=sequential). Every rank writes its partial (before) and the
reduced result (after) as raw little-endian bytes, plus cases.json describing
them, into --out. tests/kernels/gloo_validate_test.cpp feeds the partials to
kernels::reduce_partials and compares with the reduced bits.

Usage: gloo_validate.py --out DIR --world 2 [--world 4]
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Sizes chosen to exercise Gloo's segmentation: numel not divisible by the
# world size, smaller than the world size, and several MiB (many segments).
RAW_CASES = [
    ("raw_f32_small", torch.float32, 7),
    ("raw_f32_odd", torch.float32, 1001),
    ("raw_f32_big", torch.float32, 1 << 20),
    ("raw_f32_segmented", torch.float32, 3000001),  # 12 MB: more than 2 segments of 1 MiB per rank
    ("raw_f64_odd", torch.float64, 1001),
    ("raw_bf16_odd", torch.bfloat16, 1001),
    ("raw_bf16_big", torch.bfloat16, 300000),
]
M, K, N = 24, 96, 40          # tensor-parallel matmul
BATCH, IN, OUT = 64, 48, 32   # data-parallel weight gradient


def shard(n, parts, i):
    base, extra = divmod(n, parts)
    begin = i * base + min(i, extra)
    return begin, begin + base + (1 if i < extra else 0)


def partial_values(numel, dtype, rank):
    # Values of both signs over a few binades, so that most elements round
    # differently under different summation orders.
    g = torch.Generator().manual_seed(1000 + rank)
    mant = torch.rand(numel, generator=g, dtype=torch.float64) * 2 - 1
    expo = torch.randint(-3, 4, (numel,), generator=g).to(torch.float64)
    return (mant * torch.pow(2.0, expo)).to(dtype)


def write(path, t):
    t = t.contiguous()
    with open(path, "wb") as f:
        f.write(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def worker(rank, world, out, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    cases = []

    def reduce_case(name, partial, extra):
        write(os.path.join(out, f"{name}_w{world}_r{rank}_partial.bin"), partial)
        reduced = partial.clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        write(os.path.join(out, f"{name}_w{world}_r{rank}_reduced.bin"), reduced)
        cases.append(dict(name=name, world=world, dtype=str(partial.dtype).replace("torch.", ""),
                          numel=partial.numel(), order="ring", **extra))

    for name, dtype, numel in RAW_CASES:
        reduce_case(name, partial_values(numel, dtype, rank), {})

    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g)
    b = torch.randn(K, N, generator=g)
    kb, ke = shard(K, world, rank)
    # The rank's own contiguous shards, as a tensor-parallel rank holds them.
    part = torch.mm(a[:, kb:ke].contiguous(), b[kb:ke, :].contiguous())
    # What replay computes on one device: the op on views of the full tensors.
    view_part = torch.mm(a[:, kb:ke], b[kb:ke, :])
    reduce_case("tp_mm", part, dict(m=M, k=K, n=N, view_partial_equal=bool(torch.equal(part, view_part))))

    x = torch.randn(BATCH, IN, generator=g)
    dy = torch.randn(BATCH, OUT, generator=g)
    rb, re_ = shard(BATCH, world, rank)
    grad = torch.mm(dy[rb:re_].t(), x[rb:re_])
    view_grad = torch.mm(dy.t()[:, rb:re_], x[rb:re_, :])
    reduce_case("dp_weight_grad", grad, dict(batch=BATCH, inp=IN, out=OUT,
                                             view_partial_equal=bool(torch.equal(grad, view_grad))))
    if rank == 0:
        with open(os.path.join(out, f"cases_w{world}.json"), "w") as f:
            json.dump(dict(world=world, torch=torch.__version__, cases=cases), f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def accumulation(world, out):
    """Gradient accumulation in one process, the reference for reduce=sequential:
    WORLD micro-batches through a bias-free Linear, backward after each, so that
    autograd accumulates the weight gradient; each micro-batch's own gradient
    (torch.autograd.grad on the same graph) is written as a partial."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    lin = torch.nn.Linear(IN, OUT, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(OUT, IN, generator=g))
    x = torch.randn(BATCH, IN, generator=g)
    dy = torch.randn(BATCH, OUT, generator=g)
    for mb in range(world):
        rb, re_ = shard(BATCH, world, mb)
        (grad,) = torch.autograd.grad((lin(x[rb:re_]) * dy[rb:re_]).sum(), lin.weight)
        write(os.path.join(out, f"accum_weight_grad_w{world}_r{mb}_partial.bin"), grad)
    for mb in range(world):
        rb, re_ = shard(BATCH, world, mb)
        (lin(x[rb:re_]) * dy[rb:re_]).sum().backward()
    for mb in range(world):
        write(os.path.join(out, f"accum_weight_grad_w{world}_r{mb}_reduced.bin"), lin.weight.grad)
    return dict(name="accum_weight_grad", world=world, dtype="float32", numel=OUT * IN, order="sequential")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, action="append", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for world in args.world:
        store = os.path.join(os.path.abspath(args.out), f"store_w{world}")
        if os.path.exists(store):
            os.remove(store)
        mp.start_processes(worker, args=(world, os.path.abspath(args.out), store), nprocs=world, join=True,
                           start_method="spawn")
        path = os.path.join(args.out, f"cases_w{world}.json")
        with open(path) as f:
            meta = json.load(f)
        meta["cases"].append(accumulation(world, os.path.abspath(args.out)))
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)
        print(f"gloo_validate: world {world} done", file=sys.stderr)


if __name__ == "__main__":
    main()
