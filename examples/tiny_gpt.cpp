// tiny_gpt: a small decoder-only GPT trained on a character corpus with the
// libtorch C++ frontend. examples/tiny_gpt.py is the same model and training in
// PyTorch; both are the real training programs that opguard records and diffs.
//
// Under a fixed configuration (flags, threads, dtype, CPU capability) every run
// computes the same bits: batches come from a fixed integer LCG, not torch's RNG,
// and initialisation and dropout draw from torch's generator seeded by --seed.
//
// Step times measured here (2 shared cores, 2 intra-op threads, AVX-512
// capability, RelWithDebInfo, float32, mean of steps 1..N-1; step 0 is slower):
//   defaults (--width 64 --depth 2 --heads 4 --seq 32 --batch 8)       ~5 ms
//   --width 128 --depth 4 --seq 64 --batch 16                          ~70 ms
//   --width 256 --depth 4 --seq 128 --batch 16                         ~370-400 ms
// stderr's last line reports them for any configuration.
//
// stdout carries only the result lines (one per printed step, then the final
// loss), so that two runs can be compared with cmp; diagnostics go to stderr.
//
// --mkldnn off turns oneDNN off (it changes aten::gelu's bits here); --tp P
// computes the MLP's down-projection as a P-way row-parallel linear, emulated
// in one process (row_parallel_linear; record such a run with `opguard record
// --declare tp=P`). --attention sdpa computes attention with
// at::scaled_dot_product_attention (is_causal, its own dropout), as most
// current models do: on the CPU, torch runs its flash-attention kernels then;
// the default, manual, spells it out (matmul, masked_fill, softmax, dropout,
// matmul). tiny_gpt.py takes the same flags.
//
// Module calls sit inside opguard::Scope guards named like the modules
// registered below (blocks.1.attn.proj, blocks.0.mlp.fc, wte, ln_f, head,
// loss, ...), the same names the Python program's modules get from the
// recorder's global module hooks. The guards cost nothing without a recorder.

#include <dlfcn.h>
#include <torch/torch.h>

#include <opguard/record/scope.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef OPGUARD_EXAMPLES_CORPUS
#define OPGUARD_EXAMPLES_CORPUS "data/corpus.txt"
#endif

namespace {

struct Options {
  int64_t steps = 5;
  int64_t width = 64;
  int64_t depth = 2;
  int64_t heads = 4;
  int64_t seq = 32;
  int64_t batch = 8;
  int64_t threads = 0;  // 0: leave torch's default
  torch::Dtype dtype = torch::kFloat32;
  std::string dtype_name = "float32";
  uint64_t seed = 0;
  bool tied = false;
  double dropout = 0.0;
  double lr = 1e-3;
  double weight_decay = 0.01;
  std::string corpus = OPGUARD_EXAMPLES_CORPUS;
  std::string out_params;
  int64_t print_every = 1;  // <= 0: print no step lines, only the final one
  bool mkldnn = true;       // oneDNN (at::globalContext().setUserEnabledMkldnn)
  int64_t tp = 1;           // > 1: the MLP down-projection as a P-way row-parallel linear (row_parallel_linear)
  bool sdpa = false;        // --attention sdpa: at::scaled_dot_product_attention
  std::string device = "cpu";  // cpu, cuda or cuda:N: parameters are drawn on the CPU, then moved
};

class UsageError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: tiny_gpt [--steps N] [--width N] [--depth N] [--heads N] [--seq N]\n"
    "                [--batch N] [--threads N] [--dtype float32|float64|bfloat16]\n"
    "                [--seed N] [--tied] [--dropout P] [--lr X] [--weight-decay X]\n"
    "                [--corpus PATH] [--out-params PATH] [--print-every K]\n"
    "                [--mkldnn on|off] [--tp P] [--device cpu|cuda[:N]]\n"
    "                [--attention manual|sdpa]\n";

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min) {
  std::size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < min) {
    throw UsageError(flag + " wants an integer >= " + std::to_string(min) + ", got '" + text + "'");
  }
  return value;
}

