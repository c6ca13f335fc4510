#include "client/tools/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/lib/dtype_conversion.h"
#include "common/status_macros.h"

// Elements are kept little-endian in memory and parsed with memcpy; the
// project targets little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "npy.cc assumes a little-endian host");

namespace matmul {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
// numpy.lib.format: the data starts on a multiple of ARRAY_ALIGN, and the
// header leaves room for the first (C order) axis to grow to this many
// digits, so that an array can be appended to in place.
constexpr size_t kArrayAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;
// Nesting deeper than this in a header is not something NumPy writes.
constexpr int kMaxDepth = 32;
// Bytes of a header quoted in an error message.
constexpr size_t kQuoteLimit = 200;

std::string Quote(absl::string_view text) {
  const bool cut = text.size() > kQuoteLimit;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kQuoteLimit)),
                      cut ? "..." : "", "\"");
}

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

// An element type as a descr names it.
struct Descr {
  std::string text;  // as written, e.g. ">f4"
  DType dtype = DType::kFloat32;
  bool raw_uint16 = false;
  bool byte_swap = false;  // stored big-endian
  // Integers ('i1'..'i8', 'u1'..'u8'; 'u2' also sets raw_uint16): their
  // size in bytes, else 0.
  size_t int_size = 0;
  bool int_signed = false;
};

// NumPy's name of an integer descr: "int64", "uint8".
std::string IntegerName(const Descr& d) {
  return absl::StrCat(d.int_signed ? "int" : "uint", 8 * d.int_size);
}

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

// The header dictionary, checked the way numpy.lib.format does.
struct Header {
  Descr descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

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

template <size_t kSize>
void ByteSwapAll(std::string& data) {
  char* p = data.data();
  const size_t n = data.size() / kSize;
  for (size_t i = 0; i < n; ++i, p += kSize) {
    if constexpr (kSize == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      v = __builtin_bswap16(v);
      std::memcpy(p, &v, 2);
    } else if constexpr (kSize == 4) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      v = __builtin_bswap32(v);
      std::memcpy(p, &v, 4);
    } else {
      uint64_t v;
      std::memcpy(&v, p, 8);
      v = __builtin_bswap64(v);
      std::memcpy(p, &v, 8);
    }
  }
}

void ByteSwap(std::string& data, size_t item_size) {
  switch (item_size) {
    case 2:
      ByteSwapAll<2>(data);
      break;
    case 4:
      ByteSwapAll<4>(data);
      break;
    case 8:
      ByteSwapAll<8>(data);
      break;
  }
}

// Fortran (column-major) order to C (row-major) order, any rank: walks the
// source in storage order (first axis fastest) and scatters each element to
// its row-major offset, kept up to date incrementally like an odometer.
template <size_t kSize>
std::string FortranToCTyped(const std::string& src,
                            const std::vector<int64_t>& shape) {
  std::string dst(src.size(), '\0');
  const size_t rank = shape.size();
  const size_t n = src.size() / kSize;
  if (n == 0) return dst;
  std::vector<size_t> c_stride(rank);  // in elements
  size_t stride = 1;
  for (size_t k = rank; k-- > 0;) {
    c_stride[k] = stride;
    stride *= static_cast<size_t>(shape[k]);
  }
  std::vector<int64_t> index(rank, 0);
  size_t out = 0;
  const char* in = src.data();
  char* base = dst.data();
  for (size_t i = 0; i < n; ++i, in += kSize) {
    std::memcpy(base + out * kSize, in, kSize);
    for (size_t k = 0; k < rank; ++k) {
      if (++index[k] < shape[k]) {
        out += c_stride[k];
        break;
      }
      out -= static_cast<size_t>(shape[k] - 1) * c_stride[k];
      index[k] = 0;
    }
  }
  return dst;
}

std::string FortranToC(const std::string& src,
                       const std::vector<int64_t>& shape, size_t item_size) {
  switch (item_size) {
    case 1:
      return FortranToCTyped<1>(src, shape);
    case 2:
      return FortranToCTyped<2>(src, shape);
    case 4:
      return FortranToCTyped<4>(src, shape);
    default:
      return FortranToCTyped<8>(src, shape);
  }
}

uint32_t ReadLe(absl::string_view bytes, size_t offset, size_t width) {
  uint32_t v = 0;
  for (size_t i = 0; i < width; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[offset + i]))
         << (8 * i);
  }
  return v;
}

