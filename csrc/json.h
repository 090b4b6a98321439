// A minimal JSON writer for the private introspection ops (csrc/internal_ops.cpp), which return JSON
// strings: the op library has no Python dependency (it loads into C++ programs too), so it cannot
// return Python dicts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace ops {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value) {
    return raw(key, quote(value));
  }
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObject& add(const std::string& key, int64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonObject& add(const std::string& key, const JsonObject& value) { return raw(key, value.str()); }
  // Non-finite numbers have no JSON spelling: null. Finite ones in the fewest digits (15 to 17) that read
  // back as the same double: a tuning cache saved and loaded keeps its timings.
  JsonObject& add(const std::string& key, double value) {
    if (!std::isfinite(value)) return null(key);
    char buf[32];
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof(buf), "%.*g", digits, value);
      if (std::strtod(buf, nullptr) == value) break;
    }
    return raw(key, buf);
  }
  JsonObject& null(const std::string& key) { return raw(key, "null"); }
  // `json` must already be valid JSON (e.g. an array built by the caller).
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ << (empty_ ? "" : ",") << quote(key) << ":" << json;
    empty_ = false;
    return *this;
  }
  std::string str() const { return "{" + body_.str() + "}"; }

  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

 private:
  std::ostringstream body_;
  bool empty_ = true;
};

}  // namespace ops
