// Watching an HTTP client's connection while its request is being generated.
//
// cpp-httplib (0.11) does not hand its handlers the connection's socket, so it is
// found by its addresses: the one socket whose local and peer address and port are
// the request's. Reading its state (poll, MSG_PEEK) never consumes data.
#pragma once

#include <string>

namespace glm5::server {

// The connected socket with these addresses, or -1 when there is none.
int find_client_socket(const std::string& local_addr, int local_port,
                       const std::string& remote_addr, int remote_port);

// The peer has closed its side of the connection or the socket is in error.
bool client_gone(int fd);

}  // namespace glm5::server
