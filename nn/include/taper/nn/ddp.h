// ddp.h: `DistributedDataParallel`, data parallelism over a `dist::ProcessGroup`.
//
// What it is: every rank holds the whole model and runs its own share of the batch; the
// gradients are averaged over the ranks, so each rank's optimizer takes the same step. The
// parameters go from rank 0 to every rank at construction. Gradients are grouped into buckets
// of about `bucket_bytes` (reverse registration order, which is about the order backward
// finishes them; one dtype and device per bucket); a bucket's all-reduce starts as soon as the
// last of its gradients is complete during backward, so on a GPU the communication overlaps the
// rest of the backward. A gradient is freed once it is copied into its bucket's buffer: the
// gradients and the buffers together hold about one bucket more than the gradients alone, not
// twice them. Buckets are reduced in one fixed order on every rank (a bucket that is complete
// waits for the ones before it), and every rank ends with the same bits (the
// collective computes each element once). Before backward runs, each rank knows from the graph
// which parameters its step uses; with UnusedParameters::Error the ranks compare that through
// the group's host connections first, so a parameter unused on any rank is an Error on every
// rank instead of a collective that never completes.
// What it is not: a launcher (`finetune --nproc N`) or model sharding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "taper/autograd.h"
#include "taper/dist.h"
#include "taper/nn/options.h"
#include "taper/tensor.h"

namespace taper::nn {

class Module;

/// What a step does with a trainable parameter that its graph does not reach on some rank.
/// (A parameter the graph reaches but no gradient reaches, through ops whose backward gives
/// none, contributes zeros either way: every rank knows it only once backward has run.)
enum class UnusedParameters {
  Error,  ///< an Error naming them and the ranks, on every rank (costs one small host message
          ///< exchange per step; the usual case: a model whose every parameter trains)
  Zeros,  ///< this rank contributes zeros to the average over the ranks
};

struct DdpOptions {
  /// Bytes of gradients per bucket (the last bucket may be smaller; a larger parameter gets a
  /// bucket of its own; 0: a bucket per parameter). PyTorch's default is 25 MiB.
  TAPER_ARG(size_t, bucket_bytes) = size_t{25} << 20;
  TAPER_ARG(UnusedParameters, unused) = UnusedParameters::Error;
  /// Broadcast the parameters from rank 0 at construction.
  TAPER_ARG(bool, broadcast_parameters) = true;
};

/// Averages the gradients of a model's parameters over the ranks of a group (see the top of
/// this file). Every rank constructs it with the same parameters (names, shapes, dtypes: an
/// Error names the ranks whose differ) and calls backward once per step.
class DistributedDataParallel {
 public:
  /// The trainable parameters of `model` (its named_parameters()). They must be on the group's
  /// device; rank 0's values are broadcast into them (unless the options say not to).
  DistributedDataParallel(const Module& model, std::shared_ptr<dist::ProcessGroup> group,
                          DdpOptions opts = {});
  DistributedDataParallel(std::vector<std::pair<std::string, Var>> params,
                          std::shared_ptr<dist::ProcessGroup> group, DdpOptions opts = {});

  /// `loss.backward()` whose parameter gradients come back averaged over the ranks (other
  /// leaves' gradients stay this rank's own). To weight ranks with unequal shares of a batch,
  /// scale each rank's loss by share * world_size before calling it. Error (on every rank,
  /// before any collective of the step) when a parameter is unused on some rank and the
  /// options say so, naming it and the ranks.
  GradStore backward(const Tensor& loss) const;
  /// The same with an upstream gradient of `out`'s shape.
  GradStore backward(const Tensor& out, const Tensor& grad) const;

  /// The buckets' parameter names, in the order they are reduced.
  std::vector<std::vector<std::string>> bucket_names() const;
  const dist::ProcessGroup& group() const { return *group_; }

 private:
  struct Slot {
    std::string name;
    Var param;
    size_t bucket = 0, offset = 0;  ///< in the bucket's flat buffer, in elements
  };
  struct Bucket {
    std::vector<size_t> slots;
    size_t numel = 0;
    DType dtype = DType::F32;
    Device device;
  };
  std::shared_ptr<dist::ProcessGroup> group_;
  DdpOptions opts_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::unordered_map<uint64_t, size_t> index_;  ///< a parameter's id() -> its slot
};

}  // namespace taper::nn
