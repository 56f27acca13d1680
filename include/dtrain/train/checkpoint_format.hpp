#pragma once
// The checkpoint file: its layout, its validation, and the names of checkpoint files in a folder.
//
// Note [Checkpoint file format]
//   header  (32 bytes)  "DTRAINCK", u32 format version, u32 byte-order probe 0x01020304,
//                       u64 payload bytes, u64 zero
//   payload             i64 step, i64 epoch, i64 world size, string writer,
//                       u64 n, n x {string name, u64 bytes, bytes}             shared items
//                       u64 m, m x {string name, world size x {u64 bytes, bytes}} per-rank items
//   trailer (16 bytes)  u32 CRC-32C of header and payload, u32 zero, "DTRAINOK"
// Strings are a u64 length and the bytes. Integers are in the writer's byte order, which the probe
// records; an item's bytes are what dtrain_serialize / ObjectWriter made of it (Note [Object
// serialization]), so a checkpoint is read back by the same program on the same kind of machine.
// A file is valid when its magic, version, probe, length and checksum all agree; anything else is
// reported with the first thing that disagrees, which is what the warning on a skipped file says.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/serialize.hpp"
#include "dtrain/train/checkpoint_record.hpp"
#include "dtrain/core/crc32c.hpp"

namespace dtrain::detail {

inline constexpr char checkpoint_magic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
inline constexpr char checkpoint_end_magic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'O', 'K'};
inline constexpr std::uint32_t checkpoint_format_version = 1;
inline constexpr std::uint32_t checkpoint_byte_order_probe = 0x01020304u;
inline constexpr std::size_t checkpoint_header_bytes = 32;
inline constexpr std::size_t checkpoint_trailer_bytes = 16;

inline std::array<char, checkpoint_header_bytes> checkpoint_header(std::uint64_t payload_bytes) {
  std::array<char, checkpoint_header_bytes> h{};
  std::memcpy(h.data(), checkpoint_magic, 8);
  std::memcpy(h.data() + 8, &checkpoint_format_version, 4);
  std::memcpy(h.data() + 12, &checkpoint_byte_order_probe, 4);
  std::memcpy(h.data() + 16, &payload_bytes, 8);
  return h;
}

inline std::array<char, checkpoint_trailer_bytes> checkpoint_trailer(std::uint32_t crc) {
  std::array<char, checkpoint_trailer_bytes> t{};
  std::memcpy(t.data(), &crc, 4);
  std::memcpy(t.data() + 8, checkpoint_end_magic, 8);
  return t;
}

// The payload's fixed part, named once for the writer (Checkpoint::save) and the reader.
struct PayloadHead {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t world_size = 0;
  std::string writer;

  template <class Self>
  static auto tie_fields(Self& h) {
    return std::tie(h.step, h.epoch, h.world_size, h.writer);
  }
};

// Checks a whole file's bytes and indexes its payload. Returns the reason it is not a valid
// checkpoint, or an empty string (and fills `record`).
inline std::string parse_checkpoint(std::span<const char> file, CheckpointRecord& record) {
  if (file.size() < 8 && (file.empty() || std::memcmp(file.data(), checkpoint_magic, file.size()) == 0))
    return fmt::format("truncated: {} bytes", file.size());
  if (file.size() < 8 || std::memcmp(file.data(), checkpoint_magic, 8) != 0)
    return "not a dtrain checkpoint (it does not start with \"DTRAINCK\")";
  if (file.size() < checkpoint_header_bytes + checkpoint_trailer_bytes)
    return fmt::format("truncated: {} bytes, shorter than a header and trailer", file.size());
  std::uint32_t version = 0, probe = 0;
  std::uint64_t payload_bytes = 0;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&probe, file.data() + 12, 4);
  std::memcpy(&payload_bytes, file.data() + 16, 8);
  if (probe != checkpoint_byte_order_probe)
    return "written on a machine of the other byte order";
  if (version != checkpoint_format_version)
    return fmt::format("format version {}, this dtrain reads version {}", version,
                       checkpoint_format_version);
  const std::uint64_t expected = checkpoint_header_bytes + checkpoint_trailer_bytes + payload_bytes;
  if (payload_bytes > file.size() || file.size() != expected)
    return fmt::format("{}: {} bytes, its header announces {}",
                       file.size() < expected ? "truncated" : "trailing bytes", file.size(),
                       expected);
  const char* trailer = file.data() + file.size() - checkpoint_trailer_bytes;
  std::uint32_t trailer_zero = 0;
  std::memcpy(&trailer_zero, trailer + 4, 4);
  if (std::memcmp(trailer + 8, checkpoint_end_magic, 8) != 0 || trailer_zero != 0)
    return "the trailer is damaged (it does not end in 0 and \"DTRAINOK\")";
  std::uint32_t stored = 0;
  std::memcpy(&stored, trailer, 4);
  const std::uint32_t computed = crc32c(file.data(), file.size() - checkpoint_trailer_bytes);
  if (stored != computed)
    return fmt::format("checksum mismatch: stored CRC-32C {:08x}, contents give {:08x}", stored,
                       computed);
  const std::span<const char> payload = file.subspan(checkpoint_header_bytes, payload_bytes);
  ObjectReader in(payload.data(), payload.size());
  const auto item = [&] {  // u64 size, then the item's bytes, read later in place
    std::uint64_t n = 0;
    in.read(n);
    const ItemBytes bytes{checkpoint_header_bytes + in.offset(), static_cast<std::size_t>(n)};
    in.skip(n);
    return bytes;
  };
  const auto count = [&] {
    std::uint64_t n = 0;
    in.read(n);
    return n;
  };
  try {
    PayloadHead head;
    in.read(head);
    CheckpointRecord r;
    r.step = head.step;
    r.epoch = head.epoch;
    r.world_size = head.world_size;
    r.writer = std::move(head.writer);
    if (r.world_size < 1) return fmt::format("world size {} in the payload", r.world_size);
    // Each item takes at least 16 bytes (a name's length and the item's), each per-rank entry 8.
    const std::uint64_t n = count();
    if (n > payload_bytes / 16)
      return fmt::format("the payload claims {} shared items, more than it can hold", n);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string name;
      in.read(name);
      r.shared.emplace_back(std::move(name), item());
    }
    const std::uint64_t m = count();
    if (m > payload_bytes / 8)
      return fmt::format("the payload claims {} per-rank items, more than it can hold", m);
    for (std::uint64_t i = 0; i < m; ++i) {
      std::string name;
      in.read(name);
      std::vector<ItemBytes> ranks;
      for (std::int64_t k = 0; k < r.world_size; ++k) ranks.push_back(item());
      r.per_rank.emplace_back(std::move(name), std::move(ranks));
    }
    if (!in.done()) return "the payload has unread bytes after its last item";
    record = std::move(r);
  } catch (const InvalidArgumentError&) {
    return fmt::format("the payload ends inside an item or a name at byte {}",
                       checkpoint_header_bytes + in.offset());
  }
  return {};
}

