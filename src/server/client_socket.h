// Watching an HTTP client's connection while its request is being generated: the
// handler reads its own connection's socket (http_transport.h's client_socket())
// without consuming anything from it.
#pragma once

namespace glm5::server {

// The peer has closed its side of the connection or the socket is in error.
bool client_gone(int fd);

}  // namespace glm5::server
