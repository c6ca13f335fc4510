#include "client/tools/npy_header_parser.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace matmul::npy {
namespace {

// Nesting deeper than this in a header is not something NumPy writes.
constexpr int kMaxDepth = 32;
// Bytes of a header quoted in an error message.
constexpr size_t kQuoteLimit = 200;

// A value of the Python literal subset .npy headers are written in.
struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string text;               // kString
  int64_t integer = 0;            // kInt
  bool boolean = false;           // kBool
  std::vector<PyValue> items;     // kTuple, kList; kDict: the values
  std::vector<std::string> keys;  // kDict: the (string) keys
  absl::string_view source;       // the literal as written
};

// Recursive-descent parser for that subset: str, int, True/False/None,
// tuple, list and dict with string keys (what ast.literal_eval would accept
// from numpy.save, plus Python 2's "3L" integers).
class LiteralParser {
 public:
  explicit LiteralParser(absl::string_view text) : text_(text) {}

  // One value, then nothing but whitespace.
  absl::StatusOr<PyValue> ParseAll() {
    ASSIGN_OR_RETURN(PyValue value, ParseValue(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad .npy header: ", what, " at offset ", pos_, " of ", Quote(text_)));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }

  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<PyValue> ParseValue(int depth) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ == text_.size()) return Error("unexpected end, expected a value");
    const size_t start = pos_;
    PyValue value;
    const char c = text_[pos_];
    if (c == '\'' || c == '"') {
      value.kind = PyValue::Kind::kString;
      ASSIGN_OR_RETURN(value.text, ParseString());
    } else if (c == '-' || c == '+' || absl::ascii_isdigit(c)) {
      value.kind = PyValue::Kind::kInt;
      ASSIGN_OR_RETURN(value.integer, ParseInt());
    } else if (absl::ascii_isalpha(c)) {
      size_t end = pos_;
      while (end < text_.size() && absl::ascii_isalnum(text_[end])) ++end;
      const absl::string_view word = text_.substr(pos_, end - pos_);
      if (word == "True" || word == "False") {
        value.kind = PyValue::Kind::kBool;
        value.boolean = word == "True";
      } else if (word == "None") {
        value.kind = PyValue::Kind::kNone;
      } else {
        return Error(absl::StrCat("unexpected name '", word, "'"));
      }
      pos_ = end;
    } else if (c == '(' || c == '[') {
      ++pos_;
      const char close = c == '(' ? ')' : ']';
      bool trailing_comma = false;
      while (!Consume(close)) {
        if (!value.items.empty() && !trailing_comma) {
          return Error(
              absl::StrCat("expected ',' or '", std::string(1, close), "'"));
        }
        ASSIGN_OR_RETURN(PyValue item, ParseValue(depth + 1));
        value.items.push_back(std::move(item));
        trailing_comma = Consume(',');
      }
      if (c == '(' && value.items.size() == 1 && !trailing_comma) {
        // "(3)" is the int 3 in Python, not a tuple.
        PyValue inner = std::move(value.items[0]);
        inner.source = text_.substr(start, pos_ - start);
        return inner;
      }
      value.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    } else if (c == '{') {
      ++pos_;
      value.kind = PyValue::Kind::kDict;
      bool trailing_comma = false;
      while (!Consume('}')) {
        if (!value.keys.empty() && !trailing_comma) {
          return Error("expected ',' or '}'");
        }
        SkipSpace();
        if (pos_ == text_.size() ||
            (text_[pos_] != '\'' && text_[pos_] != '"')) {
          return Error("expected a string key");
        }
        ASSIGN_OR_RETURN(std::string key, ParseString());
        if (!Consume(':')) return Error("expected ':'");
        ASSIGN_OR_RETURN(PyValue item, ParseValue(depth + 1));
        value.keys.push_back(std::move(key));
        value.items.push_back(std::move(item));
        trailing_comma = Consume(',');
      }
    } else {
      return Error(
          absl::StrCat("unexpected character ", Quote(text_.substr(pos_, 1))));
    }
    value.source = text_.substr(start, pos_ - start);
    return value;
  }

  absl::StatusOr<std::string> ParseString() {
    const char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      char c = text_[pos_++];
      if (c == '\\' && pos_ < text_.size()) {
        const char e = text_[pos_++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case '0':
            c = '\0';
            break;
          case '\\':
          case '\'':
          case '"':
            c = e;
            break;
          default:  // Python keeps unknown escapes as written.
            out.push_back('\\');
            c = e;
        }
      }
      out.push_back(c);
    }
    if (pos_ == text_.size()) return Error("unterminated string");
    ++pos_;  // closing quote
    return out;
  }