const char* DescrFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kFloat16:
      return "<f2";
    case DType::kBFloat16:
      return "<u2";
  }
  return "";
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(path, ": ", status.message()));
}

// Closes a FILE* when it goes out of scope (error paths only; the success
// path closes explicitly to see the error fclose may report).
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// `n` little-endian integers of type I at `in` as `to`, rounded to nearest
// even as NumPy's astype does (through float64 for float16 and bfloat16:
// exact for magnitudes below 2^53).
template <typename I>
void IntegersTo(const char* in, size_t n, DType to, char* out) {
  for (size_t i = 0; i < n; ++i) {
    I v;
    std::memcpy(&v, in + i * sizeof(I), sizeof(I));
    switch (to) {
      case DType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(out + 4 * i, &f, 4);
        break;
      }
      case DType::kFloat64: {
        const double d = static_cast<double>(v);
        std::memcpy(out + 8 * i, &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = DoubleToHalf(static_cast<double>(v));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = DoubleToBFloat16(static_cast<double>(v));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
    }
  }
}

std::string ConvertIntegers(const std::string& data, const Descr& descr,
                            DType to) {
  const size_t n = data.size() / descr.int_size;
  std::string out(n * DTypeSize(to), '\0');
  const char* in = data.data();
  char* dst = out.data();
  switch (descr.int_size) {
    case 1:
      descr.int_signed ? IntegersTo<int8_t>(in, n, to, dst)
                       : IntegersTo<uint8_t>(in, n, to, dst);
      break;
    case 2:
      descr.int_signed ? IntegersTo<int16_t>(in, n, to, dst)
                       : IntegersTo<uint16_t>(in, n, to, dst);
      break;
    case 4:
      descr.int_signed ? IntegersTo<int32_t>(in, n, to, dst)
                       : IntegersTo<uint32_t>(in, n, to, dst);
      break;
    default:
      descr.int_signed ? IntegersTo<int64_t>(in, n, to, dst)
                       : IntegersTo<uint64_t>(in, n, to, dst);
      break;
  }
  return out;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(std::string bytes,
                                  const NpyReadOptions& options) {
  const absl::string_view view(bytes);
  if (view.substr(0, kMagic.size()) != kMagic.substr(0, view.size()) ||
      view.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a .npy file: it starts with ", Quote(view.substr(0, 6)),
        ", not the magic string \"\\x93NUMPY\""));
  }
  if (view.size() < kMagic.size() + 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy file: ", view.size(),
                     " bytes, which end inside the magic string and version"));
  }
  const int major = static_cast<unsigned char>(view[6]);
  const int minor = static_cast<unsigned char>(view[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .npy format version ", major, ".", minor,
                     " (supported: 1.0, 2.0, 3.0)"));
  }
  const size_t length_width = major == 1 ? 2 : 4;
  const size_t prefix = kMagic.size() + 2 + length_width;
  if (view.size() < prefix) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .npy file: ", view.size(),
        " bytes, which end inside the header length field of version ", major,
        ".0"));
  }
  const size_t header_length = ReadLe(view, kMagic.size() + 2, length_width);
  if (view.size() - prefix < header_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy file: the header is ", header_length,
                     " bytes long but only ", view.size() - prefix,
                     " bytes follow the preamble"));
  }
  // Version 1.0 and 2.0 headers are latin-1, 3.0 ones UTF-8; the keys and
  // every dtype we accept are ASCII, so the bytes parse the same either way.
  ASSIGN_OR_RETURN(Header header,
                   ParseHeader(view.substr(prefix, header_length)));

  Descr& descr = header.descr;
  // Integers other than uint16 (raw bfloat16 bits by convention) are read
  // only to be converted; uint16 too when a dtype other than bfloat16 is
  // asked for.
  const bool convert_integers =
      descr.int_size > 0 &&
      (!descr.raw_uint16 || (options.integers_as.has_value() &&
                             *options.integers_as != DType::kBFloat16));
  if (convert_integers && !options.integers_as.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", absl::CHexEscape(descr.text), "' (", IntegerName(descr),
        ") is read only when converted to a float dtype (matmul-cli: "
        "--dtype float32, float64, float16 or bfloat16)"));
  }
  NpyArray array;
  array.raw_uint16 = descr.raw_uint16 && !convert_integers;
  HostTensor& t = array.tensor;
  t.dtype = descr.dtype;
  t.shape = std::move(header.shape);
  // Integers: counted as float64 (8 bytes, the widest) for the overflow
  // check, then at their own size.
  ASSIGN_OR_RETURN(
      int64_t expected,
      NumBytes(t.shape, convert_integers ? DType::kFloat64 : t.dtype));
  if (convert_integers) {
    expected = expected / 8 * static_cast<int64_t>(descr.int_size);
  }
  const size_t found = view.size() - prefix - header_length;
  if (static_cast<uint64_t>(expected) != found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data length mismatch: shape ", ShapeString(t.shape), " of '",
        absl::CHexEscape(header.descr.text), "' needs ", expected,
        " bytes of data, but ", found, " bytes follow the header"));
  }
  bytes.erase(0, prefix + header_length);
  t.data = std::move(bytes);
  const size_t item_size =
      convert_integers ? descr.int_size : DTypeSize(t.dtype);
  if (descr.byte_swap) ByteSwap(t.data, item_size);
  if (header.fortran_order && t.shape.size() > 1) {
    t.data = FortranToC(t.data, t.shape, item_size);
  }
  if (convert_integers) {
    t.dtype = *options.integers_as;
    t.data = ConvertIntegers(t.data, descr, t.dtype);
  }
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path,
                                 const NpyReadOptions& options) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, path);
  struct stat info;
  if (fstat(fileno(file.get()), &info) != 0) {
    return absl::ErrnoToStatus(errno, path);
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::ErrnoToStatus(EISDIR, path);
  }
  std::string bytes;
  // A regular file is read in one go into a string of its size; anything
  // else (a pipe, /dev/stdin) grows the string as it goes.
  if (S_ISREG(info.st_mode) && info.st_size > 0) {
    bytes.resize(static_cast<size_t>(info.st_size));
    bytes.resize(std::fread(bytes.data(), 1, bytes.size(), file.get()));
  }
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    bytes.append(buffer, got);
  }
  if (std::ferror(file.get())) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
  }
  absl::StatusOr<NpyArray> array = ParseNpy(std::move(bytes), options);
  if (!array.ok()) return WithPath(path, array.status());
  return array;
}

