/*
 * edgepack_rpc_server.c - a TVM RPC server for devices without Python.
 *
 * It speaks the same protocol as `python -m tvm.exec.rpc_server`, so `tvm.rpc.connect(host, port,
 * key=...)`, `remote.upload`, `remote.load_module`, `relax.VirtualMachine(lib, remote.cpu())` and
 * `time_evaluator` work against it. The RPC session itself is TVM's own: the global function
 * `rpc.ServerLoop(sockfd)` of the official libtvm_runtime.so. This program only does what the
 * Python server does around it:
 *
 *   1. listen (127.0.0.1 by default), accept one client at a time;
 *   2. handshake: client sends int32 RPC_MAGIC, int32 keylen, "client:KEY[ -timeout=S]";
 *      server answers int32 RPC_MAGIC (or RPC_MAGIC+2 on key mismatch), int32 keylen, "server:KEY";
 *   3. fork a child per session: it gets a fresh work directory, chdir()s there and runs
 *      rpc.ServerLoop(fd) until the client closes; the parent waits (and ends the session with
 *      rpc.ReturnException when the client asked for -timeout=S), removes the directory and
 *      accepts the next client;
 *   4. optionally registers with an RPC tracker (--tracker HOST:PORT --key KEY), using the
 *      tracker's JSON protocol (UPDATE_INFO, PUT with a random match key, GET_PENDING_MATCHKEYS).
 *
 * The runtime's built-in tvm.rpc.server.upload/download/remove need "tvm.rpc.server.workpath";
 * the client's load_module needs "tvm.rpc.server.load_module". Python registers both in
 * tvm/rpc/server.py; here they are C functions registered with TVMFFIFunctionSetGlobal.
 *
 * Build: see CMakeLists.txt (links libtvm_runtime.so + libtvm_ffi.so, rpath $ORIGIN).
 * Plain C11, no C++ needed: everything goes through the tvm-ffi C ABI (tvm/ffi/c_api.h).
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <tvm/ffi/c_api.h>

#include "edgepack.h" /* ep_register_runtime_builtins, ep_memory_*: compiled in from runtimes/api/c/src/edgepack.c */
#include "ep_parallel.h" /* compiled in from runtimes/api/c/src/ep_parallel.c */

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EP_VERSION "0.3.0"

#define RPC_MAGIC 0xFF271
#define RPC_TRACKER_MAGIC 0x2F271
#define RPC_CODE_SUCCESS (RPC_MAGIC + 0)
#define RPC_CODE_MISMATCH (RPC_MAGIC + 2)

/* Tracker codes (tvm/rpc/base.py TrackerCode). */
#define TRACKER_SUCCESS 0
#define TRACKER_PUT 3
#define TRACKER_UPDATE_INFO 5
#define TRACKER_GET_PENDING_MATCHKEYS 7

#define EP_MAX_KEY 1024   /* longest handshake key accepted from a client */
#define EP_KEY_LEN 256    /* longest --key */
#define EP_MATCHKEY_SIZE (EP_KEY_LEN + 32)
#define EP_MAX_PATH 4096
#define EP_MAX_LOADS 16
#define EP_HANDSHAKE_TIMEOUT_S 10
#define EP_TRACKER_PING_S 2
#define EP_TRACKER_UNMATCH_TIMEOUT_S 4
#define EP_TRACKER_RETRY_S 5

/* ---------------------------------------------------------------------------------------- */
/* options and global state                                                                  */

typedef struct {
  const char* host;
  int port;
  int port_end;
  const char* key;
  const char* workdir;      /* parent of the per-session work directories */
  const char* port_file;    /* write the bound port here once listening */
  const char* tracker_host; /* NULL: standalone */
  int tracker_port;
  const char* custom_addr; /* address the tracker hands to clients (NULL: the tracker's view) */
  const char* loads[EP_MAX_LOADS];
  int num_loads;
  int once; /* serve one session, then exit */
  int threads; /* threads for parallel kernels (0: TVM_NUM_THREADS, else one per online CPU) */
  int silent;
  int no_plugins; /* do not load the GPU runtime plug-ins found next to the program */
  int exit_with_parent; /* SIGTERM when the process that started us ends (Linux prctl) */
} Options;

static Options g_opt;
static volatile sig_atomic_t g_stop = 0;
static pid_t g_child = -1;
static char g_session_dir[EP_MAX_PATH]; /* the work directory of the session in this process */

/* ---------------------------------------------------------------------------------------- */
/* logging                                                                                   */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void ep_log(const char* level, const char* fmt, ...) {
  if (g_opt.silent && strcmp(level, "ERROR") != 0) return;
  char stamp[32];
  time_t now = time(NULL);
  struct tm tm_now;
  localtime_r(&now, &tm_now);
  strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm_now);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s %s edgepack-rpc-server[%d]: ", stamp, level, (int)getpid());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
  va_end(ap);
}

/* ---------------------------------------------------------------------------------------- */
/* tvm-ffi helpers                                                                           */

