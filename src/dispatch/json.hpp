// A small JSON reader and string quoting for hmoe's own files (tuned tables, tuner progress). Full
// JSON syntax, no extensions; numbers are doubles. Errors say where: "line 3, column 7: ...".
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace hmoe::dispatch {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<JsonValue> items;        // kArray: the elements; kObject: the member values
  std::vector<std::string> keys;       // kObject: the member names, parallel to items

  bool is_object() const { return kind == Kind::kObject; }
  bool is_number() const { return kind == Kind::kNumber; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_array() const { return kind == Kind::kArray; }
  // The member named key of an object, or nullptr (also when this is not an object).
  const JsonValue* find(std::string_view key) const;
};

// Parses one JSON document (surrounding white space allowed); throws JsonError.
JsonValue parse_json(std::string_view text);

// text as a JSON string literal, quotes included.
std::string json_quote(std::string_view text);

}  // namespace hmoe::dispatch
