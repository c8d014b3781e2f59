// The bundle's programs as text (docs/BUNDLE.md). Kept in one file so that
// the generator in repro.cpp reads as code, not as embedded programs.

#include "repro_templates.h"

namespace opguard::bisect::templates {

const char* const kReproPy = R"TPL(#!/usr/bin/env python3
"""@@TITLE@@

Standalone reproducer written by `opguard repro` (needs only torch and h5py).
Runs the operator once under each config, each in a fresh child process with
the config's environment set (process-wide knobs such as ATEN_CPU_CAPABILITY
are read once at start-up), and compares the outputs bit for bit.

  python3 repro.py            exit 0: the divergence reproduced (good and bad bits differ)
                              exit 1: it did not (identical bits)
  python3 repro.py --strict   exit 0 only if, in addition, each config gives exactly the
                              bits in expected_good.h5 / expected_bad.h5 (same machine and
                              library as the bundle's manifest); exit 1 otherwise
  exit 2: the bundle could not be run (missing file, operator unknown to this torch,
          a knob that did not take)
"""
import argparse
import contextlib
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OP = "@@OP@@"
# The dtype of the CPU autocast (torch.autocast) the op ran under, or None.
AUTOCAST = @@AUTOCAST@@
# Whether grad mode was on when the op ran (with inputs that require grad,
# some kernels choose their path by it).
GRAD_MODE = @@GRAD_MODE@@
# torch.get_default_dtype() when the op ran (factory ops without a dtype, an
# int tensor * 0.5 give their results in it), or None: not recorded.
DEFAULT_DTYPE = @@DEFAULT_DTYPE@@
# The scaled_dot_product_attention backends enabled when the op ran ("all",
# "math", "math+flash", ...); a config's sdpa_backend replaces them.
SDPA_BACKEND = @@SDPA_BACKEND@@
# Effective configs: knob -> value, as `opguard configs` names them.
CONFIGS = @@CONFIGS@@
RECORDED_ENV = @@RECORDED_ENV@@
# Tensor outputs in the order the op returns them (nested tuples and lists
# flattened): the dataset each one has in expected_<config>.h5.
OUTPUT_DATASETS = @@OUTPUTS@@


def fail(message):
    print("repro: " + message, file=sys.stderr)
    sys.exit(2)


def env_of(config):
    env = {}
    for knob, value in config.items():
        if knob == "cpu_capability":
            env["ATEN_CPU_CAPABILITY"] = value
        elif knob == "blas_threads":
            env["MKL_NUM_THREADS"] = value
            env["OPENBLAS_NUM_THREADS"] = value
        elif knob.startswith("env:"):
            env[knob[4:]] = value
    return env


def apply_in_process(config):
    """Sets the in-process knobs; returns the dtype to cast floating inputs to, or None."""
    cast = None
    for knob, value in config.items():
        if knob == "threads":
            torch.set_num_threads(int(value))
        elif knob == "mkldnn":
            torch.backends.mkldnn.enabled = value == "on"
        elif knob == "deterministic":
            torch.use_deterministic_algorithms(value == "on")
        elif knob == "flush_denormal":
            pass  # after the thread count: set_flush_denormal below
        elif knob == "float32_matmul_precision":
            torch.set_float32_matmul_precision(value)
        elif knob == "dtype":
            cast = getattr(torch, value)
        elif knob == "device":
            if value != "cpu":
                fail("this reproducer runs on the CPU; the config asks for " + value)
        elif knob == "cpu_capability":
            got = torch.backends.cpu.get_cpu_capability().lower()
            if got != value:
                fail("ATEN_CPU_CAPABILITY=%s did not take (torch runs %s)" % (value, got))
        elif knob in ("blas_threads",) or knob.startswith("env:"):
            pass  # the parent set the environment
        elif knob in ("tp", "microbatches", "reduce"):
            pass  # run_op decomposes the call (parallel_call)
        elif knob == "sdpa_backend":
            pass  # run_op enables the backends
        else:
            fail("knob %s is not one this reproducer can set" % knob)
    if "flush_denormal" in config:
        set_flush_denormal(config["flush_denormal"])
    return cast


def set_flush_denormal(value):
    """Flushes denormals (FTZ and DAZ) on the threads `value` names: on (all), off, main (the thread that calls
    the op) or workers (torch's intra-op threads). torch.set_flush_denormal sets the calling thread's only, and
    an intra-op worker keeps what it was created with: the workers are started here, by a parallel op, under
    the setting they are to keep, before this thread's is set."""
    if not torch.set_flush_denormal(value in ("on", "workers")):
        fail("flush_denormal=%s did not take: this CPU cannot flush denormals" % value)
    torch.ones(1 << 20).sum()  # parallel: starts the intra-op workers at the thread count set above
    torch.set_flush_denormal(value in ("on", "main"))


def load(h5, name, grad=""):
    """A tensor dataset as the op saw it: its dtype, sizes, strides and storage offset, and whether it
    required grad: grad "leaf" (as a parameter does), "computed" (autograd computed it, so that an op
    may write it in place under grad mode) or "" (it did not)."""
    ds = h5[name]
    dtype = getattr(torch, ds.attrs["dtype"])
    flat = torch.from_numpy(np.ascontiguousarray(ds[()]).reshape(-1).copy())
    if flat.dtype != dtype:
        flat = flat.view(dtype)  # bfloat16, bool, float8: stored as their raw bits
    sizes = list(ds.shape)
    strides = [int(s) for s in ds.attrs["strides"]]
    offset = int(ds.attrs["storage_offset"])
    if len(strides) != len(sizes):  # no recorded layout: row-major
        strides, offset = [1] * len(sizes), 0
        for d in range(len(sizes) - 2, -1, -1):
            strides[d] = strides[d + 1] * max(sizes[d + 1], 1)
    # A zero-filled storage and the row-major elements scattered into the
    # strided view, as opguard's replay rebuilds them.
    extent = offset + (1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if flat.numel() else 0)
    storage = torch.zeros(extent, dtype=dtype)
    if flat.numel():
        storage[torch.arange(extent).as_strided(sizes, strides, offset).reshape(-1)] = flat
    with torch.enable_grad():
        if grad == "computed":
            storage = storage.requires_grad_().clone()
        x = storage.as_strided(sizes, strides, offset)
        return x.detach().requires_grad_() if grad == "leaf" else x


def generator(h5, name):
    g = torch.Generator()
    g.set_state(load(h5, name).contiguous())
    return g


# --- parallel decompositions: tp=P, microbatches=M, reduce=ORDER -------------------
# The op computed as P partial products over shards of its reduction dimension,
# summed in the order of an all-reduce, exactly as opguard's replay emulates a
# tensor- or data-parallel run on one device (replay/decomposed.cpp,
# kernels/decompose.cpp in opguard).

# The recorded call ran in the backward pass: a matmul of a transposed matrix
# there is a weight gradient, which reduces over the batch (microbatches=M).
BACKWARD = @@BACKWARD@@


def shard_of(n, parts, i):
    """[begin, end) of shard i of n elements in `parts` shards, as torch.tensor_split cuts them."""
    base, extra = divmod(n, parts)
    begin = i * base + min(i, extra)
    return begin, begin + base + (1 if i < extra else 0)


def ring_chunk(numel, element_size, ranks, c, max_segment_bytes=1 << 20):
    """The elements whose sum starts at rank c-1 in Gloo's ring all-reduce (gloo/allreduce.cc)."""
    max_segment = element_size * max(1, max_segment_bytes // element_size)
    segments = max(-(-numel * element_size // max_segment), 2 * ranks)
    segments = -(-segments // ranks) * ranks
    per_rank = segments // ranks
    segment_elems = -(-numel // segments)
    return min(numel, c * per_rank * segment_elems), min(numel, (c + 1) * per_rank * segment_elems)


def reduce_partials(parts, order):
    """The elementwise sum of the partials in an all-reduce order: sequential ((p0 + p1) + p2) + ...;
    tree (p0 + p1) + (p2 + p3); ring: chunk c summed along c-1, c-2, ..., c (mod P)."""
    flat = [p.contiguous().reshape(-1) for p in parts]
    if order == "tree":
        level = flat
        while len(level) > 1:
            nxt = [torch.add(level[j], level[j + 1]) for j in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        out = level[0].clone()
    elif order == "sequential":
        out = flat[0].clone()
        for p in flat[1:]:
            out = torch.add(out, p)
    elif order == "ring":
        out = torch.empty_like(flat[0])
        ranks = len(flat)
        for c in range(ranks):
            begin, end = ring_chunk(out.numel(), out.element_size(), ranks, c)
            chain = [(c - 1 - r) % ranks for r in range(ranks)]
            acc = flat[chain[0]][begin:end].clone()
            for r in chain[1:]:
                acc = torch.add(acc, flat[r][begin:end])
            out[begin:end] = acc
    else:
        fail("reduce=%s is not an order this reproducer knows" % order)
    return out.reshape(parts[0].shape)


def is_transposed_matrix(x):
    return x.dim() == 2 and x.size(0) > 1 and x.stride(0) == 1 and x.stride(1) >= x.size(0)


def parallel_form(args):
    """(batch split?, a, a_dim, b, b_dim, partial, finish) for the ops replay decomposes, else None."""
    if OP in ("aten::mm", "aten::bmm", "aten::matmul"):
        a, b = args[0], args[1]
        fn = {"aten::mm": torch.mm, "aten::bmm": torch.bmm, "aten::matmul": torch.matmul}[OP]
        batch = BACKWARD and OP != "aten::bmm" and is_transposed_matrix(a)
        return batch, a, a.dim() - 1, b, 0 if b.dim() == 1 else b.dim() - 2, fn, lambda s: s
    if OP == "aten::addmm":
        self_, a, b, beta, alpha = args[:5]

        def finish(s):
            scaled = s if alpha == 1 else torch.mul(s, alpha)
            return scaled if beta == 0 else torch.add(scaled, self_, alpha=beta)
        return BACKWARD and is_transposed_matrix(a), a, 1, b, 0, torch.mm, finish
    if OP == "aten::linear":
        x, w, bias = args[0], args[1], args[2] if len(args) > 2 else None
        finish = (lambda s: s) if bias is None else (lambda s: torch.add(s, bias))
        return False, x, x.dim() - 1, w, 1, lambda p, q: torch.nn.functional.linear(p, q), finish
    if OP == "aten::sum.dim_IntList" and BACKWARD:
        x, dims, keepdim, dtype = args[:4]
        if dims and not any(d in (0, -x.dim()) for d in dims):
            return None
        return True, x, 0, None, 0, lambda p, _: torch.sum(p, dims if dims else None, keepdim, dtype=dtype), lambda s: s
    return None


def parallel_call(args, config):
    """The op's result under tp / microbatches, or None where replay runs it as recorded."""
    tp, microbatches = int(config.get("tp", "0")), int(config.get("microbatches", "0"))
    if not tp and not microbatches:
        return None
    form = parallel_form(args)
    if form is None:
        return None
    batch, a, a_dim, b, b_dim, partial, finish = form
    parts = microbatches if batch else tp
    if parts <= 1:
        return None
    k = a.size(a_dim)
    if (b is not None and b.size(b_dim) != k) or k < parts:
        return None
    partials = []
    for r in range(parts):
        begin, end = shard_of(k, parts, r)
        pb = b.narrow(b_dim, begin, end - begin) if b is not None else None
        partials.append(partial(a.narrow(a_dim, begin, end - begin), pb).contiguous())
    if partials[0].dtype not in (torch.float32, torch.float64, torch.bfloat16):
        return None
    return finish(reduce_partials(partials, config.get("reduce", "sequential" if batch else "ring")))


def set_sdpa_backends(text):
    """Enables the scaled_dot_product_attention backends `text` names ("all", "none", "math+flash"), no other."""
    on = {"math", "flash", "efficient", "cudnn"} if text == "all" else set(text.split("+"))
    torch.backends.cuda.enable_math_sdp("math" in on)
    torch.backends.cuda.enable_flash_sdp("flash" in on)
    torch.backends.cuda.enable_mem_efficient_sdp("efficient" in on)
    torch.backends.cuda.enable_cudnn_sdp("cudnn" in on)


def run_op(config, cast):
    set_sdpa_backends(config.get("sdpa_backend", SDPA_BACKEND))
    if DEFAULT_DTYPE:
        torch.set_default_dtype(getattr(torch, DEFAULT_DTYPE))
    with h5py.File(os.path.join(HERE, "inputs.h5"), "r") as h5:
        def t(name, grad=""):
            x = load(h5, name, grad)
            return x.to(cast) if cast is not None and x.is_floating_point() else x

@@ARGS@@
        autocast = torch.autocast("cpu", dtype=getattr(torch, AUTOCAST)) if AUTOCAST else contextlib.nullcontext()
        with torch.set_grad_enabled(GRAD_MODE), autocast:
            result = parallel_call([@@ARG_LIST@@], config)
            if result is None:
                result = @@CALL@@
    # Then what the op writes and does not return, as it left it (opguard
    # records those after the op as outputs).
    result = [result, [@@WRITTEN@@]]
    flat = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            flat.append(v)
        elif isinstance(v, (tuple, list)):
            for e in v:
                walk(e)

    walk(result)
    return flat


def child(which, out_path):
    config = CONFIGS[which]
    cast = apply_in_process(config)
    try:
        outputs = run_op(config, cast)
    except Exception as e:  # the op failing under a config is the bundle not running
        fail("%s failed under the %s config: %s" % (OP, which, str(e).splitlines()[0]))
    expected_dtypes = []
    with h5py.File(os.path.join(HERE, "expected_%s.h5" % which), "r") as h5:
        expected_dtypes = [getattr(torch, h5[name].attrs["dtype"]) for name in OUTPUT_DATASETS]
    if cast is not None:
        outputs = [o.to(d) if o.is_floating_point() else o for o, d in zip(outputs, expected_dtypes)]
    torch.save([o.detach().contiguous().clone() for o in outputs], out_path)


def bits(t):
    """The tensor's elements as integers of the same width (bitwise comparison)."""
    t = t.contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    size = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]).to(torch.int64)


def ulp_key(t):
    """opguard's ULP ordering: +magnitude for a positive sign bit, -magnitude for a negative one."""
    b = bits(t)
    width = t.element_size() * 8
    if width < 64:
        b = b & ((1 << width) - 1)
        sign = (b >> (width - 1)) & 1
        magnitude = b & ((1 << (width - 1)) - 1)
    else:
        sign = (b < 0).to(torch.int64)
        magnitude = b & 0x7FFFFFFFFFFFFFFF
    return torch.where(sign == 1, -magnitude, magnitude)


def metrics(a, b):
    """Elements whose bits differ, max ULP, max abs and rel error (a is the reference, as in opguard)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return {"differing": -1, "note": "good gives %s, bad %s" % (shape_text(a), shape_text(b))}
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    ba, bb = bits(a).reshape(-1), bits(b).reshape(-1)
    differ = ba != bb
    m = {"differing": int(differ.sum()), "numel": a.numel(), "max_ulp": None, "max_abs": 0.0, "max_rel": 0.0}
    if m["differing"] == 0:
        return m
    da = a.reshape(-1)[differ].to(torch.float64)
    db = b.reshape(-1)[differ].to(torch.float64)
    err = (da - db).abs()
    nan = torch.isnan(da) ^ torch.isnan(db)
    err = torch.where(torch.isnan(da) & torch.isnan(db), torch.zeros_like(err), err)
    err = torch.where(nan, torch.full_like(err, float("inf")), err)
    m["max_abs"] = float(err.max())
    if a.is_floating_point():
        rel = err / da.abs()
        rel = torch.where((da == 0) | torch.isinf(da), torch.full_like(rel, float("inf")), rel)
        rel = torch.where(torch.isnan(da) & torch.isnan(db), torch.zeros_like(rel), rel)
        m["max_rel"] = float(rel.max())
        ulp = (ulp_key(a.reshape(-1)[differ]) - ulp_key(b.reshape(-1)[differ])).abs()
        ulp = torch.where(torch.isnan(da) & torch.isnan(db), torch.zeros_like(ulp), ulp)
        m["max_ulp"] = "inf" if bool(nan.any()) else int(ulp.max())
    return m


def run_config(which, tmp):
    out_path = os.path.join(tmp, which + ".pt")
    env = dict(os.environ)
    # A variable that either config sets is absent where the other leaves it
    # unset, and so is every recorded variable (RECORDED_ENV) the config does not
    # set: the recorded run did not have it, whatever this shell exports.
    for config in CONFIGS.values():
        for name in env_of(config):
            env.pop(name, None)
    for name in RECORDED_ENV:
        env.pop(name, None)
    env.update(env_of(CONFIGS[which]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", which, out_path], env=env)
    if proc.returncode != 0:
        sys.exit(2)
    return torch.load(out_path)


def shape_text(t):
    return "%s [%s]" % (str(t.dtype).replace("torch.", ""), ",".join(str(n) for n in t.shape))


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and bool((bits(a) == bits(b)).all())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strict", action="store_true", help="also require the expected bits of both configs")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    for name in ("inputs.h5", "expected_good.h5", "expected_bad.h5"):
        if not os.path.isfile(os.path.join(HERE, name)):
            fail(name + " is missing beside repro.py")
    with tempfile.TemporaryDirectory() as tmp:
        got = {which: run_config(which, tmp) for which in ("good", "bad")}
    print("operator  " + OP)
    exact = True
    for which in ("good", "bad"):
        with h5py.File(os.path.join(HERE, "expected_%s.h5" % which), "r") as h5:
            expected = [load(h5, name) for name in OUTPUT_DATASETS]
        match = len(expected) == len(got[which]) and all(same_bits(e, g) for e, g in zip(expected, got[which]))
        exact = exact and match
        knobs = ",".join("%s=%s" % kv for kv in CONFIGS[which].items())
        print("%-4s      %s\n          bits %s expected_%s.h5" % (which, knobs, "equal to" if match else "DIFFER from", which))
    diverged = len(got["good"]) != len(got["bad"])
    for k, (a, b) in enumerate(zip(got["good"], got["bad"])):
        m = metrics(a, b)
        if m["differing"] == 0:
            print("output %d  %s: identical bits" % (k, shape_text(a)))
            continue
        diverged = True
        if m["differing"] < 0:
            print("output %d  %s" % (k, m["note"]))
            continue
        print("output %d  %s: %d of %d elements differ, max %s ULP, max abs error %.6g, max rel error %.6g"
              % (k, shape_text(a), m["differing"], m["numel"],
                 "-" if m["max_ulp"] is None else m["max_ulp"], m["max_abs"], m["max_rel"]))
    if not diverged:
        print("NOT REPRODUCED: good and bad give identical bits on this machine")
        return 1
    if args.strict and not exact:
        print("REPRODUCED a divergence, but not the expected bits (--strict): another machine or library?")
        return 1
    print("REPRODUCED: good and bad give different bits" + ("" if exact else " (not the expected ones)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
)TPL";

const char* const kReproCpp = R"TPL(// @@TITLE@@
//
// Standalone reproducer written by `opguard repro`: needs only libtorch and
// the HDF5 C library (see CMakeLists.txt). Runs the operator once under each
// config, each in a fresh child process (this program re-executed) with the
// config's environment set, since process-wide knobs such as
// ATEN_CPU_CAPABILITY are read once at start-up, and compares the outputs bit
// for bit.
//
//   ./repro BUNDLE_DIR            exit 0: the divergence reproduced (good and bad bits differ)
//                                 exit 1: it did not (identical bits)
//   ./repro BUNDLE_DIR --strict   exit 0 only if, in addition, each config gives exactly the
//                                 bits in expected_good.h5 / expected_bad.h5
//   exit 2: the bundle could not be run (missing file, operator unknown to this
//           libtorch, a knob that did not take)
// BUNDLE_DIR defaults to the current directory.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <hdf5.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace {

const char* kOp = "@@OP_NAME@@";
const char* kOverload = "@@OVERLOAD@@";
// The dtype of the CPU autocast the op ran under ("": none).
const char* kAutocast = @@AUTOCAST@@;
// Whether grad mode was on when the op ran (with inputs that require grad,
// some kernels choose their path by it).
const bool kGradMode = @@GRAD_MODE@@;
// torch.get_default_dtype() when the op ran (factory ops without a dtype, an
// int tensor * 0.5 give their results in it); "": not recorded.
const char* kDefaultDtype = @@DEFAULT_DTYPE@@;
// The scaled_dot_product_attention backends enabled when the op ran ("all",
// "math", "math+flash", ...); a config's sdpa_backend replaces them.
const char* kSdpaBackend = @@SDPA_BACKEND@@;
// Effective configs: knob -> value, as `opguard configs` names them.
const std::map<std::string, std::vector<std::pair<std::string, std::string>>> kConfigs = {
@@CONFIGS@@
};
// Tensor outputs in the order the op returns them (lists flattened): their
// datasets in expected_<config>.h5.
const std::vector<std::string> kOutputDatasets = {@@OUTPUTS@@};
const std::vector<std::string> kRecordedEnv = {@@RECORDED_ENV@@};

std::string g_dir = ".";

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "repro: %s\n", message.c_str());
  std::exit(2);
}

// --- HDF5 --------------------------------------------------------------------

struct H5File {
  hid_t id = -1;
  explicit H5File(const std::string& name) {
    const std::string path = g_dir + "/" + name;
    id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) fail("cannot open " + path);
  }
  ~H5File() { H5Fclose(id); }
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
};

std::string string_attr(hid_t ds, const char* name) {
  const hid_t a = H5Aopen(ds, name, H5P_DEFAULT);
  if (a < 0) fail(std::string("a dataset has no attribute ") + name);
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  char* value = nullptr;
  if (H5Aread(a, t, &value) < 0) fail(std::string("cannot read attribute ") + name);
  std::string out = value ? value : "";
  H5free_memory(value);
  H5Tclose(t);
  H5Aclose(a);
  return out;
}

std::vector<int64_t> int_attr(hid_t ds, const char* name) {
  const hid_t a = H5Aopen(ds, name, H5P_DEFAULT);
  if (a < 0) fail(std::string("a dataset has no attribute ") + name);
  const hid_t space = H5Aget_space(a);
  std::vector<int64_t> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  if (!v.empty() && H5Aread(a, H5T_NATIVE_INT64, v.data()) < 0) fail(std::string("cannot read attribute ") + name);
  H5Sclose(space);
  H5Aclose(a);
  return v;
}

const std::map<std::string, at::ScalarType>& dtype_table() {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"float64", at::kDouble},       {"float32", at::kFloat},          {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16},    {"int8", at::kChar},              {"int16", at::kShort},
      {"int32", at::kInt},            {"int64", at::kLong},             {"uint8", at::kByte},
      {"bool", at::kBool},            {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble},
      {"uint16", at::kUInt16},        {"uint32", at::kUInt32},          {"uint64", at::kUInt64},
      {"float8_e4m3fn", at::kFloat8_e4m3fn}, {"float8_e5m2", at::kFloat8_e5m2}};
  return kTypes;
}

at::ScalarType scalar_type(const std::string& name) {
  const auto it = dtype_table().find(name);
  if (it == dtype_table().end()) fail("dtype " + name + " is unknown to this reproducer");
  return it->second;
}

// A Python number as the dispatcher passes it: a 0-dim tensor that type
// promotion treats as a scalar.
[[maybe_unused]] at::Tensor wrapped(at::Tensor t) {
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// torch's Python name ("float32"), as repro.py prints it.
std::string dtype_name(at::ScalarType type) {
  for (const auto& [name, t] : dtype_table())
    if (t == type) return name;
  return c10::toString(type);
}

// A dataset as the op saw it: a zero-filled storage with the row-major
// elements scattered into the recorded strided view (as opguard's replay
// rebuilds it), and whether it required grad: grad "leaf" (as a parameter
// does), "computed" (autograd computed it, so that an op may write it in place
// under grad mode) or "" (it did not).
at::Tensor load(const H5File& file, const std::string& name, const std::string& grad = "") {
  const hid_t ds = H5Dopen2(file.id, name.c_str(), H5P_DEFAULT);
  if (ds < 0) fail("no dataset " + name);
  const auto dtype = scalar_type(string_attr(ds, "dtype"));
  auto strides = int_attr(ds, "strides");
  int64_t offset = int_attr(ds, "storage_offset").at(0);
  const hid_t space = H5Dget_space(ds);
  const int ndim = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(ndim));
  if (ndim > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  H5Sclose(space);
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  at::Tensor flat = at::empty({numel}, at::TensorOptions().dtype(dtype));
  const hid_t type = H5Dget_type(ds);  // read as stored: the bits, unconverted
  if (H5Tget_size(type) != static_cast<std::size_t>(flat.element_size())) fail("dataset " + name + " has another element size");
  if (numel > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data_ptr()) < 0) fail("cannot read " + name);
  H5Tclose(type);
  H5Dclose(ds);
  if (strides.size() != sizes.size()) {  // no recorded layout: row-major
    strides.assign(sizes.size(), 1);
    for (std::size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
    offset = 0;
  }
  int64_t extent = offset;
  if (numel > 0) {
    extent += 1;
    for (std::size_t d = 0; d < sizes.size(); ++d) extent += (sizes[d] - 1) * strides[d];
  }
  at::Tensor storage = at::zeros({extent}, flat.options());
  if (numel > 0) {
    at::Tensor where = at::arange(extent, at::TensorOptions().dtype(at::kLong)).as_strided(sizes, strides, offset).reshape({-1});
    storage.index_put_({where}, flat);
  }
  at::AutoGradMode on(true);
  if (grad == "computed") storage = storage.requires_grad_(true).clone();
  at::Tensor x = storage.as_strided(sizes, strides, offset);
  return grad == "leaf" ? x.detach().requires_grad_(true) : x;
}

at::Generator generator(const at::Tensor& state) {
  auto g = at::detail::createCPUGenerator();
  g.set_state(state.contiguous());
  return g;
}

double d(const char* text) { return std::strtod(text, nullptr); }  // C99 hex floats, inf, nan: exact

// --- configs -----------------------------------------------------------------

std::vector<std::string> env_of(const std::vector<std::pair<std::string, std::string>>& config) {
  std::vector<std::string> env;
  for (const auto& [knob, value] : config) {
    if (knob == "cpu_capability") env.push_back("ATEN_CPU_CAPABILITY=" + value);
    else if (knob == "blas_threads") {
      env.push_back("MKL_NUM_THREADS=" + value);
      env.push_back("OPENBLAS_NUM_THREADS=" + value);
    } else if (knob.rfind("env:", 0) == 0) {
      env.push_back(knob.substr(4) + "=" + value);
    }
  }
  return env;
}

// Flushes denormals (FTZ and DAZ) on the threads `value` names: on (all), off,
// main (the thread that calls the op) or workers (libtorch's intra-op
// threads). setFlushDenormal sets the calling thread's only, and an intra-op
// worker keeps what it was created with: the workers are started here, by a
// parallel op, under the setting they are to keep, before this thread's is set.
void set_flush_denormal(const std::string& value) {
  auto& ctx = at::globalContext();
  if (!ctx.setFlushDenormal(value == "on" || value == "workers"))
    fail("flush_denormal=" + value + " did not take: this CPU cannot flush denormals");
  at::ones({1 << 20}).sum();  // parallel: starts the intra-op workers at the thread count set before
  ctx.setFlushDenormal(value == "on" || value == "main");
}

// Sets the in-process knobs; returns the dtype floating inputs are cast to.
std::optional<at::ScalarType> apply_in_process(const std::vector<std::pair<std::string, std::string>>& config) {
  std::optional<at::ScalarType> cast;
  std::optional<std::string> flush;
  auto& ctx = at::globalContext();
  for (const auto& [knob, value] : config) {
    if (knob == "threads") at::set_num_threads(std::stoi(value));
    else if (knob == "mkldnn") ctx.setUserEnabledMkldnn(value == "on");
    else if (knob == "deterministic") ctx.setDeterministicAlgorithms(value == "on", false);
    else if (knob == "flush_denormal") flush = value;  // after the thread count: set_flush_denormal below
    else if (knob == "float32_matmul_precision") ctx.setFloat32MatmulPrecision(value);
    else if (knob == "dtype") cast = scalar_type(value);
    else if (knob == "device") {
      if (value != "cpu") fail("this reproducer runs on the CPU; the config asks for " + value);
    } else if (knob == "cpu_capability") {
      std::string got = at::get_cpu_capability();
      for (char& c : got) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (got != value) fail("ATEN_CPU_CAPABILITY=" + value + " did not take (libtorch runs " + got + ")");
    } else if (knob == "blas_threads" || knob.rfind("env:", 0) == 0) {
      // the parent set the environment
    } else if (knob == "tp" || knob == "microbatches" || knob == "reduce") {
      // run_op decomposes the call (run_parallel)
    } else if (knob == "sdpa_backend") {
      // run_op enables the backends
    } else {
      fail("knob " + knob + " is not one this reproducer can set");
    }
  }
  if (flush) set_flush_denormal(*flush);
  return cast;
}

// --- parallel decompositions: tp=P, microbatches=M, reduce=ORDER -------------
// The op computed as P partial products over shards of its reduction
// dimension, summed in the order of an all-reduce, exactly as opguard's replay
// emulates a tensor- or data-parallel run on one device
// (replay/decomposed.cpp, kernels/decompose.cpp in opguard).

// The recorded call ran in the backward pass: a matmul of a transposed matrix
// there is a weight gradient, which reduces over the batch (microbatches=M).
constexpr bool kBackward = @@BACKWARD@@;

struct Range {
  int64_t begin, end;
};

// Shard i of n elements in `parts` shards, as torch.tensor_split cuts them.
Range shard_of(int64_t n, int64_t parts, int64_t i) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// The elements whose sum starts at rank c-1 in Gloo's ring all-reduce (gloo/allreduce.cc).
Range ring_chunk(int64_t numel, int64_t element_size, int64_t ranks, int64_t c) {
  const int64_t max_segment = element_size * std::max<int64_t>(1, (int64_t{1} << 20) / element_size);
  int64_t segments = std::max<int64_t>((numel * element_size + max_segment - 1) / max_segment, 2 * ranks);
  segments = (segments + ranks - 1) / ranks * ranks;
  const int64_t per_rank = segments / ranks, segment_elems = (numel + segments - 1) / segments;
  return {std::min(numel, c * per_rank * segment_elems), std::min(numel, (c + 1) * per_rank * segment_elems)};
}

// The elementwise sum of the partials: sequential ((p0 + p1) + p2) + ...; tree
// (p0 + p1) + (p2 + p3); ring: chunk c summed along c-1, c-2, ..., c (mod P).
at::Tensor reduce_partials(const std::vector<at::Tensor>& parts, const std::string& order) {
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.contiguous().reshape({-1}));
  const int64_t ranks = static_cast<int64_t>(flat.size());
  at::Tensor out;
  if (order == "tree") {
    std::vector<at::Tensor> level = flat;
    while (level.size() > 1) {
      std::vector<at::Tensor> next;
      for (std::size_t j = 0; j + 1 < level.size(); j += 2) next.push_back(at::add(level[j], level[j + 1]));
      if (level.size() % 2 == 1) next.push_back(level.back());
      level.swap(next);
    }
    out = level[0].clone();
  } else if (order == "sequential") {
    out = flat[0].clone();
    for (int64_t r = 1; r < ranks; ++r) out = at::add(out, flat[static_cast<std::size_t>(r)]);
  } else if (order == "ring") {
    out = at::empty_like(flat[0]);
    for (int64_t c = 0; c < ranks; ++c) {
      const Range chunk = ring_chunk(out.numel(), out.element_size(), ranks, c);
      auto part = [&](int64_t r) {
        return flat[static_cast<std::size_t>(((c - 1 - r) % ranks + ranks) % ranks)].slice(0, chunk.begin, chunk.end);
      };
      at::Tensor acc = part(0).clone();
      for (int64_t r = 1; r < ranks; ++r) acc = at::add(acc, part(r));
      out.slice(0, chunk.begin, chunk.end).copy_(acc);
    }
  } else {
    fail("reduce=" + order + " is not an order this reproducer knows");
  }
  return out.reshape(parts[0].sizes());
}

bool is_transposed_matrix(const at::Tensor& t) {
  return t.dim() == 2 && t.size(0) > 1 && t.stride(0) == 1 && t.stride(1) >= t.size(0);
}

std::string knob(const std::vector<std::pair<std::string, std::string>>& config, const std::string& name) {
  for (const auto& [k, v] : config)
    if (k == name) return v;
  return "";
}

// Replaces the stack's arguments by the op's result under tp / microbatches;
// false where replay runs the op as recorded.
bool run_parallel(const std::vector<std::pair<std::string, std::string>>& config, torch::jit::Stack& stack) {
  const std::string tp_text = knob(config, "tp"), mb_text = knob(config, "microbatches");
  if (tp_text.empty() && mb_text.empty()) return false;
  const std::string op = std::string(kOp) + (std::string(kOverload).empty() ? "" : "." + std::string(kOverload));
  auto tensor_at = [&](std::size_t i) { return i < stack.size() && stack[i].isTensor() ? stack[i].toTensor() : at::Tensor(); };
  at::Tensor a, b;
  int64_t a_dim = 0, b_dim = 0;
  bool batch = false;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> partial;
  std::function<at::Tensor(const at::Tensor&)> finish = [](const at::Tensor& s) { return s; };
  if (op == "aten::mm" || op == "aten::bmm" || op == "aten::matmul") {
    a = tensor_at(0), b = tensor_at(1);
    if (!a.defined() || !b.defined() || a.dim() < 1 || b.dim() < 1) return false;
    a_dim = a.dim() - 1, b_dim = b.dim() == 1 ? 0 : b.dim() - 2;
    if (op == "aten::mm") partial = [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); };
    else if (op == "aten::bmm") partial = [](const at::Tensor& x, const at::Tensor& y) { return at::bmm(x, y); };
    else partial = [](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); };
    batch = kBackward && op != "aten::bmm" && is_transposed_matrix(a);
  } else if (op == "aten::addmm" && stack.size() >= 5) {
    const at::Tensor self = tensor_at(0);
    a = tensor_at(1), b = tensor_at(2), a_dim = 1, b_dim = 0;
    if (!self.defined() || !a.defined() || !b.defined()) return false;
    const c10::Scalar beta = stack[3].toScalar(), alpha = stack[4].toScalar();
    partial = [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); };
    finish = [self, beta, alpha](const at::Tensor& s) {
      const at::Tensor scaled = alpha.equal(1) ? s : at::mul(s, alpha);
      return beta.equal(0) ? scaled : at::add(scaled, self, beta);
    };
    batch = kBackward && is_transposed_matrix(a);
  } else if (op == "aten::linear") {
    a = tensor_at(0), b = tensor_at(1);
    const at::Tensor bias = tensor_at(2);
    if (!a.defined() || !b.defined() || a.dim() < 1 || b.dim() != 2) return false;
    a_dim = a.dim() - 1, b_dim = 1;
    partial = [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); };
    if (bias.defined()) finish = [bias](const at::Tensor& s) { return at::add(s, bias); };
  } else if (op == "aten::sum.dim_IntList" && kBackward && stack.size() >= 4) {
    a = tensor_at(0);
    if (!a.defined() || a.dim() < 1) return false;
    std::vector<int64_t> dims;
    if (!stack[1].isNone()) dims = stack[1].toIntVector();
    bool over_batch = dims.empty();
    for (int64_t d : dims) over_batch = over_batch || d == 0 || d == -a.dim();
    if (!over_batch) return false;
    const bool keepdim = stack[2].toBool();
    const std::optional<at::ScalarType> dtype =
        stack[3].isNone() ? std::nullopt : std::optional<at::ScalarType>(stack[3].toScalarType());
    batch = true;
    partial = [dims, keepdim, dtype](const at::Tensor& x, const at::Tensor&) {
      return at::sum(x, dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims), keepdim, dtype);
    };
  } else {
    return false;
  }
  const std::string parts_text = batch ? mb_text : tp_text;
  if (parts_text.empty()) return false;
  const int64_t parts = std::stoll(parts_text);
  const int64_t k = a.size(a_dim);
  if (parts <= 1 || (b.defined() && b.size(b_dim) != k) || k < parts) return false;
  std::vector<at::Tensor> partials;
  for (int64_t r = 0; r < parts; ++r) {
    const Range s = shard_of(k, parts, r);
    const at::Tensor pb = b.defined() ? b.narrow(b_dim, s.begin, s.end - s.begin) : at::Tensor();
    partials.push_back(partial(a.narrow(a_dim, s.begin, s.end - s.begin), pb).contiguous());
  }
  const auto type = partials.front().scalar_type();
  if (type != at::kFloat && type != at::kDouble && type != at::kBFloat16) return false;
  std::string order = knob(config, "reduce");
  if (order.empty()) order = batch ? "sequential" : "ring";
  const at::Tensor result = finish(reduce_partials(partials, order));
  stack.clear();
  stack.emplace_back(result);
  return true;
}

// --- the call (generated from the recorded schema) -----------------------------

// Enables the scaled_dot_product_attention backends `text` names ("all",
// "none", "math+flash"), no other.
void set_sdpa_backends(const std::string& text) {
  auto on = [&](const std::string& name) {
    return text == "all" || ("+" + text + "+").find("+" + name + "+") != std::string::npos;
  };
  auto& ctx = at::globalContext();
  ctx.setSDPUseMath(on("math"));
  ctx.setSDPUseFlash(on("flash"));
  ctx.setSDPUseMemEfficient(on("efficient"));
  ctx.setSDPUseCuDNN(on("cudnn"));
}

std::vector<at::Tensor> run_op(const std::vector<std::pair<std::string, std::string>>& config,
                               std::optional<at::ScalarType> cast) {
  std::string sdpa = kSdpaBackend;
  for (const auto& [knob, value] : config)
    if (knob == "sdpa_backend") sdpa = value;
  set_sdpa_backends(sdpa);
  H5File inputs("inputs.h5");
  auto t = [&](const char* name, const char* grad = "") {
    at::Tensor x = load(inputs, name, grad);
    return cast && at::isFloatingType(x.scalar_type()) ? x.to(*cast) : x;
  };
  (void)t;
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(kOp, kOverload);
  torch::jit::Stack stack;
@@ARGS@@
  at::AutoGradMode grad_mode(kGradMode);
  if (*kDefaultDtype != '\0') c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(scalar_type(kDefaultDtype)));
  // What the op writes and does not return, compared after the call like its
  // outputs (opguard records those after the op as outputs).
  const std::vector<c10::IValue> written = {@@WRITTEN@@};
  if (*kAutocast != '\0') {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, scalar_type(kAutocast));
  }
  if (!run_parallel(config, stack)) op.callBoxed(stack);
  for (const auto& w : written) stack.push_back(w);
  std::vector<at::Tensor> flat;
  for (const auto& v : stack) {
    if (v.isTensor() && v.toTensor().defined()) flat.push_back(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& e : v.toTensorVector()) flat.push_back(e);
  }
  return flat;
}

// --- child: run one config and write the outputs -------------------------------

void write_outputs(const std::string& path, const std::vector<at::Tensor>& outputs) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = outputs.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  for (const at::Tensor& o : outputs) {
    const at::Tensor c = o.contiguous();
    const int64_t type = static_cast<int64_t>(c.scalar_type()), ndim = c.dim();
    out.write(reinterpret_cast<const char*>(&type), sizeof(type));
    out.write(reinterpret_cast<const char*>(&ndim), sizeof(ndim));
    for (int64_t s : c.sizes()) out.write(reinterpret_cast<const char*>(&s), sizeof(s));
    out.write(static_cast<const char*>(c.const_data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  if (!out) fail("cannot write " + path);
}

std::vector<at::Tensor> read_outputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof(n));
  std::vector<at::Tensor> outputs;
  for (uint64_t k = 0; k < n && in; ++k) {
    int64_t type = 0, ndim = 0;
    in.read(reinterpret_cast<char*>(&type), sizeof(type));
    in.read(reinterpret_cast<char*>(&ndim), sizeof(ndim));
    std::vector<int64_t> sizes(static_cast<std::size_t>(ndim));
    for (auto& s : sizes) in.read(reinterpret_cast<char*>(&s), sizeof(s));
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(type)));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    outputs.push_back(t);
  }
  if (!in) fail("the child's outputs in " + path + " are truncated");
  return outputs;
}

int child(const std::string& which, const std::string& out_path) {
  const auto cast = apply_in_process(kConfigs.at(which));
  std::vector<at::Tensor> outputs;
  try {
    outputs = run_op(kConfigs.at(which), cast);
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail(std::string(kOp) + " failed under the " + which + " config: " + what.substr(0, what.find('\n')));
  }
  if (cast) {
    H5File expected("expected_" + which + ".h5");
    for (std::size_t k = 0; k < outputs.size() && k < kOutputDatasets.size(); ++k)
      if (at::isFloatingType(outputs[k].scalar_type()))
        outputs[k] = outputs[k].to(load(expected, kOutputDatasets[k]).scalar_type());
  }
  write_outputs(out_path, outputs);
  return 0;
}

// --- parent: run both, compare ---------------------------------------------------

std::vector<at::Tensor> run_config(const std::string& which, const std::string& tmp, const char* self) {
  const std::string out_path = tmp + "/" + which + ".bin";
  std::vector<std::string> env;
  // A variable that either config sets is absent where the other leaves it
  // unset, and so is every recorded variable (kRecordedEnv) the config does not
  // set: the recorded run did not have it, whatever this shell exports.
  std::vector<std::string> either = kRecordedEnv;
  for (const auto& [name, config] : kConfigs)
    for (const auto& kv : env_of(config)) either.push_back(kv);
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& o : either) replaced = replaced || kv.substr(0, kv.find('=')) == o.substr(0, o.find('='));
    if (!replaced) env.push_back(kv);
  }
  const auto overrides = env_of(kConfigs.at(which));
  env.insert(env.end(), overrides.begin(), overrides.end());
  std::vector<std::string> argv = {self, g_dir, "--child", which, out_path};
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, self, nullptr, nullptr, cargv.data(), cenv.data()) != 0) fail("cannot re-execute " + std::string(self));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(2);
  return read_outputs(out_path);
}

at::Tensor bits(const at::Tensor& x) {
  at::Tensor t = x.contiguous();
  if (t.is_complex()) t = at::view_as_real(t);
  switch (t.element_size()) {
    case 1: return t.view(at::kByte).to(at::kLong);
    case 2: return t.view(at::kShort).to(at::kLong);
    case 4: return t.view(at::kInt).to(at::kLong);
    default: return t.view(at::kLong);
  }
}

// opguard's ULP ordering: +magnitude for a positive sign bit, -magnitude for a negative one.
at::Tensor ulp_key(const at::Tensor& t) {
  at::Tensor b = bits(t);
  const int64_t width = t.element_size() * 8;
  at::Tensor sign, magnitude;
  if (width < 64) {
    b = at::bitwise_and(b, (int64_t{1} << width) - 1);
    sign = at::bitwise_and(at::bitwise_right_shift(b, width - 1), 1);
    magnitude = at::bitwise_and(b, (int64_t{1} << (width - 1)) - 1);
  } else {
    sign = b.lt(0).to(at::kLong);
    magnitude = at::bitwise_and(b, INT64_MAX);
  }
  return at::where(sign.eq(1), magnitude.neg(), magnitude);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && bits(a).eq(bits(b)).all().item<bool>();
}

std::string shape_text(const at::Tensor& t) {
  std::string s = dtype_name(t.scalar_type()) + " [";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

// Prints one output's metrics; returns whether its bits differ.
bool report(std::size_t k, const at::Tensor& good, const at::Tensor& bad) {
  if (good.scalar_type() != bad.scalar_type() || good.sizes() != bad.sizes()) {
    std::printf("output %zu  good gives %s, bad %s\n", k, shape_text(good).c_str(), shape_text(bad).c_str());
    return true;
  }
  at::Tensor a = good.is_complex() ? at::view_as_real(good) : good, b = bad.is_complex() ? at::view_as_real(bad) : bad;
  const at::Tensor differ = bits(a).reshape({-1}).ne(bits(b).reshape({-1}));
  const int64_t differing = differ.sum().item<int64_t>();
  if (differing == 0) {
    std::printf("output %zu  %s: identical bits\n", k, shape_text(good).c_str());
    return false;
  }
  const at::Tensor da = a.reshape({-1}).index({differ}).to(at::kDouble), db = b.reshape({-1}).index({differ}).to(at::kDouble);
  const at::Tensor both_nan = da.isnan().logical_and(db.isnan()), one_nan = da.isnan().logical_xor(db.isnan());
  at::Tensor err = (da - db).abs();
  err = at::where(both_nan, at::zeros_like(err), err);
  err = at::where(one_nan, at::full_like(err, INFINITY), err);
  const double max_abs = err.max().item<double>();
  std::string ulp = "-";
  double max_rel = 0.0;
  if (at::isFloatingType(a.scalar_type())) {
    at::Tensor rel = err / da.abs();
    rel = at::where(da.eq(0).logical_or(da.isinf()), at::full_like(rel, INFINITY), rel);
    rel = at::where(both_nan, at::zeros_like(rel), rel);
    max_rel = rel.max().item<double>();
    at::Tensor u = (ulp_key(a.reshape({-1}).index({differ})) - ulp_key(b.reshape({-1}).index({differ}))).abs();
    u = at::where(both_nan, at::zeros_like(u), u);
    ulp = one_nan.any().item<bool>() ? std::string("inf") : std::to_string(u.max().item<int64_t>());
  }
  std::printf("output %zu  %s: %lld of %lld elements differ, max %s ULP, max abs error %.6g, max rel error %.6g\n", k,
              shape_text(good).c_str(), static_cast<long long>(differing), static_cast<long long>(a.numel()),
              ulp.c_str(), max_abs, max_rel);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool strict = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--strict") {
      strict = true;
    } else if (args[i] == "--child") {
      if (i + 2 >= args.size()) fail("--child takes CONFIG and OUT");
      return child(args[i + 1], args[i + 2]);
    } else if (args[i] == "-h" || args[i] == "--help") {
      std::printf("usage: %s [BUNDLE_DIR] [--strict]\nexit 0: reproduced, 1: not reproduced, 2: could not run\n", argv[0]);
      return 0;
    } else if (args[i].rfind("-", 0) == 0) {
      fail("unknown option " + args[i] + " (see --help)");
    } else {
      g_dir = args[i];
    }
  }
  for (const char* name : {"inputs.h5", "expected_good.h5", "expected_bad.h5"})
    if (access((g_dir + "/" + name).c_str(), R_OK) != 0) fail(std::string(name) + " is missing in " + g_dir);
  char tmpl[] = "/tmp/opguard-repro-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) fail("cannot create a temporary directory");
  const std::string tmp = tmpl;
  std::map<std::string, std::vector<at::Tensor>> got;
  for (const char* which : {"good", "bad"}) got[which] = run_config(which, tmp, "/proc/self/exe");
  for (const char* which : {"good", "bad"}) std::remove((tmp + "/" + which + ".bin").c_str());
  rmdir(tmp.c_str());
  std::printf("operator  %s%s%s\n", kOp, *kOverload ? "." : "", kOverload);
  bool exact = true;
  for (const std::string which : {"good", "bad"}) {
    H5File expected_file("expected_" + which + ".h5");
    bool match = got[which].size() == kOutputDatasets.size();
    for (std::size_t k = 0; match && k < kOutputDatasets.size(); ++k)
      match = same_bits(load(expected_file, kOutputDatasets[k]), got[which][k]);
    exact = exact && match;
    std::string knobs;
    for (const auto& [knob, value] : kConfigs.at(which)) knobs += (knobs.empty() ? "" : ",") + knob + "=" + value;
    std::printf("%-4s      %s\n          bits %s expected_%s.h5\n", which.c_str(), knobs.c_str(),
                match ? "equal to" : "DIFFER from", which.c_str());
  }
  bool diverged = got["good"].size() != got["bad"].size();
  for (std::size_t k = 0; k < got["good"].size() && k < got["bad"].size(); ++k)
    diverged = report(k, got["good"][k], got["bad"][k]) || diverged;
  if (!diverged) {
    std::printf("NOT REPRODUCED: good and bad give identical bits on this machine\n");
    return 1;
  }
  if (strict && !exact) {
    std::printf("REPRODUCED a divergence, but not the expected bits (--strict): another machine or library?\n");
    return 1;
  }
  std::printf("REPRODUCED: good and bad give different bits%s\n", exact ? "" : " (not the expected ones)");
  return 0;
}
)TPL";

const char* const kCMakeLists = R"TPL(# Builds repro.cpp against libtorch and HDF5 only (no opguard):
#   cmake -S . -B build -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
#   cmake --build build && ./build/repro .
cmake_minimum_required(VERSION 3.18)
project(opguard_repro LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()
# A CUDA build of libtorch (the pip wheel) wants the CUDA toolkit at configure
# time even for a CPU program; point it at one if it is where it usually is.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)
find_package(HDF5 REQUIRED COMPONENTS C)
# The CPU libraries only: the op runs on the CPU.
get_filename_component(TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
find_library(REPRO_TORCH_CPU torch_cpu PATHS ${TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(REPRO_C10 c10 PATHS ${TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
add_executable(repro repro.cpp)
target_include_directories(repro SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
target_compile_options(repro PRIVATE ${TORCH_CXX_FLAGS})
target_link_libraries(repro PRIVATE ${REPRO_TORCH_CPU} ${REPRO_C10} ${HDF5_C_LIBRARIES})
)TPL";

}  // namespace opguard::bisect::templates