/* Take the raised error out of TLS and describe it in buf. */
static const char* ep_ffi_error(char* buf, size_t size) {
  TVMFFIObjectHandle err = NULL;
  TVMFFIErrorMoveFromRaised(&err);
  if (err == NULL) {
    snprintf(buf, size, "unknown error");
    return buf;
  }
  const TVMFFIErrorCell* cell =
      (const TVMFFIErrorCell*)((const char*)err + sizeof(TVMFFIObject));
  snprintf(buf, size, "%.*s: %.*s", (int)cell->kind.size, cell->kind.data, (int)cell->message.size,
           cell->message.data);
  TVMFFIObjectDecRef(err);
  return buf;
}

static TVMFFIObjectHandle ep_get_global(const char* name) {
  TVMFFIByteArray bname = {name, strlen(name)};
  TVMFFIObjectHandle f = NULL;
  if (TVMFFIFunctionGetGlobal(&bname, &f) != 0) {
    char msg[1024];
    ep_log("ERROR", "looking up %s: %s", name, ep_ffi_error(msg, sizeof(msg)));
    return NULL;
  }
  return f;
}

/* View a string argument (raw, small or object string, or bytes) without copying. */
static int ep_arg_string(const TVMFFIAny* arg, const char** data, size_t* size) {
  switch (arg->type_index) {
    case kTVMFFIRawStr:
      *data = arg->v_c_str;
      *size = strlen(arg->v_c_str);
      return 0;
    case kTVMFFISmallStr:
    case kTVMFFISmallBytes:
      *data = arg->v_bytes;
      *size = arg->small_str_len;
      return 0;
    case kTVMFFIStr:
    case kTVMFFIBytes: {
      const TVMFFIByteArray* ba =
          (const TVMFFIByteArray*)((const char*)arg->v_obj + sizeof(TVMFFIObject));
      *data = ba->data;
      *size = ba->size;
      return 0;
    }
    case kTVMFFIByteArrayPtr: {
      const TVMFFIByteArray* ba = (const TVMFFIByteArray*)arg->v_ptr;
      *data = ba->data;
      *size = ba->size;
      return 0;
    }
    default:
      return -1;
  }
}

static int ep_raise(const char* kind, const char* msg) {
  TVMFFIErrorSetRaisedFromCStr(kind, msg);
  return -1;
}

/*
 * Resolve a client-supplied file name inside the session work directory. Like the Python
 * server it joins the name to the work directory; unlike it, names that would leave the
 * directory (absolute paths, "..") are refused.
 */
static int ep_resolve(const TVMFFIAny* args, int32_t num_args, const char* fname, char* out,
                      size_t out_size) {
  char msg[EP_MAX_PATH + 256];
  const char* name = NULL;
  size_t len = 0;
  if (num_args < 1 || ep_arg_string(&args[0], &name, &len) != 0) {
    snprintf(msg, sizeof(msg), "%s expects a file name (str)", fname);
    return ep_raise("TypeError", msg);
  }
  if (g_session_dir[0] == '\0') {
    return ep_raise("RuntimeError", "no RPC session work directory");
  }
  if (len == 0 || name[0] == '/' || memchr(name, '\0', len) != NULL) {
    snprintf(msg, sizeof(msg), "%s: invalid file name '%.*s' (must be relative to the work directory)",
             fname, (int)(len > 512 ? 512 : len), name);
    return ep_raise("ValueError", msg);
  }
  /* reject ".." as a path component */
  for (size_t i = 0; i < len;) {
    size_t j = i;
    while (j < len && name[j] != '/') ++j;
    if (j - i == 2 && name[i] == '.' && name[i + 1] == '.') {
      snprintf(msg, sizeof(msg), "%s: file name '%.*s' leaves the work directory", fname,
               (int)(len > 512 ? 512 : len), name);
      return ep_raise("ValueError", msg);
    }
    i = j + 1;
  }
  int n = snprintf(out, out_size, "%s/%.*s", g_session_dir, (int)len, name);
  if (n < 0 || (size_t)n >= out_size) return ep_raise("ValueError", "file name too long");
  return 0;
}

static int ep_return_string(const char* s, TVMFFIAny* result) {
  TVMFFIByteArray ba = {s, strlen(s)};
  return TVMFFIStringFromByteArray(&ba, result);
}