// ---- file names ---------------------------------------------------------------------------------

inline constexpr std::string_view checkpoint_prefix = "checkpoint-";
inline constexpr std::string_view checkpoint_suffix = ".dtrain";

inline std::string checkpoint_file_name(std::int64_t step) {
  return fmt::format("{}{:012}{}", checkpoint_prefix, step, checkpoint_suffix);
}

// The step of "checkpoint-<digits>.dtrain", or nothing for any other name.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name) {
  if (!name.starts_with(checkpoint_prefix) || !name.ends_with(checkpoint_suffix)) return {};
  const std::string_view digits = name.substr(
      checkpoint_prefix.size(), name.size() - checkpoint_prefix.size() - checkpoint_suffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(),
                                     [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return {};
  return step;
}

struct CheckpointFile {
  std::int64_t step = 0;
  std::filesystem::path path;
};

// What a non-regular entry is, for the warning that skips it.
inline std::string_view describe_file_type(std::filesystem::file_type t) {
  using std::filesystem::file_type;
  switch (t) {
    case file_type::directory: return "a directory";
    case file_type::fifo: return "a FIFO";
    case file_type::socket: return "a socket";
    case file_type::block: return "a block device";
    case file_type::character: return "a character device";
    case file_type::not_found: return "a symbolic link to nothing";
    default: return "not a regular file";
  }
}

struct SkippedCheckpointEntry {
  std::filesystem::path path;
  std::string_view what;  // describe_file_type
};

// Checkpoint files in `directory`, oldest step first; none if the folder does not exist. Only
// regular files (or links to them) count: an entry that only has a checkpoint's name (a directory,
// a FIFO, whose read would block) is left out, and reported in `skipped` when given.
inline std::vector<CheckpointFile> list_checkpoint_files(
    const std::filesystem::path& directory, std::vector<SkippedCheckpointEntry>* skipped = nullptr) {
  std::vector<CheckpointFile> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    const auto step = checkpoint_step_of(it->path().filename().string());
    if (!step) continue;
    std::error_code status_ec;
    const auto type = std::filesystem::status(it->path(), status_ec).type();
    if (type != std::filesystem::file_type::regular) {
      if (skipped) skipped->push_back({it->path(), describe_file_type(type)});
      continue;
    }
    files.push_back({*step, it->path()});
  }
  std::sort(files.begin(), files.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.step < b.step; });
  return files;
}

// The whole file, or the reason it cannot be read. Opened without blocking and checked to be a
// regular file once open, so an entry swapped for a FIFO after the folder was listed cannot block.
inline std::string read_file_bytes(const std::filesystem::path& path, std::vector<char>& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot be opened ({})", std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fmt::format("cannot be examined ({})", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  const auto size = static_cast<std::size_t>(st.st_size);
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    return fmt::format("is too large to read into memory ({} bytes)", size);
  }
  std::size_t at = 0;
  while (at < size) {
    const ::ssize_t n = ::read(fd, bytes.data() + at, size - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fmt::format("cannot be read ({})", std::strerror(errno));
    if (n == 0) return fmt::format("ended after {} of its {} bytes while being read", at, size);
    at += static_cast<std::size_t>(n);
  }
  return {};
}

}  // namespace dtrain::detail
