// A test suite's one server, started once for all its tests (`glm5 serve` with the
// suite's flags), and a check every suite makes after a bad request: a good one right
// after it still gets its reply.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server_process.h"

namespace glm5::test {

template <class Suite>
class SharedServer : public ::testing::Test {
  protected:
    // Suite::flags(): the serve flags of the suite's server.
    static void SetUpTestSuite() { server_ = std::make_unique<ServerProcess>(Suite::flags()); }
    static void TearDownTestSuite() { server_.reset(); }
    void SetUp() override { ASSERT_GT(server_->port(), 0) << server_->log(); }
    static int port() { return server_->port(); }
    static ServerProcess& server() { return *server_; }

  private:
    inline static std::unique_ptr<ServerProcess> server_;
};

}  // namespace glm5::test