static int ep_ends_with(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* tvm.rpc.server.workpath(name) -> absolute path in the session work directory */
static int ep_fn_workpath(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  char path[EP_MAX_PATH];
  if (ep_resolve(args, num_args, "tvm.rpc.server.workpath", path, sizeof(path)) != 0) return -1;
  return ep_return_string(path, result);
}

/* tvm.rpc.server.load_module(name) -> ffi.ModuleLoadFromFile(workpath(name)) */
static int ep_fn_load_module(void* self, const TVMFFIAny* args, int32_t num_args,
                             TVMFFIAny* result) {
  (void)self;
  char path[EP_MAX_PATH];
  char msg[EP_MAX_PATH + 1024];
  if (ep_resolve(args, num_args, "tvm.rpc.server.load_module", path, sizeof(path)) != 0) return -1;
  if (ep_ends_with(path, ".o") || ep_ends_with(path, ".tar")) {
    snprintf(msg, sizeof(msg),
             "cannot load %s: this device has no compiler to link object files; export the "
             "library as a shared object with the cross compiler on the host "
             "(export_library('lib.so', fcompile=tvm.support.cc.cross_compiler(...))) and upload that",
             path);
    return ep_raise("RuntimeError", msg);
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    snprintf(msg, sizeof(msg), "cannot load %s: %s (upload it first)", path, strerror(errno));
    return ep_raise("FileNotFoundError", msg);
  }
  TVMFFIObjectHandle fload = ep_get_global("ffi.ModuleLoadFromFile");
  if (fload == NULL) return ep_raise("RuntimeError", "ffi.ModuleLoadFromFile is not registered");
  TVMFFIAny arg;
  memset(&arg, 0, sizeof(arg));
  arg.type_index = kTVMFFIRawStr;
  arg.v_c_str = path;
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  /* the library's weights on huge pages, as the C API's ep_model_open() puts them */
  ep_memory_mark* mark = ep_memory_mark_take();
  int rc = TVMFFIFunctionCall(fload, &arg, 1, result);
  ep_memory_collapse_since(mark);
  TVMFFIObjectDecRef(fload);
  if (rc != 0) return rc; /* the raised error stays in TLS and travels back to the client */
  /* Keep the library mapped for the rest of the session, like tvm_ffi.load_module does. */
  TVMFFIObjectHandle fkeep = ep_get_global("ffi.ModuleGlobalsAdd");
  if (fkeep != NULL) {
    TVMFFIAny keep_rv;
    memset(&keep_rv, 0, sizeof(keep_rv));
    keep_rv.type_index = kTVMFFINone;
    if (TVMFFIFunctionCall(fkeep, result, 1, &keep_rv) != 0) {
      char err[1024];
      ep_log("WARN", "ffi.ModuleGlobalsAdd: %s", ep_ffi_error(err, sizeof(err)));
    } else if (keep_rv.type_index >= kTVMFFIStaticObjectBegin) {
      TVMFFIObjectDecRef(keep_rv.v_obj);
    }
    TVMFFIObjectDecRef(fkeep);
  }
  ep_log("INFO", "load_module %s", path);
  return 0;
}

/* tvm.rpc.server.download_linked_module: linking needs a compiler on the device. */
static int ep_fn_download_linked(void* self, const TVMFFIAny* args, int32_t num_args,
                                 TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)num_args;
  (void)result;
  return ep_raise("RuntimeError",
                  "download_linked_module is not supported by edgepack-rpc-server: the device has "
                  "no compiler; link the library on the host with the cross compiler");
}

static int ep_register(const char* name, TVMFFISafeCallType fn) {
  TVMFFIObjectHandle f = NULL;
  char msg[1024];
  if (TVMFFIFunctionCreate(NULL, fn, NULL, &f) != 0) {
    ep_log("ERROR", "creating %s: %s", name, ep_ffi_error(msg, sizeof(msg)));
    return -1;
  }
  TVMFFIByteArray bname = {name, strlen(name)};
  int rc = TVMFFIFunctionSetGlobal(&bname, f, 1);
  TVMFFIObjectDecRef(f);
  if (rc != 0) {
    ep_log("ERROR", "registering %s: %s", name, ep_ffi_error(msg, sizeof(msg)));
    return -1;
  }
  return 0;
}

static int ep_register_server_env(void) {
  if (ep_register("tvm.rpc.server.workpath", ep_fn_workpath) != 0) return -1;
  if (ep_register("tvm.rpc.server.load_module", ep_fn_load_module) != 0) return -1;
  if (ep_register("tvm.rpc.server.download_linked_module", ep_fn_download_linked) != 0) return -1;
  /* The runtime itself provides upload/download/remove over workpath, plus rpc.ServerLoop. */
  const char* required[] = {"rpc.ServerLoop", "tvm.rpc.server.upload", "runtime.RPCTimeEvaluator"};
  for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); ++i) {
    TVMFFIObjectHandle f = ep_get_global(required[i]);
    if (f == NULL) {
      ep_log("ERROR",
             "the TVM runtime has no %s: use a libtvm_runtime.so built with the RPC runtime "
             "(the official apache-tvm wheels have it)",
             required[i]);
      return -1;
    }
    TVMFFIObjectDecRef(f);
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* sockets                                                                                   */

static int ep_send_all(int fd, const void* buf, size_t len) {
  const char* p = (const char*)buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int ep_recv_all(int fd, void* buf, size_t len) {
  char* p = (char*)buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) return -1; /* peer closed */
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* The RPC protocol sends int32 in the host's byte order; every supported target is little-endian. */
static int ep_send_i32(int fd, int32_t v) { return ep_send_all(fd, &v, sizeof(v)); }

static int ep_recv_i32(int fd, int32_t* v) { return ep_recv_all(fd, v, sizeof(*v)); }

static void ep_set_timeout(int fd, int seconds) {
  struct timeval tv = {seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int ep_listen(const char* host, int port, int port_end, int* bound_port) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int last_errno = 0;
  for (int p = port; p < port_end || (p == port && port_end <= port); ++p) {
    char sport[16];
    snprintf(sport, sizeof(sport), "%d", p);
    int gai = getaddrinfo(host, sport, &hints, &res);
    if (gai != 0) {
      ep_log("ERROR", "cannot resolve --host %s: %s", host, gai_strerror(gai));
      return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      ep_log("ERROR", "socket: %s", strerror(errno));
      freeaddrinfo(res);
      return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 4) == 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof(ss);
      int actual = p;
      if (getsockname(fd, (struct sockaddr*)&ss, &sl) == 0) {
        actual = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6*)&ss)->sin6_port)
                                          : ntohs(((struct sockaddr_in*)&ss)->sin_port);
      }
      freeaddrinfo(res);
      *bound_port = actual;
      return fd;
    }
    last_errno = errno;
    close(fd);
    freeaddrinfo(res);
    res = NULL;
    if (last_errno != EADDRINUSE) break;
  }
  if (port_end > port + 1) {
    ep_log("ERROR", "cannot bind %s to any port in [%d, %d): %s", host, port, port_end,
           strerror(last_errno));
  } else {
    ep_log("ERROR", "cannot bind %s:%d: %s", host, port, strerror(last_errno));
  }
  return -1;
}

