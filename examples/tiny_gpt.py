"""tiny_gpt: a small decoder-only GPT trained on a character corpus, in PyTorch.

examples/tiny_gpt.cpp is the same model and training in the libtorch C++
frontend; both are the real training programs that opguard records and diffs.
This file contains no opguard code: the recorder gives its modules scopes
(blocks.1.attn.proj, blocks.0.mlp.fc, wte, ln_f, head, loss, ...) through
global module hooks, so the module attribute names below are the scope names
and match the C++ program's register_module names.

Under a fixed configuration (flags, threads, dtype, CPU capability) every run
computes the same bits: batches come from a fixed integer LCG, not torch's RNG,
and initialisation and dropout draw from torch's generator seeded by --seed.

Step times measured here (2 shared cores, 2 intra-op threads, AVX-512 capability,
float32, mean of steps 1..N-1; step 0 is slower):
  defaults (--width 64 --depth 2 --heads 4 --seq 32 --batch 8)       ~6-7 ms
  --width 128 --depth 4 --seq 64 --batch 16                          ~65-80 ms
  --width 256 --depth 4 --seq 128 --batch 16                         ~400-460 ms
stderr's last line reports them for any configuration. Starting Python and
importing torch adds about 3 s to every run.

stdout carries only the result lines (one per printed step, then the final
loss), so that two runs can be compared with cmp; diagnostics go to stderr.

Two numerics knobs for opguard's demos and tests: --mkldnn off turns oneDNN
off (it changes aten::gelu's bits here), and --tp P computes the MLP's
down-projection as a P-way row-parallel linear, emulated in one process
(RowParallelLinear; record such a run with `opguard record --declare tp=P`).

--attention sdpa computes attention with F.scaled_dot_product_attention
(is_causal, its own dropout), as most current models do: on the CPU, torch
runs its flash-attention kernels then (the math backend where those do not
apply). The default, manual, spells it out: matmul, masked_fill, softmax,
dropout, matmul.

--ddp trains data-parallel over torch.distributed with Gloo, one process per
rank, ranks from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
torchrun sets them):
  torchrun --standalone --nproc_per_node 2 examples/tiny_gpt.py --ddp
Every rank draws the same global batch of --batch rows and trains on its
shard (rows rank*B/W .. (rank+1)*B/W); gradients are summed with
dist.all_reduce, one call per parameter, then divided by the world size, and
every rank takes the same optimizer step. Only rank 0 prints the result lines
(the loss all-reduced over the ranks); --out-params is written by rank 0.
"""

import argparse
import gc
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
MASK64 = (1 << 64) - 1


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a tiny GPT on a character corpus.")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: leave torch's)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tied", action="store_true", help="tie the head to the token embedding")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--out-params", default="")
    p.add_argument("--print-every", type=int, default=1, help="<= 0: only the final line")
    p.add_argument("--attention", choices=("manual", "sdpa"), default="manual",
                   help="attention spelled out (manual) or F.scaled_dot_product_attention (sdpa)")
    p.add_argument("--mkldnn", choices=("on", "off"), default="on",
                   help="oneDNN (torch.backends.mkldnn.enabled)")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N (parameters are drawn on the CPU, then moved)")
    p.add_argument("--tp", type=int, default=1,
                   help="> 1: the MLP down-projection as a P-way row-parallel linear (RowParallelLinear)")
    p.add_argument("--compile", action="store_true",
                   help="compile each block with torch.compile (inductor), in place (nn.Module.compile)")
    p.add_argument("--ddp", action="store_true",
                   help="data-parallel over torch.distributed (Gloo), ranks from RANK/WORLD_SIZE")
    a = p.parse_args(argv)
    for name in ("steps", "width", "depth", "heads", "seq", "batch", "tp"):
        if getattr(a, name) < 1:
            p.error(f"--{name} wants an integer >= 1")
    if a.threads < 0 or a.seed < 0:
        p.error("--threads and --seed want integers >= 0")
    if not 0.0 <= a.dropout <= 0.999:
        p.error("--dropout wants a number in [0, 0.999]")
    if not (0.0 <= a.lr <= 10.0 and 0.0 <= a.weight_decay <= 10.0):
        p.error("--lr and --weight-decay want numbers in [0, 10]")
    if a.width % a.heads != 0:
        p.error(f"--width ({a.width}) must be a multiple of --heads ({a.heads})")
    if a.tp > 4 * a.width:
        p.error(f"--tp ({a.tp}) exceeds the MLP's 4 x --width features")
    return a


def load_corpus(path):
    """Tokens of the corpus; the vocabulary is its sorted distinct bytes."""
    with open(path, "rb") as f:
        data = f.read()
    index = {b: i for i, b in enumerate(sorted(set(data)))}
    return [index[b] for b in data], len(index)


