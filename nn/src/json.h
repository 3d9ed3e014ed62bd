// json.h (internal): a small strict JSON parser for safetensors headers, and string quoting.
//
// What it is: RFC 8259 objects, arrays, strings (every escape, \u surrogate pairs, UTF-8
// validated, no raw control characters) and integers (no fraction or exponent; overflow is an
// error); nesting depth is bounded, so hostile input cannot exhaust the stack; duplicate object
// keys are an error. What it is not: a general JSON library: `true`, `false`, `null` and
// non-integer numbers are rejected (a safetensors header never needs them).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace taper::nn::json {

/// A parse error at a byte offset of the text.
struct ParseError : std::runtime_error {
  ParseError(size_t at, const std::string& what)
      : std::runtime_error(what + " at byte " + std::to_string(at)), offset(at) {}
  size_t offset;
};

/// A parsed value.
struct Value {
  enum class Kind { Object, Array, String, Int };
  Kind kind = Kind::Object;
  std::string str;                                    ///< String
  int64_t integer = 0;                                ///< Int
  bool int_overflow = false;                          ///< Int beyond int64 (kept as an error flag)
  std::vector<Value> array;                           ///< Array
  std::vector<std::pair<std::string, Value>> object;  ///< Object, in text order

  // Declared here and defaulted in json.cpp: clang 14 with libstdc++ 12 (C++20) cannot define
  // the implicit ones of a type holding vector<pair<string, Value>> (the fuzz build needs clang).
  Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;
  ~Value();

  const char* kind_name() const;
};

/// Parses the whole of `text` (surrounding whitespace allowed) as one value.
Value parse(std::string_view text, size_t max_depth = 32);

/// `s` as a JSON string literal (quotes included), escaping what must be escaped.
std::string quote(std::string_view s);

}  // namespace taper::nn::json
