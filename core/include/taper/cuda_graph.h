// cuda_graph.h: `taper::cuda::Graph`, a step of device work captured once and replayed with one
// launch (a CUDA graph), for steps bound by the host's per-op cost.
//
// What it is: capture runs a function with the device's stream recording instead of running,
// its allocations served by a private pool (storage.h) that the graph keeps: replay writes the
// same addresses, so tensors created during the capture (a loss, a GradStore's gradients)
// hold each replay's results, and tensors read by it (parameters, static inputs) are read
// where they were. What it is not: a tracer. The host code of the function runs once, at the
// capture; a replay repeats only its device work, with the scalars the host computed then.
//
// A function fit for capture: only device work on `dev` (no copy to the host, no synchronize,
// no op profiling); no host data uploaded (copy new inputs into static tensors before replay);
// no random draws (the seed is frozen); every input it reads stays alive at the same storage
// (an optimizer that updates parameters in place does, Var::set does not). Run it once eagerly
// first, so one-time set-up (cuBLAS handles, kernel attributes) happens outside the capture.
// A host synchronisation inside it throws an Error that says so, and the capture is dropped.
#pragma once

#include <functional>
#include <memory>

#include "taper/device.h"

namespace taper::cuda {

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  /// Records the device work `fn` queues on `dev` (a CUDA device; else an Error) into this
  /// graph, replacing any earlier capture. Nothing runs: call replay() to run it.
  void capture(Device dev, const std::function<void()>& fn);
  /// Queues the captured work on its device's stream (asynchronous, like any op); Error when
  /// nothing was captured.
  void replay();
  bool captured() const;
  /// Device memory held for the graph (its private pool), in bytes.
  size_t pool_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace taper::cuda
