// main.cpp: the `finetune` program: fine-tunes all-MiniLM-L6-v2 (a pretrained BERT) on the
// task "which Jane Austen novel is this passage from?" (six classes), on the CPU.
//
// What it does: (1) the baseline: the frozen encoder's sentence embeddings (computed once under
// NoGradGuard) with a linear head trained by AdamW on them, and its test accuracy; (2) fine-tunes
// the whole model (encoder + that head) with AdamW, linear warm-up then linear decay, cross
// entropy, printing step, loss, lr, tokens/s and ETA; (3) the test accuracy again; (4) saves a
// safetensors checkpoint (model + optimizer state + step) that `--resume` continues exactly
// (bit for bit): the batch order is a function of (seed, step), every dropout mask of
// (seed, step), and the schedule of the step. Fine-tuning starts from the baseline's head
// (linear probing, then fine-tuning), so the gain over the baseline is the encoder's.
// `--bench-forward` instead times the encoder's forward (sentences/s), `--bench-train` a training
// step (ms per step, tokens/s, peak device memory).
// Data parallelism: `--nproc N` starts N processes of this program (torchrun's variables: RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); a process started so (by it or by any
// launcher that sets WORLD_SIZE) joins a taper::dist group (NCCL on GPUs, cuda:LOCAL_RANK; TCP
// on the CPU), takes its share of each global batch (rows split as evenly as they go, each
// rank's loss weighted by its share, so the averaged gradient is the global batch's), and
// averages gradients with nn::DistributedDataParallel. Rank 0 logs and writes checkpoints; a
// checkpoint resumes on any N (the batch order is global). Without WORLD_SIZE nothing changes.
// What it is not: a general trainer; the task, the model and the head are fixed here.
// Shape letters: B batch, T tokens, E hidden size, C classes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "examples/finetune/bert.h"
#include "examples/finetune/data.h"
#include "examples/finetune/tokenizer.h"
#include "taper/dist.h"
#include "taper/nn/ddp.h"
#include "taper/nn/loss.h"
#include "taper/nn/optim.h"
#include "taper/nn/safetensors.h"
#include "taper/taper.h"

namespace fs = std::filesystem;
using namespace taper;
using namespace taper::finetune;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kFormat = "taper-finetune-austen-v1";

// ---- flags ---------------------------------------------------------------------------------------

struct Flags {
  std::string device = "cpu";
  std::string dtype = "f32";
  int64_t steps = 200;
  size_t batch = 16;
  size_t seq_len = 64;
  double lr = 3e-4;
  double weight_decay = 0.01;
  double warmup = 0.1;
  double dropout = 0.0;
  size_t threads = 0;  // 0: TAPER_NUM_THREADS or all cores
  uint64_t seed = 1;
  std::string out;  // empty: <repo>/build/finetune/checkpoint.safetensors
  std::string resume;
  std::string model_dir;
  std::string data_dir;
  int64_t log_every = 10;
  int64_t save_every = 0;
  int64_t stop_after = 0;  // 0: run to --steps
  int64_t probe_steps = 200;
  double probe_lr = 3e-3;
  size_t probe_train = 0;  // 0: steps * batch, the fine-tuning's label budget
  size_t eval_batch = 64;
  size_t words = 48;
  size_t test_limit = 0;  // 0: the whole test set
  bool bench_forward = false;
  bool bench_train = false;
  size_t nproc = 0;  // 0: this process alone (or as a launcher's rank)
  // auto: on for a CUDA run without dropout or processes (run 24 ran the main job with it).
  std::string cuda_graph = "auto";
  std::set<std::string> given;  // flags set on the command line
};

