// Test helper: runs `glm5 serve` on a free loopback port (--port 0, the port read
// from its "listening on" line), and speaks plain HTTP/1.1 to it over a socket.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace glm5::test {

class ServerProcess {
  public:
    // Starts the server with `args` after "serve"; waits (up to 60 s) until it listens.
    explicit ServerProcess(const std::vector<std::string>& args) {
        char path[] = "/tmp/glm5-serve-log-XXXXXX";
        const int fd = mkstemp(path);
        log_path_ = path;
        const char* bin = std::getenv("GLM5_BINARY");  // as util_cli.h's glm5_binary()
        std::vector<std::string> argv_s = {bin && *bin ? bin : GLM5_BINARY, "serve"};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        pid_ = fork();
        if (pid_ == 0) {
            dup2(fd, 2);
            const int devnull = ::open("/dev/null", O_RDWR);
            dup2(devnull, 0);
            dup2(devnull, 1);
            std::vector<char*> argv;
            for (auto& s : argv_s) argv.push_back(s.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        ::close(fd);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        const std::regex re("listening on http://[^:]+:([0-9]+)");
        while (std::chrono::steady_clock::now() < deadline) {
            std::smatch m;
            const std::string l = log();
            if (std::regex_search(l, m, re)) {
                port_ = std::stoi(m[1]);
                return;
            }
            int st = 0;
            if (waitpid(pid_, &st, WNOHANG) == pid_) {
                exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                pid_ = -1;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ~ServerProcess() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        std::remove(log_path_.c_str());
    }
    ServerProcess(const ServerProcess&) = delete;
    ServerProcess& operator=(const ServerProcess&) = delete;

    int port() const { return port_; }  // 0 when it did not start
    pid_t pid() const { return pid_; }
    std::string log() const {
        std::ifstream f(log_path_);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }
    void signal(int sig) const {
        if (pid_ > 0) kill(pid_, sig);
    }
    // Waits for the process to exit; its exit code, or -1 on timeout.
    int wait_exit(std::chrono::milliseconds timeout) {
        if (pid_ <= 0) return exit_code_;
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            int st = 0;
            if (waitpid(pid_, &st, WNOHANG) == pid_) {
                pid_ = -1;
                exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                return exit_code_;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return -1;
    }

  private:
    pid_t pid_ = -1;
    int port_ = 0;
    int exit_code_ = -1;
    std::string log_path_;
};

struct HttpReply {
    int status = 0;
    std::string headers;
    std::string body;  // de-chunked
    std::string raw;
};

// Base64 (RFC 4648, padded): data URLs for image requests.
inline std::string base64(const std::string& bytes) {
    static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 |
                           uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
        for (int k = 3; k >= 0; --k) out += t[(v >> (6 * k)) & 63];
    }
    if (i + 1 == bytes.size()) {
        const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
        out += std::string{t[v >> 18], t[(v >> 12) & 63], '=', '='};
    } else if (i + 2 == bytes.size()) {
        const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8;
        out += std::string{t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
    }
    return out;
}

inline int connect_loopback(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(s);
        return -1;
    }
    return s;
}

inline bool send_all(int s, const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
        const ssize_t n = ::send(s, data.data() + off, data.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return false;
        off += size_t(n);
    }
    return true;
}

inline HttpReply parse_reply(const std::string& raw) {
    HttpReply r;
    r.raw = raw;
    const size_t eol = raw.find("\r\n");
    if (raw.compare(0, 5, "HTTP/") != 0 || eol == std::string::npos) return r;
    r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
    const size_t end = raw.find("\r\n\r\n");
    if (end == std::string::npos) return r;
    r.headers = raw.substr(0, end);
    std::string body = raw.substr(end + 4);
    std::string lower = r.headers;
    for (auto& c : lower) c = char(std::tolower(c));
    if (lower.find("transfer-encoding: chunked") != std::string::npos) {
        size_t p = 0;
        while (p < body.size()) {
            const size_t le = body.find("\r\n", p);
            if (le == std::string::npos) break;
            const size_t n = std::strtoul(body.substr(p, le - p).c_str(), nullptr, 16);
            if (n == 0) break;
            r.body += body.substr(le + 2, n);
            p = le + 2 + n + 2;
        }
    } else {
        r.body = body;
    }
    return r;
}

// What the peer sends until it closes (or `seconds` pass without a byte).
inline std::string read_until_closed(int s, int seconds) {
    timeval tv{seconds, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string raw;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::recv(s, buf, sizeof(buf), 0);
        if (n <= 0) break;
        raw.append(buf, size_t(n));
    }
    return raw;
}

// One request on a fresh connection ("Connection: close"); reads until the server
// closes. `raw_request` is sent as is.
inline HttpReply http_raw(int port, const std::string& raw_request) {
    HttpReply r;
    const int s = connect_loopback(port);
    if (s < 0) return r;
    send_all(s, raw_request);
    const std::string raw = read_until_closed(s, 120);
    ::close(s);
    return parse_reply(raw);
}

inline std::string http_request(const std::string& method, const std::string& path,
                                const std::string& body, const std::string& extra_headers = "") {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (method == "POST")
        req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
               "\r\n";
    req += extra_headers;
    req += "\r\n";
    req += body;
    return req;
}

inline HttpReply http_post(int port, const std::string& path, const std::string& body,
                           const std::string& extra_headers = "") {
    return http_raw(port, http_request("POST", path, body, extra_headers));
}

inline HttpReply http_get(int port, const std::string& path,
                          const std::string& extra_headers = "") {
    return http_raw(port, http_request("GET", path, "", extra_headers));
}

// A field of a process's /proc status in KiB ("VmRSS:", "VmHWM:"); -1 when absent.
inline long vm_kib(pid_t pid, const char* field) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
    return -1;
}

// A Prometheus sample's value ("glm5_busy_slots" -> 0); -1 when absent.
inline double metric_value(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (line.compare(0, name.size() + 1, name + " ") == 0)
            return std::atof(line.c_str() + name.size() + 1);
    return -1;
}

}  // namespace glm5::test