static int ep_connect_tcp(const char* host, int port, int timeout_s) {
  struct addrinfo hints, *res = NULL, *ai;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  char sport[16];
  snprintf(sport, sizeof(sport), "%d", port);
  if (getaddrinfo(host, sport, &hints, &res) != 0) return -1;
  int fd = -1;
  for (ai = res; ai != NULL; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    ep_set_timeout(fd, timeout_s); /* Linux applies SO_SNDTIMEO to connect() */
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

/* ---------------------------------------------------------------------------------------- */
/* tracker (tvm/rpc/tracker.py protocol: int32 magic, then int32-length-prefixed JSON)       */

static int ep_send_json(int fd, const char* json) {
  size_t n = strlen(json);
  if (ep_send_i32(fd, (int32_t)n) != 0) return -1;
  return ep_send_all(fd, json, n);
}

/* Receive one JSON message into a malloc'ed, NUL-terminated buffer. */
static char* ep_recv_json(int fd) {
  int32_t n = 0;
  if (ep_recv_i32(fd, &n) != 0 || n < 0 || n > (1 << 24)) return NULL;
  char* buf = (char*)malloc((size_t)n + 1);
  if (buf == NULL) return NULL;
  if (ep_recv_all(fd, buf, (size_t)n) != 0) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

static int ep_tracker_expect_success(int fd) {
  char* reply = ep_recv_json(fd);
  if (reply == NULL) return -1;
  int ok = atoi(reply) == TRACKER_SUCCESS && reply[0] != '\0';
  free(reply);
  return ok ? 0 : -1;
}

static void ep_json_addr(char* out, size_t size) {
  if (g_opt.custom_addr != NULL) {
    snprintf(out, size, "\"%s\"", g_opt.custom_addr);
  } else {
    snprintf(out, size, "null");
  }
}

static int ep_tracker_open(int port) {
  int fd = ep_connect_tcp(g_opt.tracker_host, g_opt.tracker_port, 10);
  if (fd < 0) return -1;
  int32_t magic = 0;
  if (ep_send_i32(fd, RPC_TRACKER_MAGIC) != 0 || ep_recv_i32(fd, &magic) != 0 ||
      magic != RPC_TRACKER_MAGIC) {
    ep_log("ERROR", "%s:%d is not a TVM RPC tracker", g_opt.tracker_host, g_opt.tracker_port);
    close(fd);
    return -1;
  }
  char addr[EP_KEY_LEN + 8], msg[2 * EP_KEY_LEN + 128];
  ep_json_addr(addr, sizeof(addr));
  snprintf(msg, sizeof(msg), "[%d, {\"key\": \"server:%s\", \"addr\": [%s, %d]}]",
           TRACKER_UPDATE_INFO, g_opt.key, addr, port);
  if (ep_send_json(fd, msg) != 0 || ep_tracker_expect_success(fd) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int ep_tracker_put(int fd, int port, const char* matchkey) {
  char addr[EP_KEY_LEN + 8], msg[EP_KEY_LEN + EP_MATCHKEY_SIZE + EP_KEY_LEN + 128];
  ep_json_addr(addr, sizeof(addr));
  snprintf(msg, sizeof(msg), "[%d, \"%s\", [%d, \"%s\"], %s]", TRACKER_PUT, g_opt.key, port,
           matchkey, addr);
  if (ep_send_json(fd, msg) != 0) return -1;
  return ep_tracker_expect_success(fd);
}

/* 1: matchkey is pending (a client asked the tracker for it), 0: not, -1: tracker lost */
static int ep_tracker_pending(int fd, const char* matchkey) {
  char msg[32];
  snprintf(msg, sizeof(msg), "[%d]", TRACKER_GET_PENDING_MATCHKEYS);
  if (ep_send_json(fd, msg) != 0) return -1;
  char* reply = ep_recv_json(fd);
  if (reply == NULL) return -1;
  char quoted[EP_MATCHKEY_SIZE + 8];
  snprintf(quoted, sizeof(quoted), "\"%s\"", matchkey);
  int found = strstr(reply, quoted) != NULL;
  free(reply);
  return found;
}

static void ep_random_matchkey(char* out, size_t size) {
  unsigned int r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, &r, sizeof(r)) != (ssize_t)sizeof(r)) {
    r = (unsigned int)time(NULL) ^ ((unsigned int)getpid() << 16);
  }
  if (fd >= 0) close(fd);
  snprintf(out, size, "%s:0.%09u", g_opt.key, r % 1000000000u);
}

/* ---------------------------------------------------------------------------------------- */
/* sessions                                                                                  */

static int ep_rm_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void ep_remove_tree(const char* dir) {
  if (dir[0] != '\0') nftw(dir, ep_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Runs in the forked child: the whole RPC session. Never returns. */
static void ep_session_child(int conn, const char* session_dir) {
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_session_dir, sizeof(g_session_dir), "%s", session_dir);
  if (chdir(session_dir) != 0) {
    ep_log("ERROR", "chdir %s: %s", session_dir, strerror(errno));
    _exit(3);
  }
  ep_set_timeout(conn, 0); /* blocking from now on: the RPC loop waits for the client */
  int one = 1;
  setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  TVMFFIObjectHandle loop = ep_get_global("rpc.ServerLoop");
  if (loop == NULL) _exit(3);
  TVMFFIAny arg, rv;
  memset(&arg, 0, sizeof(arg));
  memset(&rv, 0, sizeof(rv));
  arg.type_index = kTVMFFIInt;
  arg.v_int64 = conn;
  rv.type_index = kTVMFFINone;
  int code = 0;
  if (TVMFFIFunctionCall(loop, &arg, 1, &rv) != 0) {
    char msg[2048];
    ep_log("ERROR", "RPC session ended with an error: %s", ep_ffi_error(msg, sizeof(msg)));
    code = 4;
  }
  fflush(stdout);
  fflush(stderr);
  _exit(code); /* skip static destructors of the runtime in the forked child */
}

static void ep_return_exception(int conn, const char* message) {
  TVMFFIObjectHandle f = ep_get_global("rpc.ReturnException");
  if (f == NULL) return;
  TVMFFIAny args[2], rv;
  memset(args, 0, sizeof(args));
  memset(&rv, 0, sizeof(rv));
  args[0].type_index = kTVMFFIInt;
  args[0].v_int64 = conn;
  args[1].type_index = kTVMFFIRawStr;
  args[1].v_c_str = message;
  rv.type_index = kTVMFFINone;
  if (TVMFFIFunctionCall(f, args, 2, &rv) != 0) {
    char msg[1024];
    ep_log("WARN", "rpc.ReturnException: %s", ep_ffi_error(msg, sizeof(msg)));
  }
  TVMFFIObjectDecRef(f);
}

static void ep_serve(int conn, const char* peer, double timeout_s) {
  char session_dir[EP_MAX_PATH];
  int n = snprintf(session_dir, sizeof(session_dir), "%s/session.XXXXXX", g_opt.workdir);
  if (n < 0 || (size_t)n >= sizeof(session_dir) || mkdtemp(session_dir) == NULL) {
    ep_log("ERROR", "cannot create a session directory in %s: %s", g_opt.workdir, strerror(errno));
    return;
  }
  ep_log("INFO", "connected from %s, serving in %s", peer, session_dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    ep_log("ERROR", "fork: %s", strerror(errno));
    ep_remove_tree(session_dir);
    return;
  }
  if (pid == 0) ep_session_child(conn, session_dir);
  g_child = pid;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  int status = 0, done = 0, timed_out = 0;
  while (!done) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      done = 1;
      break;
    }
    if (w < 0 && errno != EINTR) break;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
    if (g_stop || (timeout_s > 0 && elapsed > timeout_s)) {
      if (!g_stop) {
        timed_out = 1;
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "RPCSessionTimeoutError: Your %gs session has expired, try to increase the "
                 "\"session_timeout\" value.",
                 timeout_s);
        ep_log("INFO", "session timeout after %gs, ending it", timeout_s);
        ep_return_exception(conn, msg);
      }
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      done = 1;
      break;
    }
    usleep(50 * 1000);
  }
  g_child = -1;
  if (done && !timed_out && WIFSIGNALED(status)) {
    ep_log("ERROR", "session process died with signal %d", WTERMSIG(status));
  } else if (done && !timed_out && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    ep_log("ERROR", "session process exited with code %d", WEXITSTATUS(status));
  }
  ep_remove_tree(session_dir);
  ep_log("INFO", "finished serving %s", peer);
}

/*
 * Handshake with a client that just connected. Returns 1 when the session may start (and sets
 * *timeout_s from a "-timeout=S" option), 0 when the connection was refused or broken.
 */
static int ep_handshake(int conn, const char* matchkey, const char* peer, double* timeout_s) {
  int32_t magic = 0, keylen = 0;
  ep_set_timeout(conn, EP_HANDSHAKE_TIMEOUT_S);
  if (ep_recv_i32(conn, &magic) != 0 || magic != RPC_MAGIC) {
    ep_log("WARN", "%s: not a TVM RPC client (bad magic), closing", peer);
    return 0;
  }
  if (ep_recv_i32(conn, &keylen) != 0 || keylen < 0 || keylen > EP_MAX_KEY) {
    ep_log("WARN", "%s: bad key length, closing", peer);
    return 0;
  }
  char key[EP_MAX_KEY + 1];
  if (keylen > 0 && ep_recv_all(conn, key, (size_t)keylen) != 0) return 0;
  key[keylen] = '\0';
  /* key = "client:MATCHKEY[ -timeout=S]..." */
  char expect[EP_MATCHKEY_SIZE + 16];
  snprintf(expect, sizeof(expect), "client:%s", matchkey);
  size_t first_len = strcspn(key, " ");
  if (first_len != strlen(expect) || strncmp(key, expect, first_len) != 0) {
    ep_log("WARN", "%s: mismatched key '%.*s' (expected '%s'), refusing", peer, (int)first_len, key,
           expect);
    ep_send_i32(conn, RPC_CODE_MISMATCH);
    return 0;
  }
  *timeout_s = 0;
  for (char* opt = strstr(key, " -timeout="); opt != NULL; opt = strstr(opt + 1, " -timeout=")) {
    *timeout_s = atof(opt + strlen(" -timeout="));
  }
  char server_key[EP_KEY_LEN + 16];
  snprintf(server_key, sizeof(server_key), "server:%s", g_opt.key);
  int32_t slen = (int32_t)strlen(server_key);
  if (ep_send_i32(conn, RPC_CODE_SUCCESS) != 0 || ep_send_i32(conn, slen) != 0 ||
      ep_send_all(conn, server_key, (size_t)slen) != 0) {
    ep_log("WARN", "%s: handshake failed: %s", peer, strerror(errno));
    return 0;
  }
  return 1;
}

static void ep_peer_name(const struct sockaddr_storage* ss, char* out, size_t size) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  snprintf(out, size, "%s:%d", host, port);
}

