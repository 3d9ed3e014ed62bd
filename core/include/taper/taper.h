/// @file taper.h
/// The public API of core in one include (CMake target taper::taper): tensors and their ops,
/// the fused ops, autograd, dtypes, shapes, devices, storage and the op registry. The nn layer
/// (modules, losses, optimizers, safetensors) is taper/nn.h; the composed forms of the fused
/// ops (`taper::composed`, metal_fallback/) are taper/composed.h. Every misuse throws
/// taper::Error (error.h).
#pragma once

#include "taper/autograd.h"  // GradStore, NoGradGuard, the graph node
#include "taper/cuda_graph.h"  // taper::cuda::Graph: a captured step replayed in one launch
#include "taper/device.h"    // Device, DeviceBackend, synchronize, num_threads
#include "taper/dist.h"      // taper::dist: process groups (NCCL, TCP) of data parallelism
#include "taper/dtype.h"     // DType, bf16 / f16, dtype traits
#include "taper/error.h"     // Error, TAPER_CHECK, TAPER_ASSERT
#include "taper/op.h"        // the op registry: OpId, dispatch, ComposedOnlyGuard, profiling
#include "taper/ops.h"       // the fused ops: softmax_last_dim, rms_norm, layer_norm, group_norm
#include "taper/shape.h"     // Shape, Layout, normalize_dim, broadcast_shapes
#include "taper/storage.h"   // Storage, the caching allocator, memory_stats
#include "taper/tensor.h"    // Tensor, Var