double parse_double(const std::string& flag, const std::string& text, double min, double max) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(value >= min && value <= max)) {
    throw UsageError(flag + " wants a number in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline_value = true;
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--tied") {
      if (has_inline_value) throw UsageError("--tied takes no value");
      o.tied = true;
      continue;
    }
    static const char* const kValueFlags[] = {
        "--steps", "--width",   "--depth",  "--heads", "--seq",          "--batch",     "--threads",
        "--seed",  "--device", "--dropout", "--lr",     "--dtype", "--weight-decay", "--corpus",    "--out-params",
        "--print-every", "--mkldnn", "--tp", "--attention"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), flag) == std::end(kValueFlags)) {
      throw UsageError("unknown flag '" + flag + "'");
    }
    if (!has_inline_value) {
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "--steps") o.steps = parse_int(flag, value, 1);
    else if (flag == "--width") o.width = parse_int(flag, value, 1);
    else if (flag == "--depth") o.depth = parse_int(flag, value, 1);
    else if (flag == "--heads") o.heads = parse_int(flag, value, 1);
    else if (flag == "--seq") o.seq = parse_int(flag, value, 1);
    else if (flag == "--batch") o.batch = parse_int(flag, value, 1);
    else if (flag == "--threads") o.threads = parse_int(flag, value, 0);
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_int(flag, value, 0));
    else if (flag == "--dropout") o.dropout = parse_double(flag, value, 0.0, 0.999);
    else if (flag == "--lr") o.lr = parse_double(flag, value, 0.0, 10.0);
    else if (flag == "--weight-decay") o.weight_decay = parse_double(flag, value, 0.0, 10.0);
    else if (flag == "--corpus") o.corpus = value;
    else if (flag == "--out-params") o.out_params = value;
    else if (flag == "--print-every") o.print_every = parse_int(flag, value, 0);
    else if (flag == "--tp") o.tp = parse_int(flag, value, 1);
    else if (flag == "--device") {
      if (value != "cpu" && value.rfind("cuda", 0) != 0) throw UsageError("--device wants cpu or cuda[:N], got '" + value + "'");
      o.device = value;
    }
    else if (flag == "--attention") {
      if (value != "manual" && value != "sdpa") throw UsageError("--attention wants manual or sdpa, got '" + value + "'");
      o.sdpa = value == "sdpa";
    }
    else if (flag == "--mkldnn") {
      if (value != "on" && value != "off") throw UsageError("--mkldnn wants on or off, got '" + value + "'");
      o.mkldnn = value == "on";
    }
    else if (flag == "--dtype") {
      o.dtype_name = value;
      if (value == "float32") o.dtype = torch::kFloat32;
      else if (value == "float64") o.dtype = torch::kFloat64;
      else if (value == "bfloat16") o.dtype = torch::kBFloat16;
      else throw UsageError("--dtype wants float32, float64 or bfloat16, got '" + value + "'");
    } else {
      throw UsageError("unknown flag '" + flag + "'");
    }
  }
  if (o.width % o.heads != 0) {
    throw UsageError("--width (" + std::to_string(o.width) + ") must be a multiple of --heads (" +
                     std::to_string(o.heads) + ")");
  }
  return o;
}

// The character data set: vocabulary = sorted distinct bytes of the corpus.
struct Corpus {
  std::vector<int64_t> tokens;
  int64_t vocab_size = 0;
};

Corpus load_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read the corpus '" + path + "': pass --corpus PATH");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool present[256] = {};
  for (unsigned char b : bytes) present[b] = true;
  int64_t index[256];
  Corpus c;
  for (int b = 0; b < 256; ++b) index[b] = present[b] ? c.vocab_size++ : -1;
  c.tokens.reserve(bytes.size());
  for (unsigned char b : bytes) c.tokens.push_back(index[b]);
  return c;
}

// Batch offsets come from this LCG rather than torch's RNG so that the data
// does not depend on the CPU capability or on torch at all; tiny_gpt.py
// implements the same generator and draws the same windows.
class BatchSampler {
 public:
  explicit BatchSampler(uint64_t seed) : state_(seed + 0x9E3779B97F4A7C15ULL) {}

