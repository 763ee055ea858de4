// Recursive-descent JSON reader: one pass over the text, position tracked for error messages.
#include "dispatch/json.hpp"

#include <cstdio>
#include <cstdlib>

namespace hmoe::dispatch {
namespace {

// NOTE: hmoe's files nest two or three levels; the bound keeps a hostile file from exhausting the stack.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (position_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1;
    int column = 1;
    for (std::size_t i = 0; i < position_ && i < text_.size(); ++i) {
      column = text_[i] == '\n' ? 1 : column + 1;
      line += text_[i] == '\n';
    }
    throw JsonError("line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what);
  }

  void skip_space() {
    while (position_ < text_.size() &&
           (text_[position_] == ' ' || text_[position_] == '\t' || text_[position_] == '\n' || text_[position_] == '\r'))
      ++position_;
  }

  char peek() {
    skip_space();
    if (position_ >= text_.size()) fail("unexpected end of input");
    return text_[position_];
  }

  void expect(char wanted) {
    if (peek() != wanted) fail(std::string("expected '") + wanted + "'");
    ++position_;
  }

  void expect_word(std::string_view word) {
    if (text_.substr(position_, word.size()) != word) fail("invalid literal");
    position_ += word.size();
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    JsonValue value;
    const char next = peek();
    if (next == '{') {
      value.kind = JsonValue::Kind::kObject;
      ++position_;
      if (peek() == '}') {
        ++position_;
        return value;
      }
      while (true) {
        if (peek() != '"') fail("expected a member name in quotes");
        value.keys.push_back(parse_string());
        expect(':');
        value.items.push_back(parse_value(depth + 1));
        if (peek() == ',') {
          ++position_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (next == '[') {
      value.kind = JsonValue::Kind::kArray;
      ++position_;
      if (peek() == ']') {
        ++position_;
        return value;
      }
      while (true) {
        value.items.push_back(parse_value(depth + 1));
        if (peek() == ',') {
          ++position_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (next == '"') {
      value.kind = JsonValue::Kind::kString;
      value.string = parse_string();
      return value;
    }
    if (next == 't' || next == 'f') {
      value.kind = JsonValue::Kind::kBool;
      value.boolean = next == 't';
      expect_word(value.boolean ? "true" : "false");
      return value;
    }
    if (next == 'n') {
      expect_word("null");
      return value;
    }
    value.kind = JsonValue::Kind::kNumber;
    value.number = parse_number();
    return value;
  }

  double parse_number() {
    const std::size_t start = position_;
    auto digits = [this] {
      const std::size_t first = position_;
      while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9') ++position_;
      return position_ > first;
    };
    if (position_ < text_.size() && text_[position_] == '-') ++position_;
    if (!digits()) fail("invalid value");
    if (position_ < text_.size() && text_[position_] == '.') {
      ++position_;
      if (!digits()) fail("invalid number");
    }
    if (position_ < text_.size() && (text_[position_] == 'e' || text_[position_] == 'E')) {
      ++position_;
      if (position_ < text_.size() && (text_[position_] == '+' || text_[position_] == '-')) ++position_;
      if (!digits()) fail("invalid number");
    }
    return std::strtod(std::string(text_.substr(start, position_ - start)).c_str(), nullptr);
  }

  std::string parse_string() {
    ++position_;  // the opening quote
    std::string result;
    while (true) {
      if (position_ >= text_.size()) fail("unterminated string");
      const char c = text_[position_++];
      if (c == '"') return result;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        result += c;
        continue;
      }
      if (position_ >= text_.size()) fail("unterminated string");
      const char escape = text_[position_++];
      switch (escape) {
        case '"': result += '"'; break;
        case '\\': result += '\\'; break;
        case '/': result += '/'; break;
        case 'b': result += '\b'; break;
        case 'f': result += '\f'; break;
        case 'n': result += '\n'; break;
        case 'r': result += '\r'; break;
        case 't': result += '\t'; break;
        case 'u': append_utf8(parse_hex4(), result); break;
        default: fail("invalid escape in string");
      }
    }
  }

  unsigned parse_hex4() {
    if (position_ + 4 > text_.size()) fail("invalid \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[position_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= c - '0';
      else if (c >= 'a' && c <= 'f') code |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') code |= c - 'A' + 10;
      else fail("invalid \\u escape");
    }
    return code;
  }

  // Surrogate pairs are not joined: hmoe's files are ASCII; an odd code unit still round-trips as bytes.
  static void append_utf8(unsigned code, std::string& out) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string_view text_;
  std::size_t position_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &items[i];
  return nullptr;
}

JsonValue parse_json(std::string_view text) { return Parser(text).document(); }

std::string json_quote(std::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(c));
      quoted += escape;
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

}  // namespace hmoe::dispatch
