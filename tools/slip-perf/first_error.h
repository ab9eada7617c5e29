// The first failure among a test's threads: the one worth reporting (the others are
// usually its consequences: a broken gate, an aborted link).
#pragma once

#include <exception>
#include <mutex>
#include <string>

namespace slipperf {

class FirstError {
 public:
  // Records the exception being handled, unless one was recorded before.
  void Record() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_ != nullptr;
  }
  void RethrowIfAny() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }
  // The recorded failure's message.
  std::string What() {
    try {
      RethrowIfAny();
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown error";
    }
    return "";
  }

 private:
  std::mutex mu_;
  std::exception_ptr error_;
};

}  // namespace slipperf
