// The .npy reader and writer (npy.h): the preamble (magic, version, header
// length) and the data are handled here; the header dictionary is parsed in
// npy_header_parser.cc, the elements converted in npy_elements.cc.
#include "client/tools/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/tools/npy_elements.h"
#include "client/tools/npy_header_parser.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
// numpy.lib.format: the data starts on a multiple of ARRAY_ALIGN, and the
// header leaves room for the first (C order) axis to grow to this many
// digits, so that an array can be appended to in place.
constexpr size_t kArrayAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;

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

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(std::string bytes,
                                  const NpyReadOptions& options) {
  const absl::string_view view(bytes);
  if (view.substr(0, kMagic.size()) != kMagic.substr(0, view.size()) ||
      view.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a .npy file: it starts with ", npy::Quote(view.substr(0, 6)),
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
  ASSIGN_OR_RETURN(npy::Header header,
                   npy::ParseHeader(view.substr(prefix, header_length)));

  npy::Descr& descr = header.descr;
  // Integers other than uint16 (raw bfloat16 bits by convention) are read
  // only to be converted; uint16 too when a dtype other than bfloat16 is
  // asked for.
  const bool convert_integers =
      descr.int_size > 0 &&
      (!descr.raw_uint16 || (options.integers_as.has_value() &&
                             *options.integers_as != DType::kBFloat16));
  if (convert_integers && !options.integers_as.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", absl::CHexEscape(descr.text), "' (", npy::IntegerName(descr),
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
  if (descr.byte_swap) npy::ByteSwap(t.data, item_size);
  if (header.fortran_order && t.shape.size() > 1) {
    t.data = npy::FortranToC(t.data, t.shape, item_size);
  }
  if (convert_integers) {
    t.dtype = *options.integers_as;
    t.data =
        npy::ConvertIntegers(t.data, descr.int_size, descr.int_signed, t.dtype);
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