const char* kUsage = R"(usage: finetune [flags]
Fine-tunes all-MiniLM-L6-v2 to tell which of Jane Austen's six novels a passage comes from:
first a baseline (frozen encoder + trained linear head), then the whole model.

  --device cpu|cuda|auto  where to run (default cpu; auto: the GPU when one is present)
  --dtype f32|bf16      model dtype (default f32; the head stays f32)
  --steps N             fine-tuning steps (default 200)
  --batch N             passages per step (default 16)
  --seq-len N           tokens per passage incl. [CLS]/[SEP] (default 64)
  --lr X                peak learning rate of the fine-tuning (default 3e-4)
  --weight-decay X      AdamW weight decay, not on biases and norms (default 0.01)
  --warmup X            fraction of steps of linear warm-up (default 0.1)
  --dropout X           hidden dropout while fine-tuning (default 0: off)
  --threads N           CPU threads (default: TAPER_NUM_THREADS, else all cores)
  --seed N              seed of the head, the batch order and dropout (default 1)
  --out PATH            checkpoint written at the end (default
                        <repo>/build/finetune/checkpoint.safetensors)
  --save-every N        also write the checkpoint every N steps (default 0: only at the end)
  --stop-after N        stop after N steps of this invocation, save, and exit (continue later
                        with --resume; the schedule still spans --steps)
  --resume PATH         continue from a checkpoint of this program (exactly)
  --model-dir DIR       all-MiniLM-L6-v2 (default .models/all-MiniLM-L6-v2)
  --data-dir DIR        janeaustenr's data folder (default .data/janeaustenr/usr/lib/R/site-library/janeaustenr/data)
  --log-every N         progress line every N steps (default 10)
  --probe-steps N       full-batch AdamW steps of the baseline's head (default 200)
  --probe-lr X          learning rate of the baseline's head (default 3e-3)
  --probe-train N       train passages embedded for the baseline (default: steps x batch,
                        as many labelled passages as the fine-tuning sees)
  --eval-batch N        passages per forward when embedding/evaluating (default 64)
  --words N             words per passage (default 48)
  --test-limit N        evaluate only the first N test passages (default 0: all; quick runs)
  --bench-forward       only time the encoder forward (mean pooling included) at --batch x
                        --seq-len (here 32 x 128 unless given), median of 5 runs (--steps N:
                        N runs), and print sentences/s
  --bench-train         only time training steps (forward, backward, AdamW; the model's
                        weights, random token ids and labels) at --batch x --seq-len, median
                        of 20 steps after 3 warm-up steps (--steps N: N steps), and print ms
                        per step, tokens/s, the step's peak device memory, its kernel
                        calls and a per-op profile of two more steps
  --cuda-graph auto|on|off
                        replay each training step's forward and backward as one CUDA graph
                        (captured at the second step; batches padded to --seq-len so that
                        every step has one shape; AdamW runs after it, in place; the first
                        replay is checked bit for bit against the eager step). auto: on with
                        --device cuda unless --dropout or --nproc is set, eager again if the
                        check fails; on: a failed check is an error; off: eager steps, the
                        smallest footprint (the graph keeps its step's tensors in a pool of
                        its own: 650 against 412 MiB at 16 x 64 f32). Default auto
  --nproc N             data parallelism: start N processes of this program (one per GPU
                        with --device cuda, cuda:0..N-1; threads split between them on the
                        CPU), each with 1/N of every batch; rank 0 logs and checkpoints.
                        A process that finds WORLD_SIZE set (torchrun's variables) joins
                        such a job by itself
  --help                this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "finetune: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error("flag " + arg + " needs a value");
      return argv[++i];
    };
    auto to_u64 = [&](const std::string& v) -> uint64_t {
      char* end = nullptr;
      errno = 0;
      const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-')
        usage_error("flag " + arg + " needs a non-negative integer, got '" + v + "'");
      return x;
    };
    auto to_f64 = [&](const std::string& v) -> double {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0)
        usage_error("flag " + arg + " needs a non-negative number, got '" + v + "'");
      return x;
    };
    f.given.insert(arg);
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (arg == "--device") f.device = next();
    else if (arg == "--dtype") f.dtype = next();
    else if (arg == "--steps") f.steps = static_cast<int64_t>(to_u64(next()));
    else if (arg == "--batch") f.batch = to_u64(next());
    else if (arg == "--seq-len") f.seq_len = to_u64(next());
    else if (arg == "--lr") f.lr = to_f64(next());
    else if (arg == "--weight-decay") f.weight_decay = to_f64(next());
    else if (arg == "--warmup") f.warmup = to_f64(next());
    else if (arg == "--dropout") f.dropout = to_f64(next());
    else if (arg == "--threads") f.threads = to_u64(next());
    else if (arg == "--seed") f.seed = to_u64(next());
    else if (arg == "--out") f.out = next();
    else if (arg == "--save-every") f.save_every = static_cast<int64_t>(to_u64(next()));
    else if (arg == "--stop-after") f.stop_after = static_cast<int64_t>(to_u64(next()));
    else if (arg == "--resume") f.resume = next();
    else if (arg == "--model-dir") f.model_dir = next();
    else if (arg == "--data-dir") f.data_dir = next();
    else if (arg == "--log-every") f.log_every = static_cast<int64_t>(to_u64(next()));
    else if (arg == "--probe-steps") f.probe_steps = static_cast<int64_t>(to_u64(next()));
    else if (arg == "--probe-lr") f.probe_lr = to_f64(next());
    else if (arg == "--probe-train") f.probe_train = to_u64(next());
    else if (arg == "--eval-batch") f.eval_batch = to_u64(next());
    else if (arg == "--words") f.words = to_u64(next());
    else if (arg == "--test-limit") f.test_limit = to_u64(next());
    else if (arg == "--bench-forward") f.bench_forward = true;
    else if (arg == "--bench-train") f.bench_train = true;
    else if (arg == "--nproc") f.nproc = to_u64(next());
    else if (arg == "--cuda-graph") f.cuda_graph = next();
    else usage_error("unknown flag '" + arg + "'");
    if (has_value && arg == "--bench-forward") usage_error("--bench-forward takes no value");
    if (has_value && arg == "--bench-train") usage_error("--bench-train takes no value");
  }
  if (f.device != "cpu" && f.device != "cuda" && f.device != "auto")
    usage_error("--device must be cpu, cuda or auto, got '" + f.device + "'");
  if (f.dtype != "f32" && f.dtype != "bf16") usage_error("--dtype must be f32 or bf16, got '" + f.dtype + "'");
  if (f.batch == 0) usage_error("--batch must be > 0");
  if (f.seq_len < 3 || f.seq_len > 512) usage_error("--seq-len must be in [3, 512]");
  if (f.warmup > 1) usage_error("--warmup is a fraction of the steps, in [0, 1]");
  if (f.dropout >= 1) usage_error("--dropout must be in [0, 1)");
  if (f.cuda_graph != "auto" && f.cuda_graph != "on" && f.cuda_graph != "off")
    usage_error("--cuda-graph must be auto, on or off, got '" + f.cuda_graph + "'");
  if (f.log_every == 0) f.log_every = 1;
  if (f.eval_batch == 0) usage_error("--eval-batch must be > 0");
  if (f.words == 0) usage_error("--words must be > 0");
  if (f.given.count("--nproc") && (f.nproc == 0 || f.nproc > 1024))
    usage_error("--nproc must be in [1, 1024]");
  if (f.nproc > 0 && dist::Env::launched())
    usage_error("--nproc starts the processes itself: WORLD_SIZE is already set (a launcher "
                "started this process); drop one of the two");
  return f;
}

// The repository root: the nearest folder at or above the current one that holds
// scripts/fetch_model.sh, else the source tree this program was built from.
fs::path repo_root() {
  for (fs::path p = fs::current_path();; p = p.parent_path()) {
    if (fs::exists(p / "scripts/fetch_model.sh")) return p;
    if (p == p.parent_path()) break;
  }
#ifdef TAPER_SOURCE_DIR
  return fs::path(TAPER_SOURCE_DIR);
#else
  return fs::current_path();
#endif
}

