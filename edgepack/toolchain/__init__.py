"""What builds code for a device: cross compilers, the Android NDK, the TVM runtime per target triple,
pinned wheel downloads, model libraries, C programs, GPU runtime plug-ins and the RPC server."""