  absl::StatusOr<int64_t> ParseInt() {
    bool negative = false;
    if (text_[pos_] == '-' || text_[pos_] == '+') {
      negative = text_[pos_] == '-';
      ++pos_;
    }
    if (pos_ == text_.size() || !absl::ascii_isdigit(text_[pos_])) {
      return Error("expected digits");
    }
    uint64_t magnitude = 0;
    while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (magnitude > (uint64_t{1} << 63) / 10 ||
          magnitude * 10 + digit > (uint64_t{1} << 63) - (negative ? 0 : 1)) {
        return Error("integer out of the int64 range");
      }
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) {
      ++pos_;  // Python 2 long
    }
    return negative ? static_cast<int64_t>(0 - magnitude)
                    : static_cast<int64_t>(magnitude);
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<Descr> ParseDescr(const PyValue& value) {
  if (value.kind != PyValue::Kind::kString) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype ", value.source,
        ": only plain floating-point and integer arrays are supported, not "
        "structured ones"));
  }
  absl::string_view s = value.text;
  Descr descr;
  descr.text = value.text;
  if (!s.empty() &&
      (s[0] == '<' || s[0] == '>' || s[0] == '=' || s[0] == '|')) {
    // '=' and '|' (which NumPy reads as "not applicable") mean the host's
    // order, which is little-endian.
    descr.byte_swap = s[0] == '>';
    s.remove_prefix(1);
  }
  if (s == "f4") {
    descr.dtype = DType::kFloat32;
  } else if (s == "f8") {
    descr.dtype = DType::kFloat64;
  } else if (s == "f2") {
    descr.dtype = DType::kFloat16;
  } else if (s.size() == 2 && (s[0] == 'i' || s[0] == 'u') &&
             (s[1] == '1' || s[1] == '2' || s[1] == '4' || s[1] == '8')) {
    descr.int_size = static_cast<size_t>(s[1] - '0');
    descr.int_signed = s[0] == 'i';
    // uint16: raw bfloat16 bits, unless the caller converts integers.
    descr.raw_uint16 = s == "u2";
    descr.dtype = DType::kBFloat16;
  } else if (s == "b1" || s == "?") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype '", absl::CHexEscape(value.text),
        "' (bool): matmul multiplies numbers; convert the array first, e.g. "
        "a.astype(numpy.float32)"));
  } else if (!s.empty() && s[0] == 'c') {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype '", absl::CHexEscape(value.text),
                     "' (complex): matmul multiplies real matrices only"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype '", absl::CHexEscape(value.text),
        "': supported are '<f4' (float32), '<f8' (float64), '<f2' (float16), "
        "'<u2' (uint16, taken as raw bfloat16 bits) and, converted to a "
        "float dtype, the integers '<i1'..'<i8' and '<u1'..'<u8', in either "
        "byte order"));
  }
  return descr;
}

}  // namespace

std::string Quote(absl::string_view text) {
  const bool cut = text.size() > kQuoteLimit;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kQuoteLimit)),
                      cut ? "..." : "", "\"");
}

std::string IntegerName(const Descr& d) {
  return absl::StrCat(d.int_signed ? "int" : "uint", 8 * d.int_size);
}

absl::StatusOr<Header> ParseHeader(absl::string_view text) {
  ASSIGN_OR_RETURN(PyValue dict, LiteralParser(text).ParseAll());
  if (dict.kind != PyValue::Kind::kDict) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad .npy header: not a dictionary: ", Quote(text)));
  }
  const PyValue* descr = nullptr;
  const PyValue* fortran_order = nullptr;
  const PyValue* shape = nullptr;
  for (size_t i = 0; i < dict.keys.size(); ++i) {
    const std::string& key = dict.keys[i];
    if (key == "descr") {
      descr = &dict.items[i];
    } else if (key == "fortran_order") {
      fortran_order = &dict.items[i];
    } else if (key == "shape") {
      shape = &dict.items[i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad .npy header: unexpected key '", absl::CHexEscape(key),
          "' (expected exactly 'descr', 'fortran_order' and 'shape') in ",
          Quote(text)));
    }
  }
  for (const auto& [name, field] :
       {std::pair<const char*, const PyValue*>{"descr", descr},
        {"fortran_order", fortran_order},
        {"shape", shape}}) {
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad .npy header: missing key '", name, "' in ", Quote(text)));
    }
  }

  Header header;
  if (fortran_order->kind != PyValue::Kind::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad .npy header: fortran_order is ",
                     fortran_order->source, ", not True or False"));
  }
  header.fortran_order = fortran_order->boolean;
  if (shape->kind != PyValue::Kind::kTuple) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad .npy header: shape is ", shape->source,
                     ", not a tuple of integers"));
  }
  for (const PyValue& dim : shape->items) {
    if (dim.kind != PyValue::Kind::kInt || dim.integer < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad .npy header: shape ", shape->source,
          " has an element that is not a non-negative integer: ", dim.source));
    }
    header.shape.push_back(dim.integer);
  }
  ASSIGN_OR_RETURN(header.descr, ParseDescr(*descr));
  return header;
}

}  // namespace matmul::npy