/// The device of --device; a GPU is cuda:LOCAL_RANK (cuda:0 without a launcher).
Device pick_device(const std::string& name, int local_rank) {
  if (name == "cpu") return Device::cpu();
  if (name == "auto" && !device_available(DeviceKind::Cuda)) return Device::cpu();
  try {
    device_backend(DeviceKind::Cuda);
  } catch (const Error&) {
    throw Error("--device cuda: this build has no CUDA backend (configure with -DTAPER_CUDA=ON "
                "on a machine with nvcc)");
  }
  TAPER_CHECK(device_available(DeviceKind::Cuda), "--device cuda: no CUDA device is available");
  TAPER_CHECK(local_rank < device_count(DeviceKind::Cuda), "--device ", name, ": LOCAL_RANK ",
              local_rank, " names cuda:", local_rank, ", but this host has ",
              device_count(DeviceKind::Cuda), " GPU(s)");
  return Device::cuda(local_rank);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string hms(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- the model: encoder + linear head -------------------------------------------------------------

/// logits = head(sqrt(E) * normalised sentence embedding). The fixed sqrt(E) scale gives the
/// head unit-variance inputs (the embedding has norm 1), so one learning rate suits it.
class Classifier : public nn::Module {
 public:
  Classifier(const BertConfig& config, DType dtype, size_t classes) : Module("Classifier") {
    bert = register_module("bert", std::make_shared<BertModel>(config, dtype));
    head = register_module("head", std::make_shared<nn::Linear>(config.hidden_size, classes));
    scale_ = std::sqrt(static_cast<double>(config.hidden_size));
  }
  /// Sentence embeddings in f32. ids, mask: (B, T) -> (B, E).
  Tensor embed(const Tensor& ids, const Tensor& mask) {
    return bert->encode(ids, mask).to_dtype(DType::F32);
  }
  /// emb: (B, E) f32 -> logits (B, C).
  Tensor classify(const Tensor& emb) { return head->forward(emb * scale_); }

  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Linear> head;

 private:
  double scale_ = 1.0;
};

// ---- batches ---------------------------------------------------------------------------------------

struct Batch {
  Tensor ids, mask, labels;  // (B, T) u32, (B, T) u8, (B) i64
  size_t tokens = 0;         // B * T (padded tokens processed)
};

class Batcher {
 public:
  Batcher(const WordPieceTokenizer& tok, const std::vector<Passage>& passages, size_t seq_len,
          Device dev)
      : tok_(tok), passages_(passages), seq_len_(seq_len), dev_(dev), cache_(passages.size()) {}
  /// Pads every batch to seq_len (one shape for a captured graph) instead of its longest row.
  void pad_to_seq_len(bool on) { pad_full_ = on; }

  Batch make(const std::vector<size_t>& idx) {
    std::vector<std::string> texts;
    std::vector<int64_t> labels;
    size_t t = pad_full_ ? seq_len_ : 2;
    for (size_t i : idx) {
      if (cache_[i].ids.empty()) cache_[i] = tok_.encode(passages_[i].text, seq_len_, /*pad=*/false);
      t = std::max(t, cache_[i].length);
      labels.push_back(passages_[i].label);
    }
    // Padded to the longest row of the batch: no work on padding when passages are short.
    const size_t b = idx.size();
    std::vector<uint32_t> ids(b * t, tok_.pad_id());
    std::vector<uint8_t> mask(b * t, 0);
    for (size_t r = 0; r < b; ++r) {
      const Encoding& e = cache_[idx[r]];
      for (size_t j = 0; j < e.length; ++j) {
        ids[r * t + j] = e.ids[j];
        mask[r * t + j] = 1;
      }
    }
    Batch out;
    out.ids = Tensor::from_vector(ids, Shape({b, t}), dev_);
    out.mask = Tensor::from_vector(mask, Shape({b, t}), dev_);
    out.labels = Tensor::from_vector(labels, Shape({b}), dev_);
    out.tokens = b * t;
    return out;
  }

 private:
  const WordPieceTokenizer& tok_;
  const std::vector<Passage>& passages_;
  size_t seq_len_;
  Device dev_;
  std::vector<Encoding> cache_;
  bool pad_full_ = false;
};

// ---- the training step as a CUDA graph -------------------------------------------------------------

/// A training step's forward and backward replayed as one CUDA graph (--cuda-graph). The first
/// step runs eagerly: AdamW makes its state and the libraries set themselves up outside the
/// capture. The second is captured, then replayed; every later one copies its batch into the
/// static inputs and replays. The loss it returns is the graph's output, rewritten by each
/// replay. The optimizer runs after it, eagerly, and must update the parameters in place: a
/// parameter that moved to new storage is an Error (the graph would read stale weights).
/// The same batch also runs eagerly just before the capture, and the replay must give its loss
/// and every gradient bit for bit. That eager step's results wait on the host, so its device
/// memory is free again while the graph's pool fills; and the last step's loss and gradients are
/// dropped before the capture, since a block freed during a capture joins the graph's pool for
/// good. When the capture fails or the bits differ, `strict`
/// (--cuda-graph on) makes that an Error; otherwise the run says so and goes on eagerly.
class GraphedStep {
 public:
  GraphedStep(Device dev, bool strict) : dev_(dev), strict_(strict) {}

  /// One training step on `b`: `loss_of(ids, mask, labels)` is the loss; `opt` steps on its
  /// gradients. Returns the loss.
  template <class F> Tensor train(const Batch& b, nn::Optimizer& opt, F&& loss_of) {
    const Tensor loss = run(b, opt.parameters(), loss_of);
    opt.step(grads_);
    check_params(opt.parameters());
    return loss;
  }

 private:
  template <class F> Tensor run(const Batch& b, const std::vector<Var>& params, F&& loss_of) {
    if (!ids_.defined()) {
      ids_ = Tensor::empty(b.ids.shape(), b.ids.dtype(), dev_);
      mask_ = Tensor::empty(b.mask.shape(), b.mask.dtype(), dev_);
      labels_ = Tensor::empty(b.labels.shape(), b.labels.dtype(), dev_);
    }
    TAPER_CHECK(b.ids.shape() == ids_.shape(), "--cuda-graph: a batch of shape ",
                b.ids.shape().to_string(), " after ", ids_.shape().to_string(),
                ": a captured step replays one shape");
    ids_.copy_from(b.ids);
    mask_.copy_from(b.mask);
    labels_.copy_from(b.labels);
    auto eager = [&] {
      const Tensor l = loss_of(ids_, mask_, labels_);
      return std::pair<Tensor, GradStore>(l, l.backward());
    };
    if (calls_++ == 0 || eager_) {
      std::tie(loss_, grads_) = eager();
    } else if (graph_.captured()) {
      graph_.replay();
    } else {
      at_.clear();
      for (const Var& p : params) at_.push_back(p.data_ptr());
      // The check's reference: this batch eagerly, its loss and gradients kept on the host.
      std::vector<Tensor> want;
      {
        const auto [le, ge] = eager();
        want = on_host(le, ge, params);
      }
      loss_ = Tensor();
      grads_ = GradStore();
      std::string failed;
      try {
        graph_.capture(dev_, [&] { std::tie(loss_, grads_) = eager(); });
      } catch (const Error& e) {
        failed = std::string("the capture failed: ") + e.what();
      }
      if (failed.empty()) {  // the replay must give the eager step's bits
        graph_.replay();
        failed = first_difference(want, on_host(loss_, grads_, params), params);
      }
      if (!failed.empty()) {
        TAPER_CHECK(!strict_, "--cuda-graph on: ", failed);
        std::printf("cuda-graph: %s; the run goes on without a graph\n", failed.c_str());
        eager_ = true;
        graph_ = cuda::Graph();
        std::tie(loss_, grads_) = eager();
      } else {
        std::printf("cuda-graph: the step's forward and backward captured (%.1f MiB of device "
                    "memory held for it) and checked bit for bit against the eager step; each "
                    "later step replays them in one launch\n",
                    static_cast<double>(graph_.pool_bytes()) / (1 << 20));
      }
      std::fflush(stdout);
    }
    return loss_;
  }

  /// The loss, then each parameter's gradient (undefined where it has none), contiguous on
  /// the host.
  static std::vector<Tensor> on_host(const Tensor& loss, const GradStore& grads,
                                     const std::vector<Var>& params) {
    std::vector<Tensor> r = {loss.to_device(Device::cpu()).contiguous()};
    for (const Var& p : params) {
      const std::optional<Tensor> g = grads.get(p);
      r.push_back(g ? g->to_device(Device::cpu()).contiguous() : Tensor());
    }
    return r;
  }

  /// "" when the replay's loss and gradients (on_host) are the eager step's bits, else what
  /// differs.
  static std::string first_difference(const std::vector<Tensor>& want,
                                      const std::vector<Tensor>& got,
                                      const std::vector<Var>& params) {
    auto same = [](const Tensor& a, const Tensor& b) {
      if (a.defined() != b.defined()) return false;
      if (!a.defined()) return true;
      return a.shape() == b.shape() && a.dtype() == b.dtype() &&
             std::memcmp(a.data_ptr(), b.data_ptr(), a.elem_count() * dtype_size(a.dtype())) == 0;
    };
    if (!same(want[0], got[0])) return "the replayed loss differs from the eager step's";
    for (size_t i = 0; i < params.size(); ++i)
      if (!same(want[i + 1], got[i + 1]))
        return detail::str_cat("the replayed gradient of parameter ", i, " ",
                               params[i].shape().to_string(), " differs from the eager step's");
    return "";
  }

  /// Throws unless every parameter is where the capture read it.
  void check_params(const std::vector<Var>& params) const {
    if (!graph_.captured()) return;
    for (size_t i = 0; i < params.size() && i < at_.size(); ++i)
      TAPER_CHECK(params[i].data_ptr() == at_[i], "--cuda-graph: parameter ", i, " ",
                  params[i].shape().to_string(), " moved to new storage after the capture "
                  "(the optimizer could not update it in place): the graph would read stale "
                  "weights; run with --cuda-graph off");
  }

  Device dev_;
  bool strict_;
  bool eager_ = false;  ///< the graph failed its check: every step runs eagerly
  Tensor ids_, mask_, labels_, loss_;
  GradStore grads_;
  cuda::Graph graph_;
  std::vector<const void*> at_;
  int64_t calls_ = 0;
};

/// Whether --cuda-graph applies: an Error where "on" cannot work.
bool use_cuda_graph(const Flags& f, Device dev, bool distributed) {
  if (f.cuda_graph == "off") return false;
  const bool on = f.cuda_graph == "on";
  const char* why = !dev.is_cuda()      ? "the device is not a GPU"
                    : f.dropout > 0.0   ? "--dropout draws a new mask each step (a replay would "
                                          "repeat one)"
                    : distributed       ? "data parallelism's collectives run outside the graph"
                                        : nullptr;
  TAPER_CHECK(!on || !why, "--cuda-graph on: ", why ? why : "");
  return !why;
}

/// Sentence embeddings (N, E) f32 of `idx` under NoGradGuard, in eval mode.
Tensor embed_all(Classifier& model, Batcher& batcher, const std::vector<size_t>& idx,
                 size_t eval_batch) {
  NoGradGuard ng;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<Tensor> parts;
  for (size_t s = 0; s < idx.size(); s += eval_batch) {
    const std::vector<size_t> sub(idx.begin() + s, idx.begin() + std::min(idx.size(), s + eval_batch));
    const Batch b = batcher.make(sub);
    parts.push_back(model.embed(b.ids, b.mask));
  }
  model.train(was_training);
  return Tensor::cat(parts, 0);
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  const std::vector<int64_t> pred = logits.argmax(-1).to_vector<int64_t>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  size_t ok = 0;
  for (size_t i = 0; i < y.size(); ++i) ok += pred[i] == y[i];
  return y.empty() ? 0.0 : static_cast<double>(ok) / static_cast<double>(y.size());
}

Tensor labels_of(const std::vector<Passage>& ps, const std::vector<size_t>& idx, Device dev) {
  std::vector<int64_t> y;
  for (size_t i : idx) y.push_back(ps[i].label);
  return Tensor::from_vector(y, Shape({y.size()}), dev);
}

/// Indices of the evaluated test passages.
std::vector<size_t> test_indices(const Corpus& c, const Flags& f) {
  const size_t n = f.test_limit ? std::min(f.test_limit, c.test.size()) : c.test.size();
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

/// Parameter groups: weight decay on matrices (and embeddings), none on biases and norms.
std::vector<nn::ParamGroup> param_groups(const nn::Module& m) {
  nn::ParamGroup decay, no_decay;
  no_decay.weight_decay = 0.0;
  for (const auto& [name, p] : m.named_parameters()) {
    const bool vector_param = p.rank() < 2;
    (vector_param ? no_decay : decay).params.push_back(p);
  }
  return {decay, no_decay};
}

// ---- checkpoints -----------------------------------------------------------------------------------

std::map<std::string, std::string> checkpoint_metadata(const Flags& f, int64_t step,
                                                       double baseline_acc, size_t classes) {
  return {{"format", kFormat},
          {"base_model", "all-MiniLM-L6-v2"},
          {"classes", std::to_string(classes)},
          {"step", std::to_string(step)},
          {"steps", std::to_string(f.steps)},
          {"batch", std::to_string(f.batch)},
          {"seq_len", std::to_string(f.seq_len)},
          {"lr", fmt("%.17g", f.lr)},
          {"weight_decay", fmt("%.17g", f.weight_decay)},
          {"warmup", fmt("%.17g", f.warmup)},
          {"dropout", fmt("%.17g", f.dropout)},
          {"seed", std::to_string(f.seed)},
          {"dtype", f.dtype},
          {"words", std::to_string(f.words)},
          {"baseline_accuracy", fmt("%.17g", baseline_acc)}};
}

void save_checkpoint(const std::string& path, Classifier& model, const nn::Optimizer& opt,
                     const Flags& f, int64_t step, double baseline_acc, size_t classes) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [k, t] : model.state_dict()) tensors.emplace_back("model." + k, t.to_device(Device::cpu()));
  for (auto& [k, t] : opt.state_dict()) tensors.emplace_back("optim." + k, t.to_device(Device::cpu()));
  tensors.emplace_back("train.step", Tensor::from_vector(std::vector<int64_t>{step}, Shape({1})));
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  safetensors::save(tensors, path, checkpoint_metadata(f, step, baseline_acc, classes));
}

/// Reads a checkpoint's run settings into `f` (flags given on the command line win, with a
/// warning where that breaks exactness). Throws for a file that is not this program's.
safetensors::File open_checkpoint(Flags& f) {
  TAPER_CHECK(fs::exists(f.resume), "--resume: checkpoint ", f.resume, " not found");
  safetensors::File file = safetensors::File::open(f.resume);
  const auto& md = file.metadata();
  auto it = md.find("format");
  TAPER_CHECK(it != md.end() && it->second == kFormat, "--resume: ", f.resume,
              " is not a checkpoint of this program (metadata format '",
              it == md.end() ? std::string("none") : it->second, "', expected '", kFormat,
              "'): a checkpoint of another model or task cannot be resumed");
  auto get = [&](const char* k) {
    auto j = md.find(k);
    TAPER_CHECK(j != md.end(), "--resume: ", f.resume, " lacks the metadata entry '", k, "'");
    return j->second;
  };
  auto adopt = [&](const char* flag, const char* key, auto& field, auto parse) {
    const auto saved = parse(get(key));
    if (!f.given.count(flag)) {
      field = saved;
    } else if (field != saved) {
      std::fprintf(stderr, "finetune: warning: %s differs from the checkpoint's (%s); the resumed "
                           "run will not match an uninterrupted one\n", flag, get(key).c_str());
    }
  };
  auto as_u = [](const std::string& s) { return static_cast<size_t>(std::stoull(s)); };
  auto as_i = [](const std::string& s) { return static_cast<int64_t>(std::stoll(s)); };
  auto as_u64 = [](const std::string& s) { return static_cast<uint64_t>(std::stoull(s)); };
  auto as_d = [](const std::string& s) { return std::stod(s); };
  adopt("--steps", "steps", f.steps, as_i);
  adopt("--batch", "batch", f.batch, as_u);
  adopt("--seq-len", "seq_len", f.seq_len, as_u);
  adopt("--lr", "lr", f.lr, as_d);
  adopt("--weight-decay", "weight_decay", f.weight_decay, as_d);
  adopt("--warmup", "warmup", f.warmup, as_d);
  adopt("--dropout", "dropout", f.dropout, as_d);
  adopt("--seed", "seed", f.seed, as_u64);
  adopt("--words", "words", f.words, as_u);
  const std::string dt = get("dtype");
  TAPER_CHECK(!f.given.count("--dtype") || dt == f.dtype, "--resume: ", f.resume,
              " was trained with --dtype ", dt, ", not ", f.dtype);
  f.dtype = dt;
  return file;
}

// ---- the phases ------------------------------------------------------------------------------------

/// Trains the head alone on cached frozen embeddings (full batch AdamW); returns test accuracy.
double baseline(Classifier& model, Batcher& train_b, Batcher& test_b, const Corpus& corpus,
                const Flags& f, Device dev) {
  const auto t0 = Clock::now();
  const size_t wanted = f.probe_train ? f.probe_train : static_cast<size_t>(f.steps) * f.batch;
  const size_t n_probe = std::min(std::max<size_t>(wanted, 1), corpus.train.size());
  // A seeded subset of the train set (epoch 0's order).
  const std::vector<size_t> probe_idx = BatchOrder(corpus.train.size(), f.seed ^ 0xba5eull).batch(0, n_probe);
  const std::vector<size_t> test_idx = test_indices(corpus, f);
  std::printf("baseline: embedding %zu train + %zu test passages with the frozen encoder\n",
              n_probe, test_idx.size());
  std::fflush(stdout);
  const Tensor x_train = embed_all(model, train_b, probe_idx, f.eval_batch);
  const Tensor x_test = embed_all(model, test_b, test_idx, f.eval_batch);
  const double t_embed = since(t0);
  const Tensor y_train = labels_of(corpus.train, probe_idx, dev);
  const Tensor y_test = labels_of(corpus.test, test_idx, dev);

  nn::AdamW opt(model.head->parameters(), nn::AdamWOptions(f.probe_lr).weight_decay(0.01));
  double loss = 0.0;
  for (int64_t s = 0; s < f.probe_steps; ++s) {
    const Tensor l = nn::cross_entropy(model.classify(x_train), y_train);
    GradStore g = l.backward();
    opt.step(g);
    loss = l.item();
  }
  double train_acc = 0.0, test_acc = 0.0;
  {
    NoGradGuard ng;
    train_acc = accuracy(model.classify(x_train), y_train);
    test_acc = accuracy(model.classify(x_test), y_test);
  }
  std::printf("baseline: head trained %lld steps (loss %.4f, train acc %.4f) in %.1f s "
              "(embedding %.1f s, %.1f passages/s)\n",
              static_cast<long long>(f.probe_steps), loss, train_acc, since(t0), t_embed,
              static_cast<double>(n_probe + test_idx.size()) / t_embed);
  std::printf("baseline: frozen encoder + linear head, test accuracy %.4f (%zu passages)\n",
              test_acc, test_idx.size());
  std::fflush(stdout);
  return test_acc;
}

/// Random token ids in the vocabulary's word range, (b, t) on dev: the cost does not depend on
/// the ids.
Tensor random_ids(size_t b, size_t t, uint64_t seed, Device dev) {
  const std::vector<float> r =
      Tensor::rand({b * t}, DType::F32, Device::cpu(), seed, 1000, 30000).to_vector<float>();
  const std::vector<uint32_t> ids(r.begin(), r.end());
  return Tensor::from_vector(ids, Shape({b, t}), dev);
}

/// Where the time of `run` goes: two more runs with every kernel call waited for and timed
/// (taper's op profile), the 16 slowest (op, dtype) rows per run.
template <class F> void print_op_profile(const char* who, const char* per, F&& run) {
  reset_op_profile();
  set_op_profiling(true);
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) run();
  const double per_run = since(t0) / 2;
  set_op_profiling(false);
  const std::vector<OpProfileRow> rows = op_profile();
  double in_ops = 0.0;
  for (const OpProfileRow& r : rows) in_ops += r.seconds / 2;
  std::printf("%s: per-op profile (each kernel call waited for): %.2f ms per %s, %.2f ms of it "
              "in the calls; the slowest:\n", who, 1e3 * per_run, per, 1e3 * in_ops);
  for (size_t i = 0; i < rows.size() && i < 16; ++i)
    std::printf("  %-26s %-5s %5.0f calls %8.3f ms per %s\n",
                std::string(op_name(rows[i].op)).c_str(),
                std::string(dtype_name(rows[i].dtype)).c_str(),
                static_cast<double>(rows[i].calls) / 2, 1e3 * rows[i].seconds / 2, per);
}

