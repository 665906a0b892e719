/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Minimal POSIX TCP socket wrapper used by rpc_socket_impl.cc (RPC client
 * connect and the server loop on an accepted fd). A TCPSocket is a plain handle:
 * copies share the fd and nothing is closed implicitly.
 */
#ifndef TVM_SUPPORT_SOCKET_H_
#define TVM_SUPPORT_SOCKET_H_

#if defined(_WIN32)
#error "edgepack's TVM compat socket.h supports POSIX systems only"
#endif

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#include <tvm/ffi/error.h>

#include <cstring>
#include <string>

#include "errno_handling.h"
#include "ssize.h"

namespace tvm {
namespace support {

/*! \brief A resolved socket address (IPv4 or IPv6). */
class SockAddr {
 public:
  SockAddr() { std::memset(&addr_, 0, sizeof(addr_)); }
  /*! \brief Resolve host (name or literal) and port; throws if it cannot be resolved. */
  SockAddr(const char* host, int port) : SockAddr() { Set(host, port); }

  void Set(const char* host, int port) {
    addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    std::string service = std::to_string(port);
    int sig = getaddrinfo(host, service.c_str(), &hints, &res);
    if (sig != 0 || res == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "cannot resolve address " << host << ":" << port << ": "
                                  << gai_strerror(sig);
    }
    std::memcpy(&addr_, res->ai_addr, res->ai_addrlen);
    addrlen_ = static_cast<socklen_t>(res->ai_addrlen);
    freeaddrinfo(res);
  }
  /*! \brief Address family (AF_INET or AF_INET6). */
  int ss_family() const { return addr_.ss_family; }
  /*! \brief "host:port" for messages. */
  std::string AsString() const {
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr_), addrlen_, host, sizeof(host), serv,
                    sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return "<unknown address>";
    }
    return std::string(host) + ":" + serv;
  }
  const sockaddr* addr() const { return reinterpret_cast<const sockaddr*>(&addr_); }
  socklen_t addrlen() const { return addrlen_; }

 private:
  sockaddr_storage addr_;
  socklen_t addrlen_{0};
};

/*! \brief Base socket handle. */
class Socket {
 public:
  using SockType = int;
  static const constexpr SockType kInvalid = -1;

  SockType sockfd;

  /*! \brief Throw an error naming the failed operation and errno. */
  [[noreturn]] static void Error(const char* msg) {
    int err = GetLastErrorCode();
    TVM_FFI_THROW(RuntimeError) << "Socket " << msg << " Error: " << std::strerror(err);
  }

  /*! \brief True when the handle is invalid or the socket is in a fatal error state. */
  bool BadSocket() const {
    if (sockfd == kInvalid) return true;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(sockfd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return true;
    return err == EBADF || err == EINTR;
  }
  bool IsClosed() const { return sockfd == kInvalid; }

  /*! \brief Close the fd (all copies of this handle become invalid). */
  void Close() {
    if (sockfd != kInvalid) {
      close(sockfd);
      sockfd = kInvalid;
    }
  }

 protected:
  explicit Socket(SockType fd) : sockfd(fd) {}
};

/*! \brief TCP stream socket. */
class TCPSocket : public Socket {
 public:
  TCPSocket() : Socket(kInvalid) {}
  explicit TCPSocket(SockType fd) : Socket(fd) {}

  /*! \brief Create the OS socket for an address family. */
  void Create(int af = AF_INET) {
    sockfd = socket(af, SOCK_STREAM, 0);
    if (sockfd == kInvalid) Socket::Error("Create");
  }
  /*! \brief Connect; false on failure. */
  bool Connect(const SockAddr& addr) {
    int ret = RetryCallOnEINTR([&]() { return connect(sockfd, addr.addr(), addr.addrlen()); },
                               GetLastErrorCode);
    return ret == 0;
  }
  /*! \brief One send(2) call; -1 on error. */
  ssize_t Send(const void* buf, size_t len, int flag = 0) {
    return RetryCallOnEINTR([&]() { return send(sockfd, buf, len, flag | kNoSignal); },
                            GetLastErrorCode);
  }
  /*! \brief One recv(2) call; 0 at end of stream, -1 on error. */
  ssize_t Recv(void* buf, size_t len, int flags = 0) {
    return RetryCallOnEINTR([&]() { return recv(sockfd, buf, len, flags); }, GetLastErrorCode);
  }
  /*! \brief Send all len bytes; throws on error. */
  size_t SendAll(const void* buf, size_t len) {
    const char* p = static_cast<const char*>(buf);
    size_t done = 0;
    while (done < len) {
      ssize_t n = Send(p + done, len - done);
      if (n == -1) Socket::Error("SendAll");
      done += static_cast<size_t>(n);
    }
    return done;
  }
  /*! \brief Receive len bytes unless the peer closes first; throws on error. */
  size_t RecvAll(void* buf, size_t len) {
    char* p = static_cast<char*>(buf);
    size_t done = 0;
    while (done < len) {
      ssize_t n = Recv(p + done, len - done, MSG_WAITALL);
      if (n == -1) Socket::Error("RecvAll");
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

 private:
#ifdef MSG_NOSIGNAL
  static const constexpr int kNoSignal = MSG_NOSIGNAL;
#else
  static const constexpr int kNoSignal = 0;
#endif
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_SOCKET_H_
