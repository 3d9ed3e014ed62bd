// fuzz_json.cpp: libFuzzer target for the JSON that taper reads: the strict parser behind
// safetensors headers (nn/src/json.h, internal to nn but exported from libtaper) and
// BertConfig::from_json_file, the example's config.json reader (examples/finetune/bert.h).
//
// Input: the text. Checks: json::parse throws json::ParseError or returns a value that, written
// back with json::quote for every string, parses to the same value; json::quote(text) parses
// back to the text whenever the text is valid UTF-8 (and never to anything else); and
// from_json_file on the text as a file (when it names a "model_type") throws taper::Error or
// returns. Anything else (a crash,
// a sanitizer report, another exception type, a round trip that differs) is a finding.
#include <string>
#include <string_view>

#include "examples/finetune/bert.h"
#include "fuzz/fuzz_common.h"
#include "json.h"

using namespace taper;
namespace json = taper::nn::json;

namespace {

// The value as JSON text: what a writer would produce.
void emit(const json::Value& v, std::string& out) {
  switch (v.kind) {
    case json::Value::Kind::Int:
      out += std::to_string(v.integer);
      break;
    case json::Value::Kind::String:
      out += json::quote(v.str);
      break;
    case json::Value::Kind::Array:
      out += '[';
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i) out += ',';
        emit(v.array[i], out);
      }
      out += ']';
      break;
    case json::Value::Kind::Object:
      out += '{';
      for (size_t i = 0; i < v.object.size(); ++i) {
        if (i) out += ',';
        out += json::quote(v.object[i].first);
        out += ':';
        emit(v.object[i].second, out);
      }
      out += '}';
      break;
  }
}

bool equal(const json::Value& a, const json::Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case json::Value::Kind::Int:
      return a.integer == b.integer;
    case json::Value::Kind::String:
      return a.str == b.str;
    case json::Value::Kind::Array:
      if (a.array.size() != b.array.size()) return false;
      for (size_t i = 0; i < a.array.size(); ++i)
        if (!equal(a.array[i], b.array[i])) return false;
      return true;
    case json::Value::Kind::Object:
      if (a.object.size() != b.object.size()) return false;
      for (size_t i = 0; i < a.object.size(); ++i)
        if (a.object[i].first != b.object[i].first ||
            !equal(a.object[i].second, b.object[i].second))
          return false;
      return true;
  }
  return false;
}

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else
      return false;
    if (s.size() - i <= n) return false;  // n continuation bytes must follow
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // 1. The parser, and a write/read round trip of what it accepted.
  try {
    const json::Value v = json::parse(text);
    std::string out;
    emit(v, out);
    json::Value w;
    try {
      w = json::parse(out);
    } catch (const json::ParseError& e) {
      fuzz::finding(std::string("the parser refuses what its value writes back: ") + e.what() +
                    " in " + out.substr(0, 200));
    }
    TAPER_FUZZ_CHECK(equal(v, w), "a parse/write/parse round trip changed the value");
  } catch (const json::ParseError& e) {
    TAPER_FUZZ_CHECK(e.offset <= size, "a parse error beyond the text: byte ", e.offset);
  } catch (const std::exception& e) {
    fuzz::finding(std::string("json::parse threw something else than ParseError: ") + e.what());
  }

  // 2. quote: its output is one JSON string holding the text, when the text is valid UTF-8.
  const std::string q = json::quote(text);
  try {
    const json::Value s = json::parse(q);
    TAPER_FUZZ_CHECK(s.kind == json::Value::Kind::String && s.str == text,
                     "quote then parse gives another string");
  } catch (const json::ParseError& e) {
    TAPER_FUZZ_CHECK(!valid_utf8(text), "the parser refuses quote(valid UTF-8): ", e.what());
  }

  // 3. config.json through the example's reader, for texts that could be one (the reader wants
  // a file, and writing one per input would halve the speed of the whole target).
  if (text.find("\"model_type\"") != std::string_view::npos) {
    const auto path = fuzz::write_scratch("config.json", text);
    fuzz::guarded("BertConfig::from_json_file",
                  [&] { (void)finetune::BertConfig::from_json_file(path); });
  }
  return 0;
}
