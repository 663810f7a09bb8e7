#include "tiler/core/error.hpp"

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>
#include <typeinfo>

#include "tiler/core/platform.hpp"

namespace tiler {
namespace {
std::string& rankPrefixStorage() {
  static std::string prefix;
  return prefix;
}

std::string withLocation(const std::string& what, const char* file, int line) {
  if (file == nullptr) return what;
  std::string f = file;
  auto slash = f.find_last_of('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return what + " [" + f + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(const std::string& what, const char* file, int line)
    : std::runtime_error(withLocation(what, file, line)), message_(what) {}

void setErrorRankPrefix(const std::string& prefix) {
  rankPrefixStorage() = prefix;
}
const std::string& errorRankPrefix() {
  return rankPrefixStorage();
}

void writeElasticErrorFile(const std::string& type, const std::string& message,
                           const std::string& traceback) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  // torchrun reads message.extraInfo.timestamp with int(): a string of whole seconds, as its ErrorHandler
  // writes.
  const nlohmann::json j = {
      {"message",
       {{"message", utf8Safe(type + ": " + message)},
        {"extraInfo",
         {{"py_callstack", utf8Safe(traceback)}, {"timestamp", std::to_string(seconds.count())}}}}}};
  // Best effort: the error is on its way to stderr already.
  (void)writeFileAtomically(path, [&](std::ostream& out) { out << j.dump() << "\n"; });
}

std::string exceptionTypeName(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                   std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

std::string withoutBacktrace(std::string what) {
  const auto cut = what.find("\nException raised from");
  if (cut != std::string::npos) what.resize(cut);
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what;
}

std::string firstLine(const std::string& what) {
  const auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

namespace {

// torchrun or ctrun on one node: an agent that watches every rank of the world.
bool underAnAgentOfEveryRank() {
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const char* world = std::getenv("WORLD_SIZE");
  return run_id && *run_id && local && world && std::string(local) == world;
}

// Until the agent stops this process (its SIGTERM ends it here), kFollowOnHold passes, or the agent is gone.
void holdForTheAgent() {
  const pid_t agent = getppid();
  const auto until = std::chrono::steady_clock::now() + kFollowOnHold;
  while (std::chrono::steady_clock::now() < until && getppid() == agent)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

namespace {

// Where a URL's part that `at` starts ends: at a space, a quote, or one of `stops`.
size_t urlPartEnd(const std::string& text, size_t at, const char* stops) {
  while (at < text.size() && !std::isspace(uint8_t(text[at])) && text[at] != '\'' && text[at] != '"' &&
         std::strchr(stops, text[at]) == nullptr)
    ++at;
  return at;
}

bool isSecretParameter(const std::string& name) {
  static const char* const secrets[] = {"x-amz-signature",
                                        "x-amz-credential",
                                        "x-amz-security-token",
                                        "x-goog-signature",
                                        "x-goog-credential",
                                        "signature",
                                        "sig",
                                        "token",
                                        "access_token"};
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::find(std::begin(secrets), std::end(secrets), lower) != std::end(secrets);
}

}  // namespace

// A scan, not std::regex: libstdc++'s regex recurses once a character, and a long line could overflow the
// stack of the very error report it passes through.
std::string redactSecrets(const std::string& text) {
  if (text.find("://") == std::string::npos) return text;  // the common case: no URL
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  for (size_t scheme; (scheme = text.find("://", at)) != std::string::npos;) {
    const size_t authority = scheme + 3, authority_end = urlPartEnd(text, authority, "/?#");
    out.append(text, at, authority - at);
    const size_t user_end = text.rfind('@', authority_end == 0 ? 0 : authority_end - 1);
    if (user_end != std::string::npos && user_end >= authority && user_end < authority_end) {
      // user:password@ keeps the user; a lone name there may be a token (https://TOKEN@host): all of it.
      const size_t colon = text.find(':', authority);
      out += colon < user_end ? text.substr(authority, colon - authority) + ":***@" : std::string("***@");
      at = user_end + 1;
    } else {
      at = authority;
    }
    // The query's secrets, up to the URL's end.
    const size_t url_end = urlPartEnd(text, at, "");
    for (size_t p = at; p < url_end; ++p) {
      if (text[p] != '?' && text[p] != '&') continue;
      const size_t eq = text.find('=', p + 1);
      const size_t value_end = eq == std::string::npos ? url_end : urlPartEnd(text, eq + 1, "&#");
      if (eq == std::string::npos || eq >= url_end || !isSecretParameter(text.substr(p + 1, eq - p - 1)))
        continue;
      out.append(text, at, eq + 1 - at).append("***");
      at = p = value_end;
      --p;
    }
    out.append(text, at, url_end - at);
    at = url_end;
  }
  return out.append(text, at, std::string::npos);
}

int reportFatal(const std::string& tool, const std::exception& e) {
  const std::string msg = redactSecrets(errorRankPrefix() + withoutBacktrace(e.what()));
  const std::string line = tool + ": error: " + msg;
  std::cerr << line << std::endl;
  writeElasticErrorFile(exceptionTypeName(e), msg, line);
  if (dynamic_cast<const PeerLostError*>(&e) && underAnAgentOfEveryRank()) holdForTheAgent();
  return kExitFatal;
}

std::string describeException(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.message();
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& err) {
    const std::string what = withoutBacktrace(err.what());
    return what.empty() ? "unknown error" : what;
  } catch (...) {
    return "unknown exception";
  }
}

std::string describeImageException(const std::exception_ptr& e, const std::string& path) {
  std::string message = describeException(e);
  if (message.find(path) == std::string::npos) message = "'" + path + "': " + message;
  return message;
}

namespace {

// The length of the valid UTF-8 sequence that starts text[i] (RFC 3629: no overlongs, no surrogates, at
// most U+10FFFF), or 0.
size_t utf8SequenceAt(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;
    if (c == 0xED) high = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

bool isUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8SequenceAt(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8Safe(const std::string& text) {
  if (isUtf8(text)) return text;
  std::string out;
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8SequenceAt(text, i);
    if (n > 0) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    const auto c = static_cast<unsigned char>(text[i++]);
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

}  // namespace tiler
