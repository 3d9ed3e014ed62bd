// options.h: the chained-setter pattern of the options structs (LibTorch's TORCH_ARG).
//
// `TAPER_ARG(bool, bias) = true;` inside a struct declares a private `bias_` with that default,
// a setter `bias(v)` that returns the struct (so setters chain:
// `LinearOptions(4, 3).bias(false)`) and a getter `bias()`.
#pragma once

#define TAPER_ARG(T, name)                          \
 public:                                            \
  auto& name(const T& new_##name) {                 \
    this->name##_ = new_##name;                     \
    return *this;                                   \
  }                                                 \
  const T& name() const noexcept { return this->name##_; } \
                                                    \
 private:                                           \
  T name##_