int bench_forward(const Flags& f, Device dev, DType dt, const fs::path& model_dir) {
  auto model = BertModel::from_pretrained(model_dir, dt);
  model->to(dev);
  model->eval();
  // sentence-transformers' usual benchmark shape unless --batch / --seq-len say otherwise.
  const size_t b = f.given.count("--batch") ? f.batch : 32;
  const size_t t = f.given.count("--seq-len") ? f.seq_len : 128;
  const Tensor x = random_ids(b, t, f.seed, dev);  // every token attended
  const Tensor m = Tensor::ones(Shape({b, t}), DType::U8, dev);
  NoGradGuard ng;
  auto run = [&] { return model->encode(x, m).to_vector<float>(); };
  run();  // warm-up: allocator cache, BLAS buffers
  const int reps = std::max(1, static_cast<int>(f.steps > 0 && f.given.count("--steps") ? f.steps : 5));
  std::vector<double> times;
  // Process CPU time too: on a shared machine the wall time also counts other programs' turns.
  const std::clock_t c0 = std::clock();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    run();
    times.push_back(since(t0));
  }
  const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / reps;
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  std::printf("bench-forward: MiniLM-L6 (%s, %s) batch %zu x seq %zu, %zu threads: median %.2f ms "
              "per batch over %d runs (min %.2f) -> %.1f sentences/s, %.0f tokens/s; process CPU "
              "time %.2f ms per batch\n",
              f.dtype.c_str(), dev.to_string().c_str(), b, t, taper::num_threads(), 1e3 * med,
              reps, 1e3 * times.front(), static_cast<double>(b) / med,
              static_cast<double>(b * t) / med, 1e3 * cpu_s);
  print_op_profile("bench-forward", "batch", run);
  return 0;
}

