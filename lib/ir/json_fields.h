// Private helpers shared by our JSON readers and writers (schedule, cost model, trace): a
// non-throwing parse that reports line and column, typed field readers whose errors name the
// JSON path, the encoding of non-finite doubles, and a one-line writer. Header-only so that both
// po_ir and po_sim can use it without a source of its own; no I/O, no global state.
//
// Paths follow the user's view of the document: "spec.stages", "stages[2].ops[17].op"; the root
// itself is called "the document".
#ifndef PIPEOFFLOAD_LIB_IR_JSON_FIELDS_H_
#define PIPEOFFLOAD_LIB_IR_JSON_FIELDS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "lib/base/echo.h"

namespace pipeoffload::internal {

using Json = nlohmann::json;
// Writers keep keys in the order they were inserted, so files read in a sensible order.
using OrderedJson = nlohmann::ordered_json;

// JSON has no literal for infinities and NaN (nlohmann would write null, which reads back as a
// different value), so non-finite doubles travel as these strings.
inline constexpr std::string_view kJsonInfinity = "Infinity";
inline constexpr std::string_view kJsonNegativeInfinity = "-Infinity";
inline constexpr std::string_view kJsonNaN = "NaN";

inline OrderedJson DoubleToJson(double value) {
  if (std::isnan(value)) return std::string(kJsonNaN);
  if (std::isinf(value)) {
    return std::string(value > 0 ? kJsonInfinity : kJsonNegativeInfinity);
  }
  return value;
}

// nlohmann's dump() throws on strings that are not valid UTF-8; we replace such bytes with
// U+FFFD instead, so that writing never throws (the text is then not byte-exact, but valid).
inline std::string DumpScalar(const OrderedJson& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, OrderedJson::error_handler_t::replace);
}

// Appends `value` on one line with ", " and ": " separators (nlohmann's dump() has either no
// spaces or one member per line; neither reads well for one op per line).
inline void AppendInline(const OrderedJson& value, std::string* out) {
  if (value.is_object()) {
    out->push_back('{');
    bool first = true;
    for (const auto& [key, member] : value.items()) {
      if (!first) out->append(", ");
      first = false;
      out->append(DumpScalar(OrderedJson(key)));
      out->append(": ");
      AppendInline(member, out);
    }
    out->push_back('}');
  } else if (value.is_array()) {
    out->push_back('[');
    for (std::size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out->append(", ");
      AppendInline(value[i], out);
    }
    out->push_back(']');
  } else {
    // Scalars: nlohmann writes shortest round-trip doubles and escapes strings.
    out->append(DumpScalar(value));
  }
}

inline std::string DumpInline(const OrderedJson& value) {
  std::string out;
  AppendInline(value, &out);
  return out;
}

// "a, b, c" (absl::StrJoin does not take std::string_view with this Abseil).
template <typename Names>
std::string JoinNames(const Names& names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out.append(", ");
    out.append(name);
  }
  return out;
}

inline std::string JoinPath(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key)
                        : absl::StrCat(std::string(parent), ".", std::string(key));
}

inline std::string IndexPath(std::string_view parent, std::size_t index) {
  return absl::StrCat(std::string(parent), "[", index, "]");
}

inline std::string PathName(std::string_view path) {
  return path.empty() ? std::string("the document") : std::string(path);
}

inline absl::Status FieldError(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(PathName(path), ": ", std::string(what)));
}

// "string", "boolean", "object", "array", "null"; numbers say which kind they are because an
// integer field given 2.5 should say so.
inline std::string JsonKind(const Json& value) {
  if (value.is_number_float()) return absl::StrCat("the number ", value.dump());
  if (value.is_number()) return absl::StrCat("the integer ", value.dump());
  return std::string(value.type_name());
}

// Deepest nesting of arrays and objects our documents accept. A schedule file nests 4 deep
// (document, stages, a stage, its ops, an op); the bound keeps a hostile file of 100,000
// brackets from reaching the recursive code that walks or prints a JSON tree.
inline constexpr int kMaxJsonDepth = 32;

// Line and column (1-based) of byte `offset` of `text`.
inline std::string JsonPosition(std::string_view text, std::size_t offset) {
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::StrCat("line ", line, ", column ", offset - line_start + 1, " (byte ", offset, ")");
}

// Checks what nlohmann's parser would not: nesting depth (above), and NUL bytes, at which it
// stops as if the text had ended, silently ignoring the rest. One pass over the bytes that
// tracks strings (a bracket inside one does not nest).
inline absl::Status CheckJsonShape(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("JSON text holds a NUL byte at ", JsonPosition(text, i)));
    }
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(absl::StrCat("JSON nests deeper than ", kMaxJsonDepth,
                                                       " arrays and objects at ",
                                                       JsonPosition(text, i)));
      }
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to report
    }
  }
  return absl::OkStatus();
}

