#include "server/client_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace glm5::server {

bool client_gone(int fd) {
    pollfd p{};
    p.fd = fd;
    p.events = POLLIN | POLLRDHUP;
    int r;
    do {
        r = poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    // A socket that cannot even be polled is no client to write to.
    if (r < 0) return true;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
    if (p.revents & POLLIN) {
        // Readable: either a pipelined request (data) or the end of the stream (0).
        char c;
        return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

}  // namespace glm5::server