  // Fills inputs and targets (batch x seq each) with windows of seq+1 tokens.
  void next(const Corpus& c, int64_t batch, int64_t seq, std::vector<int64_t>& inputs,
            std::vector<int64_t>& targets) {
    const uint64_t n_offsets = static_cast<uint64_t>(c.tokens.size()) - static_cast<uint64_t>(seq);
    inputs.resize(static_cast<std::size_t>(batch * seq));
    targets.resize(inputs.size());
    for (int64_t b = 0; b < batch; ++b) {
      const auto offset = static_cast<std::size_t>(draw() % n_offsets);
      for (int64_t t = 0; t < seq; ++t) {
        const auto at = static_cast<std::size_t>(b * seq + t);
        inputs[at] = c.tokens[offset + static_cast<std::size_t>(t)];
        targets[at] = c.tokens[offset + static_cast<std::size_t>(t) + 1];
      }
    }
  }

 private:
  uint64_t draw() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return state_ >> 33;
  }
  uint64_t state_;
};

struct ModelConfig {
  int64_t vocab_size;
  int64_t width;
  int64_t depth;
  int64_t heads;
  int64_t seq;
  bool tied;
  double dropout;
  int64_t tp;
  bool sdpa;
};

// A P-way tensor-parallel run computes a row-parallel linear (Megatron's
// RowParallelLinear: the MLP's down-projection) as P partial products over
// shards of the input features, all-reduced, plus the bias once. This emulates
// it in one process: shards as torch::tensor_split cuts them, partials summed
// in rank order ((p0 + p1) + p2) + ..., which for P = 2 is also what a ring
// all-reduce gives (a + b == b + a in IEEE arithmetic). opguard's replay knobs
// `tp=P,reduce=sequential` compute the same decomposition of the unsplit op.
// It calls ATen's linear, one operator, as Python's F.linear does (the C++
// frontend's Linear module records t, matmul and add_ instead), so that both
// programs' down-projection is the one op a bisect replays.
torch::Tensor row_parallel_linear(const torch::Tensor& x, torch::nn::Linear& layer, int64_t tp) {
  if (tp <= 1) return torch::linear(x, layer->weight, layer->bias);
  const auto xs = torch::tensor_split(x, tp, -1);
  const auto ws = torch::tensor_split(layer->weight, tp, 1);
  torch::Tensor sum = torch::linear(xs[0], ws[0]);
  for (int64_t r = 1; r < tp; ++r) sum = sum + torch::linear(xs[r], ws[r]);
  return sum + layer->bias;
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  // Skipped entirely at p = 0 (both programs) so that the default op stream has no random ops.
  return p > 0.0 ? torch::dropout(x, p, training) : x;
}

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const ModelConfig& c)
      : q(register_module("q", torch::nn::Linear(c.width, c.width))),
        k(register_module("k", torch::nn::Linear(c.width, c.width))),
        v(register_module("v", torch::nn::Linear(c.width, c.width))),
        proj(register_module("proj", torch::nn::Linear(c.width, c.width))),
        heads(c.heads),
        dropout(c.dropout),
        sdpa(c.sdpa),
        // A plain member, not a buffer: Module::to(dtype) would turn a bool buffer into floats.
        mask(torch::triu(torch::ones({c.seq, c.seq}, torch::kBool), 1)) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    torch::Tensor qh, kh, vh;
    { opguard::Scope s("q"); qh = q(x); }
    qh = qh.view({B, T, heads, D}).transpose(1, 2);
    { opguard::Scope s("k"); kh = k(x); }
    kh = kh.view({B, T, heads, D}).transpose(1, 2);
    { opguard::Scope s("v"); vh = v(x); }
    vh = vh.view({B, T, heads, D}).transpose(1, 2);
    torch::Tensor y;
    if (sdpa) {
      y = at::scaled_dot_product_attention(qh, kh, vh, /*attn_mask=*/{}, is_training() ? dropout : 0.0,
                                           /*is_causal=*/true);
    } else {
      auto att = torch::matmul(qh, kh.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
      att = att.masked_fill(mask, -std::numeric_limits<double>::infinity());
      att = torch::softmax(att, -1);
      att = maybe_dropout(att, dropout, is_training());
      y = torch::matmul(att, vh);
    }
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    { opguard::Scope s("proj"); y = proj(y); }
    return maybe_dropout(y, dropout, is_training());
  }

  torch::nn::Linear q, k, v, proj;
  int64_t heads;
  double dropout;
  bool sdpa;
  torch::Tensor mask;
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const ModelConfig& c)
      : fc(register_module("fc", torch::nn::Linear(c.width, 4 * c.width))),
        proj(register_module("proj", torch::nn::Linear(4 * c.width, c.width))),
        dropout(c.dropout),
        tp(c.tp) {}

  torch::Tensor forward(torch::Tensor x) {
    { opguard::Scope s("fc"); x = fc(x); }
    x = torch::gelu(x);
    { opguard::Scope s("proj"); x = row_parallel_linear(x, proj, tp); }
    return maybe_dropout(x, dropout, is_training());
  }

  torch::nn::Linear fc, proj;
  double dropout;
  int64_t tp;
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const ModelConfig& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        mlp(register_module("mlp", Mlp(c))) {}

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h;
    { opguard::Scope s("ln1"); h = ln1(x); }
    { opguard::Scope s("attn"); h = attn(h); }
    x = x + h;
    { opguard::Scope s("ln2"); h = ln2(x); }
    { opguard::Scope s("mlp"); h = mlp(h); }
    return x + h;
  }

  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  Mlp mlp;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const ModelConfig& c)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab_size, c.width))),
        wpe(register_module("wpe", torch::nn::Embedding(c.seq, c.width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        dropout(c.dropout) {
    for (int64_t i = 0; i < c.depth; ++i) {
      block_list.push_back(Block(c));
      blocks->push_back(block_list.back());
    }
    // Tied: no head module, so the shared weight is one parameter (as Python's
    // named_parameters() deduplicates it) and AdamW updates it once.
    if (!c.tied) {
      head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab_size).bias(false)));
    }
    loss = register_module("loss", torch::nn::CrossEntropyLoss());
  }

  // Returns the mean cross-entropy of predicting targets from idx (both batch x seq).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    const int64_t T = idx.size(1);
    torch::Tensor tok, pos_emb;
    { opguard::Scope s("wte"); tok = wte(idx); }
    // The device only off the CPU: the CPU op stream stays as it was recorded before --device.
    auto pos = idx.is_cpu() ? torch::arange(T, torch::kLong) : torch::arange(T, torch::dtype(torch::kLong).device(idx.device()));
    { opguard::Scope s("wpe"); pos_emb = wpe(pos); }
    auto x = maybe_dropout(tok + pos_emb, dropout, is_training());
    for (std::size_t i = 0; i < block_list.size(); ++i) {
      opguard::Scope s("blocks." + std::to_string(i));
      x = block_list[i](x);
    }
    { opguard::Scope s("ln_f"); x = ln_f(x); }
    torch::Tensor logits;
    {
      opguard::Scope s("head");
      // The functional form is what torch::nn::Linear calls, so tied and untied record the same ops.
      logits = head ? head(x) : torch::nn::functional::linear(x, wte->weight);
    }
    auto flat_logits = logits.view({-1, logits.size(-1)});
    auto flat_targets = targets.view({-1});
    opguard::Scope s("loss");
    return loss(flat_logits, flat_targets);
  }

  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList blocks;
  std::vector<Block> block_list;  // the same modules as `blocks`, typed
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head{nullptr};
  torch::nn::CrossEntropyLoss loss{nullptr};
  double dropout;
};
TORCH_MODULE(Gpt);

