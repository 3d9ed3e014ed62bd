// json.cpp: the strict JSON parser of safetensors headers (json.h). Every read is bounds-checked
// against the text's size: the parser never looks past the end of its input.
#include "json.h"

#include <unordered_set>

namespace taper::nn::json {

Value::Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;
Value::~Value() = default;

const char* Value::kind_name() const {
  switch (kind) {
    case Kind::Object: return "object";
    case Kind::Array: return "array";
    case Kind::String: return "string";
    case Kind::Int: return "integer";
  }
  return "?";
}

namespace {

class Parser {
 public:
  Parser(std::string_view t, size_t max_depth) : t_(t), max_depth_(max_depth) {}

  Value parse_all() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (i_ != t_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw ParseError(i_, what); }
  bool at_end() const { return i_ >= t_.size(); }
  unsigned char peek() const { return static_cast<unsigned char>(t_[i_]); }

  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++i_;
  }

  void expect(char c) {
    if (at_end()) fail(std::string("unexpected end of header, expected '") + c + "'");
    if (t_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }

  Value parse_value(size_t depth) {
    if (depth > max_depth_) fail("nesting deeper than " + std::to_string(max_depth_));
    if (at_end()) fail("unexpected end of header, expected a value");
    const char c = t_[i_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      Value v;
      v.kind = Value::Kind::String;
      v.str = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_int();
    if (c == 't' || c == 'f' || c == 'n') fail("true/false/null are not allowed in a safetensors header");
    fail("unexpected character");
  }

  Value parse_object(size_t depth) {
    Value v;
    v.kind = Value::Kind::Object;
    std::unordered_set<std::string> keys;
    expect('{');
    skip_ws();
    if (!at_end() && t_[i_] == '}') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      if (at_end() || t_[i_] != '"') fail("expected a string key");
      const size_t key_at = i_;
      std::string key = parse_string();
      // A hash set, not a scan: a header may hold ~10^6 keys.
      if (!keys.insert(key).second) throw ParseError(key_at, "duplicate key \"" + key + "\"");
      skip_ws();
      expect(':');
      skip_ws();
      Value item = parse_value(depth + 1);
      v.object.emplace_back(std::move(key), std::move(item));
      skip_ws();
      if (at_end()) fail("unexpected end of header inside an object");
      if (t_[i_] == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Value parse_array(size_t depth) {
    Value v;
    v.kind = Value::Kind::Array;
    expect('[');
    skip_ws();
    if (!at_end() && t_[i_] == ']') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.array.push_back(parse_value(depth + 1));
      skip_ws();
      if (at_end()) fail("unexpected end of header inside an array");
      if (t_[i_] == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Value parse_int() {
    Value v;
    v.kind = Value::Kind::Int;
    bool neg = false;
    if (t_[i_] == '-') {
      neg = true;
      ++i_;
    }
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a digit");
    if (t_[i_] == '0' && i_ + 1 < t_.size() && peek_at(i_ + 1) >= '0' && peek_at(i_ + 1) <= '9')
      fail("leading zeros are not allowed");
    // Accumulate as a negative number: covers INT64_MIN without overflow.
    int64_t acc = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const int d = peek() - '0';
      if (acc < (INT64_MIN + d) / 10) v.int_overflow = true;
      if (!v.int_overflow) acc = acc * 10 - d;
      ++i_;
    }
    if (!at_end() && (t_[i_] == '.' || t_[i_] == 'e' || t_[i_] == 'E'))
      fail("only integers are allowed in a safetensors header");
    if (!neg) {
      if (acc == INT64_MIN) v.int_overflow = true;
      else acc = -acc;
    }
    if (v.int_overflow) fail("integer out of range");
    v.integer = acc;
    return v;
  }

  unsigned char peek_at(size_t k) const { return static_cast<unsigned char>(t_[k]); }

  unsigned hex4() {
    if (t_.size() - i_ < 4) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = t_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // One raw UTF-8 sequence starting at i_, validated (no overlongs, no surrogates, <= U+10FFFF).
  void copy_utf8(std::string& out) {
    const unsigned char c = peek();
    size_t len;
    unsigned cp;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      fail("invalid UTF-8 in a string");
    }
    if (t_.size() - i_ < len) fail("truncated UTF-8 sequence");
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = peek_at(i_ + k);
      if ((cc & 0xC0) != 0x80) fail("invalid UTF-8 in a string");
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      fail("invalid UTF-8 in a string");
    out.append(t_.data() + i_, len);
    i_ += len;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const unsigned char c = peek();
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        copy_utf8(out);
        continue;
      }
      ++i_;
      if (at_end()) fail("unterminated escape");
      const char e = t_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (t_.size() - i_ < 2 || t_[i_] != '\\' || t_[i_ + 1] != 'u')
              fail("unpaired high surrogate in \\u escape");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: --i_; fail("bad escape character");
      }
    }
  }

  std::string_view t_;
  size_t i_ = 0;
  size_t max_depth_;
};

}  // namespace

Value parse(std::string_view text, size_t max_depth) { return Parser(text, max_depth).parse_all(); }

std::string quote(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

}  // namespace taper::nn::json
