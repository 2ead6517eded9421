// Errors are values at the edges: loading and request handling throw
// glm5::Error with a message that says what is wrong and why; the apps turn it
// into a one-line report and an exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace glm5 {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A model that does not fit the machine: apps exit with code 2 after printing it.
class ResourceError : public Error {
  public:
    explicit ResourceError(const std::string& msg) : Error(msg) {}
};

}  // namespace glm5