/// Times training steps of the classifier on the pretrained encoder: one step is the forward,
/// cross entropy, backward and AdamW, ending when the loss is on the host (so the device's work
/// of the step is done). Reports the median of --steps (default 20) after 3 warm-up steps, and
/// the most device memory live tensors held during one step.
int bench_train(const Flags& f, Device dev, DType dt, const fs::path& model_dir,
                const std::shared_ptr<dist::ProcessGroup>& group) {
  nn::manual_seed(f.seed);
  BertConfig config = BertConfig::from_json_file(model_dir / "config.json");
  config.hidden_dropout_prob = f.dropout;  // the fine-tuning run's step: --dropout, default off
  config.attention_probs_dropout_prob = 0.0;
  Classifier model(config, dt, 6);
  model.bert->load_pretrained(model_dir / "model.safetensors");
  model.to(dev);
  model.train();
  nn::AdamW opt(param_groups(model), nn::AdamWOptions(f.lr).weight_decay(f.weight_decay));
  // With a group, every rank runs --batch rows (a weak-scaling step) and averages gradients.
  std::optional<nn::DistributedDataParallel> ddp;
  if (group) ddp.emplace(model, group);
  const size_t world = group ? static_cast<size_t>(group->world_size()) : 1;
  const size_t b = f.batch, t = f.seq_len;
  const Tensor ids = random_ids(b, t, f.seed, dev);
  const Tensor mask = Tensor::ones(Shape({b, t}), DType::U8, dev);
  std::vector<int64_t> lab(b);
  for (size_t i = 0; i < b; ++i) lab[i] = static_cast<int64_t>(i % 6);
  const Tensor labels = Tensor::from_vector(lab, Shape({b}), dev);
  double host_s = 0.0;  // of the last step: until its last op was enqueued
  uint64_t calls = 0;   // kernel calls of the last step
  auto loss_of = [&](const Tensor& i, const Tensor& m, const Tensor& l) {
    return nn::cross_entropy(model.classify(model.embed(i, m)), l);
  };
  auto eager_step = [&] {
    const Tensor loss = loss_of(ids, mask, labels);
    GradStore g = ddp ? ddp->backward(loss) : loss.backward();
    opt.step(g);
    return loss;
  };
  std::optional<GraphedStep> graphed;
  if (use_cuda_graph(f, dev, group != nullptr)) graphed.emplace(dev, f.cuda_graph == "on");
  Batch batch;
  batch.ids = ids;
  batch.mask = mask;
  batch.labels = labels;
  auto step = [&] {
    const auto t0 = Clock::now();
    const uint64_t k0 = kernel_calls(dev.kind());
    const Tensor loss = graphed ? graphed->train(batch, opt, loss_of) : eager_step();
    host_s = since(t0);
    calls = kernel_calls(dev.kind()) - k0;
    return loss.item();
  };
  step();  // warm-up: allocator cache, BLAS buffers, cuBLAS plans, AdamW's state
  // The model and the optimizer's state, before a graph's memory joins them.
  const size_t base = memory_stats(dev).in_use;
  for (int i = 0; i < 2; ++i) step();  // a graph is captured at the second
  const int reps = std::max(1, static_cast<int>(f.given.count("--steps") ? f.steps : 20));
  reset_peak_memory(dev);
  std::vector<double> times, host;
  double loss = 0.0;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    loss = step();
    times.push_back(since(t0));
    host.push_back(host_s);
  }
  std::sort(times.begin(), times.end());
  std::sort(host.begin(), host.end());
  const double med = times[times.size() / 2];
  const MemoryStats ms = memory_stats(dev);
  if (world > 1)
    std::printf("bench-train: %zu processes (%s), each batch %zu x seq %zu; tokens/s below are "
                "all processes' (rank 0's step time)\n",
                world, std::string(dist::backend_name(group->backend())).c_str(), b, t);
  std::printf("bench-train: MiniLM-L6 + head (%s, %s) batch %zu x seq %zu, %zu threads: median "
              "%.2f ms per step over %d steps (min %.2f) -> %.0f tokens/s; peak memory %.1f MiB "
              "(%.1f MiB of it weights and optimizer state); last loss %.4f\n",
              f.dtype.c_str(), dev.to_string().c_str(), b, t, taper::num_threads(), 1e3 * med,
              reps, 1e3 * times.front(), static_cast<double>(world * b * t) / med,
              static_cast<double>(ms.peak) / (1 << 20), static_cast<double>(base) / (1 << 20),
              loss);
  // On a GPU the host enqueues and the device runs behind it: a host time close to the step's
  // means the step is bound by the host's per-op cost, not by the device.
  if (graphed)
    std::printf("bench-train: CUDA graph: one replay of the forward and backward plus %llu "
                "kernel calls (AdamW) per step; the host enqueued them in %.2f ms (median)\n",
                static_cast<unsigned long long>(calls), 1e3 * host[host.size() / 2]);
  else
    std::printf("bench-train: %llu kernel calls per step; the host enqueued them in %.2f ms "
                "(median), %.2f us per call\n",
                static_cast<unsigned long long>(calls), 1e3 * host[host.size() / 2],
                1e6 * host[host.size() / 2] / static_cast<double>(std::max<uint64_t>(calls, 1)));
  // The profile waits for every kernel call, which a graph cannot: it times the eager step.
  print_op_profile("bench-train", "step (eager)", [&] { (void)eager_step().item(); });
  return 0;
}