// GPT-2 style: biases 0, LayerNorm gains 1, other weights N(0, 0.02), drawn in
// named_parameters() order from torch's generator (in float32, before the cast).
void init_parameters(Gpt& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_bias) p.zero_();
    else if (p.dim() == 1) p.fill_(1.0);
    else p.normal_(0.0, 0.02);
  }
}

void write_parameters(Gpt& model, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw UsageError("cannot write --out-params '" + path + "': " + std::strerror(errno));
  for (const auto& p : model->parameters()) {
    const torch::Tensor t = p.is_cpu() ? p.detach().contiguous() : p.detach().cpu().contiguous();
    const auto n = static_cast<std::size_t>(t.numel());
    if (std::fwrite(t.data_ptr(), t.element_size(), n, f) != n) {
      std::fclose(f);
      throw UsageError("short write to --out-params '" + path + "'");
    }
  }
  if (std::fclose(f) != 0) throw UsageError("cannot finish writing --out-params '" + path + "'");
}

uint32_t float_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// This program links the CPU libtorch only (so does every opguard binary);
// --device cuda loads libtorch_cuda.so from beside it, whose initialisers
// register the CUDA kernels and hooks, as `import torch` does in Python.
void load_torch_cuda() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) == 0 || info.dli_fname == nullptr) return;
  const std::string cpu = info.dli_fname;
  const std::string lib = cpu.substr(0, cpu.rfind('/') + 1) + "libtorch_cuda.so";
  if (dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw UsageError("--device cuda: this libtorch has no CUDA (" + std::string(why ? why : lib) + ")");
  }
}

