// seed_mix.h (internal): splitmix64's finaliser, which turns counters into well-spread seeds.
#pragma once

#include <cstdint>

namespace taper::nn::detail {
inline uint64_t mix_seed(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace taper::nn::detail
