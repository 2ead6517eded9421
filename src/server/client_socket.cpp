#include "server/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace glm5::server {

namespace {

bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
        if (!inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf))) return false;
        port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
        if (!inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf))) return false;
        port = ntohs(in->sin6_port);
    } else {
        return false;
    }
    host = buf;
    return true;
}

}  // namespace

int find_client_socket(const std::string& local_addr, int local_port,
                       const std::string& remote_addr, int remote_port) {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1, by_ports = -1, n_by_ports = 0;
    while (dirent* e = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd < 0) continue;
        sockaddr_storage a{}, b{};
        socklen_t la = sizeof(a), lb = sizeof(b);
        std::string lhost, rhost;
        int lport = -1, rport = -1;
        if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&a), &la) != 0) continue;
        if (!address_of(a, lhost, lport) || lport != local_port) continue;
        if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&b), &lb) != 0) continue;
        if (!address_of(b, rhost, rport) || rport != remote_port) continue;
        ++n_by_ports;
        by_ports = int(fd);
        if (lhost == local_addr && rhost == remote_addr) {
            found = int(fd);
            break;
        }
    }
    closedir(dir);
    // Address spellings may differ (IPv4-mapped IPv6); the ports alone are unique
    // unless two peers share a port number.
    if (found < 0 && n_by_ports == 1) found = by_ports;
    return found;
}

bool client_gone(int fd) {
    if (fd < 0) return false;
    pollfd p{};
    p.fd = fd;
    p.events = POLLIN | POLLRDHUP;
    if (poll(&p, 1, 0) < 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
    if (p.revents & POLLIN) {
        // Readable: either a pipelined request (data) or the end of the stream (0).
        char c;
        return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

}  // namespace glm5::server