int run(const Options& o) {
  if (o.threads > 0) torch::set_num_threads(static_cast<int>(o.threads));
  at::globalContext().setUserEnabledMkldnn(o.mkldnn);
  torch::manual_seed(o.seed);
  const Corpus corpus = load_corpus(o.corpus);
  if (static_cast<int64_t>(corpus.tokens.size()) < o.seq + 2) {
    throw UsageError("the corpus '" + o.corpus + "' is shorter than --seq + 2 characters");
  }
  if (o.tp > 4 * o.width) throw UsageError("--tp (" + std::to_string(o.tp) + ") exceeds the MLP's 4 x --width features");
  const ModelConfig config{corpus.vocab_size, o.width, o.depth, o.heads, o.seq, o.tied, o.dropout, o.tp, o.sdpa};
  Gpt model(config);
  init_parameters(model);
  model->to(o.dtype);
  const torch::Device device(o.device);
  if (!device.is_cpu()) {
    load_torch_cuda();
    if (!torch::cuda::is_available()) throw UsageError("--device " + o.device + ": torch sees no CUDA device");
    model->to(device);
    for (auto& block : model->block_list) block->attn->mask = block->attn->mask.to(device);
  }
  model->train();
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  std::fprintf(stderr, "tiny_gpt: vocab %lld, %lld parameters, dtype %s, %d threads\n",
               static_cast<long long>(corpus.vocab_size), static_cast<long long>(n_params),
               o.dtype_name.c_str(), torch::get_num_threads());

  BatchSampler sampler(o.seed);
  std::vector<int64_t> inputs, targets;
  uint32_t last_bits = 0;
  double first_ms = 0, rest_ms = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    sampler.next(corpus, o.batch, o.seq, inputs, targets);
    auto x = torch::from_blob(inputs.data(), {o.batch, o.seq}, torch::kLong).clone();
    auto y = torch::from_blob(targets.data(), {o.batch, o.seq}, torch::kLong).clone();
    if (!device.is_cpu()) {
      x = x.to(device);
      y = y.to(device);
    }
    auto loss = model->forward(x, y);
    // Read every step, printed or not, so that --print-every does not change the op stream.
    const float loss_value = loss.detach().to(torch::kFloat32).item<float>();
    loss.backward();
    {
      opguard::PhaseScope p(opguard::PhaseScope::kOptimizer);
      optimizer.step();
      optimizer.zero_grad();
    }
    opguard::mark_step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    (step == 0 ? first_ms : rest_ms) += ms;
    last_bits = float_bits(loss_value);
    if (o.print_every > 0 && step % o.print_every == 0) {
      std::printf("step %lld loss %.6f bits %08x\n", static_cast<long long>(step),
                  static_cast<double>(loss_value), last_bits);
      std::fflush(stdout);
    }
  }
  std::printf("final loss bits %08x\n", last_bits);
  std::fflush(stdout);
  std::fprintf(stderr, "tiny_gpt: step 0 %.1f ms, steps 1..%lld mean %.1f ms\n", first_ms,
               static_cast<long long>(o.steps - 1), o.steps > 1 ? rest_ms / static_cast<double>(o.steps - 1) : 0.0);
  if (!o.out_params.empty()) write_parameters(model, o.out_params);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_options(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tiny_gpt: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiny_gpt: %s\n", e.what());
    return 1;
  }
}