absl::StatusOr<std::string> NpyHeader(const HostTensor& tensor) {
  RETURN_IF_ERROR(CheckHostTensor(tensor));
  // Byte for byte what numpy.lib.format._write_array_header produces.
  std::string dict = absl::StrCat("{'descr': '", DescrFor(tensor.dtype),
                                  "', 'fortran_order': False, 'shape': (",
                                  absl::StrJoin(tensor.shape, ", "),
                                  tensor.shape.size() == 1 ? ",), }" : "), }");
  if (!tensor.shape.empty()) {
    const size_t digits = absl::StrCat(tensor.shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) {
      dict.append(kGrowthAxisMaxDigits - digits, ' ');
    }
  }
  const size_t with_newline = dict.size() + 1;
  int major = 1;
  size_t length_width = 2;
  size_t padding =
      kArrayAlign -
      (kMagic.size() + 2 + length_width + with_newline) % kArrayAlign;
  if (with_newline + padding > 0xffff) {
    major = 2;
    length_width = 4;
    padding = kArrayAlign -
              (kMagic.size() + 2 + length_width + with_newline) % kArrayAlign;
  }
  const size_t header_length = with_newline + padding;
  std::string out(kMagic.data(), kMagic.size());
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < length_width; ++i) {
    out.push_back(static_cast<char>((header_length >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(padding, ' ');
  out.push_back('\n');
  return out;
}

absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor) {
  ASSIGN_OR_RETURN(std::string out, NpyHeader(tensor));
  out += tensor.data;
  return out;
}

absl::Status WriteNpy(const std::string& path, const HostTensor& tensor) {
  absl::StatusOr<std::string> header = NpyHeader(tensor);
  if (!header.ok()) return WithPath(path, header.status());
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, path);
  if (std::fwrite(header->data(), 1, header->size(), file.get()) !=
          header->size() ||
      std::fwrite(tensor.data.data(), 1, tensor.data.size(), file.get()) !=
          tensor.data.size()) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write failed"));
  }
  if (std::fclose(file.release()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": close failed"));
  }
  return absl::OkStatus();
}

}  // namespace matmul
