/*
 * wgpu_api.cc - dlopen() wgpu-native and resolve the functions of wgpu_api.h.
 */
#include "wgpu_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace edgepack {
namespace wgpu {

namespace {

std::once_flag g_once;
Api g_api;
bool g_ok = false;
std::string g_error;
std::string g_library;

/*! \brief The directory of the file this code was loaded from (the plug-in, or a static program). */
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string path(info.dli_fname);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

bool TryLoad(const std::string& path, std::vector<std::string>* tried) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    tried->push_back(path + ": " + (why ? why : "cannot be loaded"));
    return false;
  }
  Api api;
  std::string missing;
#define EDGEPACK_WGPU_RESOLVE(name)                                                    \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, #name));               \
  if (api.name == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(#name);
  EDGEPACK_WGPU_FUNCTIONS(EDGEPACK_WGPU_RESOLVE)
#undef EDGEPACK_WGPU_RESOLVE
  if (!missing.empty()) {
    tried->push_back(path + ": not the wgpu-native this runtime was built for (missing " + missing +
                     ")");
    dlclose(handle);
    return false;
  }
  g_api = api;
  g_library = path;
  return true;  // never dlclose()d: buffers and pipelines live until the process ends
}

void Load() {
  std::vector<std::string> candidates;
  const char* env = std::getenv("EDGEPACK_WGPU_LIBRARY");
  if (env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    std::string dir = OwnDirectory();
    if (!dir.empty()) candidates.push_back(dir + "libwgpu_native.so");
    candidates.push_back("libwgpu_native.so");
  }
  std::vector<std::string> tried;
  for (const std::string& c : candidates) {
    if (TryLoad(c, &tried)) {
      g_ok = true;
      return;
    }
  }
  g_error = "no usable wgpu-native library (libwgpu_native.so) was found; tried ";
  for (size_t i = 0; i < tried.size(); ++i) g_error += (i ? "; " : "") + tried[i];
}

}  // namespace

const Api* GetApi() {
  std::call_once(g_once, Load);
  return g_ok ? &g_api : nullptr;
}

std::string LoadError() {
  GetApi();
  return g_error;
}

std::string LoadedLibrary() {
  GetApi();
  return g_library;
}

}  // namespace wgpu
}  // namespace edgepack