class BatchSampler:
    """The LCG of tiny_gpt.cpp, not torch's RNG: the data does not depend on the
    CPU capability, and both programs draw the same windows."""

    def __init__(self, seed):
        self.state = (seed + 0x9E3779B97F4A7C15) & MASK64

    def _draw(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & MASK64
        return self.state >> 33

    def next(self, tokens, batch, seq):
        n_offsets = len(tokens) - seq
        inputs, targets = [], []
        for _ in range(batch):
            offset = self._draw() % n_offsets
            inputs.extend(tokens[offset:offset + seq])
            targets.extend(tokens[offset + 1:offset + seq + 1])
        return inputs, targets


def maybe_dropout(x, p, training):
    # Skipped entirely at p = 0 (both programs) so that the default op stream has no random ops.
    return F.dropout(x, p, training) if p > 0.0 else x


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, seq, dropout, sdpa=False):
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.heads = heads
        self.dropout = dropout
        self.sdpa = sdpa
        # A plain attribute, not a buffer, as in the C++ program.
        self.mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.heads
        q = self.q(x).view(B, T, self.heads, D).transpose(1, 2)
        k = self.k(x).view(B, T, self.heads, D).transpose(1, 2)
        v = self.v(x).view(B, T, self.heads, D).transpose(1, 2)
        if self.sdpa:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(self.mask, float("-inf"))
            att = torch.softmax(att, -1)
            att = maybe_dropout(att, self.dropout, self.training)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return maybe_dropout(self.proj(y), self.dropout, self.training)


class RowParallelLinear(nn.Linear):
    """A P-way tensor-parallel run computes a row-parallel linear (Megatron's
    RowParallelLinear: the MLP's down-projection) as P partial products over
    shards of the input features, all-reduced, plus the bias once. This emulates
    it in one process: shards as torch.tensor_split cuts them, partials summed
    in rank order ((p0 + p1) + p2) + ..., which for P = 2 is also what a ring
    all-reduce gives (a + b == b + a in IEEE arithmetic). opguard's replay knobs
    tp=P,reduce=sequential compute the same decomposition of the unsplit op.
    tiny_gpt.cpp's row_parallel_linear is the same."""

    def __init__(self, in_features, out_features, tp):
        super().__init__(in_features, out_features)
        self.tp = tp

    def forward(self, x):
        if self.tp <= 1:
            return super().forward(x)
        xs = torch.tensor_split(x, self.tp, -1)
        ws = torch.tensor_split(self.weight, self.tp, 1)
        total = F.linear(xs[0], ws[0])
        for r in range(1, self.tp):
            total = total + F.linear(xs[r], ws[r])
        return total + self.bias