int run(Flags f) {
  const auto t_start = Clock::now();
  // A launcher's rank (WORLD_SIZE set): join the job before any work, so a bad launch fails fast.
  const dist::Env env = dist::Env::from_environment();
  const Device dev = pick_device(f.device, env.local_rank);
  if (f.threads) taper::set_num_threads(f.threads);
  std::shared_ptr<dist::ProcessGroup> group;
  if (dist::Env::launched()) {
    dist::Options o;
    o.env = env;
    o.device = dev;
    group = dist::init_process_group(o);
    std::printf("dist: world size %d, %s backend, rank 0 on %s (rank 0 logs and checkpoints)\n",
                group->world_size(), std::string(dist::backend_name(group->backend())).c_str(),
                dev.to_string().c_str());
  }
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->world_size() : 1;
  const fs::path root = repo_root();
  const fs::path model_dir = f.model_dir.empty() ? root / ".models/all-MiniLM-L6-v2" : fs::path(f.model_dir);
  const fs::path data_dir = f.data_dir.empty()
                                ? root / ".data/janeaustenr/usr/lib/R/site-library/janeaustenr/data"
                                : fs::path(f.data_dir);
  for (const char* file : {"model.safetensors", "config.json", "vocab.txt"})
    TAPER_CHECK(fs::exists(model_dir / file), "model file ", (model_dir / file).string(),
                " not found: fetch all-MiniLM-L6-v2 with `bash scripts/fetch_model.sh` (or pass "
                "--model-dir)");

  if (f.out.empty()) f.out = (root / "build/finetune/checkpoint.safetensors").string();
  if (f.bench_forward) return bench_forward(f, dev, f.dtype == "bf16" ? DType::BF16 : DType::F32, model_dir);
  if (f.bench_train)
    return bench_train(f, dev, f.dtype == "bf16" ? DType::BF16 : DType::F32, model_dir, group);

  std::optional<safetensors::File> ckpt;
  if (!f.resume.empty()) ckpt = open_checkpoint(f);
  const DType dt = f.dtype == "bf16" ? DType::BF16 : DType::F32;

  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(model_dir / "vocab.txt");
  CorpusOptions copt;
  copt.words_per_passage = f.words;
  const Corpus corpus = load_austen(data_dir, copt);
  std::printf("data: %zu train / %zu test passages of %zu words from %zu novels\n",
              corpus.train.size(), corpus.test.size(), f.words, corpus.class_names.size());

  // Construction order fixes every seed (head init, dropout masks): the same for a resumed run.
  nn::manual_seed(f.seed);
  BertConfig config = BertConfig::from_json_file(model_dir / "config.json");
  config.hidden_dropout_prob = f.dropout;
  config.attention_probs_dropout_prob = 0.0;
  Classifier model(config, dt, corpus.class_names.size());
  model.bert->load_pretrained(model_dir / "model.safetensors");
  model.to(dev);
  std::printf("model: all-MiniLM-L6-v2 (%zu layers, hidden %zu, %.1fM parameters), %s on %s, "
              "%zu threads\n",
              config.num_hidden_layers, config.hidden_size, model.num_parameters() / 1e6,
              f.dtype.c_str(), dev.to_string().c_str(), taper::num_threads());
  std::fflush(stdout);

  Batcher train_b(tok, corpus.train, f.seq_len, dev), test_b(tok, corpus.test, f.seq_len, dev);

  // The head is trained in the baseline phase (or restored with the checkpoint); fine-tuning
  // starts from it, so the difference between the two accuracies is the encoder's.
  double baseline_acc = 0.0;
  int64_t start_step = 0;
  nn::AdamW opt(param_groups(model), nn::AdamWOptions(f.lr).weight_decay(f.weight_decay));
  if (ckpt) {
    const auto all = [&] {
      std::vector<std::pair<std::string, Tensor>> v;
      for (const auto& n : ckpt->names()) v.emplace_back(n, ckpt->get(n, dev));
      return v;
    }();
    std::vector<std::pair<std::string, Tensor>> model_part;
    for (const auto& [k, t] : all)
      if (k.rfind("model.", 0) == 0) model_part.emplace_back(k.substr(6), t);
    model.load_state_dict(model_part, nn::LoadOptions().strict(true), "'" + f.resume + "'");
    opt.load_state_dict(all, "optim.");
    start_step = static_cast<int64_t>(ckpt->get("train.step").item());
    baseline_acc = std::stod(ckpt->metadata().at("baseline_accuracy"));
    std::printf("resume: %s at step %lld of %lld (baseline test accuracy %.4f from that run)\n",
                f.resume.c_str(), static_cast<long long>(start_step),
                static_cast<long long>(f.steps), baseline_acc);
  } else {
    baseline_acc = baseline(model, train_b, test_b, corpus, f, dev);
  }
  // Each training step draws one mask per dropout module: the counters are the step.
  for (auto& d : model.bert->dropouts()) d->set_calls(static_cast<uint64_t>(start_step));
  // Data parallelism: rank 0's parameters go to every rank; gradients are averaged.
  std::optional<nn::DistributedDataParallel> ddp;
  if (group) {
    TAPER_CHECK(f.batch >= static_cast<size_t>(world), "--batch ", f.batch, " is smaller than the ",
                world, " processes: every rank needs at least one passage per step");
    ddp.emplace(model, group);
  }
  // This rank's rows of each global batch: [lo, lo + rows), shares as even as they go, and the
  // weight of its mean loss so that the ranks' average is the global batch's mean.
  const size_t per = f.batch / static_cast<size_t>(world), extra = f.batch % static_cast<size_t>(world);
  const size_t r_ = static_cast<size_t>(rank);
  const size_t rows = per + (r_ < extra ? 1 : 0), lo = r_ * per + std::min(r_, extra);
  const double loss_weight =
      static_cast<double>(rows * static_cast<size_t>(world)) / static_cast<double>(f.batch);

  const int64_t warmup = static_cast<int64_t>(std::ceil(f.warmup * static_cast<double>(f.steps)));
  const nn::WarmupLinearSchedule sched(f.lr, std::min(warmup, f.steps), f.steps);
  BatchOrder order(corpus.train.size(), f.seed);
  model.train();
  // The step as a CUDA graph: every batch padded to --seq-len, one shape to replay.
  std::optional<GraphedStep> graphed;
  if (use_cuda_graph(f, dev, group != nullptr)) {
    graphed.emplace(dev, f.cuda_graph == "on");
    train_b.pad_to_seq_len(true);
  }
  const auto t_train = Clock::now();
  size_t tokens = 0, window_tokens = 0;
  double window_loss = 0.0;
  Tensor window_loss_t;
  int64_t window_n = 0;
  auto t_window = Clock::now();
  if (start_step < f.steps)
    std::printf("fine-tune: %lld steps of %zu passages x %s%zu tokens, AdamW lr %g (warm-up %lld, "
                "linear decay), weight decay %g, dropout %g%s\n",
                static_cast<long long>(f.steps - start_step), f.batch, graphed ? "" : "<= ",
                f.seq_len, f.lr, static_cast<long long>(warmup), f.weight_decay, f.dropout,
                graphed ? ", CUDA graph" : "");
  for (int64_t step = start_step; step < f.steps; ++step) {
    std::vector<size_t> idx = order.batch(step, f.batch);
    if (ddp) idx = std::vector<size_t>(idx.begin() + static_cast<ptrdiff_t>(lo),
                                       idx.begin() + static_cast<ptrdiff_t>(lo + rows));
    const Batch b = train_b.make(idx);
    const double lr = sched.apply(opt);
    auto loss_of = [&](const Tensor& ids, const Tensor& mask, const Tensor& labels) {
      return nn::cross_entropy(model.classify(model.embed(ids, mask)), labels);
    };
    Tensor loss;
    if (graphed) {
      loss = graphed->train(b, opt, loss_of);
    } else {
      loss = loss_of(b.ids, b.mask, b.labels);
      GradStore g = !ddp ? loss.backward()
                         : ddp->backward(loss_weight == 1.0 ? loss : loss * loss_weight);
      opt.step(g);
    }
    // Summed on the device: the host reads the loss only for the progress line. With ranks,
    // each adds its share of the global batch's mean (summed over the ranks at the line).
    const Tensor l64 = ddp ? loss.detach().to_dtype(DType::F64) *
                                 (static_cast<double>(rows) / static_cast<double>(f.batch))
                           : loss.detach().to_dtype(DType::F64);
    window_loss_t = window_loss_t.defined() ? window_loss_t + l64 : l64;
    ++window_n;
    window_tokens += b.tokens;
    const int64_t done = step + 1;
    if (done % f.log_every == 0 || done == f.steps) {
      if (group) {  // every rank takes this branch at the same steps
        const Tensor both = Tensor::cat(
            {window_loss_t.reshape({1}),
             Tensor::from_vector(std::vector<double>{static_cast<double>(window_tokens)}, Shape({1}), dev)},
            0);
        group->all_reduce(both, dist::ReduceOp::Sum);
        const std::vector<double> v = both.to_vector<double>();
        window_loss = v[0];
        window_tokens = static_cast<size_t>(v[1]);
      } else {
        window_loss = window_loss_t.item();
      }
      tokens += window_tokens;
      window_loss_t = Tensor();
      const double el = since(t_train), w = since(t_window);
      const double per_step = el / static_cast<double>(done - start_step);
      std::printf("step %5lld/%lld  loss %.4f  lr %.3e  %6.0f tok/s  elapsed %s  ETA %s  "
                  "peak %.0f MiB\n",
                  static_cast<long long>(done), static_cast<long long>(f.steps),
                  window_loss / static_cast<double>(window_n), lr,
                  static_cast<double>(window_tokens) / w, hms(el).c_str(),
                  hms(per_step * static_cast<double>(f.steps - done)).c_str(),
                  static_cast<double>(memory_stats(dev).peak) / (1 << 20));
      std::fflush(stdout);
      window_loss = 0.0;
      window_n = 0;
      window_tokens = 0;
      t_window = Clock::now();
    }
    if (f.stop_after > 0 && done - start_step >= f.stop_after && done < f.steps) {
      if (rank == 0) save_checkpoint(f.out, model, opt, f, done, baseline_acc, corpus.class_names.size());
      std::printf("stopped after %lld steps at step %lld of %lld; checkpoint %s (continue with "
                  "--resume %s)\n",
                  static_cast<long long>(done - start_step), static_cast<long long>(done),
                  static_cast<long long>(f.steps), f.out.c_str(), f.out.c_str());
      return 0;
    }
    if (rank == 0 && f.save_every > 0 && done % f.save_every == 0 && done < f.steps)
      save_checkpoint(f.out, model, opt, f, done, baseline_acc, corpus.class_names.size());
  }
  const double train_s = since(t_train);
  if (rank != 0) return 0;  // rank 0 evaluates and writes the checkpoint

  const auto t_eval = Clock::now();
  const std::vector<size_t> test_idx = test_indices(corpus, f);
  const Tensor x_test = embed_all(model, test_b, test_idx, f.eval_batch);
  double test_acc = 0.0;
  {
    NoGradGuard ng;
    test_acc = accuracy(model.classify(x_test), labels_of(corpus.test, test_idx, dev));
  }
  const double eval_s = since(t_eval);
  save_checkpoint(f.out, model, opt, f, std::max(start_step, f.steps), baseline_acc,
                  corpus.class_names.size());
  std::printf("fine-tuned: test accuracy %.4f (%zu passages; evaluated in %.1f s)\n", test_acc,
              test_idx.size(), eval_s);
  std::printf("checkpoint: %s (step %lld)\n", f.out.c_str(),
              static_cast<long long>(std::max(start_step, f.steps)));
  std::printf("summary: baseline %.4f -> fine-tuned %.4f test accuracy; fine-tuning %.1f s, "
              "%.0f tokens/s; wall time %.1f s\n",
              baseline_acc, test_acc, train_s,
              train_s > 0 ? static_cast<double>(tokens) / train_s : 0.0, since(t_start));
  return 0;
}