static void ep_on_signal(int sig) {
  (void)sig;
  g_stop = 1;
  if (g_child > 0) kill(g_child, SIGKILL);
}

static int ep_write_port_file(const char* path, int port) {
  char tmp[EP_MAX_PATH];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (f == NULL) return -1;
  fprintf(f, "%d\n", port);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

static int ep_run(void) {
  int port = 0;
  int lfd = ep_listen(g_opt.host, g_opt.port, g_opt.port_end, &port);
  if (lfd < 0) return 1;
  ep_log("INFO", "bind to %s:%d", g_opt.host, port);
  if (g_opt.port_file != NULL && ep_write_port_file(g_opt.port_file, port) != 0) {
    ep_log("ERROR", "cannot write --port-file %s: %s", g_opt.port_file, strerror(errno));
    close(lfd);
    return 1;
  }

  int tracker = -1;
  int tracker_registered = 0;
  time_t tracker_next_try = 0;
  int unmatch_count = 0;
  char matchkey[EP_MATCHKEY_SIZE];
  snprintf(matchkey, sizeof(matchkey), "%s", g_opt.key);

  while (!g_stop) {
    if (g_opt.tracker_host != NULL) {
      if (tracker < 0 && time(NULL) >= tracker_next_try) {
        tracker = ep_tracker_open(port);
        tracker_registered = 0;
        if (tracker < 0) {
          ep_log("WARN", "cannot reach tracker %s:%d, retrying in %ds", g_opt.tracker_host,
                 g_opt.tracker_port, EP_TRACKER_RETRY_S);
          tracker_next_try = time(NULL) + EP_TRACKER_RETRY_S;
        } else {
          ep_log("INFO", "connected to tracker %s:%d", g_opt.tracker_host, g_opt.tracker_port);
        }
      }
      if (tracker >= 0 && !tracker_registered) {
        ep_random_matchkey(matchkey, sizeof(matchkey));
        if (ep_tracker_put(tracker, port, matchkey) != 0) {
          ep_log("WARN", "tracker dropped the connection");
          close(tracker);
          tracker = -1;
          continue;
        }
        tracker_registered = 1;
        unmatch_count = 0;
      }
    }

    fd_set rfds;
    FD_ZERO(&rfds);
    FD_SET(lfd, &rfds);
    struct timeval tv = {g_opt.tracker_host != NULL ? EP_TRACKER_PING_S : 1, 0};
    int ready = select(lfd + 1, &rfds, NULL, NULL, &tv);
    if (ready < 0) {
      if (errno == EINTR) continue;
      ep_log("ERROR", "select: %s", strerror(errno));
      break;
    }
    if (ready == 0) {
      if (tracker >= 0) {
        int pending = ep_tracker_pending(tracker, matchkey);
        if (pending < 0) {
          ep_log("WARN", "lost the tracker connection");
          close(tracker);
          tracker = -1;
          continue;
        }
        unmatch_count = pending ? 0 : unmatch_count + 1;
        /* the key was handed to a client that never came: offer a fresh one */
        if (unmatch_count * EP_TRACKER_PING_S > EP_TRACKER_UNMATCH_TIMEOUT_S + EP_TRACKER_PING_S) {
          tracker_registered = 0;
        }
      }
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int conn = accept4(lfd, (struct sockaddr*)&ss, &sl, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      ep_log("ERROR", "accept: %s", strerror(errno));
      break;
    }
    /* The session child must inherit the connection. */
    fcntl(conn, F_SETFD, 0);
    char peer[128];
    ep_peer_name(&ss, peer, sizeof(peer));
    double timeout_s = 0;
    if (ep_handshake(conn, matchkey, peer, &timeout_s)) {
      ep_serve(conn, peer, timeout_s);
      if (tracker >= 0) tracker_registered = 0; /* a used match key is not offered again */
      if (g_opt.once) {
        close(conn);
        break;
      }
    }
    close(conn);
  }
  if (tracker >= 0) close(tracker);
  close(lfd);
  ep_log("INFO", "stopped");
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* GPU runtime plug-ins                                                                       */

/*
 * The official runtime has no GPU runtime; edgepack's are plug-ins (runtimes/plugins/opencl:
 * libtvm_opencl.so, runtimes/plugins/vulkan: libtvm_vulkan.so) whose static initialisers register their
 * device API and module loader with tvm-ffi. Installed next to this program they are loaded at
 * start-up (as the C API loads them next to a model), so that clients see session.device("opencl")
 * and uploaded GPU candidates load: what tuning a Mali/Adreno profile needs. The variable of each
 * names another file. A plug-in loads the GPU driver only when a GPU is first used, so loading it
 * on a device without one is harmless. They are loaded before any session is forked: every
 * session process inherits them, and only session processes touch the driver.
 */
typedef struct {
  const char* file;
  const char* env;
} ep_plugin;

static const ep_plugin ep_plugins[] = {
    {"libtvm_opencl.so", "EDGEPACK_OPENCL_PLUGIN"},
    {"libtvm_vulkan.so", "EDGEPACK_VULKAN_PLUGIN"},
};

static int ep_load_plugins(void) {
  char self[EP_MAX_PATH];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  char* slash = NULL;
  if (n > 0) {
    self[n] = '\0';
    slash = strrchr(self, '/');
  }
  for (size_t i = 0; i < sizeof(ep_plugins) / sizeof(ep_plugins[0]); ++i) {
    char path[EP_MAX_PATH];
    const char* env = getenv(ep_plugins[i].env);
    if (env != NULL && env[0] != '\0') {
      snprintf(path, sizeof(path), "%s", env);
    } else {
      if (slash == NULL) continue;
      int len = snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - self), self, ep_plugins[i].file);
      if (len < 0 || (size_t)len >= sizeof(path) || access(path, R_OK) != 0) continue; /* not installed */
    }
    if (dlopen(path, RTLD_NOW | RTLD_GLOBAL) == NULL) {
      ep_log("ERROR", "cannot load the GPU runtime plug-in %s: %s", path, dlerror());
      return -1;
    }
    ep_log("INFO", "loaded the GPU runtime plug-in %s", path);
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* main                                                                                      */

static void ep_usage(FILE* out) {
  fprintf(out,
          "usage: edgepack_rpc_server [options]\n"
          "A TVM RPC server without Python (protocol of python -m tvm.exec.rpc_server).\n"
          "\n"
          "  --host ADDR          address to listen on (default 127.0.0.1; reach it through an SSH "
          "tunnel)\n"
          "  --port N             port (default 9090; 0 picks a free one)\n"
          "  --port-end N         try ports [port, port-end) until one is free (default port+1)\n"
          "  --key KEY            RPC key clients must present (default \"\")\n"
          "  --workdir DIR        parent of the per-session work directories (default $TMPDIR or "
          "/tmp)\n"
          "  --port-file FILE     write the bound port to FILE once listening\n"
          "  --tracker HOST:PORT  register with a TVM RPC tracker (needs --key)\n"
          "  --custom-addr ADDR   address the tracker gives to clients (default: as the tracker "
          "sees us)\n"
          "  --load LIB           dlopen LIB (RTLD_GLOBAL) before serving; may be repeated\n"
          "  --no-plugins         do not load the GPU runtime plug-ins next to the program\n"
          "                       (libtvm_opencl.so, libtvm_vulkan.so; or $EDGEPACK_OPENCL_PLUGIN,\n"
          "                       $EDGEPACK_VULKAN_PLUGIN)\n"
          "  --exit-with-parent   stop when the process that started this one ends, even if it was\n"
          "                       killed (for a server started by a local tool)\n"
          "  --threads N          threads for the models' parallel kernels (default: $TVM_NUM_THREADS,\n"
          "                       else one per online CPU); a client may ask for fewer\n"
          "  --once               serve one session, then exit\n"
          "  --silent             log errors only\n"
          "  --version, --help\n");
}

static int ep_parse_int(const char* s, int lo, int hi, int* out) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static int ep_valid_key(const char* key) {
  if (strlen(key) > EP_KEY_LEN) return 0;
  for (const char* p = key; *p; ++p) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || c == '.' || c == ':' || c == '/' || c == '+';
    if (!ok) return 0;
  }
  return 1;
}

static int ep_parse_args(int argc, char** argv) {
  memset(&g_opt, 0, sizeof(g_opt));
  g_opt.host = "127.0.0.1";
  g_opt.port = 9090;
  g_opt.port_end = -1;
  g_opt.key = "";
  const char* tmp = getenv("TMPDIR");
  g_opt.workdir = (tmp != NULL && tmp[0] != '\0') ? tmp : "/tmp";
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define EP_NEED_VALUE()                                              \
  do {                                                               \
    if (v == NULL) {                                                 \
      fprintf(stderr, "edgepack_rpc_server: %s needs a value\n", a); \
      return -1;                                                     \
    }                                                                \
    ++i;                                                             \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      ep_usage(stdout);
      exit(0);
    } else if (strcmp(a, "--version") == 0) {
      printf("edgepack_rpc_server %s\n", EP_VERSION);
      exit(0);
    } else if (strcmp(a, "--host") == 0) {
      EP_NEED_VALUE();
      g_opt.host = v;
    } else if (strcmp(a, "--port") == 0) {
      EP_NEED_VALUE();
      if (ep_parse_int(v, 0, 65535, &g_opt.port) != 0) {
        fprintf(stderr, "edgepack_rpc_server: bad --port %s\n", v);
        return -1;
      }
    } else if (strcmp(a, "--port-end") == 0) {
      EP_NEED_VALUE();
      if (ep_parse_int(v, 1, 65536, &g_opt.port_end) != 0) {
        fprintf(stderr, "edgepack_rpc_server: bad --port-end %s\n", v);
        return -1;
      }
    } else if (strcmp(a, "--key") == 0) {
      EP_NEED_VALUE();
      g_opt.key = v;
    } else if (strcmp(a, "--workdir") == 0) {
      EP_NEED_VALUE();
      g_opt.workdir = v;
    } else if (strcmp(a, "--port-file") == 0) {
      EP_NEED_VALUE();
      g_opt.port_file = v;
    } else if (strcmp(a, "--tracker") == 0) {
      EP_NEED_VALUE();
      static char tracker_host[256];
      const char* colon = strrchr(v, ':');
      if (colon == NULL || (size_t)(colon - v) >= sizeof(tracker_host) || colon == v ||
          ep_parse_int(colon + 1, 1, 65535, &g_opt.tracker_port) != 0) {
        fprintf(stderr, "edgepack_rpc_server: --tracker wants HOST:PORT, got %s\n", v);
        return -1;
      }
      memcpy(tracker_host, v, (size_t)(colon - v));
      tracker_host[colon - v] = '\0';
      g_opt.tracker_host = tracker_host;
    } else if (strcmp(a, "--custom-addr") == 0) {
      EP_NEED_VALUE();
      g_opt.custom_addr = v;
    } else if (strcmp(a, "--load") == 0) {
      EP_NEED_VALUE();
      if (g_opt.num_loads >= EP_MAX_LOADS) {
        fprintf(stderr, "edgepack_rpc_server: too many --load\n");
        return -1;
      }
      g_opt.loads[g_opt.num_loads++] = v;
    } else if (strcmp(a, "--no-plugins") == 0) {
      g_opt.no_plugins = 1;
    } else if (strcmp(a, "--exit-with-parent") == 0) {
      g_opt.exit_with_parent = 1;
    } else if (strcmp(a, "--threads") == 0) {
      EP_NEED_VALUE();
      if (ep_parse_int(v, 1, 1024, &g_opt.threads) != 0) {
        fprintf(stderr, "edgepack_rpc_server: bad --threads %s\n", v);
        return -1;
      }
    } else if (strcmp(a, "--once") == 0) {
      g_opt.once = 1;
    } else if (strcmp(a, "--silent") == 0) {
      g_opt.silent = 1;
    } else {
      fprintf(stderr, "edgepack_rpc_server: unknown option %s (see --help)\n", a);
      return -1;
    }
#undef EP_NEED_VALUE
  }
  if (g_opt.port_end < 0) g_opt.port_end = g_opt.port + 1;
  if (!ep_valid_key(g_opt.key)) {
    fprintf(stderr, "edgepack_rpc_server: --key may only contain letters, digits and -_.:/+\n");
    return -1;
  }
  if (g_opt.tracker_host != NULL && g_opt.key[0] == '\0') {
    fprintf(stderr, "edgepack_rpc_server: --tracker needs --key (the device kind clients ask for)\n");
    return -1;
  }
  if (g_opt.custom_addr != NULL && !ep_valid_key(g_opt.custom_addr)) {
    fprintf(stderr, "edgepack_rpc_server: bad --custom-addr\n");
    return -1;
  }
  return 0;
}

/* Models run their parallel kernels on edgepack's pool (ep_parallel.c, installed by
   ep_register_runtime_builtins before any model loads): --threads, else TVM_NUM_THREADS, else the big
   cores. TVM_NUM_THREADS is set to the same count for what TVM's own pool still runs (without it, on
   x86 TVM takes half the logical CPUs, which leaves a small machine single-threaded). A client changes
   the count with edgepack.set_num_threads. */
static void ep_set_threads(void) {
  char text[16];
  int n = g_opt.threads;
  const char* env = getenv("TVM_NUM_THREADS");
  if (n == 0 && env != NULL && env[0] != '\0') return;
  if (n == 0) n = ep_parallel_default_threads();
  snprintf(text, sizeof(text), "%d", n);
  setenv("TVM_NUM_THREADS", text, 1);
}

int main(int argc, char** argv) {
  pid_t parent = getppid();
  if (ep_parse_args(argc, argv) != 0) return 2;
  ep_set_threads();
  if (g_opt.exit_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 0; /* it ended before the line above */
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = ep_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  for (int i = 0; i < g_opt.num_loads; ++i) {
    if (dlopen(g_opt.loads[i], RTLD_NOW | RTLD_GLOBAL) == NULL) {
      ep_log("ERROR", "cannot load %s: %s", g_opt.loads[i], dlerror());
      return 1;
    }
    ep_log("INFO", "loaded additional library %s", g_opt.loads[i]);
  }
  if (!g_opt.no_plugins && ep_load_plugins() != 0) return 1;
  ep_register_runtime_builtins(); /* what models call that TVM's Python would provide (NonZero, TopK ...) */
  struct stat st;
  if (stat(g_opt.workdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    ep_log("ERROR", "--workdir %s is not a directory", g_opt.workdir);
    return 1;
  }
  if (ep_register_server_env() != 0) return 1;
  return ep_run();
}