class Mlp(nn.Module):
    def __init__(self, width, dropout, tp):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = RowParallelLinear(4 * width, width, tp)
        self.dropout = dropout

    def forward(self, x):
        return maybe_dropout(self.proj(F.gelu(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, width, heads, seq, dropout, tp, sdpa=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, seq, dropout, sdpa)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = Mlp(width, dropout, tp)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab_size, width, depth, heads, seq, tied, dropout, tp=1, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, seq, dropout, tp, sdpa) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        if tied:
            # named_parameters() then lists the shared weight once, as wte.weight.
            self.head.weight = self.wte.weight
        self.loss = nn.CrossEntropyLoss()
        self.dropout = dropout

    def forward(self, idx, targets):
        """Mean cross-entropy of predicting targets from idx (both batch x seq)."""
        T = idx.size(1)
        tok = self.wte(idx)
        # The device only off the CPU: the CPU op stream stays as it was recorded before --device.
        pos = (torch.arange(T, dtype=torch.long) if idx.is_cpu
               else torch.arange(T, dtype=torch.long, device=idx.device))
        x = maybe_dropout(tok + self.wpe(pos), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return self.loss(logits.view(-1, logits.size(-1)), targets.view(-1))


@torch.no_grad()
def init_parameters(model):
    """GPT-2 style: biases 0, LayerNorm gains 1, other weights N(0, 0.02), drawn in
    named_parameters() order from torch's generator (in float32, before the cast)."""
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)


def write_parameters(model, path):
    with open(path, "wb") as f:
        for p in model.parameters():
            t = p.detach() if p.is_cpu else p.detach().cpu()
            f.write(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def float_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


class DataParallel:
    """The --ddp mode: this process's rank and world, the shard of a batch it
    trains on, and the gradient all-reduce. rank 0 of 1 without --ddp."""

    def __init__(self, enabled, batch):
        self.rank, self.world = 0, 1
        self.dist = None
        if not enabled:
            return
        import torch.distributed as dist

        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name):
                raise SystemExit(f"tiny_gpt.py: --ddp needs {name} in the environment: launch it with "
                                 "torchrun --standalone --nproc_per_node N examples/tiny_gpt.py --ddp")
        dist.init_process_group("gloo")
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if batch % self.world != 0:
            raise SystemExit(f"tiny_gpt.py: --batch ({batch}) must be a multiple of the world size ({self.world})")

    def shard(self, rows, batch, seq):
        """This rank's rows of a global batch given as a flat list of batch*seq tokens."""
        per_rank = batch // self.world
        return rows[self.rank * per_rank * seq:(self.rank + 1) * per_rank * seq], per_rank

    @torch.no_grad()
    def average_gradients(self, model):
        if self.dist is None:
            return
        for p in model.parameters():
            if p.grad is not None:
                self.dist.all_reduce(p.grad)
                p.grad.div_(self.world)

    @torch.no_grad()
    def mean_loss(self, loss_value):
        if self.dist is None:
            return loss_value
        t = torch.tensor([loss_value], dtype=torch.float32)
        self.dist.all_reduce(t)
        return (t / self.world).item()

    def close(self):
        # Gloo's worker threads must be gone before the interpreter finalises:
        # one that drops the last reference to a finished collective's tensors
        # then takes the GIL and aborts the process ("terminate called without
        # an active exception", the teardown race of pytorch/pytorch#179291).
        # The barrier puts every rank past its last collective; destroying the
        # group, and collecting what still refers to it, joins the threads.
        if self.dist is not None:
            self.dist.barrier()
            self.dist.destroy_process_group()
            gc.collect()


def main(argv):
    a = parse_args(argv)
    ddp = DataParallel(a.ddp, a.batch)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    try:
        tokens, vocab_size = load_corpus(a.corpus)
    except OSError as e:
        print(f"tiny_gpt.py: cannot read the corpus '{a.corpus}': {e.strerror}: pass --corpus PATH",
              file=sys.stderr)
        return 2
    if len(tokens) < a.seq + 2:
        print(f"tiny_gpt.py: the corpus '{a.corpus}' is shorter than --seq + 2 characters", file=sys.stderr)
        return 2
    torch.backends.mkldnn.enabled = a.mkldnn == "on"
    model = Gpt(vocab_size, a.width, a.depth, a.heads, a.seq, a.tied, a.dropout, a.tp, a.attention == "sdpa")
    init_parameters(model)
    model.to(DTYPES[a.dtype])
    try:
        device = torch.device(a.device)
    except RuntimeError:
        print(f"tiny_gpt.py: --device wants cpu or cuda[:N], got '{a.device}'", file=sys.stderr)
        return 2
    if device.type != "cpu":
        if device.type != "cuda" or not torch.cuda.is_available():
            print(f"tiny_gpt.py: --device {a.device}: torch sees no such device", file=sys.stderr)
            return 2
        model.to(device)
        for block in model.blocks:
            block.attn.mask = block.attn.mask.to(device)
    if a.compile:
        for block in model.blocks:
            block.compile()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny_gpt.py: vocab {vocab_size}, {n_params} parameters, dtype {a.dtype}, "
          f"{torch.get_num_threads()} threads" + (f", rank {ddp.rank} of {ddp.world}" if a.ddp else ""),
          file=sys.stderr)
    printing = ddp.rank == 0

    sampler = BatchSampler(a.seed)
    last_bits = 0
    first_ms = rest_ms = 0.0
    for step in range(a.steps):
        start = time.perf_counter()
        inputs, targets = sampler.next(tokens, a.batch, a.seq)
        inputs, rows = ddp.shard(inputs, a.batch, a.seq)
        targets, _ = ddp.shard(targets, a.batch, a.seq)
        x = torch.tensor(inputs, dtype=torch.long).view(rows, a.seq)
        y = torch.tensor(targets, dtype=torch.long).view(rows, a.seq)
        if device.type != "cpu":
            x, y = x.to(device), y.to(device)
        loss = model(x, y)
        # Read every step, printed or not, so that --print-every does not change the op stream.
        loss_value = loss.detach().to(torch.float32).item()
        loss.backward()
        ddp.average_gradients(model)
        loss_value = ddp.mean_loss(loss_value)
        optimizer.step()
        optimizer.zero_grad()
        ms = (time.perf_counter() - start) * 1e3
        if step == 0:
            first_ms = ms
        else:
            rest_ms += ms
        last_bits = float_bits(loss_value)
        if printing and a.print_every > 0 and step % a.print_every == 0:
            print("step %d loss %.6f bits %08x" % (step, loss_value, last_bits), flush=True)
    if printing:
        print("final loss bits %08x" % last_bits, flush=True)
    mean = rest_ms / (a.steps - 1) if a.steps > 1 else 0.0
    print(f"tiny_gpt.py: step 0 {first_ms:.1f} ms, steps 1..{a.steps - 1} mean {mean:.1f} ms", file=sys.stderr)
    if a.out_params and printing:
        write_parameters(model, a.out_params)
    ddp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