// ---- --nproc: the launcher ------------------------------------------------------------------------

/// A TCP port of this host that was free a moment ago (the rendezvous's, unless MASTER_PORT is
/// set).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  TAPER_CHECK(fd >= 0, "--nproc: socket(): ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  TAPER_CHECK(ok, "--nproc: cannot find a free port: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

/// Starts `f.nproc` processes of this program with torchrun's variables (RANK, WORLD_SIZE,
/// LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the same flags less --nproc, waits for them, and
/// stops the others when one fails. On the CPU without --threads or TAPER_NUM_THREADS, the
/// cores are split between them.
int launch(const Flags& f, int argc, char** argv) {
  std::vector<std::string> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") ++i;
    else if (a.rfind("--nproc=", 0) != 0) args.push_back(a);
  }
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port = port_env && *port_env ? port_env : std::to_string(free_port());
  const char* addr_env = std::getenv("MASTER_ADDR");
  const std::string addr = addr_env && *addr_env ? addr_env : "127.0.0.1";
  const bool split_threads = f.device == "cpu" && !f.given.count("--threads") &&
                             std::getenv("TAPER_NUM_THREADS") == nullptr;
  const size_t threads = std::max<size_t>(1, std::thread::hardware_concurrency() / f.nproc);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  // Each child's environment is built before fork: between fork and exec a child of a process
  // with threads (OpenBLAS's, say) may only make async-signal-safe calls.
  std::vector<std::vector<std::string>> envs(f.nproc);
  std::vector<std::vector<char*>> envps(f.nproc);
  for (size_t r = 0; r < f.nproc; ++r) {
    const std::map<std::string, std::string> set = {
        {"RANK", std::to_string(r)},        {"LOCAL_RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(f.nproc)}, {"MASTER_ADDR", addr},
        {"MASTER_PORT", port}};
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (!set.count(kv.substr(0, kv.find('=')))) envs[r].push_back(kv);
    }
    for (const auto& [k, v] : set) envs[r].push_back(k + "=" + v);
    if (split_threads) envs[r].push_back("TAPER_NUM_THREADS=" + std::to_string(threads));
    for (std::string& kv : envs[r]) envps[r].push_back(kv.data());
    envps[r].push_back(nullptr);
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (size_t r = 0; r < f.nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string err = std::strerror(errno);
      for (pid_t p : pids) kill(p, SIGTERM);
      throw Error("--nproc: fork() of rank " + std::to_string(r) + ": " + err);
    }
    if (pid == 0) {
      execve("/proc/self/exe", cargs.data(), envps[r].data());
      static const char msg[] = "finetune: --nproc: cannot start a rank (execve failed)\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::printf("finetune: started %zu processes (MASTER_ADDR=%s MASTER_PORT=%s%s)\n", f.nproc,
              addr.c_str(), port.c_str(),
              split_threads ? (", " + std::to_string(threads) + " threads each").c_str() : "");
  std::fflush(stdout);
  int rc = 0;
  size_t left = pids.size();
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    --left;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && rc == 0) {
      rc = code;
      std::fprintf(stderr, "finetune: rank %td exited with status %d; stopping the others\n",
                   it - pids.begin(), code);
      for (pid_t other : pids)  // the live ones: an exited rank's slot is 0, and kill(-1, ...)
        if (other > 0 && other != pid) kill(other, SIGTERM);  // would signal every process
    }
    *it = 0;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = parse_flags(argc, argv);
  // A launcher's rank other than 0 keeps quiet on stdout: rank 0 logs (errors still go to
  // stderr, with the rank).
  std::string who = "finetune";
  if (dist::Env::launched())
    if (const char* r = std::getenv("RANK"); r != nullptr && std::string(r) != "0") {
      who = std::string("finetune [rank ") + r + "]";
      if (std::freopen("/dev/null", "w", stdout) == nullptr) std::perror("finetune: /dev/null");
    }
  try {
    if (f.nproc > 0) return launch(f, argc, argv);
    return run(f);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return 1;
  }
}