// Parses `text` without letting an exception escape. Errors: InvalidArgument "JSON syntax error
// at line L, column C (byte B): <what the parser expected>", or CheckJsonShape's.
inline absl::StatusOr<Json> ParseJsonText(std::string_view text) {
  if (absl::Status shape = CheckJsonShape(text); !shape.ok()) return shape;
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& error) {
    // error.byte counts the characters read, the offending one included.
    const std::size_t offset = std::min<std::size_t>(error.byte > 0 ? error.byte - 1 : 0,
                                                     text.size());
    // Keep the parser's explanation, without its "[json.exception...] parse error at ...: "
    // prefix (we give the position ourselves).
    std::string_view detail = error.what();
    if (const std::size_t colon = detail.find(": "); colon != std::string_view::npos) {
      detail.remove_prefix(colon + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "JSON syntax error at ", JsonPosition(text, offset), ": ", Echo(detail, 256)));
  } catch (const Json::exception& error) {
    // Numbers too large for a double and similar: not a syntax error, but not readable either.
    std::string_view detail = error.what();
    if (const std::size_t end = detail.find("] "); end != std::string_view::npos) {
      detail.remove_prefix(end + 2);  // "[json.exception.out_of_range.406] "
    }
    return absl::InvalidArgumentError(
        absl::StrCat("JSON could not be read: ", Echo(detail, 256)));
  }
}

// Fails when `value` is not an object or holds a key outside `allowed` (naming the key and
// listing the accepted ones, since a typo is the usual cause).
inline absl::Status CheckObjectKeys(const Json& value, std::string_view path,
                                    std::initializer_list<std::string_view> allowed) {
  if (!value.is_object()) {
    return FieldError(path, absl::StrCat("expected an object, got ", JsonKind(value)));
  }
  for (const auto& [key, member] : value.items()) {
    bool known = false;
    for (std::string_view name : allowed) known = known || name == key;
    if (!known) {
      return FieldError(JoinPath(path, Echo(key)),
                        absl::StrCat("unknown key; expected one of ", JoinNames(allowed)));
    }
  }
  return absl::OkStatus();
}

// The member `key` of object `value`, or nullptr when it is absent.
inline const Json* FindMember(const Json& value, std::string_view key) {
  const auto it = value.find(std::string(key));
  return it == value.end() ? nullptr : &*it;
}

// Integers: any JSON integer that fits. A number written with a fraction or an exponent is not an
// integer here, even when its value is whole, because nlohmann reads it as a double.
inline absl::Status ReadValue(const Json& value, std::string_view path, std::int64_t* out) {
  if (value.is_number_unsigned()) {
    const std::uint64_t u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return FieldError(path, absl::StrCat("integer ", u, " is out of range"));
    }
    *out = static_cast<std::int64_t>(u);
    return absl::OkStatus();
  }
  if (value.is_number_integer()) {
    *out = value.get<std::int64_t>();
    return absl::OkStatus();
  }
  return FieldError(path, absl::StrCat("expected an integer, got ", JsonKind(value)));
}

inline absl::Status ReadValue(const Json& value, std::string_view path, int* out) {
  std::int64_t wide = 0;
  if (absl::Status status = ReadValue(value, path, &wide); !status.ok()) return status;
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
    return FieldError(path, absl::StrCat("integer ", wide, " is out of range"));
  }
  *out = static_cast<int>(wide);
  return absl::OkStatus();
}

// Accepts any JSON number, or one of the non-finite spellings written by DoubleToJson.
inline absl::Status ReadValue(const Json& value, std::string_view path, double* out) {
  if (value.is_number()) {
    *out = value.get<double>();
    return absl::OkStatus();
  }
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text == kJsonInfinity) {
      *out = std::numeric_limits<double>::infinity();
      return absl::OkStatus();
    }
    if (text == kJsonNegativeInfinity) {
      *out = -std::numeric_limits<double>::infinity();
      return absl::OkStatus();
    }
    if (text == kJsonNaN) {
      *out = std::numeric_limits<double>::quiet_NaN();
      return absl::OkStatus();
    }
  }
  return FieldError(path, absl::StrCat("expected a number (or \"Infinity\", \"-Infinity\", "
                                       "\"NaN\"), got ",
                                       JsonKind(value)));
}

inline absl::Status ReadValue(const Json& value, std::string_view path, bool* out) {
  if (!value.is_boolean()) {
    return FieldError(path, absl::StrCat("expected true or false, got ", JsonKind(value)));
  }
  *out = value.get<bool>();
  return absl::OkStatus();
}

inline absl::Status ReadValue(const Json& value, std::string_view path, std::string* out) {
  if (!value.is_string()) {
    return FieldError(path, absl::StrCat("expected a string, got ", JsonKind(value)));
  }
  *out = value.get<std::string>();
  return absl::OkStatus();
}

inline absl::Status RequireArray(const Json& value, std::string_view path) {
  if (!value.is_array()) {
    return FieldError(path, absl::StrCat("expected an array, got ", JsonKind(value)));
  }
  return absl::OkStatus();
}

// Arrays of any type that has a ReadValue overload; element errors name the index.
template <typename T>
absl::Status ReadValue(const Json& value, std::string_view path, std::vector<T>* out) {
  if (absl::Status status = RequireArray(value, path); !status.ok()) return status;
  std::vector<T> elements(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    absl::Status status = ReadValue(value[i], IndexPath(path, i), &elements[i]);
    if (!status.ok()) return status;
  }
  *out = std::move(elements);
  return absl::OkStatus();
}

// Reads member `key` of `object` (whose path is `path`) into `out` with the ReadValue overload
// for T. An absent member is an error when `required`, else leaves `out` as it was.
template <typename T>
absl::Status ReadMember(const Json& object, std::string_view path, std::string_view key, T* out,
                        bool required = true) {
  const Json* member = FindMember(object, key);
  if (member == nullptr) {
    return required ? FieldError(JoinPath(path, key), "missing required key") : absl::OkStatus();
  }
  return ReadValue(*member, JoinPath(path, key), out);
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_IR_JSON_FIELDS_H_
