// loss.cpp: cross_entropy, nll_loss, mse_loss from public tensor ops and the fused log-softmax.
#include "taper/nn/loss.h"

#include "taper/ops.h"

namespace taper::nn {

namespace {

// The targets as the losses use them: a safe index per row, a keep mask per row and how many
// are kept. CPU targets are read and checked on the host (an Error naming the loss at once).
// Targets on another device stay there: the mask and the count are tensor ops, and a target out
// of range is reported by gather's kernel at the next synchronisation (no host read, no wait).
struct Picked {
  Tensor index;  // (N, 1) i64 or u32; ignored rows point at class 0
  Tensor keep;   // (N) u8
  Tensor kept;   // (): the number kept (f64; summed on a device in f32 but for f64 scores)
};

Picked pick(const char* op, const Tensor& scores, const Tensor& targets, int64_t ignore_index) {
  TAPER_CHECK(is_float(scores.dtype()) && scores.rank() >= 1, op,
              ": input must be a float (..., C) tensor, got ", dtype_name(scores.dtype()), " ",
              scores.shape().to_string());
  TAPER_CHECK(targets.dtype() == DType::I64 || targets.dtype() == DType::U32, op,
              ": targets must be i64 or u32, got ", dtype_name(targets.dtype()));
  std::vector<size_t> lead = scores.dims();
  const size_t c = lead.back();
  lead.pop_back();
  TAPER_CHECK(targets.dims() == lead, op, ": targets ", targets.shape().to_string(),
              " must be the input ", scores.shape().to_string(), " without its class dim");
  const size_t n = targets.elem_count();
  const Device dev = scores.device();
  Picked p;
  if (!targets.device().is_cpu()) {
    const bool u32 = targets.dtype() == DType::U32;
    const bool can_match = !u32 || (ignore_index >= 0 && ignore_index <= int64_t{UINT32_MAX});
    const Tensor t = targets.reshape(Shape({n}));
    p.keep = can_match ? t.ne(static_cast<double>(ignore_index))
                       : Tensor::ones(Shape({n}), DType::U8, dev);
    p.index = p.keep.where_cond(t, 0.0).reshape(Shape({n, 1}));
    p.kept = p.keep.to_dtype(stat_dtype(scores.dtype())).sum_all();
    return p;
  }
  const std::vector<int64_t> tv = targets.to_vector<int64_t>();
  std::vector<int64_t> idx(tv.size());
  std::vector<uint8_t> keep(tv.size());
  size_t kept = 0;
  for (size_t i = 0; i < tv.size(); ++i) {
    if (tv[i] == ignore_index) continue;
    TAPER_CHECK(tv[i] >= 0 && static_cast<size_t>(tv[i]) < c, op, ": target ", tv[i],
                " at position ", i, " is out of range for ", c, " classes");
    idx[i] = tv[i];
    keep[i] = 1;
    ++kept;
  }
  p.index = Tensor::from_vector(idx, Shape({tv.size(), 1}), dev);
  p.keep = Tensor::from_vector(keep, Shape({tv.size()}), dev);
  p.kept = Tensor::full(Shape({}), static_cast<double>(kept), DType::F64, dev);
  return p;
}

// per: (N) losses, already zero where ignored.
Tensor reduce_loss(const Tensor& per, const Picked& p, const Tensor& targets, Reduction r) {
  switch (r) {
    case Reduction::None: return per.reshape(targets.shape());
    case Reduction::Sum: return per.sum_all();
    case Reduction::Mean: break;
  }
  // Over the kept targets only; 0/0 = NaN when every target is ignored, as PyTorch.
  return per.sum_all() / p.kept.to_dtype(per.dtype());
}

Tensor nll_rows(const Tensor& logp2, const Picked& p) {
  return -logp2.gather(p.index, 1).reshape(Shape({p.index.dim(0)}));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  TAPER_CHECK(o.label_smoothing() >= 0.0 && o.label_smoothing() <= 1.0,
              "cross_entropy: label_smoothing must be in [0, 1], got ", o.label_smoothing());
  const Picked p = pick("cross_entropy", logits, targets, o.ignore_index());
  const size_t c = logits.dim(-1), n = targets.elem_count();
  const Tensor logp = ops::log_softmax_last_dim(logits).reshape(Shape({n, c}));
  Tensor per = nll_rows(logp, p);
  const double s = o.label_smoothing();
  if (s > 0.0) {
    // (1 - s) * nll + s * (uniform-target cross entropy = -mean_c log p_c)
    per = per * (1.0 - s) + logp.mean({1}) * (-s);
  }
  per = p.keep.where_cond(per, 0.0);
  return reduce_loss(per, p, targets, o.reduction());
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, const NllLossOptions& o) {
  const Picked p = pick("nll_loss", log_probs, targets, o.ignore_index());
  const size_t c = log_probs.dim(-1), n = targets.elem_count();
  Tensor per = nll_rows(log_probs.reshape(Shape({n, c})), p);
  per = p.keep.where_cond(per, 0.0);
  return reduce_loss(per, p, targets, o.reduction());
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TAPER_CHECK(input.shape() == target.shape(), "mse_loss: input ", input.shape().to_string(),
              " and target ", target.shape().to_string(), " differ in shape");
  TAPER_CHECK(is_float(input.dtype()), "mse_loss: needs a float input, got ",
              dtype_name(input.dtype()));
  const Tensor sq = (input - target).sqr();
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sq.sum_all();
    case Reduction::Mean: break;
  }
  return sq.mean_all();
}

}  // namespace taper::nn
