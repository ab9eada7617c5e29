#include "tools/slip-stat/exit_records.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/trusted_path.h"
#include "tools/slip-stat/json_reader.h"

namespace slipstat {
namespace {

bool StringField(const JsonValue& object, const char* key, std::string* out) {
  const JsonValue* v = object.Find(key);
  if (v == nullptr || v->type != JsonValue::Type::kString) return false;
  *out = v->text;
  return true;
}

bool UintField(const JsonValue& object, const char* key, uint64_t* out) {
  const JsonValue* v = object.Find(key);
  return v != nullptr && v->AsUint(out);
}

bool ToConnection(const JsonValue& v, Connection* c) {
  return v.type == JsonValue::Type::kObject && StringField(v, "local", &c->local) &&
         StringField(v, "remote", &c->remote) && StringField(v, "transport", &c->transport) &&
         StringField(v, "reason", &c->reason) && UintField(v, "bytes_sent", &c->bytes_sent) &&
         UintField(v, "bytes_received", &c->bytes_received) &&
         (v.Find("provider") == nullptr || StringField(v, "provider", &c->provider));
}

// Appends what is in fd from `offset` on to *out, up to `max` bytes; *unread says how many
// more there were (as fstat tells: a file that grows meanwhile may have more still).
bool ReadFrom(int fd, uint64_t offset, uint64_t max, std::string* out, uint64_t* unread) {
  char buf[64 * 1024];
  auto at = static_cast<off_t>(offset);
  while (out->size() < max) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof(buf), max - out->size()));
    ssize_t n = pread(fd, buf, want, at);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      at += n;
    }
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > at) *unread = static_cast<uint64_t>(st.st_size - at);
  return true;
}

}  // namespace

bool ParseExitRecord(std::string_view line, Process* out, std::string* error) {
  JsonValue record;
  if (!ParseJson(line, &record, error)) return false;
  Process p;
  uint64_t pid = 0;
  const JsonValue* connections = record.Find("connections");
  if (record.type != JsonValue::Type::kObject || !UintField(record, "pid", &pid) ||
      pid > INT32_MAX || !StringField(record, "exe", &p.exe) ||
      !UintField(record, "dropped", &p.dropped) || connections == nullptr ||
      connections->type != JsonValue::Type::kArray) {
    *error = "not an exit record (pid, exe, dropped, connections)";
    return false;
  }
  p.pid = static_cast<pid_t>(pid);
  for (const JsonValue& item : connections->items) {
    Connection c;
    if (!ToConnection(item, &c)) {
      *error = "a connection lacks local, remote, transport, reason or byte counts";
      return false;
    }
    p.connections.push_back(std::move(c));
  }
  *out = std::move(p);
  return true;
}

bool ReadExitRecords(const std::string& path, uint64_t offset, ExitRecords* out,
                     std::string* error) {
  slip::PathVerdict verdict;
  int fd = slip::OpenOwnFileForRead(path.c_str(), &verdict);
  if (fd < 0 && errno == ENOENT) return true;
  if (fd < 0) {
    *error = path + ": " + verdict.why;
    return false;
  }
  std::string text;
  bool ok = ReadFrom(fd, offset, kMaxExitRecordBytes, &text, &out->unread_bytes);
  int err = errno;
  close(fd);
  if (!ok) {
    *error = path + ": " + strerror(err);
    return false;
  }
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
    Process p;
    std::string why;
    if (ParseExitRecord(line, &p, &why)) {
      out->processes.push_back(std::move(p));
    } else if (!line.empty()) {
      ++out->bad_lines;
    }
  }
  return true;
}

}  // namespace slipstat
